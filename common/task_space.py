"""Task-space accounting: how many tasks of one kind may run at once (the seed's LimitedSpaceContainer)."""

from __future__ import annotations


class TaskSpace:
    """A counter of free slots between ``min_val`` and ``max_val``.

    ``acquire_space`` takes a slot if one is free; ``release_space`` gives one back; ``resize``
    changes the capacity when collectors join or leave.
    """

    def __init__(self, min_val: int = 0, max_val: int = 1) -> None:
        if not 0 <= min_val <= max_val:
            raise ValueError(f"task space needs 0 <= min_val <= max_val, got {min_val}, {max_val}")
        self.min_val = min_val
        self.max_val = max_val
        self.cur = min_val

    def acquire_space(self) -> bool:
        """Take one slot; False when none is free."""
        if self.cur < self.max_val:
            self.cur += 1
            return True
        return False

    def release_space(self) -> None:
        """Give one slot back. Raises ``RuntimeError`` when nothing was acquired (a double release)."""
        if self.cur <= self.min_val:
            raise RuntimeError("task space released more often than acquired")
        self.cur -= 1

    def resize(self, max_val: int) -> None:
        """Set the capacity to ``max_val`` (at least ``min_val``). Running tasks keep their slots:
        above a lowered capacity, ``acquire_space`` fails until enough of them are released."""
        self.max_val = max(self.min_val, int(max_val))

    @property
    def in_use(self) -> int:
        return self.cur - self.min_val

    def state_dict(self) -> dict[str, int]:
        """``min_val``, ``max_val`` and ``cur`` (ints): the wire form :meth:`load_state_dict` reads."""
        return {"min_val": self.min_val, "max_val": self.max_val, "cur": self.cur}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Adopt :meth:`state_dict` output.

        Raises:
            ValueError: a key is missing or not an int, or the values break ``0 <= min_val <= max_val``
                and ``min_val <= cur``.
        """
        got = {}
        for name in ("min_val", "max_val", "cur"):
            value = state.get(name) if isinstance(state, dict) else None
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"task space state needs int {name!r}, got {state!r}")
            got[name] = value
        if not 0 <= got["min_val"] <= got["max_val"] or got["cur"] < got["min_val"]:
            raise ValueError(f"task space state needs 0 <= min_val <= max_val and min_val <= cur, got {state!r}")
        self.min_val, self.max_val, self.cur = got["min_val"], got["max_val"], got["cur"]
