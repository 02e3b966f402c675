"""Name -> class registries, as DI-engine's ``LEARNER_REGISTRY`` / ``COMMANDER_REGISTRY``.

Algorithms have their own one-line registry in common/policy/__init__.py.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


class Registry:
    """A named mapping of implementations, filled with the :meth:`register` decorator."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator registering ``obj`` under ``name``.

        Raises:
            KeyError: ``name`` is already registered for another object.
        """

        def deco(obj: Any) -> Any:
            if name in self._items and self._items[name] is not obj:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> Any:
        """The object registered as ``name``.

        Raises:
            KeyError: unknown name; the message lists the known ones.
        """
        self._load_builtins()
        if name not in self._items:
            raise KeyError(f"unknown {self.kind} type {name!r}; known: {sorted(self._items)}")
        return self._items[name]

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Instantiate the object registered as ``name`` with the given arguments."""
        return self.get(name)(*args, **kwargs)

    def _load_builtins(self) -> None:
        for module in _BUILTINS[self.kind]:
            importlib.import_module(module)


_BUILTINS = {"learner": ("workers.learner",), "commander": ("coordinator.commander", "coordinator.league_commander")}

LEARNER_REGISTRY = Registry("learner")
COMMANDER_REGISTRY = Registry("commander")


def import_names(names: list[str]) -> None:
    """Import user modules that register extra implementations (``create_config.*.import_names``)."""
    for name in names:
        importlib.import_module(name)
