"""Where a client's calls go: over HTTP to a running hub, or to a hub in this process.

A :class:`Call` is one operation of the API v1, described once for both transports: the
HTTP request (method, path, body, query) and the same operation as a call on the
in-process :class:`~backchannel.member.MemberApi` or :class:`~backchannel.member.AdminApi`.
The client builds calls; a transport carries them. Callers never see which transport
they have.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from backchannel import errors
from backchannel.errors import BackchannelError, Forbidden, PeerError, Unauthorized
from backchannel.member import AdminApi, MemberApi
from backchannel.models import HookResult
from backchannel.reach import loopback, not_the_hub, untrusted_certificate
from backchannel.types import Member

if TYPE_CHECKING:
    from backchannel.hub import Hub

R = TypeVar("R")


class Scope:
    """What an in-process call may use: the caller's member API or the admin API (each
    refused with the same 403 the HTTP API answers), and the hub for the few calls
    that act on it directly."""

    def __init__(self, hub: Hub, member: Member | None) -> None:
        self.hub = hub
        self._member = member

    @property
    def is_admin(self) -> bool:
        return self._member is None

    @property
    def member(self) -> MemberApi:
        if self._member is None:
            raise Forbidden(
                "this call acts as a member; use a member token (the admin token manages "
                "teams and members only)"
            )
        return MemberApi(self.hub, self._member)

    @property
    def admin(self) -> AdminApi:
        if self._member is not None:
            raise Forbidden("this call needs the administrator: connect without a member token")
        return AdminApi(self.hub)

    def need_team(self, team: str) -> None:
        if self._member is not None and self._member.team != team:
            raise errors.UnknownTeam(f"unknown team {team!r}", team=team)


@dataclass(frozen=True)
class Call(Generic[R]):
    """One operation: ``local`` runs it in-process; the rest says it over HTTP, and
    ``model`` reads the answer (``None``: the answer is ``parse``'s)."""

    method: str
    path: str
    local: Callable[[Scope], Awaitable[R]]
    model: type[BaseModel] | None = None
    json: Any = None
    params: dict[str, Any] | None = None
    wait: float = 0.0
    token: str | None = None  # another bearer token for this one call
    parse: Callable[[httpx.Response], R] | None = None
    #: Made twice, the call means what it meant once (a read, an ack, a send under its
    #: ``message_id``, an event or a timer under its ``request_id``, a delegation under
    #: its ``tool_use_id``, an open under its session id): made again when its answer
    #: was lost on the way (see :class:`HttpTransport`).
    repeatable: bool = False
    #: A call that leases (a receive): when its caller is cancelled (a task cancel,
    #: Ctrl-C in a sync client) once the hub's answer began to arrive, the answer is read
    #: to its end anyway and handed to this, which gives back what the caller never got
    #: (at once, not at the end of the lease; see :meth:`HttpTransport.call`).
    given_back: Callable[[R], Awaitable[Any]] | None = None


@dataclass(frozen=True)
class Stream(Generic[R]):
    """A server-sent event stream, read item by item."""

    path: str
    local: Callable[[Scope], AsyncIterator[R]]
    model: type[BaseModel]
    params: dict[str, Any] = field(default_factory=dict)
    #: over HTTP, how long (seconds) the stream is opened again, with ``Last-Event-ID``,
    #: while the way to the hub fails (a hub restarting, a connection cut); ``None``: a
    #: failure ends it at once
    reconnect_within: float | None = None


class Transport:
    """Carries calls. ``start`` before the first, ``close`` after the last."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def call(self, call: Call[R]) -> R:
        raise NotImplementedError

    def stream(self, stream: Stream[R]) -> AsyncIterator[R]:
        raise NotImplementedError


class LocalTransport(Transport):
    """A hub in this process. ``token=None`` acts as the administrator. ``own_hub``: the
    hub is started and closed with the transport."""

    def __init__(self, hub: Hub, token: str | None, *, own_hub: bool) -> None:
        self._hub = hub
        self._token = token
        self._own = own_hub
        self._me: Member | None = None
        #: the hub's token generation when ``_me`` was last looked up
        self._seen = -1

    async def start(self) -> None:
        await self._hub.start()
        if self._token is not None:
            self._seen = self._hub.members.token_generation
            self._me = await self._hub.authenticate(self._token)
            if self._me is None:
                raise Unauthorized("invalid token: no member of any team has it")

    async def close(self) -> None:
        if self._own:
            await self._hub.close()

    async def _scope(self) -> Scope:
        """The caller as the hub knows it now. The member is looked up again whenever the
        hub forgot its cached tokens since the last look (a rotation, a removal, by this
        process or, once it hears, by another on the same store): a call with a token
        that stopped working is refused, and nothing is looked up while none changed."""
        if self._token is not None:
            if self._me is None:
                raise Unauthorized("the client is not started: use `async with` or start()")
            members = self._hub.members
            if members.token_generation != self._seen:
                seen = members.token_generation
                me = await members.member_of_token(self._me.token_hash)
                if me is None:
                    raise Unauthorized(
                        "this token was rotated or its member removed; use the new token"
                    )
                self._me, self._seen = me, seen
        return Scope(self._hub, self._me)

    async def call(self, call: Call[R]) -> R:
        return await call.local(await self._scope())

    async def stream(self, stream: Stream[R]) -> AsyncIterator[R]:
        async for item in stream.local(await self._scope()):
            yield item


_ERRORS: dict[str, type[BackchannelError]] = {
    cls.code: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, BackchannelError)
}


def raise_for(resp: httpx.Response) -> None:
    """The hub's error answer as the exception it stands for."""
    if resp.status_code < 400:
        return
    try:
        body = resp.json()["error"]
        code, message = body.pop("code"), body.pop("message")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise PeerError(
            f"hub answered {resp.status_code} without a backchannel error body: "
            f"{not_the_hub(resp.status_code, resp.content[:2000])}"
        ) from None
    raise _ERRORS.get(code, BackchannelError)(message, **body)


def _raise_streamed(body: Any) -> None:
    """An event stream's ``event: error`` as the exception it stands for."""
    try:
        error = dict(body["error"])
        code, message = error.pop("code"), error.pop("message")
    except (KeyError, TypeError, ValueError):
        raise PeerError(
            f"hub ended the stream with an error it did not name: {body!r}"[:300]
        ) from None
    raise _ERRORS.get(code, BackchannelError)(message, **error)


#: How long a call is made again while the way to the hub fails (a hub restarting, a
#: proxy that cut the connection), and the longest pause between two tries.
RETRY_WITHIN = 10.0
RETRY_PAUSE_MAX = 2.0


def _seconds(value: object, *, infinite: bool = False) -> bool:
    """``value`` is a number of seconds (not a bool, not NaN; infinite if allowed)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return False
    return infinite or math.isfinite(value)


def _retry_after(resp: httpx.Response) -> float | None:
    """The pause a 503, or a 429 that says how long to wait, asks for (a 429 without
    ``Retry-After`` is the hub's budget or quota: trying again changes nothing). A 502
    or 504 that is not the hub's own JSON answer is a reverse proxy's while the hub
    behind it restarts: tried again as a bare 503 is."""
    value = resp.headers.get("Retry-After")
    if resp.status_code in (502, 504) and not resp.headers.get("content-type", "").startswith(
        "application/json"
    ):
        return 0.0
    if resp.status_code == 503 or (resp.status_code == 429 and value is not None):
        try:
            return max(float(value or 0), 0.0)
        except ValueError:
            return 1.0  # an HTTP date: wait as for a bare 503
    return None


class HttpTransport(Transport):
    """A hub over its HTTP API v1 (``transport``: httpx's, e.g. ``httpx.ASGITransport``
    or ``httpx.MockTransport`` in tests).

    A call that failed to connect never reached the hub and is made again, pausing
    (0.2 s, doubling up to :data:`RETRY_PAUSE_MAX`) for up to ``retry_within`` s
    (:data:`RETRY_WITHIN` unless said; the CLI, which a person waits on, says 1). A
    :attr:`Call.repeatable` call (and any GET) is also made again when the connection broke after the
    request went out (the hub may have done it: a send then answers ``replayed``, never a
    second message) and on a 503 or a 429 with ``Retry-After`` (after that pause), or a
    reverse proxy's 502 or 504 (a hub restarting behind it). Any
    other call whose answer was lost raises :class:`PeerError`: made twice it could do
    twice what it did (a member added twice, a removal answered 404).

    ``timeout`` (seconds, above 0) is how long one try waits for the hub's answer, past
    the ``wait`` a long-poll asks for; connecting waits 5 s at most."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retry_within: float = RETRY_WITHIN,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not _seconds(timeout) or timeout <= 0:
            raise errors.InvalidRequest(
                f"timeout must be a number of seconds above 0 (how long a call waits for "
                f"the hub's answer, past any wait it asks for), not {timeout!r}",
                field="timeout",
            )
        if not _seconds(retry_within, infinite=True) or retry_within < 0:
            raise errors.InvalidRequest(
                f"retry_within must be a number of seconds from 0 (how long a call is "
                f"made again while the way to the hub fails), not {retry_within!r}",
                field="retry_within",
            )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retry_within = retry_within
        self.timeout = float(timeout)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            transport=transport or direct_transport(self.url),
        )

    async def close(self) -> None:
        await self._http.aclose()

    def _unreachable(self, exc: Exception) -> PeerError:
        if (why := untrusted_certificate(exc)) is not None:
            return PeerError(f"the hub at {self.url} was not used: {why}")
        return PeerError(
            f"cannot reach the hub at {self.url}: {exc}; is `backchannel serve` running?"
        )

    def _lost(self, call: Call[Any], exc: Exception) -> PeerError:
        return PeerError(
            f"the answer to {call.method} {call.path} was lost on the way back from the hub "
            f"at {self.url} ({exc}): the hub may have done it. This call is not made again "
            "by itself (made twice it could do twice what it did); look at what it changes "
            "before you make it again"
        )

    def _lost_again(self, call: Call[Any], exc: Exception) -> PeerError:
        return PeerError(
            f"the answer to {call.method} {call.path} was lost on the way back from the hub "
            f"at {self.url}, and the tries made again within {self.retry_within:g} s got "
            f"none either ({exc or type(exc).__name__}): the hub may have done it"
        )

    async def call(self, call: Call[R]) -> R:
        # a long-poll holds its answer for up to ``wait``: the hub checks the value, and
        # one that is no time (NaN, negative) adds none here so that the hub's refusal
        # comes back
        held = call.wait if _seconds(call.wait) and call.wait > 0 else 0.0
        timeout = httpx.Timeout(held + self.timeout, connect=min(self.timeout, 5.0))
        headers = {"Authorization": f"Bearer {call.token}"} if call.token else None
        # a GET reads (a receive leases: made again, what the lost answer held comes
        # back after its lease, late but once)
        repeatable = call.repeatable or call.method == "GET"
        until = time.monotonic() + self.retry_within
        pause = 0.2
        went_out = False  # a try of a call that changes something reached the hub
        while True:
            try:
                request = self._http.build_request(
                    call.method,
                    call.path,
                    json=call.json,
                    params=call.params,
                    headers=headers,
                    timeout=timeout,
                )
                resp = await self._answer(call, request)
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if not (never_sent or repeatable):
                    raise self._lost(call, exc) from exc
                if untrusted_certificate(exc) is not None:  # the same the next time
                    raise self._unreachable(exc) from exc
                went_out = went_out or not (never_sent or call.method == "GET")
                if time.monotonic() + pause > until:
                    # not "cannot reach the hub" when a try reached it: the caller must
                    # hear that the call may be done before making it again
                    if went_out:
                        raise self._lost_again(call, exc) from exc
                    raise self._unreachable(exc) from exc
            else:
                asked = _retry_after(resp) if repeatable else None
                if asked is None or time.monotonic() + min(asked, RETRY_PAUSE_MAX) > until:
                    break
                pause = max(pause, min(asked, RETRY_PAUSE_MAX))
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_MAX)
        return self._read(call, resp)

    @staticmethod
    def _read(call: Call[R], resp: httpx.Response) -> R:
        if call.parse is not None:
            return call.parse(resp)
        raise_for(resp)
        assert call.model is not None
        got: R = call.model.model_validate(resp.json())  # type: ignore[assignment]
        return got

    async def _answer(self, call: Call[Any], request: httpx.Request) -> httpx.Response:
        """The hub's whole answer to ``request``. For a call that leases
        (:attr:`Call.given_back`), a cancel that lands once the answer's head came (the
        hub leased and wrote its messages; the body is still on its way) no longer
        drops it, which left its messages leased to nobody until the lease ended (each
        such a delivery attempt): the body is read to its end all the same (within the
        call's timeout), what it holds is given back, and the cancel goes on. A cancel
        before the head came closes the connection, which the hub takes as the receiver
        gone (it gives back what it had not written yet)."""
        resp = await self._http.send(request, stream=True)
        if call.given_back is None:
            await _read_closed(resp)
            return resp
        reading = asyncio.ensure_future(_read_closed(resp))
        try:
            await asyncio.shield(reading)
        except asyncio.CancelledError:
            await _give_back(call, resp, reading, self.timeout)
            raise
        return resp

    async def stream(self, stream: Stream[R]) -> AsyncIterator[R]:
        """The events of ``stream``. With :attr:`Stream.reconnect_within`, a connection
        that fails (refused, cut, a 503 or a proxy's 502 or 504 while the hub restarts,
        a stream the hub ended as it stopped) is opened again with ``Last-Event-ID``
        set to the ``id:`` of the last whole event read, after a pause that grows (0.2
        s, doubling up to :data:`RETRY_PAUSE_MAX`): the hub goes on right after it, so
        no event comes twice and none is lost. It gives up, with the cursor to go on
        from, once it has failed for ``reconnect_within`` s without an event between."""
        within = stream.reconnect_within
        last: str | None = None  # the id: of the last whole event handed over
        pause, failing_since = 0.2, None
        while True:
            headers = {"Last-Event-ID": last} if last is not None else None
            try:
                async for item, cursor in self._stream_once(stream, headers):
                    last = cursor if cursor is not None else last
                    pause, failing_since = 0.2, None
                    yield item
                why: Exception = PeerError("the hub ended the stream")
            except _Again as exc:
                why = exc
            except httpx.TransportError as exc:
                if within is None or untrusted_certificate(exc) is not None:
                    raise self._unreachable(exc) from exc
                why = exc
            if within is None:
                return
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            if now + pause - failing_since > within:
                resume = f"; go on with after={last}" if last is not None else ""
                raise PeerError(
                    f"the event stream from the hub at {self.url} could not be opened "
                    f"again within {within:g} s ({why}){resume}"
                ) from (why if isinstance(why, httpx.TransportError) else None)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_MAX)

    async def _stream_once(
        self, stream: Stream[R], headers: dict[str, str] | None
    ) -> AsyncIterator[tuple[R, str | None]]:
        """One connection's whole events, each with its ``id:`` (None if it has none)."""
        async with self._http.stream(
            "GET", stream.path, params=stream.params, headers=headers, timeout=None
        ) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                if stream.reconnect_within is not None and _retry_after(resp) is not None:
                    raise _Again(f"the hub answered {resp.status_code}")
                raise_for(resp)
            # an event is dispatched at the blank line that ends it (as an EventSource
            # does): one cut off by a dropped connection is not read
            name, data, cursor = "", "", None
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("id: "):
                    cursor = line[4:].strip()
                elif line.startswith("data: "):
                    data = line[6:]
                elif not line and data:
                    # the stream's end, with the hub's reason; or events it will never
                    # send (retention removed them): the caller reads state again
                    if name in ("error", "skipped"):
                        _raise_streamed(json.loads(data))
                    item: R = stream.model.model_validate(json.loads(data))  # type: ignore[assignment]
                    yield item, cursor
                    name, data, cursor = "", "", None
                elif not line:
                    name, cursor = "", None


async def _read_closed(resp: httpx.Response) -> None:
    try:
        await resp.aread()
    finally:
        await resp.aclose()


async def _give_back(
    call: Call[Any], resp: httpx.Response, reading: asyncio.Future[None], within: float
) -> None:
    """The answer of ``call``, whose caller was cancelled while it was read, handed to
    :attr:`Call.given_back` once read whole (a second cancel, a body that does not come
    within ``within`` s, or an answer that is not the call's: nothing to give back; its
    messages come back at the lease's end)."""
    assert call.given_back is not None
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(reading), within)
        if resp.status_code < 400:
            await call.given_back(HttpTransport._read(call, resp))
    if not reading.done():
        reading.cancel()


class _Again(Exception):
    """A stream's connection the hub refused for now (it restarts): opened again."""


def direct_transport(url: str) -> httpx.AsyncHTTPTransport | None:
    """A transport that goes to the hub at ``url`` itself, past any proxy the environment
    names, when that hub is on this machine (:func:`backchannel.reach.loopback`);
    ``None`` (httpx's own, which honours ``HTTP_PROXY`` and ``NO_PROXY``) for a hub
    elsewhere. The certificates the environment names (``SSL_CERT_FILE``) still count."""
    return httpx.AsyncHTTPTransport() if loopback(url) else None


def hub_request(method: str, url: str, **options: Any) -> httpx.Response:
    """One blocking request to a hub (the CLI's checks), past any proxy when the hub is
    on this machine, as :func:`direct_transport` says."""
    transport = httpx.HTTPTransport() if loopback(url) else None
    with httpx.Client(transport=transport) as http:
        return http.request(method, url, **options)


def hook_result(resp: httpx.Response) -> HookResult:
    """A hook call's answer over HTTP: the runtime's JSON, the problem and the ids it
    hands over from their headers."""
    from backchannel.runtimes.common import PROBLEM_HEADER
    from backchannel.runtimes.seen import DELIVERED_HEADER, delivered_ids

    try:
        answer = resp.json()
    except ValueError:
        answer = None
    if resp.status_code >= 400:
        raise_for(resp)
    if not isinstance(answer, dict):
        return HookResult(answer={}, problem=resp.headers.get(PROBLEM_HEADER))
    return HookResult(
        answer=answer,
        problem=resp.headers.get(PROBLEM_HEADER),
        delivered=delivered_ids(resp.headers.get(DELIVERED_HEADER)),
    )
