"""The push dispatcher: one task per member whose ``delivery`` setting names a push adapter.

::

    async with Dispatcher(hub):       # or: await d.start() ... await d.stop()
        ...

Every ``rescan_s`` seconds (and on :meth:`Dispatcher.poke`) the dispatcher lists the
teams and their members. A member whose ``delivery.type`` is a push adapter
(``inbox-file``, ``tmux``, ``stdin``, ``webhook``) gets a worker task; a member added later
is picked up by the next scan, a member whose setting changed gets a new worker, and a
member whose setting went back to pull loses its worker. An old worker is stopped in the
background (a delivery under way gets ``grace_s``, as at shutdown) so the scan, which
renews every member's lease, never waits on it; its member's new worker starts once it
has stopped. Members without a setting, or
with ``pull``/``hook``, fetch their messages themselves and are left alone; an unknown
type is logged once and left alone too (its messages wait for whoever pulls them).

A worker leases its member's messages with ``hub.receive(team, member, session=...,
wait=...)``: the hub wakes it when a message is committed (no polling), holds messages
back while the adapter's session has a turn open, and hands them out in send order. The
worker hands them to the adapter one at a time, in that order, and records the result:

* returned: ``hub.mark_delivered(detail)``, and ``hub.ack`` in the same transaction
  (``ack=True``) when the adapter's delivery is the agent's receipt (the agent cannot ack).
  While the store cannot be reached these are tried again, and nothing else is pushed
  until they are recorded: the push has happened, and a copy left leased would come
  back at its lease's end and be pushed again, after newer messages;
* :class:`~backchannel.delivery.base.AdapterError` (transient): the rest of the batch is
  released at once, the worker waits the adapter's backoff (``retry_after`` or
  ``retry.delay(attempt)``, capped) still holding the lease, then releases the copy, which
  comes back first on the next lease (leased alone until it is settled: the copies behind
  it are not handed out with each of its tries, and the hand-outs of copies released
  untried do not count as their tries). Once the copy has had the hub's ``max_attempts``, or
  the adapter's retry budget since its first failure is spent, it is given up instead:
  ``hub.give_up`` with ``"gave up after N attempt(s): <last error>"`` (the sender is
  told; when the last error has ``tell_operator``, the team's ``user`` gets a ``system``
  notice too);
* :class:`~backchannel.delivery.base.PermanentDeliveryError`: ``hub.give_up(reason)``;
  the copy is dead, the sender gets a ``system`` notice, and the next message follows;
* :class:`~backchannel.delivery.base.HeldDelivery` (the agent is not in its pane): the
  copy and the rest of the batch are released at once, neither dead-lettered nor
  counted against the retry budget; the operator is told by a ``system`` notice to the
  team's ``user`` (once per held copy and lease), a WARNING in the hub's log (again every
  :data:`HOLD_REMIND_S` while it lasts) and the worker's status (``held``, with the
  reason); the worker asks ``adapter.ready()`` (every 0.5 s, slowing
  to :data:`HOLD_PAUSE_MAX` s) and leases again once it is ready. A hold costs the
  copy no attempt (its lease is given back untried: nothing was typed or sent). It is
  bounded: the ``user`` is reminded at :data:`HOLD_REMINDERS` of the adapter's
  ``hold_max`` (default 30 minutes), and a copy still held after ``hold_max`` since it
  was first held (a ``held`` event in its history: the count goes on across restarts and
  hubs taking the member over) is given up, no attempt spent (``hub.give_up``: the
  sender told, ``held: <member>'s screen showed <line> for N minutes; nobody answered
  it``, and the ``user`` too);
* anything else: logged with its traceback and treated as transient.

A copy given up after a transient error that says the target cannot be reached
(``AdapterError.unreachable``: a refused connection, a timeout, an attempt cut off) marks
the member's push down (:mod:`.circuit`): what is queued behind it is dead-lettered at
once with a reason naming the target and the way out, the worker leases nothing until a
probe is due (``probe_start_s``, doubling to ``probe_max_s``), then tries the next copy
once. A probe that is answered closes the circuit and the copies go on in order with
their normal tries; one that is not is dead-lettered with what is queued behind it.
The circuit is kept in the store as it changes, so every hub warns and shows it, and a
worker that starts (a takeover) goes on from the stored one: it waits for the stored
probe instead of giving the next copy its full tries.

The session a worker leases with is the adapter's ``session``: an id from the setting
(opened if the hub does not know it; the worker stops when it is terminated), ``"auto"``
(the member's most recently active session that is not terminated, looked up again when
a session ends and at least every 5 s), or none (no gating).

Workers are independent tasks, so one member's slow adapter (a webhook that hangs, an
inbox lock held by another writer) never delays another member's deliveries. A worker's
lease is long enough for one attempt plus the longest backoff, so the hub does not take
a copy back while the worker still works on it. Each adapter bounds its own attempt
(``attempt_timeout``); as a backstop the worker cuts an attempt off
:data:`ATTEMPT_SLACK_S` past it and counts it a transient failure, so an adapter that
overruns can neither hold its member for good nor outlive the lease.

Shutdown (:meth:`Dispatcher.stop`): scanning stops, idle workers are cancelled at once,
workers in the middle of a delivery get ``grace_s`` to finish it, then are cancelled;
every copy a worker still holds is released (it is delivered again later: at least once),
and every adapter is closed. A lease transaction that was running when its worker was
cancelled may still commit: what it leased goes back to the queue as soon as it has
(while this hub still owns the member; a lease for a hub that does not leases nothing).

Many hubs, one store: every hub may run a dispatcher. Each member's push delivery is
owned by one hub at a time through a lease in the store (:mod:`.ownership`); a hub runs
a member's worker only while it holds that lease, renews it every quarter of its
length (beside the listing of teams and members, which may be slow), and another hub
takes it over once it runs out (a hub that stops gracefully gives it up at once).
The hub that takes a member over returns the copies the previous owner still held to
the queue in the same transaction, so they go out again before anything newer, and
the worker's ``receive`` leases, and its records of a push (delivered, acked, dead,
released) take effect, only while its hub holds the member: per-member order is kept
across failover, a copy is pushed twice only if it was never acked, and a hub that
lost the member never dead-letters or acks the copy its new owner is pushing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Self

from backchannel.core.delegation import next_try
from backchannel.core.messages import current_session, derived_id
from backchannel.delivery.adapters import (
    ADAPTERS,
    PULL_TYPES,
    AdapterFactory,
    MisconfiguredAdapter,
    build_adapter,
    delivery_type,
)
from backchannel.delivery.base import (
    AUTO_SESSION,
    Adapter,
    AdapterContext,
    AdapterError,
    HeldDelivery,
    PermanentDeliveryError,
)
from backchannel.delivery.circuit import PROBE_MAX_S, PROBE_START_S, PushCircuit
from backchannel.delivery.ownership import OWNERSHIP_S, Ownership
from backchannel.errors import (
    BackchannelError,
    Forbidden,
    InvalidState,
    StoreError,
    UnknownMember,
    UnknownSession,
    UnknownTeam,
)
from backchannel.hub.outage import Outage
from backchannel.types import InboxMessage, Member, SessionState

if TYPE_CHECKING:
    from backchannel.hub import Hub
    from backchannel.stores.base import Tx

__all__ = ["Dispatcher", "WorkerStatus"]

log = logging.getLogger("backchannel.delivery.dispatcher")

#: Longest pause of a worker whose hub calls fail (the store is down, say).
_MAX_PAUSE = 30.0
#: Longest pause between tries to record a push that happened while the store is away:
#: the worker pushes nothing until it is recorded, so a pause grown through a long
#: outage would hold every later message that long after the store is back. A try
#: while the store is known to be away fails within about a second, so this is cheap.
_RECORD_PAUSE_MAX = 2.0
#: An attempt is cut off this long after its adapter's ``attempt_timeout`` (an adapter
#: bounds its own steps; this is the backstop that keeps an attempt inside its lease).
ATTEMPT_SLACK_S = 1.0


class _Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    HOLD = "hold"
    DEAD = "dead"


#: Longest pause between two ``ready()`` checks while a delivery is held.
HOLD_PAUSE_MAX = 5.0
#: How often the log repeats that a delivery is still held.
HOLD_REMIND_S = 300.0
#: Who is told that a delivery is held: the team's human.
OPERATOR = "user"
#: When, as fractions of a delivery's ``hold_max`` since a copy was first held, the team's
#: human is reminded that it still is (with ``hold_max`` of 30 minutes: after 3¾, 7½ and
#: 15 minutes); at ``hold_max`` the copy is given up.
HOLD_REMINDERS = (0.125, 0.25, 0.5)
#: How many held copies a worker keeps the time of (a copy acked by another route is
#: forgotten once more are held).
_HELD_MAX = 256


def _span(seconds: float) -> str:
    """A hold's length as a person reads it: ``45 s``, ``30 minutes``, ``2.5 hours``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


@dataclass
class WorkerStatus:
    """What one member's worker is doing, for logs, dashboards and tests."""

    team: str
    member: str
    type: str
    target: str = ""
    # starting | waiting | delivering | backoff | held | down | stopped | failed
    state: str = "starting"
    session: str | None = None
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    last_error: str | None = None
    stopped_reason: str | None = None
    circuit: str = "up"  # up | down: see backchannel.delivery.circuit
    updated_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class _Worker:
    """One member's delivery loop (see the module docstring)."""

    def __init__(self, d: Dispatcher, member: Member, snapshot: str) -> None:
        self.d = d
        self.hub = d.hub
        self.team, self.member = member.team, member.name
        self.kind = member.kind.value
        self.setting = dict(member.delivery)
        self.snapshot = snapshot
        self.status = WorkerStatus(self.team, self.member, delivery_type(self.setting))
        self.closing = False
        self.lost = False  # this hub no longer owns the member's push delivery
        # the member's delivery setting is no longer this worker's (changed or removed
        # before the next scan replaces the worker): it stops, and stores nothing more
        self.outdated = False
        self.busy = False
        # a receive failed: what it leased (if it committed) is held by nobody; returned
        # to the queue before the next receive
        self.unsure = False
        self.held: dict[str, None] = {}  # leased ids not yet resolved, in order
        # the held ids whose push was begun under their lease: the others, released when
        # the worker stops, were never tried, and their lease is not counted an attempt
        self.tried: set[str] = set()
        # the store's failures, said once an outage (not once a try)
        self.outage = Outage(log, f"{self.team}/{self.member}: receiving", cap=_MAX_PAUSE)
        self.first_failure: dict[str, float] = {}
        # the copies held (HeldDelivery): since when (time.monotonic()), and how many
        # reminders the team's user has had about each (see _hold)
        self.held_since: dict[str, float] = {}
        self.reminded: dict[str, int] = {}
        # a copy is being retried: lease it alone until it is settled, so the copies
        # behind it are not handed out (and counted) with each of its tries
        self.retrying = False
        # the member's push target is down (see _open_circuit): this hub's record of it,
        # the monotonic time of the next probe, the interval after it, and whether the
        # copies leased now are dead-lettered at once (draining what was queued)
        self.circuit: PushCircuit | None = None
        self.probe_due = 0.0
        self.probe_interval = d.probe_start_s
        self.draining = False
        # a change of the circuit the store did not take yet (its state, or None: closed)
        self.unsaved: list[dict[str, Any] | None] = []
        self.task = asyncio.create_task(self.run(), name=f"bc-deliver-{self.team}-{self.member}")

    @property
    def key(self) -> tuple[str, str]:
        return (self.team, self.member)

    def stopping(self) -> bool:
        return self.closing or self.outdated or self._lost()

    def _lost(self) -> bool:
        """Whether this hub's lease on the member ran out (it stops pushing at once)."""
        if not self.lost and not self.d.ownership.holds(self.key):
            self.lost = True
            self.status.stopped_reason = "push delivery moved to another hub"
            log.warning("%s/%s: this hub's lease on its push delivery ran out; stopping",
                        self.team, self.member)  # fmt: skip
        return self.lost

    def _state(self, state: str, error: str | None = None) -> None:
        self.status.state = state
        self.status.updated_at = time.time()
        if error is not None:
            self.status.last_error = error

    # -- lifecycle ---------------------------------------------------------------------
    async def run(self) -> None:
        ctx = AdapterContext(self.hub, self.team, self.member, self.setting, kind=self.kind)
        adapter = build_adapter(ctx, adapters=self.d.adapters)
        try:
            adapter = await self._start(adapter, ctx)
            self.status.target = adapter.describe()
            await self._adopt_circuit(adapter)
            await self._loop(adapter)
        finally:
            if self.circuit is not None:  # this worker no longer pushes: it knows no state
                self.hub.push_circuits.close(self.team, self.member, self.circuit)
            tried = [mid for mid in self.held if mid in self.tried]
            await self._release(tried)
            await self._release(list(self.held), untried=True)
            try:
                await adapter.close()
            except Exception:
                log.exception("closing %s failed", adapter.describe())
            if self.status.state != "failed":
                self._state("stopped")

    async def _start(self, adapter: Adapter, ctx: AdapterContext) -> Adapter:
        pause = 0.5
        while True:
            try:
                await adapter.start()
                break
            except PermanentDeliveryError as exc:
                log.error("%s/%s: %s", self.team, self.member, exc.message)
                await adapter.close()
                adapter = MisconfiguredAdapter(ctx, exc.message)
                break
            except Exception as exc:
                self._state("backoff", f"start failed: {exc}")
                log.warning("%s/%s: starting %s failed (%s); retrying in %.1f s",
                            self.team, self.member, adapter.describe(), exc, pause)  # fmt: skip
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)
        if adapter.session is None and isinstance(s := self.setting.get("session"), str):
            adapter.session = s  # a misconfigured adapter still leases what it must refuse
        self.status.session = adapter.session
        return adapter

    async def stop(self, grace: float) -> None:
        """Finish the delivery under way (up to ``grace`` seconds), then end."""
        self.closing = True
        if self.task.done():
            return
        if not self.busy:
            self.task.cancel()
        done, _ = await asyncio.wait({self.task}, timeout=grace)
        if not done:
            self.task.cancel()
            await asyncio.wait({self.task})

    # -- the loop ----------------------------------------------------------------------
    async def _loop(self, adapter: Adapter) -> None:
        hub = self.hub
        lease = max(hub.config.lease_seconds, adapter.attempt_timeout + adapter.retry.cap + 5.0)
        follow = adapter.session == AUTO_SESSION
        # following: look again for the member's live session at least this often
        wait = min(self.d.wait_s, 5.0) if follow else self.d.wait_s
        while not self.stopping():
            session = await self._live_session() if follow else adapter.session
            self.status.session = session
            one_per_turn = adapter.starts_turn and session is not None
            if self.unsure and not await self._requeue_unsure():
                await self._pause(self.outage.pause)
                continue
            if self.unsaved:
                await self._save_circuit(self.unsaved.pop())
            if self.circuit is not None and not self.draining and not await self._await_probe():
                continue  # the probe is not due yet, or the worker stops
            self._state("down" if self.circuit is not None else "waiting")
            try:
                got = await hub.receive(
                    self.team,
                    self.member,
                    session=session,
                    limit=1 if one_per_turn or self.retrying else self.d.batch,
                    wait=0.0 if self.draining else wait,
                    lease_seconds=lease,
                    owner=self.d.ownership.owner,
                )
            except (InvalidState, UnknownSession) as exc:
                if follow:
                    continue  # that session just ended: follow the next one
                if isinstance(exc, UnknownSession) and session is not None:
                    if not await self._open_session(session):
                        return
                    continue
                self.status.stopped_reason = exc.message  # the session was terminated
                log.warning("%s/%s: stopped delivering: %s", self.team, self.member, exc.message)
                return
            except (UnknownMember, UnknownTeam) as exc:
                self.status.stopped_reason = exc.message
                return
            except Exception as exc:
                self.unsure = True  # it may have leased copies (a commit whose answer was lost)
                self._state("backoff", f"receive failed: {exc}")
                await self._pause(self.outage.failed(exc))
                continue
            self.outage.ok()
            if self.draining and not got:
                self.draining = False  # what was queued when the target went down is told
                if self.circuit is not None:
                    await self._save_circuit(self.circuit.to_state())  # its dead letters
                continue
            self.held.update(dict.fromkeys(g.message.message_id for g in got))
            if follow and got and await self._live_session() != session:
                await self._release(list(self.held))  # a session began or ended meanwhile
                continue
            turn_before = await self._turn(session) if session and one_per_turn and got else None
            for i, item in enumerate(got):
                if self.stopping():
                    return  # the rest is released on the way out
                if not await self._handle(adapter, item, got[i + 1 :]):
                    break
            if session is not None and turn_before is not None and adapter.turn_wait > 0:
                await self._await_turn(session, turn_before, adapter.turn_wait)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` after a failed store call, or less if the dispatcher sees the
        store back first: a pause grown through a long outage (up to 30 s) would
        otherwise hold the member's messages that long after the store is back."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.d._store_back.wait(), seconds)

    async def _requeue_unsure(self) -> bool:
        """After a failed receive: return the member's leased copies to the queue (this
        worker holds none of them now), so a lease that committed although its answer
        was lost does not let later messages overtake its copies. False: try again."""
        try:
            n = await self.d.ownership.requeue(self.key, "a lease's outcome was not known")
        except Exception as exc:
            self._state("backoff", f"returning leased copies failed: {exc}")
            self.outage.failed(exc)  # said once an outage, with the receive's failures
            return False
        self.unsure = False
        if n:
            log.warning("%s/%s: %d copies leased by a receive that failed are back in the "
                        "queue", self.team, self.member, n)  # fmt: skip
        return True

    async def _handle(self, adapter: Adapter, item: InboxMessage, rest: list[InboxMessage]) -> bool:
        """Deliver one copy and record the result. False: it is being retried, so the
        rest of the batch was released and the loop must lease again."""
        mid = item.message.message_id
        self.busy = True  # through the recording: stop() lets this finish
        try:
            if self.circuit is not None and self.draining:
                await self._record_outcome(adapter, mid, _Outcome.DEAD, self._down_reason())
                self.circuit.dead_lettered += 1
                return True
            outcome, detail, error = await self._attempt(adapter, item)
            if self.circuit is not None:  # this attempt was the probe
                if outcome is _Outcome.RETRY and error is not None and error.unreachable:
                    await self._probe_failed(detail)
                    if self.outdated:
                        # about a target the member no longer has: the copy is its next
                        # worker's (or puller's) to deliver, not this one's to give up
                        await self._release([mid])
                        return True
                    await self._record_outcome(adapter, mid, _Outcome.DEAD, self._down_reason())
                    self.circuit.dead_lettered += 1
                    return True
                await self._close_circuit(adapter)  # answered: the target is back
            if outcome is _Outcome.HOLD:
                since = await self._held_since(mid, detail)
                while len(self.held_since) > _HELD_MAX:  # copies acked by another route
                    gone = next(iter(self.held_since))
                    self.held_since.pop(gone)
                    self.reminded.pop(gone, None)
                if (held := time.monotonic() - since) >= adapter.hold_max:
                    # held past its bound: given up, so its sender hears of it, rather
                    # than waiting unseen behind a dialog nobody answers
                    shows = error.shows if isinstance(error, HeldDelivery) else None
                    outcome, detail = _Outcome.DEAD, self._held_too_long(detail, shows, held)
                    release = [m.message.message_id for m in rest]
                    await self._release(release, untried=True)
                    # nothing was typed or sent: the lease it is given up from is no
                    # attempt (as the holds before it were not)
                    recorded = await self._record_outcome(
                        adapter, mid, outcome, detail, untried=True
                    )
                    if recorded:
                        await self._tell_operator_given_up(item, detail)
                    return True
                # held before anything was typed or sent (see HeldDelivery): no attempt
                await self._release([mid, *(m.message.message_id for m in rest)], untried=True)
                self.busy = False
                await self._tell_operator(item, detail)
                await self._hold(adapter, detail, item)
                return False
            if outcome is _Outcome.RETRY:
                delay = self._retry_delay(adapter, item, error.retry_after if error else None)
                if delay is None:
                    outcome = _Outcome.DEAD
                    detail = f"gave up after {self._tries(item)} attempt(s): {detail}"
                else:
                    self.status.retried += 1
                    self._state("backoff", detail)
                    log.info("%s/%s: %s failed (attempt %d): %s; retrying in %.2f s",
                             self.team, self.member, mid, self._tries(item), detail,
                             delay)  # fmt: skip
                    self.retrying = True
                    # behind the one retried, never tried: their lease is no attempt
                    await self._release([m.message.message_id for m in rest], untried=True)
                    self.busy = False
                    if not self.closing:
                        await asyncio.sleep(delay)
                    await self._release([mid])
                    return False
            if outcome is _Outcome.DEAD and error is not None and error.unreachable:
                # stored before the copy is given up: a hub that dies between the two
                # leaves its successor the circuit (which probes with this copy again),
                # not a dead copy and a closed circuit that gives each copy queued
                # behind it its whole tries again
                await self._open_circuit(adapter, detail)
            recorded = await self._record_outcome(adapter, mid, outcome, detail)
            if recorded and outcome is _Outcome.DEAD and error is not None and error.tell_operator:
                await self._tell_operator_given_up(item, detail)
            return True
        finally:
            self.busy = False

    # -- the circuit (backchannel.delivery.circuit) ------------------------------------
    async def _adopt_circuit(self, adapter: Adapter) -> None:
        """Start from the member's stored circuit (:mod:`.circuit`): a hub that takes the
        member over, or a worker started again, keeps probing a target another worker
        found down, at the stored time and interval, instead of giving the next queued
        message its full tries. A circuit stored for another target is dropped."""
        try:
            state = await self.hub.store.read(lambda tx: tx.push_circuit(*self.key))
        except Exception as exc:
            # the store away is told once by the worker's own receive (its outage line);
            # a second line of the same outage here would be one line per try again
            log.log(
                logging.DEBUG if isinstance(exc, StoreError) else logging.WARNING,
                "%s/%s: could not read its stored push circuit (%s); starting as if the "
                "target were up",
                self.team,
                self.member,
                exc,
            )
            return
        if state is None:
            return
        c = PushCircuit.from_state(self.team, self.member, state)
        if c.target != adapter.describe():
            await self._save_circuit(None)  # about a target this member no longer has
            return
        self.probe_interval = min(max(c.probe_interval, self.d.probe_start_s), self.d.probe_max_s)
        wait = min(max(0.0, c.next_probe_at - self.hub.clock.now()), self.probe_interval)
        self.probe_due = time.monotonic() + wait
        c.probe_interval = self.probe_interval
        self.circuit = c
        self.hub.push_circuits.open(c)
        self.status.circuit = "down"
        self._state("down", c.reason)
        log.warning("%s/%s: push to %s is down since %s (%s), as stored; the next message "
                    "is tried once, as a probe, in %.3g s", self.team, self.member, c.target,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.down_since)), c.reason,
                    wait)  # fmt: skip

    async def _save_circuit(self, state: dict[str, Any] | None) -> None:
        """Store the member's circuit (``None``: forget it) while this hub owns the
        member's push delivery and the member's delivery setting is still this worker's,
        both checked in the writing transaction: a hub that lost the member never
        overwrites what its new owner stored, and a worker whose member's setting changed
        (which forgot the circuit) before the next scan replaced it never stores the old
        target's circuit again, where no worker would ever close it. Such a worker stops
        (:attr:`outdated`). A write that fails is made again before the next lease (the
        circuit keeps working in this worker meanwhile; other hubs see the change once
        it is stored)."""
        team, member = self.team, self.member
        owner, snapshot = self.d.ownership.owner, self.snapshot

        def fn(tx: Tx) -> bool:
            row = tx.dispatch_owner(team, member)
            if row is None or row[0] != owner:
                return True  # the member's new owner keeps its circuit
            m = tx.get_member(team, member)
            if m is None or _snapshot(m.delivery) != snapshot:
                return False
            tx.set_push_circuit(team, member, state)
            return True

        try:
            current = await self.hub.store.transact(fn)
        except Exception as exc:
            self.unsaved = [state]
            log.warning("%s/%s: could not store its push circuit (%s); trying again before "
                        "the next lease", team, member, exc)  # fmt: skip
            return
        self.unsaved = []
        if not current and not self.outdated:
            self.outdated = True
            self.status.stopped_reason = "the member's delivery setting changed"
            log.warning("%s/%s: its delivery setting changed; this worker for %s stops and "
                        "stores no push circuit for it", team, member,
                        self.status.target)  # fmt: skip

    async def _open_circuit(self, adapter: Adapter, detail: str) -> None:
        """A copy was given up after its whole tries because the target could not be
        reached: mark the member's push down, dead-letter what is queued behind it at
        once (not each after its own tries), and probe with the next message later."""
        now = self.hub.clock.now()
        self.probe_interval = self.d.probe_start_s
        self.probe_due = time.monotonic() + self.probe_interval
        self.circuit = PushCircuit(
            self.team, self.member, adapter.describe(), detail, down_since=now,
            next_probe_at=now + self.probe_interval, probe_interval=self.probe_interval,
        )  # fmt: skip
        self.hub.push_circuits.open(self.circuit)
        await self._save_circuit(self.circuit.to_state())
        self.draining = True
        self.status.circuit = "down"
        self._state("down", detail)
        log.warning("%s/%s: push to %s is down (%s): the messages queued for it are "
                    "dead-lettered now, and the next one is tried in %g s",
                    self.team, self.member, adapter.describe(), detail,
                    self.probe_interval)  # fmt: skip

    async def _probe_failed(self, detail: str) -> None:
        """The probe could not reach the target either: dead-letter it and what is
        queued behind it, and probe again after twice as long (up to the cap)."""
        assert self.circuit is not None
        self.probe_interval = min(self.probe_interval * 2, self.d.probe_max_s)
        self.probe_due = time.monotonic() + self.probe_interval
        self.circuit.reason = detail
        self.circuit.probes += 1
        self.circuit.next_probe_at = self.hub.clock.now() + self.probe_interval
        self.circuit.probe_interval = self.probe_interval
        await self._save_circuit(self.circuit.to_state())
        self.draining = True
        self._state("down", detail)
        log.warning("%s/%s: push to %s is still down (%s); next probe in %g s", self.team,
                    self.member, self.circuit.target, detail, self.probe_interval)  # fmt: skip

    async def _close_circuit(self, adapter: Adapter) -> None:
        assert self.circuit is not None
        log.warning("%s/%s: push to %s answered a probe; delivering again (%d message(s) "
                    "were dead-lettered while it was down)", self.team, self.member,
                    adapter.describe(), self.circuit.dead_lettered)  # fmt: skip
        self.hub.push_circuits.close(self.team, self.member, self.circuit)
        self.circuit = None
        await self._save_circuit(None)
        self.status.circuit = "up"
        self.draining = False

    def _down_reason(self) -> str:
        """A dead letter's reason while the target is down: the target, why, since when,
        and the way out."""
        c = self.circuit
        assert c is not None
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.down_since))
        return (
            f"push delivery to {self.member!r} is down: {c.target} could not be reached "
            f"since {since} ({c.reason}); not tried on its own. Send it again once the "
            f"target is back (backchannel member list {self.team} shows 'push down' until "
            "a probe gets through), or change the member's delivery setting"
        )

    async def _await_probe(self) -> bool:
        """Wait, leasing nothing, until the next probe is due. False: the worker is
        stopping (or the wait was cut short) and the loop must look again."""
        delay = self.probe_due - time.monotonic()
        if delay > 0:
            self._state("down")
            await asyncio.sleep(min(delay, self.d.wait_s))
        return not self.stopping() and time.monotonic() >= self.probe_due

    async def _tell_operator(self, item: InboxMessage, reason: str) -> None:
        """A ``system`` notice to the team's human (``user``), once per held copy and
        lease, so the operator learns that an agent is not in its pane. Never about the
        operator's own deliveries (a notice held for them would beget another)."""
        if self.member == OPERATOR:
            return
        m = item.message
        text = (
            f"A message from {m.sender} to {self.member} is held, not delivered: {reason}. "
            "It waits in the queue and is delivered once the agent is back."
        )
        await self._hold_notice(item, reason, text, f"{item.attempt}", "held", "notice")

    async def _hold_notice(
        self, item: InboxMessage, reason: str, text: str, key: str, what: str, kind: str
    ) -> None:
        """Send the team's human ``text`` about the held copy ``item`` (once per ``key``:
        its id is derived from it); a failure is logged, never raised."""
        m = item.message
        try:
            await self.hub.notice(
                self.team,
                OPERATOR,
                text,
                message_id=derived_id(f"held-{m.message_id}-{self.member}-{key}"),
                summary=f"delivery to {self.member} {what}",
                meta={"held_message_id": m.message_id, "member": self.member, "reason": reason},
            )
        except Exception as exc:  # the log line in _hold still tells
            log.warning("%s/%s: could not send the hold %s (%s)",
                        self.team, self.member, kind, exc)  # fmt: skip

    def _held_too_long(self, detail: str, shows: str | None, held: float) -> str:
        """The reason a copy held past ``hold_max`` is given up with."""
        span = _span(held)
        if shows:
            return (
                f"held: {self.member}'s screen showed {shows!r} for {span}; nobody answered "
                "it, and the message was never typed in. Send it again once the agent is "
                f"back at its prompt (the hold: {detail})"
            )
        return (
            f"held for {span} and never delivered: {detail}. Send it again once the "
            "agent can take it"
        )

    async def _remind_operator(
        self, item: InboxMessage, reason: str, held: float, hold_max: float
    ) -> None:
        """Remind the team's human that a copy is still held, and when it is given up."""
        if self.member == OPERATOR:
            return
        m, n = item.message, self.reminded.get(item.message.message_id, 0)
        text = (
            f"A message from {m.sender} to {self.member} is still held, not delivered, "
            f"after {_span(held)}: {reason}. It is given up (dead-lettered, its sender "
            f"told) if it is still held in {_span(max(0.0, hold_max - held))}."
        )
        await self._hold_notice(item, reason, text, f"reminder-{n}", "still held", "reminder")

    async def _tell_operator_given_up(self, item: InboxMessage, reason: str) -> None:
        """A ``system`` notice to the team's human that a copy is given up with part of
        it left where only a person can finish or undo it (``AdapterError.tell_operator``:
        a text typed into a prompt, not submitted). Not when the human is the sender (the
        dead-letter notice tells them) or the recipient."""
        m = item.message
        if OPERATOR in (self.member, m.sender):
            return
        text = f"A message from {m.sender} to {self.member} was given up: {reason}."
        try:
            await self.hub.notice(
                self.team,
                OPERATOR,
                text,
                message_id=derived_id(f"given-up-{m.message_id}-{self.member}"),
                summary=f"delivery to {self.member} given up",
                meta={"dead_message_id": m.message_id, "member": self.member, "reason": reason},
            )
        except Exception as exc:  # the dead letter and the log still tell
            log.warning("%s/%s: could not send the give-up notice (%s)",
                        self.team, self.member, exc)  # fmt: skip

    async def _hold(self, adapter: Adapter, reason: str, item: InboxMessage) -> None:
        """Wait, leasing nothing, until the adapter is ready again (or the worker stops),
        or until the held copy reaches its ``hold_max`` (it is leased again, and given up
        if still held). The team's human is reminded at :data:`HOLD_REMINDERS` of the
        way there (an eighth, a quarter, a half: growing intervals, three at most)."""
        self._state("held", reason)
        log.warning("%s/%s: holding deliveries to %s: %s", self.team, self.member,
                    adapter.describe(), reason)  # fmt: skip
        mid = item.message.message_id
        since = self.held_since.get(mid, time.monotonic())
        pause, reminded = 0.5, time.monotonic()
        while not self.closing:
            now = time.monotonic()
            n = self.reminded.get(mid, 0)
            due = [since + adapter.hold_max * f for f in HOLD_REMINDERS[n:]]
            until = min([*due, since + adapter.hold_max])
            await asyncio.sleep(max(0.0, min(pause, until - now)))
            pause = min(pause * 2, HOLD_PAUSE_MAX)
            now = time.monotonic()
            if now - since >= adapter.hold_max:
                return  # leased again: given up if it is still held
            if due and now >= due[0]:
                self.reminded[mid] = n + 1
                await self._remind_operator(item, reason, now - since, adapter.hold_max)
            try:
                why = await adapter.ready()
            except Exception as exc:  # ready() must not raise; never let it end the worker
                why = f"{type(exc).__name__}: {exc}"
            if why is None:
                log.warning("%s/%s: %s is ready again; delivering", self.team, self.member,
                            adapter.describe())  # fmt: skip
                return
            if time.monotonic() - reminded >= HOLD_REMIND_S:
                reminded = time.monotonic()
                log.warning("%s/%s: still holding deliveries: %s", self.team, self.member, why)
            self._state("held", why)
            reason = why

    async def _held_since(self, mid: str, detail: str) -> float:
        """When (``time.monotonic``) the copy ``mid`` was first held: by this worker, or
        earlier as the store recorded it (``hub.first_held``: a hub restarted, or another
        that pushed to this member before, held it first), whichever is earlier; the
        hold's bound counts from there. The store away, this worker's own count."""
        now = time.monotonic()
        since = self.held_since.setdefault(mid, now)
        try:
            first = await self.hub.first_held(
                self.team, self.member, mid, detail, owner=self.d.ownership.owner
            )
        except Exception as exc:
            log.warning("%s/%s: could not read or record when %s was first held (%s); "
                        "counting its hold from this worker's", self.team, self.member, mid,
                        exc)  # fmt: skip
            return since
        if first is not None:
            since = min(since, now - max(0.0, self.hub.clock.now() - first))
            self.held_since[mid] = since
        return since

    async def _record_outcome(
        self, adapter: Adapter, mid: str, outcome: _Outcome, detail: str, untried: bool = False
    ) -> bool:
        """Record the push's outcome; whether it took effect. Every record names this
        hub (``owner``) and takes effect only while the store names it the member's
        owner: a hub paused mid-push while another took the member over must not mark
        delivered, ack or dead-letter the copy the new owner now holds."""
        self.first_failure.pop(mid, None)
        self.held_since.pop(mid, None)
        self.reminded.pop(mid, None)
        self.retrying = False
        owner = self.d.ownership.owner
        team, member = self.team, self.member
        if outcome is _Outcome.DEAD:
            self.status.dead += 1
            self._state("delivering", detail)
            log.warning("%s/%s: dead-lettering %s: %s", team, member, mid, detail)
            done = await self._record(
                lambda: self.hub.give_up(team, member, mid, detail, owner=owner, untried=untried),
                mid,
            )
            if done is False:
                log.warning("%s/%s: %s was no longer leased by this hub when given up; it "
                            "is not dead-lettered", team, member, mid)  # fmt: skip
        else:
            self.status.delivered += 1
            # delivered and acked in one transaction: a team's writers take turns on the
            # store, so a second commit a push halved the team's push rate
            ack = adapter.ack_on_delivery
            done = await self._record(
                lambda: self.hub.mark_delivered(team, member, mid, detail, owner=owner, ack=ack),
                mid,
            )
            if done is False:
                log.warning("%s/%s: %s was no longer leased by this hub when delivered; it "
                            "may be delivered again", team, member, mid)  # fmt: skip
        self.held.pop(mid, None)
        self.tried.discard(mid)
        return bool(done)

    async def _attempt(
        self, adapter: Adapter, item: InboxMessage
    ) -> tuple[_Outcome, str, AdapterError | None]:
        """The outcome, its detail, and the transient error (for its ``retry_after`` and
        ``tell_operator``)."""
        self._state("delivering")
        self.tried.add(item.message.message_id)
        limit = adapter.attempt_timeout + ATTEMPT_SLACK_S
        try:
            # the lease covers one attempt of attempt_timeout: an adapter that overruns
            # it would hold the member for good, or outlive the lease and push a copy
            # the hub has handed out again
            async with asyncio.timeout(limit):
                detail = await adapter.deliver(item)
        except TimeoutError:
            log.warning("%s/%s: %s did not finish delivering %s within %g s; cut off",
                        self.team, self.member,
                        adapter.describe(), item.message.message_id, limit)  # fmt: skip
            said = (
                f"{adapter.describe()} did not finish within {limit:g} s (its "
                f"attempt_timeout, {adapter.attempt_timeout:g} s, and "
                f"{ATTEMPT_SLACK_S:g} s more); the attempt was cut off"
            )
            return _Outcome.RETRY, said, AdapterError(said, unreachable=True)
        except PermanentDeliveryError as exc:
            return _Outcome.DEAD, exc.message, None
        except HeldDelivery as exc:
            return _Outcome.HOLD, exc.message, exc
        except AdapterError as exc:
            return _Outcome.RETRY, exc.message, exc
        except Exception as exc:
            log.exception("%s failed on %s", adapter.describe(), item.message.message_id)
            return _Outcome.RETRY, f"{type(exc).__name__}: {exc}", None
        return _Outcome.DELIVERED, detail, None

    def _retry_delay(
        self, adapter: Adapter, item: InboxMessage, retry_after: float | None
    ) -> float | None:
        """The wait before the next attempt, or None when the copy must be given up."""
        tries = self._tries(item)
        if tries >= self.hub.config.max_attempts:
            return None
        now = time.monotonic()
        first = self.first_failure.setdefault(item.message.message_id, now)
        policy = adapter.retry
        at = next_try(policy, tries, first, now)
        if at is None:
            return None
        delay = at - now if retry_after is None else min(retry_after, policy.cap)
        return max(0.0, delay)

    def _tries(self, item: InboxMessage) -> int:
        """How often ``item`` was tried: the hub's hand-outs (a lease a worker gave back
        untried, behind a copy being retried or as its hub stopped, is not one: the
        store takes it back, so the count holds across restarts and failovers)."""
        return max(1, item.attempt)

    async def _record(self, call: Callable[[], Awaitable[Any]], mid: str) -> Any:
        """Make a hub call that records an outcome. The push it records has happened, so
        while the store cannot be reached (``StoreError``) the call is made again, with
        backoff, and nothing else is pushed meanwhile: a copy left leased would come
        back when its lease ran out and be pushed a second time, after the messages
        sent later. Only a worker that is stopping gives up (the copy is then delivered
        again); any other failure is logged and the copy comes back the same way."""
        pause, tries = 0.5, 0
        while True:
            try:
                done = await call()
            except StoreError as exc:
                if self.closing:
                    log.error("%s/%s: could not record the outcome of %s before stopping "
                              "(%s); it will be delivered again", self.team, self.member,
                              mid, exc)  # fmt: skip
                    return None
                tries += 1
                self._state("backoff", f"recording {mid} failed: {exc}")
                # said once an outage (then quietly): the tries are a couple of seconds apart
                log.log(logging.WARNING if tries == 1 else logging.DEBUG,
                        "%s/%s: could not record the outcome of %s (%s); trying again every "
                        "%.0f s at most until it is recorded", self.team, self.member, mid,
                        exc, _RECORD_PAUSE_MAX)  # fmt: skip
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RECORD_PAUSE_MAX)
                continue
            except Exception as exc:
                log.error("%s/%s: could not record the outcome of %s (%s); it will be "
                          "delivered again", self.team, self.member, mid, exc)  # fmt: skip
                return None
            if tries:
                log.warning("%s/%s: recorded the outcome of %s after %d failed tries",
                            self.team, self.member, mid, tries)  # fmt: skip
            return done

    async def _release(self, ids: list[str], untried: bool = False) -> None:
        for mid in ids:
            self.held.pop(mid, None)
            self.tried.discard(mid)
        if not ids or self._lost():
            return  # the next owner returns them to the queue when it takes over
        try:
            await self.hub.release(
                self.team, self.member, ids, owner=self.d.ownership.owner, untried=untried
            )
        except Exception as exc:
            log.warning("%s/%s: could not release %s (%s); they return when their lease "
                        "ends", self.team, self.member, ids, exc)  # fmt: skip

    # -- sessions ------------------------------------------------------------------------
    async def _live_session(self) -> str | None:
        """``"session": "auto"``: the member's session that runs now (the one its runtime
        reports turns for; a running one before one its process left,
        :func:`current_session`), or None."""
        try:
            # its live sessions only, from their index: a member that opened thousands
            # of sessions (each /clear opens one) costs a push what one with two does
            live = await self.hub.list_sessions(self.team, self.member, which="live")
        except BackchannelError:
            return None
        found = current_session(live)
        return found.session_id if found is not None else None

    async def _open_session(self, session: str) -> bool:
        """The setting names a session the hub does not know yet: open it."""
        try:
            await self.hub.open_session(self.team, self.member, session)
            return True
        except (Forbidden, InvalidState, UnknownMember) as exc:
            self.status.stopped_reason = exc.message
            self._state("failed", exc.message)
            log.error("%s/%s: cannot use session %r: %s",
                      self.team, self.member, session, exc.message)  # fmt: skip
            return False
        except BackchannelError as exc:
            log.warning("%s/%s: cannot open session %r yet: %s",
                        self.team, self.member, session, exc.message)  # fmt: skip
            await asyncio.sleep(1.0)
            return True

    async def _turn(self, session: str) -> int | None:
        try:
            return (await self.hub.get_session(self.team, session)).turn
        except BackchannelError:
            return None

    async def _await_turn(self, session: str, before: int, turn_wait: float) -> None:
        """After typing a message in, wait (at most ``turn_wait``) for the turn it starts
        to be reported, so the next message is not typed into that turn."""
        self._state("waiting")
        deadline = time.monotonic() + turn_wait
        step = 0.02
        while time.monotonic() < deadline and not self.closing:
            try:
                s = await self.hub.get_session(self.team, session)
            except BackchannelError:
                return
            if s.turn > before or s.state is not SessionState.IDLE:
                return
            await asyncio.sleep(min(step, max(0.0, deadline - time.monotonic())))
            step = min(step * 2, 0.25)


class Dispatcher:
    """Pushes messages to every member whose ``delivery`` names a push adapter.

    ``rescan_s``: how often teams are listed for new or changed members; ``wait_s``: the
    longest single ``receive`` wait; ``batch``: copies leased at once (1 for adapters that
    start a turn and have a session); ``grace_s``: how long :meth:`stop` lets a delivery
    under way finish; ``adapters``: ``delivery.type`` -> factory; ``teams``: serve only
    these teams (default all); ``owner``: this hub's name in the store's push-delivery
    leases (default: host, process id and a random part); ``ownership_s``: how long such a
    lease lasts (a crashed hub's members move to another hub within about this long; it
    is renewed at least every quarter of it); ``probe_start_s`` and ``probe_max_s``: the
    first and the longest interval between probes of a push target that is down
    (:mod:`.circuit`).
    """

    def __init__(
        self,
        hub: Hub,
        *,
        rescan_s: float = 2.0,
        wait_s: float = 30.0,
        batch: int = 16,
        grace_s: float = 5.0,
        adapters: Mapping[str, AdapterFactory] = ADAPTERS,
        teams: Collection[str] | None = None,
        owner: str | None = None,
        ownership_s: float = OWNERSHIP_S,
        probe_start_s: float = PROBE_START_S,
        probe_max_s: float = PROBE_MAX_S,
    ) -> None:
        if rescan_s <= 0 or wait_s <= 0 or batch < 1 or grace_s < 0:
            raise ValueError("rescan_s and wait_s must be positive, batch at least 1")
        if not 0 < probe_start_s <= probe_max_s:
            raise ValueError("probe_start_s must be positive and at most probe_max_s")
        self.probe_start_s, self.probe_max_s = probe_start_s, probe_max_s
        self.ownership = Ownership(hub, owner=owner, lease_s=ownership_s)
        # renew the leases often enough that one slow renewal is harmless; the listing
        # of teams and members runs beside the renewals, never between two of them
        self._tick = ownership_s / 4
        self.hub = hub
        self.rescan_s, self.wait_s, self.batch, self.grace_s = rescan_s, wait_s, batch, grace_s
        self.adapters = adapters
        self.teams = frozenset(teams) if teams is not None else None
        self._workers: dict[tuple[str, str], _Worker] = {}
        # workers being stopped in the background (see _retire), by member
        self._retiring: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._warned: set[tuple[str, str, str]] = set()
        self._scan_task: asyncio.Task[None] | None = None
        self._renew_task: asyncio.Task[None] | None = None
        # the push members found by the last listing, renewed between listings
        self._wanted: dict[tuple[str, str], tuple[Member, str]] | None = None
        self._poke = asyncio.Event()
        self._scan_lock = asyncio.Lock()
        self._outage = Outage(log, "scanning teams for push members")
        # set (and replaced) when the scan or a renewal works again after failing: the
        # workers pausing after their own failed store calls try again at once
        self._store_back = asyncio.Event()
        self._closed = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Scan once (so members that exist are served when this returns), then keep
        scanning in the background. The hub must be started."""
        if self._scan_task is not None:
            return
        self._closed = False
        await self.rescan()
        self._scan_task = asyncio.create_task(self._scan_loop(), name="bc-dispatcher-scan")
        self._renew_task = asyncio.create_task(self._renew_loop(), name="bc-dispatcher-renew")

    async def stop(self) -> None:
        """Stop scanning, let deliveries under way finish (``grace_s``), release what the
        workers hold and close the adapters. Idempotent."""
        self._closed = True
        loops = {t for t in (self._scan_task, self._renew_task) if t is not None}
        for t in loops:
            t.cancel()
        if loops:
            await asyncio.wait(loops)
        self._scan_task = self._renew_task = None
        async with self._scan_lock:
            workers = list(self._workers.values())
            self._workers.clear()
        if workers:
            await asyncio.gather(*(w.stop(self.grace_s) for w in workers))
        if self._retiring:
            await asyncio.wait(set(self._retiring.values()))
        await self.ownership.release()
        from backchannel.delivery.inbox_file import release_presence

        # this hub's inbox-file claims: another store's hub may take them over now
        release_presence(self.hub.store)

    def poke(self) -> None:
        """Scan now instead of at the next ``rescan_s`` tick (after adding a member)."""
        self._poke.set()

    def status(self) -> list[WorkerStatus]:
        """One entry per member served (or stopped), sorted by team and member."""
        return [self._workers[k].status for k in sorted(self._workers)]

    async def _scan_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.rescan_s)
            self._poke.clear()
            try:
                await self.rescan()
            except Exception as exc:
                # said once an outage; tried again at the next rescan or sooner on a poke
                self._outage.failed(exc)
            else:
                self._store_ok()

    async def _renew_loop(self) -> None:
        """Renew this hub's leases every quarter of their length, whatever a listing of
        teams and members costs meanwhile (on a loaded store it takes seconds, and a
        renewal that waited for it came after the push window had closed)."""
        while True:
            await asyncio.sleep(self._tick)
            try:
                await self.renew()
            except Exception as exc:
                self._outage.failed(exc)  # the same store, the same outage as the scan's
            else:
                self._store_ok()

    def _store_ok(self) -> None:
        if self._outage.down:
            back, self._store_back = self._store_back, asyncio.Event()
            back.set()
        self._outage.ok()

    async def rescan(self) -> None:
        """List teams and members now; claim or renew this hub's lease on each push
        member's delivery; start, replace or stop workers to match."""
        # listed outside the lock: renewals go on while the listing is slow
        wanted: dict[tuple[str, str], tuple[Member, str]] = {}
        for team in await self.hub.list_teams():
            if self.teams is not None and team.name not in self.teams:
                continue
            try:
                members = await self.hub.list_members(team.name)
            except UnknownTeam:
                continue
            for m in members:
                kind = delivery_type(m.delivery)
                if kind in PULL_TYPES:
                    continue
                if kind not in self.adapters:
                    self._warn_unknown(m, kind)
                    continue
                snapshot = _snapshot(m.delivery)
                wanted[(m.team, m.name)] = (m, snapshot)
        async with self._scan_lock:
            if self._closed:
                return
            self._wanted = wanted
            await self._reconcile(wanted)

    async def renew(self) -> None:
        """Renew the leases on the members the last listing found (claiming those this
        hub does not hold yet), and start, replace or stop workers to match."""
        async with self._scan_lock:
            if self._closed or self._wanted is None:
                return
            await self._reconcile(self._wanted)

    async def _reconcile(self, wanted: dict[tuple[str, str], tuple[Member, str]]) -> None:
        """Claim or renew the lease on every member in ``wanted``, give up the rest,
        and start, replace or stop workers to match (under the scan lock)."""
        for key, w in list(self._workers.items()):
            want = wanted.get(key)
            crashed = w.task.done() and not w.task.cancelled() and w.task.exception()
            if want is None or want[1] != w.snapshot or crashed or w.lost:
                del self._workers[key]
                self._retire(w)
        # a retiring worker may still push (its grace): its member counts as running,
        # so the claim leaves its copies leased to it, and gets no new worker before
        # a scan that finds the old one gone (that scan's claim puts back what it held)
        retiring = set(self._retiring)
        held = await self.ownership.claim(
            wanted, running={*self._workers, *retiring}, drop=self.ownership.held()
        )
        lost = [w for key, w in self._workers.items() if key not in held]
        for w in lost:
            w.lost = True  # another hub owns it: release nothing on the way out
            w.status.stopped_reason = "push delivery moved to another hub"
            del self._workers[w.key]
            self._retire(w)  # in the background: the renewals of the others go on
        for key, (member, snapshot) in wanted.items():
            if key in held and key not in self._workers and key not in retiring:
                w = _Worker(self, member, snapshot)
                w.task.add_done_callback(_log_crash)
                self._workers[key] = w
                log.info("delivering to %s/%s by %s", key[0], key[1], w.status.type)

    def _retire(self, w: _Worker) -> None:
        """Stop ``w`` (its member's setting changed, or it went) in the background: its
        delivery under way gets ``grace_s``, and the scan, which renews every member's
        lease, must not wait that long. Its member gets a new worker at the first scan
        after it has stopped, never two at once."""
        if w.task.done():
            return  # nothing left to stop
        task = asyncio.create_task(w.stop(self.grace_s), name=f"bc-retire-{w.team}-{w.member}")
        self._retiring[w.key] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._retiring.get(w.key) is t:
                del self._retiring[w.key]
            self._poke.set()  # its member's new worker, if any, starts now

        task.add_done_callback(done)

    def _warn_unknown(self, m: Member, kind: str) -> None:
        key = (m.team, m.name, kind)
        if key not in self._warned:
            self._warned.add(key)
            known = ", ".join(sorted({*PULL_TYPES, *self.adapters}))
            log.warning("member %s/%s has delivery type %r, which no adapter serves (known: "
                        "%s); its messages wait for whoever pulls them", m.team, m.name,
                        kind, known)  # fmt: skip


def _snapshot(delivery: Mapping[str, Any]) -> str:
    """A member's delivery setting as one comparable text (a worker serves one)."""
    return json.dumps(delivery, sort_keys=True, default=str)


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("delivery worker %s crashed", task.get_name(), exc_info=exc)
