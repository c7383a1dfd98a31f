"""``GET /metrics``: the hub's numbers in the Prometheus text format (the ``metrics``
extra, ``prometheus-client``). Only the admin token may read them.

What happens is counted by a :class:`HubMiddleware` (sends, acks, dead letters) and an
ASGI wrapper (open connections); what *is* (queue depths, link crossings, overdue
timers, outbox retries) is read from the store when scraped. Each scrape has its own
registry of those read values, so a team or member that is gone leaves no stale series.
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from backchannel.core.timers import TIMER_JOB
from backchannel.errors import Unauthorized
from backchannel.hub import Hub, HubMiddleware
from backchannel.hub.outbox import OUTBOX_JOB
from backchannel.interfaces.routes.deps import bearer_token
from backchannel.stores.base import Tx
from backchannel.types import Delivery, Job, Message, SendResult

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

_PENDING_SENDS = 100_000  # sends remembered for the latency histogram; oldest dropped


class MetricsMiddleware(HubMiddleware):
    """Counts as the hub works: latency from send to ack per copy, dead letters."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self.messages = Counter(
            "backchannel_messages_sent", "Messages accepted", ["team", "kind"], registry=registry
        )
        self.latency = Histogram(
            "backchannel_delivery_latency_seconds",
            "From send to the recipient's ack, per copy",
            ["team"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800, 3600),
            registry=registry,
        )
        self.dead = Counter(
            "backchannel_dead_letters", "Copies given up on", ["team"], registry=registry
        )

        # the labelled children, kept: ``labels()`` costs more than the count itself
        self._counts: dict[tuple[str, str], Any] = {}
        self._latencies: dict[str, Any] = {}

    def after_send(self, hub: Hub, message: Message, result: SendResult) -> None:
        key = (message.team, message.kind.value)
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = self.messages.labels(*key)
        count.inc()
        for r in result.recipients:
            self.sent[(message.team, r.member, message.message_id)] = message.created_at
        while len(self.sent) > _PENDING_SENDS:
            self.sent.popitem(last=False)

    def after_ack(self, hub: Hub, team: str, member: str, message_ids: Sequence[str]) -> None:
        now = hub.clock.now()
        latency = self._latencies.get(team)
        if latency is None:
            latency = self._latencies[team] = self.latency.labels(team)
        for mid in message_ids:
            at = self.sent.pop((team, member, mid), None)
            if at is not None:
                latency.observe(max(0.0, now - at))

    def after_dead(self, hub: Hub, delivery: Delivery, reason: str) -> None:
        self.dead.labels(delivery.team).inc()


class OpenConnections:
    """ASGI wrapper: HTTP requests and streams in progress (long polls and SSE included)."""

    def __init__(self, app: ASGIApp, gauge: Gauge) -> None:
        self.app, self.gauge = app, gauge

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        self.gauge.inc()
        try:
            await self.app(scope, receive, send)
        finally:
            self.gauge.dec()


class _TeamCounts(NamedTuple):
    members: list[str]
    pending: dict[str, int]
    crossings: int
    first_due: list[Job]
    retries: int


def _team_counts(tx: Tx, team: str) -> _TeamCounts:
    """What ``/metrics`` shows of ``team``, counted in the store in one read, whatever
    its size: its members with how many copies each has not acked (one count grouped by
    member, from an index of the pending copies alone), its links' crossings (a sum, no
    link read out), its most overdue pending timer (the first by due time: one index
    entry, however many timers wait) and the retries its pending callback posts made
    (summed in the store: a post's payload carries the answer, and none is read out)."""
    return _TeamCounts(
        [m.name for m in tx.list_members(team)],
        tx.pending_counts(team),
        tx.link_crossings(team),
        tx.list_jobs(team, kind=TIMER_JOB, limit=1),
        tx.pending_job_attempts(team, OUTBOX_JOB),
    )


async def snapshot(hub: Hub) -> CollectorRegistry:
    """What the store holds now, as gauges in a fresh registry."""
    reg = CollectorRegistry()
    depth = Gauge(
        "backchannel_queue_depth", "Copies not acked yet", ["team", "member"], registry=reg
    )
    crossings = Gauge(
        "backchannel_link_crossings", "Turn outputs carried over links", ["team"], registry=reg
    )
    lateness = Gauge(
        "backchannel_timer_lateness_seconds",
        "How far past due the most overdue pending timer is (0: none overdue)",
        ["team"],
        registry=reg,
    )
    retries = Gauge(
        "backchannel_outbox_retries",
        "Retries made so far by callback posts still pending",
        ["team"],
        registry=reg,
    )
    down = Gauge(
        "backchannel_push_down",
        "1 for each member whose push target a hub found down (its queued messages "
        "are dead-lettered at once and the next one is sent as a probe)",
        ["team", "member"],
        registry=reg,
    )
    await hub.push_circuits.refresh(0)  # whichever hub found a target down
    for circuit in hub.push_circuits.all():
        down.labels(circuit.team, circuit.member).set(1)
    now = hub.clock.now()
    for team in await hub.list_teams():
        t = team.name
        counts = await hub.store.read(partial(_team_counts, team=t))
        for m in counts.members:
            depth.labels(t, m).set(counts.pending.get(m, 0))
        crossings.labels(t).set(counts.crossings)
        lateness.labels(t).set(max([0.0, *(now - j.due_at for j in counts.first_due)]))
        retries.labels(t).set(counts.retries)
    return reg


def install(app: FastAPI, hub: Hub, admin_token: str) -> None:
    """Add ``GET /metrics`` and the counting hooks to ``app`` and ``hub``."""
    registry = CollectorRegistry()
    hub.middleware.append(MetricsMiddleware(registry))
    connections = Gauge(
        "backchannel_open_connections", "HTTP requests and streams in progress", registry=registry
    )
    started = time.time()
    Gauge("backchannel_start_time_seconds", "When this hub started", registry=registry).set(started)
    app.add_middleware(OpenConnections, gauge=connections)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        how = "metrics need the admin token: Authorization: Bearer <admin token>"
        try:
            given = bearer_token(request.headers.getlist("authorization"), how=how)
        except Unauthorized as exc:
            return JSONResponse(exc.to_json(), status_code=401)
        if not hmac.compare_digest(given.encode(), admin_token.encode()):
            return JSONResponse(
                {"error": {"code": "unauthorized", "message": how}}, status_code=401
            )
        body = generate_latest(registry) + generate_latest(await snapshot(hub))
        return Response(body, media_type=CONTENT_TYPE_LATEST)
