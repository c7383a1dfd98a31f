"""The outbox: durable HTTP POSTs to registered callback services, retried with backoff.

A POST is a scheduled job of kind ``outbox``. When due, the maintenance transaction
leases it (pushes its due time past one attempt's timeout, so a hub that dies mid-POST
leaves it to be retried) and the POST runs after the commit, in its own task: a slow or
hanging service never delays another delivery. Connection errors, 408, 425, 429 and 5xx
are retried with capped exponential backoff within a time budget; other answers
(including redirects, never followed) are final and go to ``_outbox_dead``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from backchannel.callbacks import CallbackConfig
from backchannel.core import delegation as rules
from backchannel.errors import UnknownService
from backchannel.hub.messages import JobHandler, JobOutcome
from backchannel.hub.timers import TimersMixin
from backchannel.stores.base import Tx
from backchannel.types import Job, JobState

log = logging.getLogger("backchannel.outbox")

OUTBOX_JOB = "outbox"


class OutboxMixin(TimersMixin):
    """Outbound HTTP through the callback registry (see the module docstring)."""

    callbacks: CallbackConfig
    _http: httpx.AsyncClient | None = None
    _posts: set[asyncio.Task[None]]
    _post_slots: asyncio.Semaphore

    def _init_outbox(self, callbacks: CallbackConfig | None) -> None:
        self.callbacks = callbacks or CallbackConfig.load(None)
        self._posts = set()
        self._post_slots = asyncio.Semaphore(64)

    async def _close_outbox(self) -> None:
        for task in list(self._posts):
            task.cancel()
        for task in list(self._posts):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _enqueue_post(
        self,
        tx: Tx,
        team: str,
        *,
        service: str,
        path: str,
        body: Mapping[str, Any],
        bearer: str | None,
        purpose: str,
        ref: str,
        now: float,
    ) -> int:
        """Queue a POST in ``tx``; it runs once the transaction committed."""
        job = Job(
            team,
            OUTBOX_JOB,
            now,
            now,
            None,
            {
                "service": service,
                "path": path,
                "body": dict(body),
                "bearer": bearer,
                "purpose": purpose,
                "ref": ref,
                "attempt": 0,
                "first_at": now,
            },
        )
        job_id = tx.add_job(job)
        self._scheduled.append(now)
        return job_id

    def _fire_outbox(self, tx: Tx, job: Job, now: float) -> JobOutcome:
        lease = now + self.callbacks.retry.timeout + 5.0
        tx.reschedule_job(job.job_id, lease, job.payload)
        return JobOutcome(keep=True, run_after=job)

    def _job_handlers(self) -> dict[str, JobHandler]:
        return {**super()._job_handlers(), OUTBOX_JOB: self._fire_outbox}

    def _start_after(self, job: Job) -> None:
        if job.kind != OUTBOX_JOB:
            super()._start_after(job)
            return
        task = asyncio.create_task(self._post(job), name=f"bc-post-{job.job_id}")
        self._posts.add(task)
        task.add_done_callback(self._posts.discard)

    async def _post(self, job: Job) -> None:
        """One attempt. Whatever goes wrong in it (a payload this hub cannot send, a bug)
        counts as a failed attempt: retried within the budget, then dead with the reason,
        never re-run forever."""
        try:
            await self._attempt_post(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("POST job %s failed unexpectedly", job.job_id)
            detail = f"could not send the POST ({type(exc).__name__}: {exc})"
            try:
                await self._finish_post(job, rules.Outcome.RETRY, detail, None)
            except Exception:
                log.exception("could not record the failure of POST job %s", job.job_id)

    async def _attempt_post(self, job: Job) -> None:
        p = job.payload
        policy = self.callbacks.retry
        status: int | None = None
        detail = ""
        try:
            svc = self.callbacks.resolve(str(p["service"]))  # checked again before sending
        except UnknownService as exc:
            await self._finish_post(job, rules.Outcome.DEAD, exc.message, None)
            return
        if svc.kind == "a2a":  # an A2A agent, called with the A2A client
            from backchannel.a2a_peer import run_a2a_job

            await run_a2a_job(self, job, svc)
            return
        if self._http is None:
            self._http = httpx.AsyncClient(follow_redirects=False)
        headers = {"Authorization": f"Bearer {p['bearer']}"} if p.get("bearer") else {}
        async with self._post_slots:
            try:
                resp = await self._http.post(
                    svc.endpoint(str(p["path"])),
                    json=p["body"],
                    headers=headers,
                    timeout=policy.timeout,
                )
                status = resp.status_code
                detail = f"HTTP {status}: {resp.text[:200]}"
            except httpx.HTTPError as exc:
                detail = f"{type(exc).__name__}: {exc}"
        outcome = rules.classify(status)
        await self._finish_post(job, outcome, detail, status)

    async def _finish_post(
        self, job: Job, outcome: rules.Outcome, detail: str, status: int | None
    ) -> None:
        p = dict(job.payload)
        now = self.clock.now()
        attempt = int(p.get("attempt", 0)) + 1
        if outcome is rules.Outcome.RETRY:
            at = rules.next_try(self.callbacks.retry, attempt, float(p["first_at"]), now)
            if at is None:
                outcome = rules.Outcome.DEAD
                detail = f"gave up after {attempt} attempts over the retry budget; last: {detail}"
        p["attempt"] = attempt
        p["last"] = detail

        def fn(tx: Tx) -> None:
            if outcome is rules.Outcome.RETRY:
                tx.reschedule_job(job.job_id, at or now, p)
                self._scheduled.append(at or now)
                return
            # a finished POST keeps its record, not its credentials
            tx.reschedule_job(job.job_id, now, _without_secrets(p))
            tx.finish_job(job.job_id, JobState.DONE, now)
            if outcome is rules.Outcome.DONE:
                self._outbox_done(tx, job, now)
            else:
                self._outbox_dead(tx, job, detail, now, status)

        log.log(
            logging.WARNING if outcome is rules.Outcome.DEAD else logging.DEBUG,
            "POST %s%s for %s %s: %s (%s)",
            p.get("service"),
            p.get("path"),
            p.get("purpose"),
            p.get("ref"),
            outcome.value,
            detail,
        )
        try:
            await self.store.transact(fn)
        except Exception:
            log.exception(
                "could not record the outcome of POST job %s; it will be retried", job.job_id
            )
        self._flush_due()
        self._waiters.notify(job.team, None)

    def _outbox_done(self, tx: Tx, job: Job, now: float) -> None:
        """Hook: a POST was accepted (2xx). Runs in the recording transaction."""

    def _outbox_dead(self, tx: Tx, job: Job, reason: str, now: float, status: int | None) -> None:
        """Hook: a POST was given up on (``status``: the last HTTP status, ``None`` when
        there was no answer). Runs in the recording transaction."""


def _without_secrets(payload: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` without the bearer token it was sent with, nor a reply token in its body."""
    out = {**payload, "bearer": None}
    body = payload.get("body")
    if isinstance(body, Mapping) and isinstance(body.get("reply"), Mapping):
        reply = {k: v for k, v in body["reply"].items() if k != "bearerToken"}
        out["body"] = {**body, "reply": reply}
    return out
