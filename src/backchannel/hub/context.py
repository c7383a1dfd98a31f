"""What every part of the hub is built on (:class:`Env`), and the state of one store
transaction (:class:`Ctx`), which the parts fill with their after-commit effects.

Nothing per transaction lives on the hub or on a part: a store may run several
transactions at once on several threads (PostgreSQL), and may run a transaction
function again after a failed commit. :meth:`Env.transact` gives each run a fresh
:class:`Ctx` and applies the effects of the run that committed, on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from backchannel.core import messages as rules
from backchannel.delivery.circuit import PushCircuits
from backchannel.stores.base import Store, Tx
from backchannel.types import Clock, Delivery, InboxMessage, Job, Message, SendResult

if TYPE_CHECKING:
    from backchannel.hub.facade import Hub

log = logging.getLogger("backchannel.hub")
T = TypeVar("T")

__all__ = [
    "Ctx",
    "Env",
    "HubConfig",
    "HubMiddleware",
    "JobHandler",
    "JobOutcome",
    "Taker",
    "Takers",
    "Waiters",
]


class HubMiddleware:
    """Ordered hooks around hub operations, for audit, metrics and the like.

    Every hook runs after the operation committed; an exception in a hook is logged
    and never undoes or fails the operation.
    """

    def after_send(self, hub: Hub, message: Message, result: SendResult) -> None:
        """A message was accepted (not called on an idempotent replay)."""

    def after_ack(self, hub: Hub, team: str, member: str, message_ids: Sequence[str]) -> None:
        """Copies were acknowledged."""

    def after_dead(self, hub: Hub, delivery: Delivery, reason: str) -> None:
        """A copy was given up on."""


@dataclass
class HubConfig:
    lease_seconds: float = 60.0
    max_attempts: int = 5
    max_text: int = rules.DEFAULT_MAX_TEXT
    default_limit: int = 10
    #: how many held messages an event stream opened again reads from the store at once
    held_page: int = 1000
    #: seconds an event stream's write may wait for its reader to take it: a reader that
    #: takes nothing for that long (gone without a word, or stopped reading) ends the
    #: stream, and what it holds goes back untried
    stream_write_timeout: float = 10.0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What firing a job did, for the work that follows the commit."""

    keep: bool = False  # the handler rescheduled the job: leave it pending
    run_after: Job | None = None  # I/O to start once the transaction committed


#: Fires one scheduled job inside the maintenance transaction (no I/O there); wake-ups
#: go in the :class:`Ctx`; returns a :class:`JobOutcome` (``None``: done).
JobHandler = Callable[["Ctx", Job, float], "JobOutcome | None"]


class Ctx:
    """One run of a store transaction: its :class:`Tx` and the effects the parts ask
    for once it commits. Parts write effects here and never keep them themselves."""

    __slots__ = ("after", "due", "events", "handed", "tx", "watchers", "woken")

    def __init__(self, tx: Tx) -> None:
        self.tx = tx
        self.handed: list[tuple[Taker, list[InboxMessage]]] | None = None  # see Takers
        self.woken: set[tuple[str | None, str | None]] = set()  # inboxes to wake
        self.watchers: set[str] = set()  # teams whose traffic watchers to wake
        self.due: list[float] = []  # times scheduled work falls due
        self.events: list[tuple[str, tuple[Any, ...]]] = []  # middleware hooks to run
        self.after: list[Job] = []  # I/O to start (outbox POSTs)

    def wake(self, team: str | None, member: str | None) -> None:
        """Wake the receivers of ``member`` (``None``: everyone in ``team``)."""
        self.woken.add((team, member))

    def watched(self, team: str) -> None:
        """Wake those watching ``team``'s traffic (feed, events, tasks), no receiver:
        a message stored in this transaction wakes its own readers."""
        self.watchers.add(team)

    def schedule(self, when: float) -> None:
        """Something stored in this transaction falls due at ``when``."""
        self.due.append(when)

    def emit(self, hook: str, *args: Any) -> None:
        """Run middleware ``hook`` with ``args`` after the commit."""
        self.events.append((hook, args))

    def hand(self, taker: Taker, got: list[InboxMessage]) -> None:
        """``got`` was leased in this transaction for ``taker``: its receive gets them
        once the transaction committed."""
        if self.handed is None:
            self.handed = []
        self.handed.append((taker, got))


class Taker:
    """A receive waiting on an empty inbox, which a send to its member may lease its
    message for in the send's own transaction (:class:`Takers`). One use: claimed by
    at most one transaction run, then answered once, on the event loop, with what that
    run leased for it if the run committed and nothing otherwise."""

    __slots__ = ("claimed", "future", "holder", "lease", "limit")

    def __init__(
        self,
        limit: int,
        lease: float,
        future: asyncio.Future[list[InboxMessage]],
        holder: str | None = None,
    ) -> None:
        self.limit = limit
        self.lease = lease
        self.future = future
        self.holder = holder  # the receive's name its client gave (``receive_id``)
        self.claimed = False  # under Takers' lock

    def answer(self, got: list[InboxMessage]) -> None:
        if not self.future.done():
            self.future.set_result(got)


class Takers:
    """The receives of this process waiting on an empty inbox, by (team, member), that
    a send may hand its message to: the send's transaction leases it for the first of
    them, and that receive returns it without a transaction of its own (one store
    transaction and one wake-up fewer a message). Claimed from the store's threads,
    hence the lock; a receive that stops waiting while a send has claimed it takes
    what that send leased (or, cancelled, gives it back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_member: dict[tuple[str, str], list[Taker]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_member)

    def add(self, team: str, member: str, taker: Taker) -> None:
        with self._lock:
            self._by_member.setdefault((team, member), []).append(taker)

    def remove(self, team: str, member: str, taker: Taker) -> bool:
        """Stop offering ``taker``; False if a transaction has claimed it already."""
        with self._lock:
            waiting = self._by_member.get((team, member))
            if waiting is not None and taker in waiting:
                waiting.remove(taker)
                if not waiting:
                    del self._by_member[(team, member)]
            return not taker.claimed

    def claim(self, team: str, member: str) -> Taker | None:
        """The first waiting receive of ``member``, taken out (from a transaction)."""
        with self._lock:
            waiting = self._by_member.get((team, member))
            if not waiting:
                return None
            taker = waiting.pop(0)
            if not waiting:
                del self._by_member[(team, member)]
            taker.claimed = True
            return taker


class Waiters:
    """Wake-ups for receivers blocked on an empty inbox; keyed by (team, member), and
    (team, None) for those watching the team's traffic (feed, events, tasks).

    A waiter takes the current event *before* it looks at the store, so a message
    committed between its look and its wait still wakes it. A receiver is woken only
    for its own member (:meth:`Ctx.wake` per recipient, where messages are stored).
    ``woken`` counts, per key, the wake-ups that found someone waiting.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str | None, str | None], asyncio.Event] = {}
        self.woken: Counter[tuple[str | None, str | None]] = Counter()

    def event(self, team: str | None, member: str | None) -> asyncio.Event:
        ev = self._events.get((team, member))
        if ev is None:
            ev = self._events[(team, member)] = asyncio.Event()
        return ev

    def _set(self, key: tuple[str | None, str | None]) -> None:
        ev = self._events.pop(key, None)
        if ev is not None:
            self.woken[key] += 1
            ev.set()

    def notify_watchers(self, team: str) -> None:
        """Wake those watching the team's traffic, not its receivers."""
        self._set((team, None))

    def notify_members(self, team: str, members: Iterable[str]) -> None:
        """Wake the receivers of ``members`` and the team's watchers."""
        for member in set(members):
            self._set((team, member))
        self._set((team, None))

    def notify(self, team: str | None, member: str | None) -> None:
        """Wake ``member``'s receivers and the team's watchers; with ``member`` None,
        every waiter of the team (a team removed, a change another process made that
        does not say whose), with ``team`` None every waiter."""
        if team is None:
            keys = list(self._events)
        else:
            keys = (
                [(team, member), (team, None)]
                if member is not None
                else [k for k in self._events if k[0] == team]
            )
        for key in keys:
            self._set(key)


def _unhand(runs: Iterable[Ctx]) -> None:
    """Runs that did not commit: the receives they claimed get nothing, and lease
    again themselves."""
    for c in runs:
        if c.handed:
            for taker, _ in c.handed:
                taker.answer([])


class _Run:
    """``fn`` as a store transaction function: each run gets a fresh :class:`Ctx` (a run
    again after a failed commit starts from scratch), the last in ``runs``.

    Its caller may stop waiting (cancelled) while a store's thread still runs it: such a
    store calls :meth:`finished` once it knows whether it committed
    (:func:`~backchannel.stores.base.tell_finished`), and the caller's :class:`Env`
    settles it then (:meth:`when_finished`)."""

    __slots__ = ("_committed", "_then", "fn", "runs")

    def __init__(self, fn: Callable[[Ctx], Any]) -> None:
        self.fn = fn
        self.runs: list[Ctx] = []
        self._then: Callable[[bool], None] | None = None
        self._committed: bool | None = None

    def __call__(self, tx: Tx) -> Any:
        c = Ctx(tx)
        self.runs.append(c)
        return self.fn(c)

    def finished(self, committed: bool) -> None:
        """The store's word, on the event loop, for a caller that stopped waiting."""
        then, self._then = self._then, None
        if then is None:
            self._committed = committed
        else:
            then(committed)

    def when_finished(self, then: Callable[[bool], None]) -> None:
        """Call ``then`` with the store's word (at once if it came already)."""
        if self._committed is None:
            self._then = then
        else:
            then(self._committed)

    def settle(self, env: Env, committed: bool) -> None:
        """Apply the effects of the run that committed; answer the claims of the others."""
        runs = self.runs
        if committed and runs:
            _unhand(runs[:-1])
            env.apply(runs[-1])
        else:
            _unhand(runs)


async def wait_for(event: asyncio.Event, seconds: float) -> None:
    """Wait for ``event`` up to ``seconds``. (Not ``asyncio.wait_for``: on Python 3.11 it
    can swallow a cancellation that arrives as the event is set, leaving a task that will
    not stop.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def boot_time() -> float:
    """Seconds on a clock that never steps and runs on while the machine sleeps (Linux's
    ``CLOCK_BOOTTIME``), against which a step of the wall clock shows. Where there is
    none, the monotonic clock, which may stop while the machine sleeps: a sleep there
    looks like a step, and the leases given before it run their length again (a delay,
    never a copy handed twice)."""
    if _BOOTTIME is None:
        return time.monotonic()
    return time.clock_gettime(_BOOTTIME)


_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)
#: How far the wall clock may run ahead of the boot clock between two maintenance passes
#: before the hub takes it that the wall clock stepped forward (NTP correcting a clock
#: that was behind, an operator setting the date); see :meth:`.Maintenance._carry_leases`.
STEPPED_AFTER = 5.0


class Env:
    """The store, the clock, the settings, the wake-ups and the middleware every part
    uses; it runs transactions and applies their effects after the commit."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        config: HubConfig,
        middleware: Iterable[HubMiddleware],
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.middleware = list(middleware)
        self.waiters = Waiters()
        self.takers = Takers()
        #: members whose push target is down: this hub's dispatcher's, and the stored
        #: ones any hub's found (backchannel.delivery.circuit)
        self.push_circuits = PushCircuits(store)
        self.hub: Hub | None = None  # what middleware hooks receive; set by the facade
        self.next_due: float | None = None
        self.maint_wake = asyncio.Event()
        #: since when this hub has run without a gap: its start, or the end of the last
        #: stretch it did not run through (stopped, the machine asleep, its clock stepped
        #: forward; :meth:`.Maintenance.loop`). No sign of life could reach it before.
        self.awake_since = clock.now()
        #: the hub's clock minus the boot clock at maintenance's last pass (None: not
        #: known, or a clock that does not follow the wall clock): see :meth:`stepped`
        self.wall_boot: float | None = None

    def stepped(self, now: float) -> float:
        """How far the wall clock has stepped forward since maintenance's last pass
        (0.0: not beyond :data:`STEPPED_AFTER`), which then wakes to carry what the step
        would end early. For a decision that the clock's time alone would take before
        maintenance sees the step (a pair's budget window ending); one clock read."""
        if self.wall_boot is None:
            return 0.0
        step = now - boot_time() - self.wall_boot
        if step <= STEPPED_AFTER:
            return 0.0
        self.maint_wake.set()
        return step

    async def transact(self, fn: Callable[[Ctx], T]) -> T:
        """Run ``fn`` in one store transaction; apply its effects once it committed.
        (:meth:`transact_ctx` without the context: one coroutine fewer a call.)

        A caller cancelled meanwhile stops waiting, but a store whose thread runs the
        transaction may still commit it: its effects are then applied when the store
        is done (:meth:`_left`), so a receive it handed messages to is answered and the
        recipients of what it stored are woken."""
        run = _Run(fn)
        call = self.store.transact(run)
        try:
            result: T = await call
        except asyncio.CancelledError:
            self._left(call, [run])
            raise
        except BaseException:
            _unhand(run.runs)
            raise
        run.settle(self, True)
        return result

    async def transact_ctx(self, fn: Callable[[Ctx], T]) -> tuple[T, Ctx]:
        """:meth:`transact`, also returning the committed run's :class:`Ctx`."""
        run = _Run(fn)
        call = self.store.transact(run)
        try:
            result: T = await call
        except asyncio.CancelledError:
            self._left(call, [run])
            raise
        except BaseException:
            _unhand(run.runs)
            raise
        run.settle(self, True)
        return result, run.runs[-1]

    async def transact_each(self, fns: Sequence[Callable[[Ctx], T]]) -> list[T | Exception]:
        """Run each of ``fns`` as :meth:`transact` does, as one store call
        (:meth:`Store.transact_each`): each one's result or exception, in order. The
        effects of each that committed are applied; those of one that raised are not."""
        runs = [_Run(fn) for fn in fns]
        call = self.store.transact_each(runs)
        try:
            done: list[T | Exception] = await call
        except asyncio.CancelledError:
            self._left(call, runs, each=True)
            raise
        except BaseException:
            _unhand(c for r in runs for c in r.runs)
            raise
        for run, outcome in zip(runs, done, strict=True):
            run.settle(self, not isinstance(outcome, Exception))
        return done

    def _left(self, call: Awaitable[Any], runs: Sequence[_Run], each: bool = False) -> None:
        """The caller of a store call was cancelled. A coroutine stopped with it, and
        what it ran did not commit. A future (a store's thread runs the transactions)
        may have been answered just before, or is settled when the store tells."""
        if not isinstance(call, asyncio.Future):
            _unhand(c for r in runs for c in r.runs)
        elif not call.done() or call.cancelled():
            for run in runs:
                run.when_finished(partial(run.settle, self))
        elif call.exception() is not None:
            _unhand(c for r in runs for c in r.runs)
        else:
            outcomes = call.result() if each else [None]
            for run, outcome in zip(runs, outcomes, strict=True):
                run.settle(self, not isinstance(outcome, Exception))

    def apply(self, c: Ctx) -> None:
        if c.handed:  # before the wake-ups: a woken receive finds its messages
            for taker, got in c.handed:
                taker.answer(got)
        for when in c.due:
            self.due_at(when)
        for team, member in c.woken:
            self.waiters.notify(team, member)
        for team in c.watchers:
            self.waiters.notify_watchers(team)
        for hook, args in c.events:
            self.run_middleware(hook, *args)

    def due_at(self, when: float) -> None:
        """Something was scheduled for ``when``: make the maintenance task wake by then."""
        if self.next_due is None or when < self.next_due:
            self.next_due = when
            self.maint_wake.set()

    def run_middleware(self, hook: str, *args: Any) -> None:
        for mw in self.middleware:
            try:
                getattr(mw, hook)(self.hub, *args)
            except Exception:
                log.exception("middleware %s.%s failed", type(mw).__name__, hook)
