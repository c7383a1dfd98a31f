"""The outbox: durable HTTP POSTs to registered callback services, retried with backoff.

A POST is a scheduled job of kind ``outbox``. When due, the maintenance transaction
leases it (pushes its due time past one attempt's timeout, so a hub that dies mid-POST
leaves it to be retried) and the POST runs after the commit, in its own task: a slow or
hanging service never delays another delivery. Connection errors, 408, 425, 429 and 5xx
are retried with capped exponential backoff within a time budget; other answers
(including redirects, never followed) are final: the pipeline's ``post_dead`` tells the
part that queued the POST.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from backchannel import outbound
from backchannel.callbacks import CallbackConfig
from backchannel.core import delegation as rules
from backchannel.core.budget import ChainRef
from backchannel.errors import UnknownService
from backchannel.hub.context import Ctx, Env, JobHandler, JobOutcome
from backchannel.hub.pipeline import Pipeline
from backchannel.stores.base import Tx
from backchannel.types import Job, JobState

log = logging.getLogger("backchannel.outbox")

OUTBOX_JOB = "outbox"
#: How much of a refusal the outbox reads: its reason, and a budget's error object.
BUDGET_ERROR_BYTES = 16 * 1024


class Outbox:
    """Outbound HTTP through the callback registry (see the module docstring)."""

    def __init__(self, env: Env, pipeline: Pipeline, callbacks: CallbackConfig | None) -> None:
        self.env = env
        self.store, self.clock, self.config = env.store, env.clock, env.config
        self.pipeline = pipeline
        self.callbacks = callbacks or CallbackConfig.load(None)
        self._http: httpx.AsyncClient | None = None
        self._posts: set[asyncio.Task[None]] = set()
        self._running: dict[int, Job] = {}  # the jobs of the POSTs under way, by id
        self._post_slots = asyncio.Semaphore(64)

    async def close(self) -> None:
        for task in list(self._posts):
            task.cancel()
        for task in list(self._posts):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def enqueue(
        self,
        c: Ctx,
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
        """Queue a POST in ``c``; it runs once the transaction committed."""
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
        job_id = c.tx.add_job(job)
        c.schedule(now)
        return job_id

    def _fire(self, c: Ctx, job: Job, now: float) -> JobOutcome:
        c.tx.reschedule_job(job.job_id, self._lease(now), job.payload)
        return JobOutcome(keep=True, run_after=job)

    def _lease(self, now: float) -> float:
        """Until when a POST starting at ``now`` keeps its job from firing again."""
        return now + self.callbacks.retry.timeout + 5.0

    async def hold_running(self, now: float) -> int:
        """The wall clock stepped forward: the jobs of the POSTs under way here keep their
        lease, one attempt's timeout from ``now``; by the clock's new time they would fall
        due at once and each POST be made again beside itself. Returns how many."""
        running = list(self._running.values())
        if not running:
            return 0
        lease = self._lease(now)

        def fn(tx: Tx) -> int:
            held = 0
            for job in running:
                current = tx.get_job(job.team, job.job_id)
                if current is None or current.state is not JobState.PENDING:
                    continue  # finished meanwhile
                if current.due_at < lease:
                    tx.reschedule_job(job.job_id, lease, current.payload)
                    held += 1
            return held

        return await self.store.transact(fn)

    def job_handlers(self) -> dict[str, JobHandler]:
        return {OUTBOX_JOB: self._fire}

    def start(self, job: Job) -> None:
        """Run the POST of a fired job in its own task."""
        if job.kind != OUTBOX_JOB:
            log.warning("job %s asked for work after commit, but nothing runs it", job.job_id)
            return
        task = asyncio.create_task(self._post(job), name=f"bc-post-{job.job_id}")
        self._posts.add(task)
        self._running[job.job_id] = job
        task.add_done_callback(self._posts.discard)
        task.add_done_callback(lambda _: self._running.pop(job.job_id, None))

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
                await self.finish(job, rules.Outcome.RETRY, detail, None)
            except Exception:
                log.exception("could not record the failure of POST job %s", job.job_id)

    async def _attempt_post(self, job: Job) -> None:
        p = job.payload
        policy = self.callbacks.retry
        status: int | None = None
        detail = ""
        reached = True
        try:
            svc = self.callbacks.resolve(str(p["service"]))  # checked again before sending
        except UnknownService as exc:
            await self.finish(job, rules.Outcome.DEAD, exc.message, None)
            return
        if svc.kind == "a2a":  # an A2A agent, called with the A2A client
            from backchannel.a2a_peer import run_a2a_job

            await run_a2a_job(self, job, svc)
            return
        if self._http is None:
            self._http = outbound.client(deadline=policy.timeout)
        headers = {"Authorization": f"Bearer {p['bearer']}"} if p.get("bearer") else {}
        async with self._post_slots:
            # httpx's timeout bounds each read, not the request: an answer dribbled out
            # (or never ended) would keep the job leased past its lease, and the POST
            # would be made again beside it. The status is the outcome, within the
            # attempt's timeout; of the answer only the start of a refusal is read, for
            # its reason (the client's deadline ends a dribbled one).
            try:
                request = self._http.build_request(
                    "POST",
                    svc.endpoint(str(p["path"])),
                    json=p["body"],
                    headers=headers,
                    timeout=policy.timeout,
                )
                async with asyncio.timeout(policy.timeout):
                    resp = await self._http.send(request, stream=True)
                try:
                    status = resp.status_code
                    start = await _answer_start(resp) if status >= 300 else ""
                finally:
                    await resp.aclose()
                detail = f"HTTP {status}" + (f": {start.strip()[:200]}" if start.strip() else "")
            except TimeoutError:
                detail = (
                    f"no complete answer within {policy.timeout:g} s (the callback retry "
                    "policy's timeout)"
                )
                status, reached = None, False
            except httpx.HTTPError as exc:
                # no answer came: refused, unresolved, TLS, or cut before the status
                detail = f"{type(exc).__name__}: {exc}"
                reached = False
            else:
                if status == 429 and _budget_spent(start):
                    # a spent chain does not reset with time, nor a spent pair within the
                    # retries (its window runs an hour by default): no retry gets it
                    # through, and one that did would pass with nobody deciding it
                    await self.finish(job, rules.Outcome.DEAD, detail, status)
                    return
        outcome = rules.classify(status)
        await self.finish(job, outcome, detail, status, reached=reached)

    async def finish(
        self,
        job: Job,
        outcome: rules.Outcome,
        detail: str,
        status: int | None,
        *,
        reached: bool = True,
        refused: bool = True,
    ) -> None:
        """Record one attempt's ``outcome``. ``reached``: the other side answered (an
        HTTP status, an A2A agent's word); False when no answer came (a connection
        refused, a name not resolved, TLS, a timeout), which the caller is told as a hub
        it could not reach, not as one that refused. ``refused``: a final ``detail`` is
        the other side's refusal, quoted as such; False when it is a sentence of its own
        (this hub could not send, the other side kept failing, an agent's task ended
        without an answer)."""
        p = dict(job.payload)
        svc = self.callbacks.services.get(str(p.get("service")))
        if svc is not None:  # an error may quote the address (its password) or a token
            detail = outbound.scrub(detail, svc.url, svc.token, p.get("bearer"))
        now = self.clock.now()
        attempt = int(p.get("attempt", 0)) + 1
        if p.get("first_at") is None:  # the first failure since the call last got through
            p["first_at"] = now
        if outcome is rules.Outcome.RETRY:
            at = rules.next_try(self.callbacks.retry, attempt, float(p["first_at"]), now)
            if at is None:
                outcome = rules.Outcome.DEAD
                detail = (
                    f"the other side kept failing: gave up after {attempt} attempts over the "
                    f"retry budget; last: {detail}"
                )
                refused = False
        p["attempt"] = attempt
        p["last"] = detail
        p["reached"] = reached

        def fn(c: Ctx) -> None:
            tx = c.tx
            c.watched(job.team)  # the feed shows the outcome; recipients wake on insert
            if outcome is rules.Outcome.RETRY:
                tx.reschedule_job(job.job_id, at or now, p)
                c.schedule(at or now)
                return
            # a finished POST keeps its record, not its credentials
            tx.reschedule_job(job.job_id, now, _without_secrets(p))
            tx.finish_job(job.job_id, JobState.DONE, now)
            if outcome is rules.Outcome.DONE:
                self.pipeline.post_done(c, job, now)
            else:
                self.pipeline.post_dead(
                    c, job, detail, now, status, reached=reached, refused=refused
                )

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
            await self.env.transact(fn)
        except Exception:
            log.exception(
                "could not record the outcome of POST job %s; it will be retried", job.job_id
            )

    async def answered(self, job: Job, text: str, chain: ChainRef | None = None) -> None:
        """A call that answers inline (an A2A agent) answered ``text`` (in ``chain``, when
        the answer names one): the job is done and the pipeline delivers the answer."""
        now = self.clock.now()

        def fn(c: Ctx) -> None:
            c.tx.finish_job(job.job_id, JobState.DONE, now)
            self.pipeline.post_answered(c, job, text, now, chain)

        await self.env.transact(fn)


def _without_secrets(payload: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` without the bearer token it was sent with, nor a reply token in its body."""
    out = {**payload, "bearer": None}
    body = payload.get("body")
    if isinstance(body, Mapping) and isinstance(body.get("reply"), Mapping):
        reply = {k: v for k, v in body["reply"].items() if k != "bearerToken"}
        out["body"] = {**body, "reply": reply}
    return out


async def _answer_start(resp: httpx.Response) -> str:
    """The start of a refusal, enough for its reason and a budget's error object, read
    without reading the rest (:data:`BUDGET_ERROR_BYTES`)."""
    try:
        raw = await outbound.read_bounded(resp, BUDGET_ERROR_BYTES)
    except outbound.AnswerRefused as exc:
        return f"({exc})"
    except httpx.HTTPError as exc:
        return f"(the answer could not be read: {type(exc).__name__})"
    return raw.decode("utf-8", errors="replace")


def _budget_spent(start: str) -> bool:
    """The other hub refused the request because a conversation budget (its chain's or
    its pair's) is spent (``start``: the start of its answer)."""
    try:
        error = json.loads(start).get("error")
    except (ValueError, AttributeError):
        return False
    return (
        isinstance(error, dict)
        and error.get("code") == "budget_exhausted"
        and error.get("budget") in ("chain", "pair")
    )
