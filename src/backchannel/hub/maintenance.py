"""Maintenance: leases that ran out, scheduled jobs that fell due, retention.

One task per hub sleeps until the next due work (a lease's end, a job's due time, or at
most a minute) and does everything due in bounded transactions. Work scheduled by this
process wakes it through :meth:`Env.due_at`; other processes' changes through the
store's change callback. What a job does is its part's business
(:meth:`Pipeline.job_handlers`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from backchannel.core import budget as budget_rules
from backchannel.core import messages as rules
from backchannel.core.delegation import DEADLINE_JOB
from backchannel.core.timers import TIMER_JOB
from backchannel.errors import ClockSkew, StoreError
from backchannel.hub.context import (
    STEPPED_AFTER,
    Ctx,
    Env,
    JobHandler,
    JobOutcome,
    boot_time,
    wait_for,
)
from backchannel.hub.messages import Messages
from backchannel.hub.outage import Outage
from backchannel.hub.pipeline import Pipeline
from backchannel.stores.base import CompactCursor, Tx
from backchannel.types import DelegationState, Delivery, DeliveryState, Job, JobState

log = logging.getLogger("backchannel.hub")

__all__ = [
    "COMPACT_EVERY",
    "DEFAULT_RETENTION",
    "FAILURE_KEY",
    "FailingJob",
    "FailingLease",
    "Maintenance",
    "UnknownJobKind",
    "retry_delay",
]

DEFAULT_RETENTION = 30 * 86400.0
"""Acked and dead messages are kept 30 days by default (``retention_seconds``)."""
COMPACT_EVERY = 300.0  # seconds between retention passes once caught up
LEASE_BATCH = 500  # expired leases a transaction
JOB_BATCH = 200  # due jobs a transaction
_FAR = 1e15  # a time after every lease's end: "every lease", earliest end first
#: The most a hub's clock may differ from the database's that hubs on several hosts share
#: (PostgreSQL): a hub further off refuses to start, and one that drifts further while
#: it runs returns leases by the database's clock (see :meth:`Maintenance.check_clock`).
#: Also how far ahead of this hub's clock a lease may have been given before maintenance
#: takes it for one given before the clock stepped back (and restarts it).
MAX_CLOCK_SKEW = 5.0
CLOCK_WARN = 1.0  # a skew that is logged at start, still tolerated
CLOCK_CHECK_EVERY = 60.0  # seconds (monotonic) between two comparisons while running
#: How much later than it meant to the maintenance loop may wake, by the hub's clock,
#: before the hub takes it that it did not run meanwhile (its process stopped, the
#: machine asleep, or its clock stepped forward): it is then awake since that pass.
ASLEEP_AFTER = 5.0
#: The payload key that says a job's due time moved with a step of the wall clock:
#: ``[at, by]``, the hub's clock when it moved and the step. Another hub on the same
#: database that sees the same step (one host's clock) moves it no further.
STEP_KEY = "clock_step"
#: The payload key of a job set aside after failing: ``failures``, the last ``error``,
#: the job's own ``due_at`` (its due time moves to each retry) and ``at``.
FAILURE_KEY = "maintenance_failure"
RETRY_FIRST = 5.0  # seconds before the first retry of a failed job
RETRY_MAX = 3600.0  # the longest a failing job waits between two tries


def retry_delay(failures: int) -> float:
    """Seconds until a job that failed ``failures`` times in a row is tried again."""
    return min(RETRY_FIRST * 2.0 ** min(failures - 1, 30), RETRY_MAX)


class UnknownJobKind(Exception):
    """A due job of a kind this hub has no handler for."""


@dataclass(frozen=True, slots=True)
class FailingJob:
    """A scheduled job whose firing failed, set aside to be tried again at ``retry_at``
    while all other maintenance goes on."""

    job_id: int
    team: str
    kind: str
    failures: int  # in a row
    error: str  # the last one
    retry_at: float

    @property
    def way_out(self) -> str:
        give_up = (
            f"to give it up, its member cancels it (`backchannel timer cancel {self.job_id}`, "
            f"or DELETE /v1/timers/{self.job_id})"
            if self.kind == TIMER_JOB
            else "to give it up, remove its team or mark it cancelled in the jobs table"
        )
        return (
            "If a newer backchannel on the same database wrote it, upgrade this hub; if "
            f"the error is a bug, report it with this log; {give_up}."
        )


@dataclass(frozen=True, slots=True)
class FailingLease:
    """An expired lease whose return to the queue (or giving up, after the last attempt)
    failed, set aside to be tried again at ``retry_at`` while all other maintenance goes
    on. The copy stays leased meanwhile: handed to nobody, lost to nobody."""

    team: str
    message_id: str
    member: str
    failures: int  # in a row
    error: str  # the last one
    retry_at: float

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.team, self.message_id, self.member)

    @property
    def way_out(self) -> str:
        return (
            "If a newer backchannel on the same database wrote it, upgrade this hub; if "
            "the error is a bug, report it with this log; the copy stays leased (handed "
            "to nobody) until it goes through, and an ack from its member settles it."
        )


def _key(d: Delivery) -> tuple[str, str, str]:
    return (d.team, d.message_id, d.recipient.member)


class Maintenance:
    """See the module docstring."""

    def __init__(
        self, env: Env, messages: Messages, pipeline: Pipeline, retention_seconds: float | None
    ) -> None:
        self.env = env
        self.store, self.clock, self.config = env.store, env.clock, env.config
        self.messages = messages
        self.pipeline = pipeline
        # acked and dead messages older than this are removed by maintenance
        self.retention_seconds = retention_seconds
        self._compact_at = 0.0
        self._compact_from: CompactCursor | None = None  # where the pass under way goes on
        self._failing: dict[int, FailingJob] = {}  # jobs set aside, by id (see failing)
        # expired leases set aside, by (team, message id, member) (see failing_leases)
        self._failing_leases: dict[tuple[str, str, str], FailingLease] = {}
        self._last_now: float | None = None  # the clock at the last pass (None: none yet)
        self._last_boot = 0.0  # the boot clock (boot_time) at the last pass
        self._last_job = 0  # the highest job id at the last pass: jobs set before it
        #: this hub's clock minus the database's (PostgreSQL) at the last comparison, and
        #: whether that was beyond MAX_CLOCK_SKEW; when to compare again (monotonic), and
        #: the clock minus the monotonic clock then (a step in between compares at once)
        self.skew = 0.0
        self.skewed = False
        self._skew_check: tuple[float, float] | None = None

    def on_external_change(self, team: str | None, member: str | None) -> None:
        self.env.waiters.notify(team, member)
        self.env.maint_wake.set()

    async def maintain(self) -> float | None:
        """Do all work that is due now: expired leases go back to the queue, or dead
        after the last attempt (the sender is told); due jobs fire. Returns when work is
        next due.

        All of it runs in one transaction a batch, the quick way. If that fails (a job
        whose handler raises: one bad row, or a job a newer hub on the same database
        wrote; a lease whose return raises), the batch is done again piece by piece:
        each expired lease in a transaction of its own, then each job in its own, so the
        failing lease or job alone is undone; it is set aside with backoff
        (:meth:`_set_aside`, :meth:`_set_leases_aside`) and named, and everything else
        due, for every team, goes on."""
        now = self.clock.now()
        boot = boot_time()
        handlers = self.pipeline.job_handlers()
        stepped = self._stepped(now, boot)
        step = max(stepped, 0.0)
        elapsed = boot - self._last_boot
        if self._last_now is None or now < self._last_now:
            await self._restart_leases(now)  # the first pass, or the clock stepped back
        self._last_now, self._last_boot = now, boot
        if stepped or self._clock_moved():
            await self.check_clock()
        if stepped and not self.skewed:
            # the database's clock stepped too (one host), or there is none: what was
            # due in so long from the step is due in as long still
            await self._shift_jobs(now, stepped, elapsed)
        if step:
            # no sign of life was missed in the time skipped: silence counts from now
            self.env.awake_since = max(self.env.awake_since, now)
            log.warning(
                "the wall clock stepped about %.0f s forward while the hub ran (NTP, or "
                "the date set by hand); sessions' silence counts from now",
                step,
            )
            if not self.skewed:
                await self._carry_leases(now, step)
                await self._carry_windows(now, step)
            # jobs fire by this hub's clock, skewed or not: the POSTs under way keep theirs
            await self.pipeline.outbox.hold_running(now)
        if getattr(self.clock, "follows_wall_clock", True):
            # from here a step is carried: a send no longer allows for it (Env.stepped)
            self.env.wall_boot = now - boot
        # leases end by the database's clock while this hub's runs too far ahead of it:
        # by its own, it would take other hubs' live leases back early
        lease_now = now - self.skew if self.skewed and self.skew > 0 else now

        def fn(c: Ctx) -> tuple[bool, float | None, list[int], list[tuple[str, str, str]]]:
            tx = c.tx
            expired = self._expirable(tx, lease_now)
            for d in expired:
                self._expire(c, d, now)
            jobs = tx.due_jobs(now, JOB_BATCH)
            for job in jobs:
                self._fire(c, handlers, job, now)
            more = len(expired) == LEASE_BATCH or len(jobs) == JOB_BATCH
            returned = [_key(d) for d in expired]
            dues = [t for t in (tx.next_lease_expiry(), tx.next_job_due()) if t is not None]
            self._last_job = tx.last_job_id()
            return more, min(dues) if dues else None, [j.job_id for j in jobs], returned

        more = True
        next_due: float | None = None
        while more:
            try:
                (more, next_due, fired, returned), c = await self.env.transact_ctx(fn)
            except Exception as exc:
                log.debug("maintenance batch failed (%s); going piece by piece", exc)
                more, next_due = await self._piece_by_piece(handlers, now, lease_now)
                continue
            for job in c.after:
                self.pipeline.start_after(job)
            for job_id in fired:
                self._failing.pop(job_id, None)
            for key in returned:
                self._failing_leases.pop(key, None)
        if self._failing or self._failing_leases:
            await self._forget_settled()
        if self._failing_leases:
            next_due = await self.store.read(self._next_due)
        if self.retention_seconds is not None and now >= self._compact_at:
            await self.compact(now - self.retention_seconds)
        self.env.next_due = next_due
        return next_due

    def _clock_moved(self) -> bool:
        """Whether it is time to compare the clock with the database's: every
        :data:`CLOCK_CHECK_EVERY` seconds, and at once when the clock stepped (moved
        apart from the monotonic clock by more than :data:`CLOCK_WARN`)."""
        if self._skew_check is None:
            return True
        due, drift = self._skew_check
        mono = time.monotonic()
        return mono >= due or abs(self.clock.now() - mono - drift) > CLOCK_WARN

    async def check_clock(self, *, starting: bool = False) -> float | None:
        """Compare this hub's clock with the database's, where hubs on several hosts
        share it (PostgreSQL; other stores, and a clock that does not follow the wall
        clock, are not compared: ``None``). Returns this hub's clock minus the
        database's.

        Each hub gives leases and returns them by its own clock, so a hub whose clock
        runs ahead would return other hubs' live leases early: a message handed twice.
        Starting (``starting``) more than :data:`MAX_CLOCK_SKEW` off, it raises
        :class:`ClockSkew`; more than :data:`CLOCK_WARN` off, it says so. Drifted
        further off while running, it logs an error, ``/healthz`` says degraded, and
        maintenance returns leases by the database's clock until the clocks agree."""
        if not getattr(self.clock, "follows_wall_clock", True):
            return None
        before = self.clock.now()
        database = await self.store.database_time()
        after = self.clock.now()
        mono = time.monotonic()
        self._skew_check = (mono + CLOCK_CHECK_EVERY, after - mono)
        if database is None:
            return None
        skew = (before + after) / 2 - database
        off = abs(skew) - (after - before) / 2  # the least it can be off by
        way = "ahead of" if skew > 0 else "behind"
        what = (
            f"this hub's clock is {abs(skew):.1f} s {way} the database's ({self.store.url}); "
            f"hubs on one database may differ by at most {MAX_CLOCK_SKEW:.0f} s"
        )
        fix = (
            "Keep the hosts' clocks in sync (NTP: chrony or systemd-timesyncd on the hub's "
            "host and the database's) and start the hub again."
        )
        if starting and off > MAX_CLOCK_SKEW:
            raise ClockSkew(
                f"{what}: a hub ahead would take other hubs' live leases back early and a "
                f"message would be handed twice. {fix}",
                skew=round(skew, 3),
            )
        if off > MAX_CLOCK_SKEW:
            if not self.skewed:
                log.error(
                    "%s; leases are returned by the database's clock meanwhile. %s", what, fix
                )
            self.skew, self.skewed = skew, True
            return skew
        if self.skewed:
            log.warning("this hub's clock is back within %.0f s of the database's", MAX_CLOCK_SKEW)
        elif off > CLOCK_WARN:
            log.warning("%s, but it is more than %.0f s. %s", what, CLOCK_WARN, fix)
        self.skew, self.skewed = skew, False
        return skew

    async def _restart_leases(self, now: float) -> None:
        """Leases given after now (by the hub's clock, beyond :data:`MAX_CLOCK_SKEW`) were
        given before the clock stepped back: each runs its own length again from now,
        so its message is not held for as long as the clock stepped back (an hour held
        an hour), nor taken from a receiver that still works on it. Done on the first
        pass (the hub may have been stopped while the clock stepped back) and whenever
        the clock is behind where it was the pass before."""
        restarted = await self._restart_in_batches(
            lambda tx: tx.restart_leases(now, now + MAX_CLOCK_SKEW, LEASE_BATCH)
        )
        if restarted:
            log.warning(
                "the clock is behind the start of %d leases (it stepped back, or the hub "
                "that gave them keeps a clock ahead of this one): each runs its length "
                "again from now",
                restarted,
            )

    async def _restart_in_batches(self, batch: Callable[[Tx], Sequence[Delivery]]) -> int:
        """Run ``batch`` (one ``restart_leases`` of :data:`LEASE_BATCH` at most) until a
        batch comes back short; how many leases it restarted in all."""
        restarted = 0
        while True:
            found = await self.store.transact(batch)
            restarted += len(found)
            if len(found) < LEASE_BATCH:
                return restarted

    def _stepped(self, now: float, boot: float) -> float:
        """How far the wall clock stepped since the last pass (forward: positive, back:
        negative): how much further it ran than the boot clock, or how much less, beyond
        :data:`STEPPED_AFTER` (0.0: it did not; a clock that does not follow the wall
        clock, such as a test's, never steps)."""
        if self._last_now is None or not getattr(self.clock, "follows_wall_clock", True):
            return 0.0
        step = (now - self._last_now) - (boot - self._last_boot)
        return step if abs(step) > STEPPED_AFTER else 0.0

    async def _shift_jobs(self, now: float, step: float, elapsed: float) -> None:
        """The wall clock stepped ``step`` seconds (either way) some time in the
        ``elapsed`` seconds (boot clock) since the last pass: every pending job set
        before the step moves by the step, so it falls due as long after it was set as
        meant, by the boot clock. Otherwise an hour forward fires every timer due within
        the hour at once (each a model turn), and an hour back holds every timer an
        hour (an agent waiting on a reply is not woken).

        Set before the step: the job's id is at most the highest id at the last pass
        (:meth:`Tx.last_job_id`), or it was set since by the clock before the step
        (before ``now - step`` after a step forward, after ``now`` after one back). Its
        ``set_at`` (a timer's) and a failure record's ``due_at`` move too, and so do a
        pending delegation's ``deadline`` and ``created_at`` with its deadline job (the
        task sent to another hub carries the time left, an A2A call gives up after it):
        the delegation keeps the length its caller asked for. A job another
        hub moved for the same step (its :data:`STEP_KEY`) stays. A paged pass over each
        team's pending jobs, one transaction a team: a step is rare, the send path does
        nothing for it."""
        upto = self._last_job
        same_step_since = now - elapsed - MAX_CLOCK_SKEW

        def set_before(job: Job) -> bool:
            if job.job_id <= upto:
                return True
            if step > 0:
                return job.created_at < now - step
            return job.created_at > now + MAX_CLOCK_SKEW

        def moved_already(job: Job) -> bool:
            mark = job.payload.get(STEP_KEY)
            if not isinstance(mark, list) or len(mark) != 2:
                return False
            at, by = mark
            return (
                isinstance(at, int | float)
                and isinstance(by, int | float)
                and at >= same_step_since
                and abs(by - step) <= STEPPED_AFTER
            )

        def one(team: str) -> Callable[[Tx], int]:
            def fn(tx: Tx) -> int:
                moved = 0
                for job in tx.list_jobs(team, pending_only=True):
                    if not set_before(job) or moved_already(job):
                        continue
                    payload: dict[str, object] = {**job.payload, STEP_KEY: [now, step]}
                    set_at = payload.get("set_at")
                    if isinstance(set_at, int | float):
                        payload["set_at"] = set_at + step
                    failed = payload.get(FAILURE_KEY)
                    if isinstance(failed, Mapping) and isinstance(
                        failed.get("due_at"), int | float
                    ):
                        payload[FAILURE_KEY] = {**failed, "due_at": failed["due_at"] + step}
                    if tx.reschedule_job(job.job_id, job.due_at + step, payload):
                        moved += 1
                        if job.kind == DEADLINE_JOB:
                            self._shift_deadline(tx, job, step)
                return moved

            return fn

        moved = await self._each_team(one)
        if moved:
            log.warning(
                "%d pending timers and jobs set before the clock stepped %.0f s %s each "
                "fall due as long after they were set as meant",
                moved, abs(step), "forward" if step > 0 else "back",
            )  # fmt: skip

    @staticmethod
    def _shift_deadline(tx: Tx, job: Job, step: float) -> None:
        """A delegation's deadline job moved by ``step``: its record's deadline (and its
        start, so its length reads the same) moves with it while it is pending."""
        d = tx.get_delegation(job.team, str(job.payload.get("delegation_id")))
        if d is None or d.state is not DelegationState.PENDING:
            return
        tx.update_delegation(
            dataclasses.replace(d, deadline=d.deadline + step, created_at=d.created_at + step)
        )

    async def _each_team(self, one: Callable[[str], Callable[[Tx], int]]) -> int:
        """Run ``one(team)`` in a transaction of its own for each team (a team's records
        at a time, never the whole store in one), and the sum of what they counted."""
        teams = await self.store.read(lambda tx: [t.name for t in tx.list_teams()])
        total = 0
        for team in teams:
            total += await self.store.transact(one(team))
        return total

    async def _carry_windows(self, now: float, step: float) -> None:
        """The wall clock stepped ``step`` seconds forward: a pair's budget window open at
        the step (begun before ``now - step``, ending after it) starts that much later,
        so it keeps its length by the boot clock. Otherwise the step ends it, and two
        agents that spent their budget get a full one again. A step back is left alone:
        a window then lasts longer, which holds a pair back, never lets it run."""

        def one(team: str) -> Callable[[Tx], int]:
            def fn(tx: Tx) -> int:
                t = tx.get_team(team)
                if t is None:
                    return 0
                window = budget_rules.limits(t.settings).pair_window
                moved = 0
                for b in tx.list_budgets(team):
                    if not b.key.startswith(budget_rules.Scope.PAIR.value + ":"):
                        continue
                    if b.window_start < now - step < b.window_start + window:
                        tx.put_budget(dataclasses.replace(b, window_start=b.window_start + step))
                        moved += 1
                return moved

            return fn

        moved = await self._each_team(one)
        if moved:
            log.warning(
                "%d pair budget windows open when the clock stepped forward each keep "
                "their length from their start",
                moved,
            )

    async def _carry_leases(self, now: float, step: float) -> None:
        """The wall clock stepped ``step`` seconds forward since the last pass, while the
        hub ran: the leases given before the step (``updated_at`` before ``now - step``)
        would all look run out, and their copies go to the next receive while their
        receivers still work on them (handed twice). Each instead runs its own length
        again from now, as after a step back (:meth:`_restart_leases`): a copy whose lease
        truly ended just before the step comes back that much later, never twice. Not
        done while the hub's clock is off the database's (PostgreSQL, hubs on several
        hosts: a step of this host's clock alone), where leases go by the database's
        clock (:meth:`check_clock`)."""
        restarted = await self._restart_in_batches(
            lambda tx: tx.restart_leases(now, -_FAR, LEASE_BATCH, given_before=now - step)
        )
        if restarted:
            log.warning(
                "%d leases given before the clock stepped forward each run their length "
                "again from now",
                restarted,
            )

    def _held_back(self, now: float) -> set[tuple[str, str, str]]:
        """The expired leases set aside whose retry is not due yet."""
        return {k for k, f in self._failing_leases.items() if f.retry_at > now}

    def _expirable(self, tx: Tx, now: float) -> list[Delivery]:
        """Up to :data:`LEASE_BATCH` leases that ran out, the earliest first, but for
        those set aside whose retry is not due (so they never fill a batch)."""
        held = self._held_back(now)
        expired = tx.expired_leases(now, LEASE_BATCH + len(held))
        return [d for d in expired if _key(d) not in held][:LEASE_BATCH]

    def _next_due(self, tx: Tx) -> float | None:
        """When work is next due: the earliest lease end or job due time. With leases set
        aside, their retry instead of their end, so a lease that keeps failing never
        keeps maintenance busy (a read: it looks at live leases, locking none)."""
        lease = tx.next_lease_expiry()
        dues = [t for t in (tx.next_job_due(),) if t is not None]
        if lease is not None and self._failing_leases:
            held = self._failing_leases
            first = tx.expired_leases(_FAR, len(held) + 1)
            ends = [d.lease_until for d in first if _key(d) not in held and d.lease_until]
            lease = min(ends, default=None)
            dues += [f.retry_at for f in held.values()]
        if lease is not None:
            dues.append(lease)
        return min(dues) if dues else None

    def _expire(self, c: Ctx, d: Delivery, now: float) -> None:
        """A lease that ran out: back to the queue, or dead after the last attempt."""
        tx = c.tx
        member = d.recipient.member
        if rules.after_lease_expiry(d.attempts, self.config.max_attempts) is (
            rules.ExpiryAction.REQUEUE
        ):
            moved = tx.transition(
                d.team,
                d.message_id,
                member,
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=now,
                event="lease_expired",
                detail=f"attempt {d.attempts} was not acknowledged",
            )
            if moved:
                c.wake(d.team, member)
            return
        reason = rules.exhausted_reason(d.attempts)
        if not self.messages.kill(c, d, reason, now):
            return  # acked meanwhile (by another hub): nothing to give up
        c.emit("after_dead", d, reason)
        self.messages.dead_notice(c, d, reason, now)

    def _fire(self, c: Ctx, handlers: Mapping[str, JobHandler], job: Job, now: float) -> None:
        """Fire one due job in ``c``'s transaction. A job set aside after failing is
        handed to its handler as it was scheduled (its own due time, its payload without
        the failure record), with the count of its failures (so a timer fired late from
        a retry says why it is late). Raises whatever its handler raises, and
        :class:`UnknownJobKind` for a kind this hub has no handler for."""
        failed = job.payload.get(FAILURE_KEY)
        if failed is not None:
            payload = {k: v for k, v in job.payload.items() if k != FAILURE_KEY}
            due = failed.get("due_at") if isinstance(failed, Mapping) else None
            due_at = float(due) if isinstance(due, int | float) else job.due_at
            count = failed.get("failures") if isinstance(failed, Mapping) else None
            failures = count if isinstance(count, int) and count > 0 else 1
            job = dataclasses.replace(job, payload=payload, due_at=due_at, failures=failures)
        handler = handlers.get(job.kind)
        if handler is None:
            raise UnknownJobKind(
                f"no handler for scheduled job kind {job.kind!r} in this hub (a newer "
                "backchannel on the same database may have written it)"
            )
        outcome = handler(c, job, now) or JobOutcome()
        if outcome.run_after is not None:
            c.after.append(outcome.run_after)
        if not outcome.keep:
            c.tx.finish_job(job.job_id, JobState.DONE, now)

    async def _piece_by_piece(
        self, handlers: Mapping[str, JobHandler], now: float, lease_now: float
    ) -> tuple[bool, float | None]:
        """The batch failed: every expired lease in a transaction of its own, then every
        due job in its own (one store call for each kind), the failing ones set aside.
        Raises the store's error instead when nothing went through and every failure
        was the store's (:class:`StoreError`). Returns whether more is due now, and when
        work is next due."""
        expired = await self.store.read(lambda tx: self._expirable(tx, lease_now))

        def back(d: Delivery) -> Callable[[Ctx], bool]:
            def fn(c: Ctx) -> bool:
                # read again in this transaction (on PostgreSQL under the team's lock,
                # which every lease takes): another hub may have moved it since
                member = d.recipient.member
                copies = c.tx.deliveries(d.team, d.message_id)
                x = next((x for x in copies if x.recipient.member == member), None)
                if x is None or x.state is not DeliveryState.LEASED or not x.lease_until:
                    return False  # acked or returned meanwhile (another hub)
                if x.lease_until > lease_now:
                    return False  # leased again meanwhile: a live lease
                self._expire(c, x, now)
                return True

            return fn

        returned = await self.env.transact_each([back(d) for d in expired])
        due = await self.store.read(lambda tx: tx.due_jobs(now, JOB_BATCH))

        def one(team: str, job_id: int) -> Callable[[Ctx], list[Job] | None]:
            def fn(c: Ctx) -> list[Job] | None:
                job = c.tx.get_job(team, job_id)
                if job is None or job.state is not JobState.PENDING or job.due_at > now:
                    return None  # done meanwhile (another hub), or moved on
                self._fire(c, handlers, job, now)
                return c.after

            return fn

        done = await self.env.transact_each([one(j.team, j.job_id) for j in due])
        errors = [r for r in (*returned, *done) if isinstance(r, Exception)]
        if errors and len(errors) == len(returned) + len(done):
            store = [e for e in errors if isinstance(e, StoreError)]
            if len(store) == len(errors):
                # nothing went through, each for the store's own failure (its file
                # cannot be written, the database is down): not bad rows to set aside
                # with a growing backoff, but the store, which the loop retries each second
                raise store[0]
        lost: list[tuple[Delivery, Exception]] = []
        for d, result in zip(expired, returned, strict=True):
            if isinstance(result, Exception):
                lost.append((d, result))
            else:
                self._failing_leases.pop(_key(d), None)
        if lost:
            self._set_leases_aside(lost, now)
        failed: list[tuple[Job, Exception]] = []
        for job, outcome in zip(due, done, strict=True):
            if isinstance(outcome, Exception):
                failed.append((job, outcome))
                continue
            for after in outcome or ():
                self.pipeline.start_after(after)
            self._failing.pop(job.job_id, None)
        if failed:
            await self._set_aside(failed, now)

        more = len(expired) == LEASE_BATCH or len(due) == JOB_BATCH
        return more, await self.store.read(self._next_due)

    def _set_leases_aside(self, lost: Sequence[tuple[Delivery, Exception]], now: float) -> None:
        """Expired leases whose return raised: each stays leased, is tried again after a
        backoff that doubles up to :data:`RETRY_MAX`, is logged with the way out and
        listed by :meth:`failing_leases` (and ``/healthz``). Kept by this hub only: a
        hub started again tries each at once, and sets it aside again if it still
        fails."""
        for d, exc in lost:
            before = self._failing_leases.get(_key(d))
            failures = (before.failures if before else 0) + 1
            error = f"{type(exc).__name__}: {exc}"[:500]
            retry_at = now + retry_delay(failures)
            f = FailingLease(d.team, d.message_id, d.recipient.member, failures, error, retry_at)
            self._failing_leases[f.key] = f
            self.env.due_at(retry_at)
            log.warning(
                "the lease of message %s for %s (team %r) ran out but returning it failed: "
                "%s; set aside (failure %d), tried again in %.0f s while all other "
                "maintenance goes on. %s",
                d.message_id, f.member, d.team, error, failures, retry_at - now, f.way_out,
                exc_info=exc if failures == 1 else None,
            )  # fmt: skip

    async def _set_aside(self, failed: Sequence[tuple[Job, Exception]], now: float) -> None:
        """Jobs whose firing raised: each is left pending with a failure record in its
        payload (how many failures, the last error, its own due time) and retried after a
        backoff that doubles up to :data:`RETRY_MAX`, logged with the way out and listed
        by :meth:`failing`."""

        def one(team: str, job_id: int, error: str) -> Callable[[Ctx], FailingJob | None]:
            def fn(c: Ctx) -> FailingJob | None:
                job = c.tx.get_job(team, job_id)
                if job is None or job.state is not JobState.PENDING:
                    return None
                before = job.payload.get(FAILURE_KEY)
                before = before if isinstance(before, Mapping) else {}
                count = before.get("failures")
                failures = (count if isinstance(count, int) else 0) + 1
                due = before.get("due_at")
                retry_at = now + retry_delay(failures)
                record = {
                    "failures": failures,
                    "error": error,
                    "due_at": due if isinstance(due, int | float) else job.due_at,
                    "at": now,
                }
                c.tx.reschedule_job(job_id, retry_at, {**job.payload, FAILURE_KEY: record})
                c.schedule(retry_at)
                return FailingJob(job_id, team, job.kind, failures, error, retry_at)

            return fn

        errors = [f"{type(exc).__name__}: {exc}"[:500] for _, exc in failed]
        done = await self.env.transact_each(
            [
                one(job.team, job.job_id, error)
                for (job, _), error in zip(failed, errors, strict=True)
            ]
        )
        for (job, exc), outcome in zip(failed, done, strict=True):
            if isinstance(outcome, Exception):
                log.error(
                    "scheduled job %s (%s, team %r) failed (%s) and could not be set aside "
                    "(%s); maintenance tries it again",
                    job.job_id, job.kind, job.team, exc, outcome,
                )  # fmt: skip
                continue
            if outcome is None:
                continue  # finished meanwhile (another hub)
            self._failing[job.job_id] = outcome
            log.warning(
                "scheduled job %s (%s, team %r) failed: %s; set aside (failure %d), tried "
                "again in %.0f s while all other maintenance goes on. %s",
                job.job_id, job.kind, job.team, outcome.error, outcome.failures,
                outcome.retry_at - now, outcome.way_out,
                exc_info=exc if outcome.failures == 1 else None,
            )  # fmt: skip

    async def _forget_settled(self) -> None:
        """Drop the jobs set aside that are no longer pending (cancelled, finished by
        another hub) from :meth:`failing`, and the leases set aside that are no longer
        held (acked, returned by another hub) from :meth:`failing_leases`."""
        keys = [(f.team, f.job_id) for f in self._failing.values()]
        leases = list(self._failing_leases)

        def fn(tx: Tx) -> tuple[list[int], list[tuple[str, str, str]]]:
            gone = []
            for team, job_id in keys:
                job = tx.get_job(team, job_id)
                if job is None or job.state is not JobState.PENDING:
                    gone.append(job_id)
            settled = []
            for team, message_id, member in leases:
                held = [
                    d
                    for d in tx.deliveries(team, message_id)
                    if d.recipient.member == member and d.state is DeliveryState.LEASED
                ]
                if not held:
                    settled.append((team, message_id, member))
            return gone, settled

        gone, settled = await self.store.read(fn)
        for job_id in gone:
            self._failing.pop(job_id, None)
        for key in settled:
            self._failing_leases.pop(key, None)

    def failing(self) -> list[FailingJob]:
        """The scheduled jobs this hub set aside because firing them failed, by id."""
        return [self._failing[k] for k in sorted(self._failing)]

    def failing_leases(self) -> list[FailingLease]:
        """The expired leases this hub set aside because returning them failed."""
        return [self._failing_leases[k] for k in sorted(self._failing_leases)]

    async def compact(self, before: float, *, batch: int = 500, max_batches: int = 8) -> int:
        """Remove acked and dead messages (with their history) created and done with
        (acked, dead) before ``before``, and finished jobs, a bounded number of batches
        at a time; maintenance calls this every few minutes with ``now -
        retention_seconds``. Messages still waiting for a recipient are never removed.
        Each batch goes on from the last message the one before examined, by its
        ``(created_at, team, message_id)``, so a pass always advances. Returns how many
        messages went."""
        removed = 0
        for _ in range(max_batches):
            frm = self._compact_from

            def fn(tx: Tx, frm: CompactCursor | None = frm) -> tuple[int, CompactCursor | None]:
                return tx.compact(before, frm, batch)

            gone, last = await self.store.transact(fn)
            removed += gone
            if last is None:  # reached the end: next time, look again from the oldest
                self._compact_from = None
                self._compact_at = self.clock.now() + COMPACT_EVERY
                break
            self._compact_from = last
        else:
            self._compact_at = self.clock.now() + 1.0  # more to do: soon, in small steps
        if removed:
            log.info("retention: removed %d messages created before %.0f", removed, before)
        return removed

    async def loop(self) -> None:
        # the store down: said once, briefly, and tried every second or two until it is
        # back (maintenance returns expired leases, so it never waits long)
        outage = Outage(log, "maintenance", first=1.0, cap=2.0)
        while True:
            try:
                next_due = await self.maintain()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                next_due = self.clock.now() + outage.failed(exc)
            else:
                outage.ok()
            # sleep until the next due work; local scheduling and other processes' changes
            # wake the loop earlier, and a minute is the longest it ever sleeps
            slept_at = self.clock.now()
            delay = 60.0 if next_due is None else min(max(next_due - slept_at, 0.0), 60.0)
            self.env.maint_wake.clear()
            await wait_for(self.env.maint_wake, delay + 0.001)
            self._woke(slept_at, delay)

    def _woke(self, slept_at: float, delay: float) -> None:
        """The loop woke from a sleep of ``delay`` seconds begun at ``slept_at``. Later
        than that by over :data:`ASLEEP_AFTER`, the hub did not run meanwhile (a process
        stopped with SIGSTOP or Ctrl-Z, a laptop's lid closed, the clock stepped forward):
        no event or beat could reach it, so it is awake only from now on
        (``env.awake_since``), and a session's silence counts from here, not from
        before the gap (:meth:`.Sessions._fire_silent`)."""
        now = self.clock.now()
        late = now - slept_at - delay
        if late > ASLEEP_AFTER:
            log.warning(
                "the hub did not run for about %.0f s (stopped, asleep, or its clock "
                "stepped forward); sessions' silence counts from now",
                late,
            )
            self.env.awake_since = now
