"""State kept as dataclass fields, whose plain-JSON form (``state_dict``) is derived from the fields.

A commander's state round-trips through the coordinator's Redis state and the run folder's
``resume.json``; writing its keys out by hand twice (save and load) let the two lists drift apart.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Union, get_args, get_origin, get_type_hints

# Field metadata of a dataclass field that is configuration or a collaborator, not state.
NOT_STATE = {"state": False}


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a decoded JSON ``value`` fits the field type ``hint`` (outer type only; an int fits float)."""
    if hint is Any:
        return True
    if get_origin(hint) is Union:
        return any(_conforms(value, arg) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    base = get_origin(hint) or hint
    if base in (int, float):
        return isinstance(value, (int, float) if base is float else int) and not isinstance(value, bool)
    return isinstance(value, base)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


class WireState:
    """Mixin for a dataclass whose fields (but those with ``metadata=NOT_STATE``) are its state.

    :meth:`state_dict` gives each field under its own name: a plain JSON value as a deep copy, a
    value with its own ``state_dict`` / ``load_state_dict`` (a :class:`common.task_space.TaskSpace`)
    by those. A field holding another ``WireState`` (a part the state is split into) adds that
    part's keys beside its own, so a state split into parts keeps one flat dict: the wire form
    the coordinator's Redis state and ``resume.json`` have always had.
    """

    def state_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values, one key each, parts' keys flattened in.

        Raises:
            TypeError: two parts name the same key (their states would overwrite each other).
        """
        out: dict[str, Any] = {}
        for f in _state_fields(self):
            value = getattr(self, f.name)
            if isinstance(value, WireState):
                part = value.state_dict()
            elif hasattr(value, "state_dict"):
                part = {f.name: value.state_dict()}
            else:
                part = {f.name: copy.deepcopy(value)}
            clash = out.keys() & part.keys()
            if clash:
                raise TypeError(f"{type(self).__name__}: state key(s) {sorted(clash)} named twice")
            out.update(part)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt :meth:`state_dict` output. A key the state lacks (it was written by an older
        commander) leaves its field as it is; keys no field names are ignored. Parts load in place.

        Raises:
            ValueError: a value does not fit its field's type (the message names the key).
        """
        hints = get_type_hints(type(self))
        for f in _state_fields(self):
            value = getattr(self, f.name)
            if isinstance(value, WireState):
                value.load_state_dict(state)
            elif f.name not in state:
                continue
            elif hasattr(value, "load_state_dict"):
                try:
                    value.load_state_dict(state[f.name])
                except ValueError as e:
                    raise ValueError(f"commander state key {f.name!r}: {e}") from None
            elif not _conforms(state[f.name], hints[f.name]):
                raise ValueError(f"commander state key {f.name!r} must be {_type_name(hints[f.name])}, "
                                 f"got {state[f.name]!r:.80}")
            else:
                setattr(self, f.name, copy.deepcopy(state[f.name]))


def _state_fields(obj: Any) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(obj) if f.metadata.get("state", True)]
