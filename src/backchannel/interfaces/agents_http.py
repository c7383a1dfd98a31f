"""HTTP routes for agent runtimes: hook receivers (``/v1/hooks/{runtime}``) and the MCP
server over streamable HTTP (``/mcp``).

``POST /v1/hooks/{claude-code,codex,gemini}`` takes the runtime's own hook JSON with a
member token and answers with the runtime's own hook output JSON. A payload it cannot
use is answered ``200 {}`` (a broken hook must never block the agent), with the reason
logged and sent back in the ``Backchannel-Hook-Problem`` header. ``?as=TEAM/MEMBER``
makes the call refuse (with no effect) a token of any other member. An answer that
hands messages over names their ids in ``Backchannel-Delivered`` (a JSON list), which the
command hook records for the session (:mod:`backchannel.runtimes.seen`).

``/mcp`` serves the agent tools (:mod:`.mcp`) to the member whose token is in the
``Authorization`` header (resolved like every other call), on the hub this process runs.
It is stateless (each request stands alone, so hub restarts cost clients nothing) and
answers JSON. ``Backchannel-Session: <id>`` names the session the tools act for.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from backchannel.client import Client
from backchannel.errors import BackchannelError, Forbidden, InvalidRequest, ServiceError
from backchannel.hub import Hub
from backchannel.interfaces.http import Auth, principal
from backchannel.interfaces.mcp import (
    ANSWERING,
    CANCELLED,
    Agent,
    Unanswered,
    build_server,
    cancelled_requests,
)
from backchannel.interfaces.strict import parse_runtime_json
from backchannel.models import HookAnswer
from backchannel.runtimes import RUNTIMES
from backchannel.runtimes.common import PROBLEM_HEADER, check_expected
from backchannel.runtimes.receiver import handle_hook
from backchannel.runtimes.seen import DELIVERED_HEADER
from backchannel.types import Member

log = logging.getLogger("backchannel.hooks")

SESSION_HEADER = "Backchannel-Session"
_MEMBER_KEY = "backchannel.member"
_TOKEN_KEY = "backchannel.token"
_SESSION_KEY = "backchannel.session"
#: The JSON-RPC error code of a call the client cancelled while it ran.
REQUEST_CANCELLED = -32800


def tool_call_id(body: bytes) -> Any:
    """The request id of ``body`` when it is one ``tools/call`` (None otherwise)."""
    if b"tools/call" not in body:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict) and value.get("method") == "tools/call":
        ident = value.get("id")
        if isinstance(ident, (int, str)) and not isinstance(ident, bool):
            return ident
    return None


def _header_safe(text: str) -> str:
    return (
        text.encode("ascii", "replace").decode("ascii").replace("\r", " ").replace("\n", " ")[:500]
    )


def mount_agent_routes(app: FastAPI) -> None:
    """Add the hook receivers and the MCP endpoint to ``app``."""
    hub: Hub = app.state.hub

    @app.post(
        "/v1/hooks/{runtime}",
        tags=["hooks"],
        response_model=None,
        responses={200: {"model": HookAnswer}},
    )
    async def hook(
        runtime: Annotated[str, Path(pattern=f"^({'|'.join(RUNTIMES)})$")],
        request: Request,
        who: Auth,
    ) -> JSONResponse:
        """A runtime's hook call: its own hook JSON in, its own hook output JSON out."""
        me = who.need_member()
        if runtime not in RUNTIMES:
            raise InvalidRequest(
                f"unknown runtime {runtime!r}; use one of: {', '.join(RUNTIMES)}",
                field="runtime",
            )
        expect = request.query_params.get("as")
        raw = await request.body()
        try:
            check_expected(me, expect)
            payload: Any = parse_runtime_json(raw)
        except Forbidden as exc:
            return _ignored(me, runtime, exc.message)
        except ValueError as exc:
            return _ignored(me, runtime, f"hook payload is not JSON ({exc})")
        result = await handle_hook(hub, me, runtime, payload)
        headers = {PROBLEM_HEADER: _header_safe(result.problem)} if result.problem else {}
        if result.delivered:  # the command hook records them for the session (runtimes.seen)
            headers[DELIVERED_HEADER] = json.dumps(list(result.delivered))
        return JSONResponse(result.answer, headers=headers)

    endpoint = McpEndpoint(hub)
    app.router.routes.append(Route("/mcp", endpoint=endpoint, include_in_schema=False))
    outer = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with outer(a) as state, endpoint.running():
            yield state

    app.router.lifespan_context = lifespan


def _ignored(member: Member, runtime: str, reason: str) -> JSONResponse:
    log.warning("hook %s from %s/%s had no effect: %s", runtime, member.team, member.name, reason)
    return JSONResponse({}, headers={PROBLEM_HEADER: _header_safe(reason)})


#: The JSON-RPC error code of a request refused before it reached the tools: its token
#: is none, not a member's, or no longer acts for its member (rotated or removed).
REFUSED = -32001


def refusal(exc: BackchannelError) -> dict[str, Any]:
    """A refused ``/mcp`` request's body: a JSON-RPC error, which an MCP client hands its
    caller as it is (the SDK's client puts a bare 401 as "Server returned an error
    response", and the model cannot tell a revoked token from a broken hub). The hub's
    own error is its ``data``; the request's id is not read before the token is checked,
    and is ``null``, which the client matches to the request it made."""
    return {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": REFUSED, "message": exc.message, "data": exc.to_json()["error"]},
    }


#: The largest ``/mcp`` request body read for a ``notifications/cancelled``.
HEARD_MAX = 65_536


class McpEndpoint:
    """``/mcp``: authenticates the member, then hands the request to the MCP SDK's
    streamable-HTTP session manager (which runs while the app's lifespan does)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        #: its send and delegate calls that went unanswered: a client that gave up on
        #: one says so in a request of its own (stateless: the SDK cannot match it)
        self.unanswered = Unanswered()
        self.server = build_server(self._resolve, delegate=True, unanswered=self.unanswered)
        self.manager: StreamableHTTPSessionManager | None = None
        #: the tool calls under way, not answered yet, by (team, member, session,
        #: request id): each one's ``stop``, for a ``notifications/cancelled`` that names it
        self.calling: dict[tuple[Any, ...], list[Callable[[], None]]] = {}

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        manager = StreamableHTTPSessionManager(self.server, json_response=True, stateless=True)
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            if self.manager is None:
                raise ServiceError("the MCP endpoint is not running (the app's lifespan is off)")
            member = (await principal(request)).need_member()
        except BackchannelError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
            await JSONResponse(refusal(exc), exc.status, headers=headers)(scope, receive, send)
            return
        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        inner = {
            **scope,
            _MEMBER_KEY: member,
            _TOKEN_KEY: token,
            _SESSION_KEY: request.headers.get(SESSION_HEADER) or None,
        }
        if scope.get("method") == "POST":
            who = (member.team, member.name, inner[_SESSION_KEY])

            def heard(body: bytes) -> None:
                if CANCELLED.encode() in body:
                    for request in cancelled_requests(body):
                        self.unanswered.cancelled((*who, request))
                        # a call under way that the client gave up on: stopped before
                        # its answer goes out (a check_inbox's would be acked, then
                        # dropped by the client unread); one only, when the request id
                        # names one call (stateless clients' ids repeat)
                        if len(under_way := self.calling.get((*who, request), [])) == 1:
                            under_way[0]()

            await self._unless_gone(self.manager, inner, receive, send, heard, self.calling, who)
        else:
            await self.manager.handle_request(inner, receive, send)

    @staticmethod
    async def _unless_gone(
        manager: StreamableHTTPSessionManager,
        scope: Scope,
        receive: Receive,
        send: Send,
        heard: Callable[[bytes], None] = lambda body: None,
        calling: dict[tuple[Any, ...], list[Callable[[], None]]] | None = None,
        who: tuple[Any, ...] = (),
    ) -> None:
        """Handle a POST, and stop its calls when the client hangs up before the answer:
        the SDK would run them on and write the answer into the closed connection, so
        a ``check_inbox`` would ack messages nobody reads. Stopped, the tool gives back
        what it took (see :func:`.mcp.build_server`). The connection is watched once the
        body has been read, when nothing else reads it."""
        body_read = asyncio.Event()
        body = bytearray()
        answered: list[Callable[[bool], None]] = []  # told whether the answer went out
        written = False  # the answer's last byte was handed to the server
        lost = False  # the client hung up before
        started = False  # the answer's head was handed to the server
        stopped: Any = None  # the id of the tool call the client cancelled under way
        registered: tuple[tuple[Any, ...], Callable[[], None]] | None = None

        def stop(call_id: Any) -> None:
            nonlocal stopped
            if not started and stopped is None:
                stopped = call_id
                handling.cancel()

        async def sending(message: Message) -> None:
            nonlocal written, started
            started = True
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                written = True

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(body) <= HEARD_MAX:
                body.extend(message.get("body", b""))  # a cancel is small: no more is kept
            done = message["type"] != "http.request" or not message.get("more_body", False)
            if done and not body_read.is_set():
                body_read.set()
                if len(body) <= HEARD_MAX:
                    heard(bytes(body))  # what the client said (a cancel of an earlier call)
                    if calling is not None and (call_id := tool_call_id(bytes(body))) is not None:
                        nonlocal registered
                        registered = ((*who, call_id), functools.partial(stop, call_id))
                        calling.setdefault(registered[0], []).append(registered[1])
            return message

        async def client_gone() -> None:
            nonlocal lost
            await body_read.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            lost = not written

        # the calls this request runs take the context it has here (the SDK passes on
        # the context of the task that read the request), and with it ``answered``
        settling = ANSWERING.set(answered)
        try:
            handling = asyncio.ensure_future(manager.handle_request(scope, receiving, sending))
        finally:
            ANSWERING.reset(settling)
        watching = asyncio.ensure_future(client_gone())
        try:
            await asyncio.wait({handling, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            handling.cancel()  # nothing when it is done: the client is gone otherwise
            await asyncio.wait({handling})
            if registered is not None and calling is not None:
                left = calling.get(registered[0], [])
                with contextlib.suppress(ValueError):
                    left.remove(registered[1])
                if not left:
                    calling.pop(registered[0], None)
            for settle in answered:
                settle(written and not lost)
        if stopped is not None and not started and not lost:
            # the client cancelled it and reads no answer; one is owed all the same
            error = {"code": REQUEST_CANCELLED, "message": "the client cancelled this call"}
            refused = {"jsonrpc": "2.0", "id": stopped, "error": error}
            await JSONResponse(refused)(scope, receive, send)
            return
        if not handling.cancelled():
            handling.result()  # its errors, as without the watch

    async def _resolve(self, ctx: Any) -> Agent:
        scope = ctx.request.scope
        member: Member = scope[_MEMBER_KEY]
        client = Client.local(self.hub, scope[_TOKEN_KEY])
        await client.start()
        return Agent(client, member.team, member.name, scope.get(_SESSION_KEY))
