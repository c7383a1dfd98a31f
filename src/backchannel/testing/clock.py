"""A clock that moves only when told to."""

from __future__ import annotations


class FakeClock:
    """A clock for tests: starts at ``start`` and moves only by :meth:`advance`."""

    #: years from the wall clock on purpose: not compared with a database's clock
    follows_wall_clock = False

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        self._now = when
