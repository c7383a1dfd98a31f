"""Settings for a process that hosts a busy hub.

Python's cyclic garbage collector looks at its youngest objects every 700 container
allocations (more precisely: when allocations outnumber frees by 700). A hub allocates
its messages, futures and records by the thousand a second, and each of its messages
lives for a transaction's batch: at 700 a collection runs every few dozen messages,
moves what is in flight to the older generations, and these fill until the collector
walks every object of the process. Measured on the in-process load of ``bench/`` (16
senders, one message at a time), that is 12–18 µs of a message's 105–110: the
difference between 8,400–8,800 and about 10,100 messages a second.

``backchannel serve`` calls :func:`tune_gc` itself, since it owns its process. A program
that runs a :class:`~backchannel.Hub` in-process owns its own process, so the hub does
not change it behind the program's back: call :func:`tune_gc` once, at start, as one
picks uvloop. It only ever raises the threshold, so a program that chose its own keeps
it.
"""

from __future__ import annotations

import gc

__all__ = ["GC_YOUNG_THRESHOLD", "tune_gc"]

#: Allocations between two collections of the youngest generation when tuned. Ten
#: thousand keeps a message's short-lived objects out of the older generations (they die
#: before the next collection) and a young collection still short (under a millisecond);
#: 50,000 measured no better.
GC_YOUNG_THRESHOLD = 10_000

_MOST = 2**31 - 1  # the collector keeps its thresholds as C ints


def tune_gc(young: int = GC_YOUNG_THRESHOLD) -> tuple[int, int, int]:
    """Collect the youngest generation every ``young`` allocations instead of Python's
    700, if it is lower now; the older generations keep their thresholds. Returns the
    thresholds as they were, for ``gc.set_threshold(*before)``."""
    if isinstance(young, bool) or not isinstance(young, int) or not 1 <= young <= _MOST:
        raise ValueError(
            f"young must be a whole number of allocations from 1 to {_MOST}, not {young!r}"
        )
    before = gc.get_threshold()
    if 0 < before[0] < young:  # 0: the program turned collection off; left so
        gc.set_threshold(young, before[1], before[2])
    return before
