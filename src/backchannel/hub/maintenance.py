"""Maintenance: leases that ran out, scheduled jobs that fell due, retention.

One task per hub sleeps until the next due work (a lease's end, a job's due time, or at
most a minute) and does everything due in bounded transactions. Work scheduled by this
process wakes it through :meth:`Env.due_at`; other processes' changes through the
store's change callback. What a job does is its part's business
(:meth:`Pipeline.job_handlers`).
"""

from __future__ import annotations

import asyncio
import logging

from backchannel.core import messages as rules
from backchannel.errors import StoreError
from backchannel.hub.context import Ctx, Env, JobOutcome, wait_for
from backchannel.hub.messages import Messages
from backchannel.hub.pipeline import Pipeline
from backchannel.stores.base import CompactCursor, Tx
from backchannel.types import DeliveryState, JobState

log = logging.getLogger("backchannel.hub")

__all__ = ["COMPACT_EVERY", "DEFAULT_RETENTION", "Maintenance"]

DEFAULT_RETENTION = 30 * 86400.0
"""Acked and dead messages are kept 30 days by default (``retention_seconds``)."""
COMPACT_EVERY = 300.0  # seconds between retention passes once caught up


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

    def on_external_change(self, team: str | None, member: str | None) -> None:
        self.env.waiters.notify(team, member)
        self.env.maint_wake.set()

    async def maintain(self) -> float | None:
        """Do all work that is due now: expired leases go back to the queue, or dead
        after the last attempt (the sender is told). Returns when work is next due."""
        now = self.clock.now()
        max_attempts = self.config.max_attempts

        def fn(c: Ctx) -> tuple[bool, float | None]:
            tx = c.tx
            expired = tx.expired_leases(now, 500)
            for d in expired:
                member = d.recipient.member
                if rules.after_lease_expiry(d.attempts, max_attempts) is rules.ExpiryAction.REQUEUE:
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
                    continue
                reason = rules.exhausted_reason(d.attempts)
                if not self.messages.kill(c, d, reason, now):
                    continue  # acked meanwhile (by another hub): nothing to give up
                c.emit("after_dead", d, reason)
                self.messages.dead_notice(c, d, reason, now)
            handlers = self.pipeline.job_handlers()
            jobs = tx.due_jobs(now, 200)
            for job in jobs:
                handler = handlers.get(job.kind)
                if handler is None:
                    log.warning(
                        "no handler for scheduled job kind %r; dropping job %s",
                        job.kind,
                        job.job_id,
                    )
                    tx.finish_job(job.job_id, JobState.DONE, now)
                    continue
                outcome = handler(c, job, now) or JobOutcome()
                if outcome.run_after is not None:
                    c.after.append(outcome.run_after)
                if not outcome.keep:
                    tx.finish_job(job.job_id, JobState.DONE, now)
            dues = [t for t in (tx.next_lease_expiry(), tx.next_job_due()) if t is not None]
            return len(expired) == 500 or len(jobs) == 200, min(dues) if dues else None

        more = True
        next_due: float | None = None
        while more:
            (more, next_due), c = await self.env.transact_ctx(fn)
            for job in c.after:
                self.pipeline.start_after(job)
        if self.retention_seconds is not None and now >= self._compact_at:
            await self.compact(now - self.retention_seconds)
        self.env.next_due = next_due
        return next_due

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
        while True:
            try:
                next_due = await self.maintain()
            except asyncio.CancelledError:
                raise
            except StoreError as exc:  # the store is down: say so once a second, briefly
                log.warning(
                    "maintenance could not reach the store (%s); retrying in 1 s", exc.message
                )
                next_due = self.clock.now() + 1.0
            except Exception:
                log.exception("maintenance failed; retrying in 1 s")
                next_due = self.clock.now() + 1.0
            # sleep until the next due work; local scheduling and other processes' changes
            # wake the loop earlier, and a minute is the longest it ever sleeps
            delay = 60.0 if next_due is None else min(max(next_due - self.clock.now(), 0.0), 60.0)
            self.env.maint_wake.clear()
            await wait_for(self.env.maint_wake, delay + 0.001)
