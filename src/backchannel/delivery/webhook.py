"""``webhook``: POST each message to a registered callback service.

Setting::

    {"type": "webhook", "service": "billing-bot"}   # a name in the callback registry, never a URL

The service is resolved through the hub's callback registry (``hub.callbacks``, see
:mod:`backchannel.callbacks`) at every delivery, and the request goes to the fixed path
:data:`DELIVER_PATH` under its base URL, so a member's setting cannot point the hub at an
address of its choosing. Redirects are never followed.

Request::

    POST {service url}/backchannel/deliver
    Content-Type: application/json
    Authorization: Bearer <the service's registered token>      (when it has one)
    X-Backchannel-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
                                                                  (when the hub has a callback secret)
    X-Backchannel-Message-Id, Idempotency-Key: <message_id>
    X-Backchannel-Attempt: <n>

    {"team", "message_id", "from", "to", "session", "kind", "text", "summary",
     "created_at", "attempt", "meta"}

``body`` in the signature is the exact request body. A receiver verifies the HMAC in
constant time, refuses a ``t`` too far from its clock (5 minutes is usual), and drops a
``message_id`` it has seen: a copy is sent again after a crash between the POST and the
hub's record, and after a timeout whose request did arrive.

Outcome: any 2xx is delivered, whatever the body says (the receiver took the message;
its body is not read, however long). Of another answer only its start is read, for the
reason, and an answer sent compressed is not unpacked (:mod:`backchannel.outbound`). Each attempt has the registry's ``timeout`` as a whole (an
answer dribbled out a byte at a time is cut off there too). Connection errors, timeouts, 408, 425, 429 and 5xx are transient:
retried with the registry's capped backoff (``hub.callbacks.retry``; a ``Retry-After``
in seconds is honoured up to the cap) until its budget or the hub's attempts are spent,
then dead-lettered; a connection error or a timeout is ``unreachable``, and a message
given up after one marks the member's push down (:mod:`.circuit`). Any other status, 3xx included, is permanent: dead-lettered at once
with the status and the start of the answer as the reason. An unknown service is
permanent too, with a reason naming the fix.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time

import httpx

from backchannel import outbound
from backchannel.callbacks import Service
from backchannel.core import delegation as rules
from backchannel.delivery.base import (
    Adapter,
    AdapterContext,
    AdapterError,
    PermanentDeliveryError,
)
from backchannel.errors import UnknownService
from backchannel.types import InboxMessage

__all__ = ["DELIVER_PATH", "WebhookAdapter", "sign", "verify"]

#: Where deliveries go under a service's base URL.
DELIVER_PATH = "/backchannel/deliver"
SIGNATURE_HEADER = "X-Backchannel-Signature"


def sign(secret: str, body: bytes, t: int) -> str:
    """The ``X-Backchannel-Signature`` value for ``body`` sent at UNIX time ``t``."""
    mac = hmac.new(secret.encode("utf-8"), f"{t}.".encode() + body, hashlib.sha256)
    return f"t={t},v1={mac.hexdigest()}"


def verify(secret: str, body: bytes, header: str, *, now: float, tolerance: float = 300.0) -> bool:
    """What a receiver does: check ``header`` against ``body`` in constant time and
    refuse a timestamp more than ``tolerance`` seconds from ``now``."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        t = int(fields["t"])
        given = fields["v1"]
    except (ValueError, KeyError):
        return False
    if abs(now - t) > tolerance:
        return False
    expected = sign(secret, body, t).rsplit("v1=", 1)[1]
    return hmac.compare_digest(given, expected)


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: use the policy's delay


class WebhookAdapter(Adapter):
    """See the module docstring. One ``httpx.AsyncClient`` per adapter, so each member's
    deliveries run on their own connections: a slow service never holds another's."""

    type = "webhook"

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        service = ctx.str_option("service")
        if not service:
            raise PermanentDeliveryError(
                f"member {ctx.member!r} has a webhook delivery setting without a 'service'; "
                'set the member\'s delivery to {"type": "webhook", "service": "<registered name>"} '
                "(webhooks name a service from the callback registry, never a URL)"
            )
        self.service = service
        self.retry = ctx.hub.callbacks.retry
        self.attempt_timeout = self.retry.timeout
        self._http: httpx.AsyncClient | None = None

    def describe(self) -> str:
        return f"webhook to service {self.service!r}{DELIVER_PATH}"

    def _resolve(self) -> Service:
        try:
            return self.ctx.hub.callbacks.resolve(self.service)
        except UnknownService as exc:
            raise PermanentDeliveryError(
                f"member {self.ctx.member!r}'s webhook delivery: {exc.message} Fix: register "
                f"{self.service!r} (BACKCHANNEL_CALLBACKS=name=url, or callbacks: in "
                "config.yaml) and restart the hub, or change the member's delivery to a registered "
                "service."
            ) from exc

    async def start(self) -> None:
        self._http = outbound.client(deadline=self.attempt_timeout)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def request(
        self, item: InboxMessage, *, now: float | None = None
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the POST for ``item`` (signed at ``now``)."""
        body = json.dumps(
            {"team": self.ctx.team, **item.to_json()}, ensure_ascii=False, separators=(",", ":")
        ).encode("utf-8")
        mid = item.message.message_id
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "backchannel-webhook/1",
            "X-Backchannel-Message-Id": mid,
            "Idempotency-Key": mid,
            "X-Backchannel-Attempt": str(item.attempt),
        }
        secret = self.ctx.hub.callbacks.secret
        if secret:
            headers[SIGNATURE_HEADER] = sign(secret, body, int(time.time() if now is None else now))
        return body, headers

    async def deliver(self, item: InboxMessage) -> str:
        svc = self._resolve()
        if self._http is None:
            await self.start()
        assert self._http is not None
        body, headers = self.request(item)
        if svc.token:
            headers["Authorization"] = f"Bearer {svc.token}"
        where = f"service {svc.name!r} ({DELIVER_PATH})"
        # httpx's timeout bounds each connect, read and write, not the request: a
        # service that dribbles its answer a byte at a time would hold the member's
        # worker forever. The status within ``attempt_timeout`` is the outcome; the body
        # of a 2xx is never read (a service that sends a gigabyte after its 200, or never
        # ends, took the message all the same: reading on would time out and send it
        # again), and of a refusal only its start, for the reason.
        try:
            request = self._http.build_request(
                "POST",
                svc.endpoint(DELIVER_PATH),
                content=body,
                headers=headers,
                timeout=self.retry.timeout,
            )
            async with asyncio.timeout(self.attempt_timeout):
                resp = await self._http.send(request, stream=True)
        except TimeoutError as exc:
            raise AdapterError(
                f"POST to {where} timed out: no complete answer within "
                f"{self.attempt_timeout:g} s (the callback retry policy's timeout)",
                unreachable=True,
            ) from exc
        except httpx.HTTPError as exc:
            said = outbound.scrub(f"{type(exc).__name__}: {exc}", svc.url, svc.token)
            raise AdapterError(
                f"POST to {where} failed: {said}",
                unreachable=isinstance(exc, httpx.TransportError),
            ) from exc
        try:
            status = resp.status_code
            outcome = rules.classify(status)
            if outcome is rules.Outcome.DONE:
                return f"HTTP {status} from {where}"
            # the reason goes to the sender: an answer that echoes the request keeps
            # the service's token and the password of its address out of it
            snippet = outbound.scrub(await outbound.answer_start(resp), svc.url, svc.token)
        finally:
            await resp.aclose()
        detail = f"HTTP {status} from {where}" + (f": {snippet}" if snippet else "")
        if outcome is rules.Outcome.RETRY:
            raise AdapterError(detail, retry_after=_retry_after(resp))
        if 300 <= status < 400:
            detail += " (redirects are never followed; register the final URL as the service)"
        raise PermanentDeliveryError(detail)
