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

A hub's Python runs under one GIL, so its process uses one core at most, and its two
busiest threads (the event loop's and the SQLite writer's) hand work to each other
hundreds of times a second. Where waking a thread on another CPU is dear, as on a
virtual machine whose idle CPU halts, each hand-off costs more when the two threads sit
on different CPUs: on the 2-CPU development box a round trip from the event loop to a
thread and back took 44 µs of CPU across CPUs and 17 µs on one. :func:`pin_to_cpu` runs
the process on one CPU (Linux): in-process at 16 senders, 10,000–11,100 msgs/s in eight
runs against 7,700–11,100 unpinned; ``backchannel serve --cpu N`` over HTTP 4,110–4,180
against 3,760–3,830. It is never done by default: a machine running several hubs, or a
program with work of its own outside the GIL, chooses its CPUs itself.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["GC_YOUNG_THRESHOLD", "pin_to_cpu", "tune_gc", "unpin_cpu"]

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


def _cpu_list(cpus: Iterable[int]) -> str:
    return ", ".join(str(c) for c in sorted(cpus))


def _set_every_thread(cpus: set[int]) -> None:
    """``cpus`` for every thread of this process (a new thread takes its creator's)."""
    tasks = Path("/proc/self/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, ValueError):  # a thread that ended meanwhile
            continue
    os.sched_setaffinity(0, cpus)


def pin_to_cpu(cpu: int | None = None) -> frozenset[int]:
    """Run every thread of this process, and every one it starts later, on CPU ``cpu``
    (by default the lowest this process may use). Returns the CPUs the process could use
    before, for :func:`unpin_cpu`. Linux only: raises ``OSError`` elsewhere and
    ``ValueError`` for a CPU the process may not use."""
    if not hasattr(os, "sched_setaffinity"):
        raise OSError(
            "pinning to one CPU needs Linux (os.sched_setaffinity); leave it out here "
            "(for serve: without --cpu)"
        )
    allowed = frozenset(os.sched_getaffinity(0))
    if cpu is None:
        cpu = min(allowed)
    if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu not in allowed:
        raise ValueError(
            f"CPU {cpu!r} is not one this process may use; pick one of {_cpu_list(allowed)}"
        )
    _set_every_thread({cpu})
    return allowed


def unpin_cpu(cpus: Iterable[int]) -> None:
    """Let every thread of this process run on ``cpus`` again (what :func:`pin_to_cpu`
    returned)."""
    wanted = set(cpus)
    if not wanted or not all(isinstance(c, int) and not isinstance(c, bool) for c in wanted):
        raise ValueError(
            f"CPUs are whole numbers, at least one, not {sorted(wanted, key=repr)!r}: pass "
            "what pin_to_cpu returned"
        )
    try:
        _set_every_thread(wanted)
    except OSError as exc:  # none of them is a CPU this system has for the process
        raise ValueError(
            f"CPUs {_cpu_list(wanted)} were refused ({exc.strerror}): pass what pin_to_cpu returned"
        ) from None
