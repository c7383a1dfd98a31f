"""Every member is an A2A agent: ``/a2a/{team}/{member}/`` (needs ``a2a-sdk``).

The agent card is at ``/a2a/{team}/{member}/.well-known/agent-card.json``; it lists two
interfaces, JSON-RPC at ``/a2a/{team}/{member}/`` and HTTP+JSON under the same prefix
(``.../message:send``, ``.../tasks/{id}``), both with streaming. The routes are the
SDK's own (``create_jsonrpc_routes``, ``create_rest_routes``), mounted behind a gate:

* every request, the card included, carries ``Authorization: Bearer <token>`` of a
  member of the same team (the card declares this as its ``bearer`` security scheme).
  No token or a wrong one is 401; an unknown member and another team's member are the
  same 404, so nobody learns of another team;
* the message comes from the member the token belongs to;
* a request that waits (a blocking ``message/send``, a stream) asks again whether its
  token still acts for its member before it hands anything over: a token rotated (or
  its member removed) meanwhile gets 401, or the stream ends with an ``error`` event;
  and it does so at once, not when the answer comes (by another hub process on the
  same store, once this one hears of the rotation).

What a message does to the member is :mod:`.a2a_tasks`. ``mount_a2a(app, open_member=
(team, member, caller))`` lets one member be called without a token, acting as
``caller``; it exists for the conformance kit (which sends no credentials) and is never
used by ``backchannel serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from backchannel.errors import BackchannelError, token_revoked
from backchannel.interfaces.wire import REFUSED, parse_json

if TYPE_CHECKING:
    from fastapi import FastAPI

    from backchannel.hub import Hub

log = logging.getLogger("backchannel.a2a")

PREFIX = "/a2a"
CARD_PATH = "/.well-known/agent-card.json"

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def available() -> bool:
    """Whether ``a2a-sdk`` (the ``a2a`` extra) is installed."""
    try:
        import a2a.server.routes  # noqa: F401
    except ImportError:
        return False
    return True


def mount_a2a(app: FastAPI, *, open_member: tuple[str, str, str] | None = None) -> bool:
    """Serve every member of ``app.state.hub`` as an A2A agent under ``/a2a``. Does
    nothing (and returns False) when ``a2a-sdk`` is not installed."""
    if not available():
        log.debug("a2a-sdk is not installed; no A2A endpoints (pip install 'backchannel[a2a]')")
        return False
    gate = build(app.state.hub, open_member=open_member)
    app.mount(PREFIX, gate)
    outer = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with outer(a) as state:
            try:
                yield state
            finally:
                await gate.close()  # running tasks end; their state stays in the store

    app.router.lifespan_context = lifespan
    return True


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str]
) -> None:
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})


class Gate:
    """Authenticates, resolves ``/{team}/{member}`` and hands over to the SDK's routes."""

    def __init__(
        self, hub: Hub, inner: ASGIApp, handler: Any, open_member: tuple[str, str, str] | None
    ) -> None:
        self.hub = hub
        self.inner = inner
        self.handler = handler
        self.open_member = open_member
        #: Requests whose token was revoked while they waited, answered already, left to
        #: end on their own (held here so they are not collected while they run).
        self._detached: set[asyncio.Future[None]] = set()

    async def close(self) -> None:
        await self.handler.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        from backchannel.interfaces.a2a_tasks import STATE_KEY, Caller

        path: str = scope.get("path", "")
        root = scope.get("root_path", "")
        rest = path[len(root) :] if root and path.startswith(root) else path
        parts = rest.lstrip("/").split("/", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            await self._not_found(send, "use /a2a/{team}/{member}/")
            return
        team, member = parts[0], parts[1]
        given = sum(1 for k, _ in scope.get("headers", []) if k == b"authorization")
        if given > 1:  # which one counts is not guessed: a proxy may have checked another
            await _send_json(
                send,
                401,
                _error(
                    "unauthorized",
                    f"send one Authorization header, not {given}: 'Authorization: Bearer "
                    "<token>' with the token of a member of this team",
                ),
                {"WWW-Authenticate": 'Bearer realm="backchannel"'},
            )
            return
        token = _bearer(scope)
        caller: str | None = None
        digest: str | None = None  # the token's hash, watched while the request runs
        if self.open_member is not None and (team, member) == self.open_member[:2]:
            caller = self.open_member[2]
            token = None  # not the caller's credential: nothing to ask again
        elif token is None:
            await _send_json(
                send,
                401,
                _error(
                    "unauthorized",
                    "missing bearer token: send 'Authorization: Bearer <token>' with the "
                    "token of a member of this team",
                ),
                {"WWW-Authenticate": 'Bearer realm="backchannel"'},
            )
            return
        else:
            who = await self.hub.authenticate(token)
            if who is None:
                await _send_json(
                    send,
                    401,
                    _error("unauthorized", "unknown token: use a member token of this team"),
                    _CHALLENGE,
                )
                return
            if who.team != team:
                await self._not_found(send, f"no A2A agent at /a2a/{team}/{member}")
                return
            caller, digest = who.name, who.token_hash
        try:
            await self.hub.get_member(team, member)
        except BackchannelError:
            await self._not_found(send, f"no A2A agent at /a2a/{team}/{member}")
            return
        ctype = _header(scope, b"content-type")
        jsonrpc = len(parts) < 3 or not parts[2]
        if scope.get("method") == "POST" and ctype and not _is_json(ctype):
            await _unsupported_media(send, ctype, jsonrpc=jsonrpc)
            return
        rpc_id: Any = None
        if scope.get("method") == "POST" and jsonrpc:
            # the SDK's JSON-RPC parser answers a body nested too deep or a number too
            # long as an internal error, with a traceback logged: read it here first
            body = await _body(receive)
            try:
                parsed = parse_json(body)
            except json.JSONDecodeError as exc:
                await _parse_error(send, exc.msg)
                return
            rpc_id = parsed.get("id") if isinstance(parsed, dict) else None
            receive = _replay(body, receive)
        state = scope.setdefault("state", {})
        state[STATE_KEY] = Caller(team, member, caller)
        streaming = ended = started = False
        held: ASGIMessage | None = None  # an HTTP+JSON 400's start, until its body is seen

        async def revoked() -> bool:
            # asked again before an answer or a stream's event is handed over: a
            # blocking send or a stream can outlive a rotation or a removal
            if token is None:
                return False  # the open member (the conformance kit's) needs no token
            who = await self.hub.authenticate(token)
            return who is None or (who.team, who.name) != (team, caller)

        async def guarded(message: ASGIMessage) -> None:
            nonlocal streaming, ended, held, started
            if ended:
                return  # the answer was refused: nothing more of it goes out
            if held is not None and message["type"] == "http.response.body":
                start, held = held, None
                started = True
                await send(_spec_status(start, message))
            elif message["type"] == "http.response.start":
                headers = message.get("headers", [])
                kind = next((bytes(v) for k, v in headers if k == b"content-type"), b"")
                streaming = kind.startswith(b"text/event-stream")
                if not streaming and await revoked():
                    ended = True
                    await _send_json(send, 401, _error("unauthorized", _REVOKED), _CHALLENGE)
                    return
                # HTTP+JSON answers are application/json (spec 1.0.1, section 11.1)
                message["headers"] = [
                    (k, b"application/json" if k == b"content-type" and v == _A2A_JSON else v)
                    for k, v in headers
                ]
                if not jsonrpc and message.get("status") == 400:
                    held = message  # its status may be another (see _spec_status)
                    return
                started = True
            elif streaming and message.get("body") and await revoked():
                ended = True
                await send(_stream_error(rpc_id, jsonrpc))
                return
            await send(message)

        if token is None or digest is None:
            await self.inner(scope, receive, guarded)
            return
        # a request may wait long (a blocking send waits for the member's answer): the
        # token's rotation, or its member's removal, ends it then, by this hub process
        # or another on the same store (Admin.watch_revocation)
        gone = asyncio.Event()
        inner = asyncio.ensure_future(self.inner(scope, receive, guarded))
        with self.hub.watch_revocation(digest, gone, team):
            revocation = asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({inner, revocation}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                inner.cancel()
                raise
            finally:
                revocation.cancel()
        if inner.done() or not await revoked():
            await inner
            return
        # nothing more of the answer goes out (``guarded`` drops it). A stream is
        # cancelled, as a client that went away cancels it (the SDK consumes the task's
        # events on); a blocking send is left to end with its task, as it is for a client
        # that went away (the SDK's wait swallows a cancellation and goes on waiting)
        ended = True
        if streaming:
            inner.cancel()
        self._detached.add(inner)
        inner.add_done_callback(self._detached.discard)
        if not started:
            await _send_json(send, 401, _error("unauthorized", _REVOKED), _CHALLENGE)
        elif streaming:
            await send(_stream_error(rpc_id, jsonrpc))
        else:  # an answer half sent: end it (the client sees it cut short)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _not_found(send: Send, message: str) -> None:
        await _send_json(send, 404, _error("not_found", message), {})


def _stream_error(rpc_id: Any, jsonrpc: bool) -> ASGIMessage:
    """The last body of a stream whose token was revoked: an ``error`` event."""
    error = (
        {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": -32000, "message": _REVOKED}}
        if jsonrpc
        else {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": _REVOKED}}
    )
    event = f"event: error\ndata: {json.dumps(error)}\n\n".encode()
    return {"type": "http.response.body", "body": event, "more_body": False}


_A2A_JSON = b"application/a2a+json"
_REVOKED = token_revoked("the request waited").message
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="backchannel", error="invalid_token"'}


#: HTTP+JSON statuses spec 1.0 section 5.4 gives errors the SDK answers with 400, by the
#: reason in their AIP-193 ``ErrorInfo``.
_STATUS_OF_REASON = {"TASK_NOT_CANCELABLE": 409}


def _spec_status(start: ASGIMessage, body: ASGIMessage) -> ASGIMessage:
    """``start`` of an HTTP+JSON 400 error with the status the spec maps its error to
    (the SDK's table answers ``TaskNotCancelableError`` with 400; section 5.4 says ``409
    Conflict``), rewriting the AIP-193 body's ``code`` alike. Anything else goes out as
    it came."""
    raw = body.get("body", b"")
    if body.get("more_body") or b"_NOT_" not in raw:
        return start
    try:
        payload = json.loads(raw)
        error = payload["error"]
        reasons = [d.get("reason") for d in error.get("details", []) if isinstance(d, dict)]
    except (ValueError, KeyError, TypeError, AttributeError):
        return start
    status = next((_STATUS_OF_REASON[r] for r in reasons if r in _STATUS_OF_REASON), None)
    if status is None:
        return start
    error["code"] = status
    new = json.dumps(payload).encode()
    body["body"] = new
    headers = [
        (k, str(len(new)).encode() if k == b"content-length" else v)
        for k, v in start.get("headers", [])
    ]
    return {**start, "status": status, "headers": headers}


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return bytes(v).decode("latin-1")
    return None


def _is_json(ctype: str) -> bool:
    media = ctype.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def _unsupported_media(send: Send, ctype: str, *, jsonrpc: bool) -> None:
    message = f"Content-Type {ctype!r} is not supported: send application/json"
    if jsonrpc:  # ContentTypeNotSupportedError, whose HTTP status is 415 (spec section 5.4)
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32005, "message": message}}
    else:  # the binding's own error shape (AIP-193), as the SDK writes it
        from a2a.utils.error_handlers import build_rest_error_payload
        from a2a.utils.errors import ContentTypeNotSupportedError

        body = build_rest_error_payload(ContentTypeNotSupportedError(message))
    await _send_json(send, 415, body, {})


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` given first (then the client's disconnect, as before)."""
    given = False

    async def replay() -> ASGIMessage:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _parse_error(send: Send, why: str) -> None:
    message = (
        f"request body refused: {why.removeprefix(REFUSED)}"
        if why.startswith(REFUSED)
        else f"request body is not valid JSON ({why})"
    )
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": message}}
    await _send_json(send, 200, body, {})


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class _RefusedRequestLine(logging.Filter):
    """The SDK's JSON-RPC dispatcher logs a request it cannot read (params of the wrong
    type or range, an envelope without a method) with ``logger.exception``: a traceback in
    the hub's log for every such request a client sends. The client is answered with the
    error (-32602, -32600); the log keeps one warning line naming why."""

    QUIET = frozenset(
        {"Failed to parse request params", "Failed to validate base JSON-RPC request"}
    )

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in self.QUIET and record.exc_info:
            exc = record.exc_info[1]
            record.msg = f"A2A request refused: {record.msg} ({type(exc).__name__}: {exc})"
            record.args = None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _quiet_refused_requests() -> None:
    sdk = logging.getLogger("a2a.server.routes.jsonrpc_dispatcher")
    if not any(isinstance(f, _RefusedRequestLine) for f in sdk.filters):
        sdk.addFilter(_RefusedRequestLine())


def build(hub: Hub, *, open_member: tuple[str, str, str] | None = None) -> Gate:
    """The ASGI app for ``/a2a``: the gate in front of the SDK's routes."""
    _quiet_refused_requests()
    from a2a.server.context import ServerCallContext
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict
    from a2a.server.routes import (
        DefaultServerCallContextBuilder,
        create_jsonrpc_routes,
        create_rest_routes,
    )
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Mount, Route, Router

    from backchannel.interfaces.a2a_tasks import (
        STATE_KEY,
        Caller,
        HubTaskStore,
        MemberRequestHandler,
    )

    class ContextBuilder(DefaultServerCallContextBuilder):
        def build(self, request: Request) -> ServerCallContext:
            ctx = super().build(request)
            ctx.state[STATE_KEY] = request.scope["state"][STATE_KEY]
            return ctx

    tasks = HubTaskStore(hub)
    handler = MemberRequestHandler(
        hub,
        tasks,
        agent_card=member_card("team", "member", "http://localhost/a2a/team/member"),
    )
    builder = ContextBuilder()

    async def card(request: Request) -> Response:
        who: Caller = request.scope["state"][STATE_KEY]
        base = str(request.base_url).rstrip("/")
        c = member_card(
            who.team,
            who.member,
            f"{base}{PREFIX}/{who.team}/{who.member}",
            open_access=open_member is not None and (who.team, who.member) == open_member[:2],
        )
        return JSONResponse(agent_card_to_dict(c))

    member_routes = [
        Route(CARD_PATH, card, methods=["GET"]),
        *create_jsonrpc_routes(handler, "/", context_builder=builder),
        *create_rest_routes(handler, context_builder=builder),
    ]
    router = Router(routes=[Mount("/{team}/{member}", routes=member_routes)])
    return Gate(hub, router, handler, open_member)


def member_card(team: str, member: str, url: str, *, open_access: bool = False) -> Any:
    """The agent card of ``member`` (its interfaces under ``url``)."""
    from a2a.types.a2a_pb2 import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        HTTPAuthSecurityScheme,
        SecurityRequirement,
        SecurityScheme,
        StringList,
    )

    card = AgentCard(
        name=member,
        description=(
            f"Member {member!r} of team {team!r} on a backchannel hub. A message starts a "
            "task the member works on in its own session; its answer is the task's artifact."
        ),
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=url.rstrip("/") + "/", protocol_binding="JSONRPC", protocol_version="1.0"
            ),
            AgentInterface(
                url=url.rstrip("/"), protocol_binding="HTTP+JSON", protocol_version="1.0"
            ),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(
                id="work",
                name="work on a task",
                description=f"{member} works on what you send and answers when its turn ends",
                tags=["backchannel"],
            )
        ],
    )
    if not open_access:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    description="the token of a member of the same team",
                )
            )
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card
