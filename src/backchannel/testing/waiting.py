"""Waiting for observable state: the one way tests wait for something to happen.

A test never sleeps for a fixed time and hopes; it names what it waits for and polls a
check until the check returns something truthy. :func:`eventually` is for coroutines
(the check may be a plain function or a coroutine function); :func:`eventually_blocking`
is the same loop for code without an event loop (threads, subprocesses, a sync client).
On time-out both raise ``AssertionError`` naming what was awaited and the last value the
check returned, so a failure says how far things got::

    status = await eventually(lambda: hub.message_status("t", mid), what="m1 acked")

A check that can only answer "not yet" (``None``) names what else to show with ``show``,
called once, on time-out::

    await eventually(held_worker, what="a held worker", show=dispatcher.status)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

__all__ = ["eventually", "eventually_blocking"]

T = TypeVar("T")

#: The first pause between checks; each pause doubles up to :data:`LONGEST_PAUSE`.
FIRST_PAUSE = 0.01
LONGEST_PAUSE = 0.1


@overload
async def eventually(
    check: Callable[[], Awaitable[T]],
    *,
    what: str,
    within: float = 10.0,
    show: Callable[[], object] | None = None,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T],
    *,
    what: str,
    within: float = 10.0,
    show: Callable[[], object] | None = None,
) -> T: ...


async def eventually(
    check: Callable[[], Any],
    *,
    what: str,
    within: float = 10.0,
    show: Callable[[], object] | None = None,
) -> Any:
    """Call ``check`` until it returns something truthy and return that; raise
    ``AssertionError`` after ``within`` seconds (with what ``show`` returns, if given).
    Exceptions from ``check`` propagate."""
    deadline = time.monotonic() + within
    pause = FIRST_PAUSE
    while True:
        got = check()
        value = await got if inspect.isawaitable(got) else got
        if value:
            return value
        await asyncio.sleep(_next_pause(pause, deadline, what, within, value, show))
        pause = min(pause * 2, LONGEST_PAUSE)


def eventually_blocking(
    check: Callable[[], T],
    *,
    what: str,
    within: float = 10.0,
    show: Callable[[], object] | None = None,
) -> T:
    """:func:`eventually` for code that is not in an event loop: blocks the thread."""
    deadline = time.monotonic() + within
    pause = FIRST_PAUSE
    while True:
        value = check()
        if value:
            return value
        time.sleep(_next_pause(pause, deadline, what, within, value, show))
        pause = min(pause * 2, LONGEST_PAUSE)


def _shown(value: object) -> str:
    seen = repr(value)
    return seen if len(seen) <= 500 else seen[:500] + "..."


def _next_pause(
    pause: float,
    deadline: float,
    what: str,
    within: float,
    last: Any,
    show: Callable[[], object] | None,
) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        also = "" if show is None else f"; then: {_shown(show())}"
        raise AssertionError(
            f"timed out after {within:g} s waiting for {what}; the check last returned "
            f"{_shown(last)}{also}"
        )
    return min(pause, left)
