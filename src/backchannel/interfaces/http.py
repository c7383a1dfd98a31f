"""HTTP API v1 (FastAPI). It only translates requests to :class:`Hub` calls and back.

Auth: ``Authorization: Bearer <token>``. The admin token manages teams and members; a
member token acts as that member, and the sender of a message is always the member
the token belongs to. A member never learns of another team: every team-scoped path
answers 404 for another team, exactly as for a team that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from backchannel.core.timers import DEFAULT_ANCHOR_MINUTES
from backchannel.core.timers import MAX_SECONDS as MAX_TIMER_SECONDS
from backchannel.errors import (
    BackchannelError,
    Forbidden,
    InvalidRequest,
    TooLarge,
    Unauthorized,
    UnknownTeam,
)
from backchannel.hub import FeedItem, Hub, session_json
from backchannel.interfaces.wire import (
    MAX_INT,
    NAME_SHAPES,
    REFUSED,
    REPLAYED,
    SHAPES,
    TO_PATTERN,
    IdField,
    ItemId,
    JsonObject,
    JsonValue,
    MemberName,
    MemberQuery,
    MessageId,
    NameField,
    SessionField,
    SessionId,
    SessionQuery,
    StrictRoute,
    TeamName,
    body_limit,
    document_errors,
)
from backchannel.types import Member, MemberKind

log = logging.getLogger("backchannel.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the administrator, or one member of one team."""

    member: Member | None

    @property
    def is_admin(self) -> bool:
        return self.member is None

    def need_member(self) -> Member:
        if self.member is None:
            raise Forbidden(
                "this call acts as a member; use a member token (the admin token manages "
                "teams and members only)"
            )
        return self.member

    def need_admin(self) -> None:
        if self.member is not None:
            raise Forbidden("this call needs the admin token (from $BACKCHANNEL_HOME/admin.token)")

    def need_team(self, team: str) -> None:
        """Admins see every team; a member only its own (others look nonexistent)."""
        if self.member is not None and self.member.team != team:
            raise UnknownTeam(f"unknown team {team!r}", team=team)


# -- request bodies ---------------------------------------------------------------


_M = TypeVar("_M", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TeamIn(_Body):
    name: NameField = Field(description="team name: letters, digits, '_' or '-', at most 64")
    settings: JsonObject = Field(default_factory=dict)


class MemberIn(_Body):
    name: NameField
    kind: MemberKind = MemberKind.LLM
    delivery: JsonObject = Field(default_factory=dict)
    settings: JsonObject = Field(default_factory=dict)


class MemberPatch(_Body):
    delivery: JsonObject | None = None
    settings: JsonObject | None = None


class MessageIn(_Body):
    # a broadcast can neither name one session of its recipients nor close a link
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "not": {
                        "required": ["to", "session"],
                        "properties": {"to": {"const": "*"}, "session": {"type": "string"}},
                    }
                },
                {
                    "not": {
                        "required": ["to", "close_link"],
                        "properties": {"to": {"const": "*"}, "close_link": {"const": True}},
                    }
                },
            ]
        }
    )
    to: str = Field(
        pattern=TO_PATTERN, description="a member name, or '*' for every member but you"
    )
    text: str
    summary: str | None = None
    message_id: IdField | None = Field(None, description="your id for idempotent retries")
    session: SessionField | None = Field(
        None, description="deliver to this session of the recipient only"
    )
    from_session: SessionField | None = Field(
        None, description="your session that is sending (its turn)"
    )
    close_link: bool = Field(False, description="deliver, then close your open link with them")
    link: bool = Field(True, description="open a link to the recipient if none is open")
    link_budget: int | None = Field(None, ge=1, le=1000, description="turns for a new link")


class AckIn(_Body):
    message_ids: list[IdField] = Field(min_length=1, max_length=1000)


class SessionIn(_Body):
    session_id: SessionField | None = None


class EventIn(_Body):
    kind: Literal[
        "turn_start", "thought", "tool_call", "tool_result", "agent_output", "agent_stop"
    ] = Field(description="turn_start, thought, tool_call, tool_result, agent_output or agent_stop")
    text: str = ""
    data: JsonObject = Field(default_factory=dict)


class TerminateIn(_Body):
    reason: str = ""


class ReactionIn(_Body):
    emoji: str = Field(min_length=1, max_length=32)


class DelegateIn(_Body):
    to: str = Field(description="a member, or agent@service for an agent on another hub")
    task: str = Field(pattern=r"\S", description="what the callee should do")
    timeout_s: float | None = Field(None, ge=1, le=86400)
    tool_use_id: IdField | None = None
    session: SessionField | None = Field(None, description="your session [your only open turn]")


class ReplyRoute(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    callbackService: str
    bearerToken: str


class ChatIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    agent: NameField
    message: str
    reply: ReplyRoute
    session_id: SessionField | None = None
    tool_use_id: IdField | None = None
    timeout_s: float | None = Field(None, ge=1, le=86400)


class ToolResponseIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    result: JsonValue


def _duration(unit: float, what: str) -> Any:
    """A positive number of ``unit`` seconds up to the longest timer; null is refused
    (leave the field out instead), so the schema need not allow it."""
    top = MAX_TIMER_SECONDS / unit
    schema = {"type": "number", "exclusiveMinimum": 0, "maximum": top, "description": what}
    return Annotated[
        float | None,
        Field(gt=0, le=top),
        BeforeValidator(_not_null),
        WithJsonSchema(schema),
    ]


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("give a number, or leave the field out")
    return value


class TimerIn(_Body):
    # at most one of minutes and seconds (an anchor without either is due in the default
    # time); check and wait name their peer and one of the two
    model_config = ConfigDict(
        json_schema_extra={
            "not": {"required": ["minutes", "seconds"]},
            "if": {"required": ["intent"], "properties": {"intent": {"enum": ["check", "wait"]}}},
            "then": {
                "required": ["target"],
                "properties": {"target": {"type": "string"}},
                "anyOf": [{"required": ["minutes"]}, {"required": ["seconds"]}],
            },
        }
    )
    intent: Literal["anchor", "check", "wait"] = Field(
        description="anchor (return to your task), check (look at a peer), wait (see whether a peer replied)"
    )
    minutes: _duration(60, "due in this many minutes (an anchor: 10 when not given)") = None  # type: ignore[valid-type]
    seconds: _duration(1, "or in this many seconds") = None  # type: ignore[valid-type]
    note: str = Field(
        pattern=r"\S", max_length=2000, description="the breadcrumb you will read when it fires"
    )
    target: NameField | None = Field(None, description="the peer, for check and wait")
    session: SessionField | None = Field(None, description="your session [your only open one]")


# -- the app ------------------------------------------------------------------------


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 before reading them whole."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _send_error(send, self._error(int(value)))
                return
        seen = 0
        too_large: TooLarge | None = None

        async def limited() -> Message:
            nonlocal seen, too_large
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit and too_large is None:
                    too_large = self._error(seen, complete=not msg.get("more_body", False))
                    raise _BodyTooLarge(too_large)
            return msg

        replaced = False

        async def guarded_send(msg: Message) -> None:
            # whatever the app makes of the aborted read, the caller is told 413
            nonlocal replaced
            if too_large is None:
                await send(msg)
            elif not replaced:
                replaced = True
                await _send_error(send, too_large)

        try:
            await self.app(scope, limited, guarded_send)
        except _BodyTooLarge as exc:
            if not replaced:
                await _send_error(send, exc.error)

    def _error(self, size: int, *, complete: bool = True) -> TooLarge:
        # a chunked body is refused as soon as it passes the limit: its size is unknown
        said = (
            f"is {size} bytes" if complete else f"is at least {size} bytes (refused as it arrived)"
        )
        return TooLarge(
            f"request body {said}, over the {self.limit}-byte limit; send less per request "
            "(a message text may hold up to the hub's text limit in UTF-8 bytes)",
            limit=self.limit,
        )


class _BodyTooLarge(Exception):
    def __init__(self, error: TooLarge) -> None:
        self.error = error


async def _send_error(send: Send, error: BackchannelError) -> None:
    body = json.dumps(error.to_json()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _error_response(error: BackchannelError, headers: dict[str, str] | None = None) -> JSONResponse:
    if error.status == 503:
        headers = {**(headers or {}), "Retry-After": "1"}
    return JSONResponse(error.to_json(), status_code=error.status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx", {})
            why = str(ctx.get("error", ""))
            if why.startswith(REFUSED):
                return f"request body refused: {why.removeprefix(REFUSED)}", []
            return (
                f"request body is not valid JSON ({ctx.get('error', 'parse error')}); "
                "send a JSON object with Content-Type: application/json",
                [],
            )
        if not loc and err.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            return (
                "request body must be a JSON object; send one with Content-Type: application/json",
                [],
            )
        problem = err.get("msg", "invalid")
        if err.get("type") == "string_pattern_mismatch":
            pattern = err.get("ctx", {}).get("pattern", "")
            shape = SHAPES.get(pattern, f"must match {pattern}")
            problem = f"{_clip(repr(err.get('input')))} is not valid: {shape}"
        problems.append({"field": loc or "body", "problem": problem})
    text = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
    return f"invalid request: {text}", problems


def _clip(text: str, size: int = 80) -> str:
    return text if len(text) <= size else text[: size - 3] + "..."


async def principal(request: Request) -> Principal:
    """Resolve the bearer token to the administrator or a member (constant-time compare)."""
    hub: Hub = request.app.state.hub
    admin_token: str = request.app.state.admin_token
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "missing bearer token: send 'Authorization: Bearer <token>' with a member token "
            "(from `backchannel member add`) or the admin token ($BACKCHANNEL_HOME/admin.token)"
        )
    if hmac.compare_digest(token.encode(), admin_token.encode()):
        return Principal(None)
    member = await hub.authenticate(token)
    if member is None:
        raise Unauthorized("invalid token: it belongs to no member and is not the admin token")
    return Principal(member)


Auth = Annotated[Principal, Depends(principal)]


def create_app(
    hub: Hub,
    admin_token: str,
    *,
    max_body: int | None = None,
    title: str = "backchannel",
) -> FastAPI:
    """The ASGI app serving the API for ``hub``."""
    limit = max_body if max_body is not None else body_limit(hub.config.max_text)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await hub.start()
        yield

    app = FastAPI(
        title=title,
        version="1",
        summary="A durable message hub for teams of AI agents",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.router.route_class = StrictRoute  # strict JSON bodies on every route added below
    app.state.hub = hub
    app.state.admin_token = admin_token

    @app.exception_handler(BackchannelError)
    async def on_error(request: Request, exc: BackchannelError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("%s %s failed: %s", request.method, request.url.path, exc.message)
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, problems = _validation_message(exc)
        names = any(
            e.get("type") == "string_pattern_mismatch"
            and e.get("ctx", {}).get("pattern") in NAME_SHAPES
            for e in exc.errors()
        )
        code = "invalid_name" if names else "invalid_request"
        body = {"error": {"code": code, "message": message, "problems": problems}}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = (
            f"no such endpoint {request.method} {request.url.path}; see /openapi.json"
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # every method the path takes (starlette names only the first route's)
            allowed: set[str] = set()
            for route in request.app.router.routes:
                if route.matches(request.scope)[0] != Match.NONE:
                    allowed |= getattr(route, "methods", None) or set()
            headers["Allow"] = ", ".join(sorted(allowed))
        return JSONResponse(
            {"error": {"code": code, "message": message}},
            status_code=exc.status_code,
            headers=headers,
        )

    @app.get("/healthz", tags=["meta"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/me", tags=["meta"])
    async def me(who: Auth) -> dict[str, Any]:
        if who.member is None:
            return {"admin": True, "team": None, "name": None}
        m = who.member
        return {"admin": False, "team": m.team, "name": m.name, "kind": m.kind.value}

    # -- teams and members -------------------------------------------------------
    @app.post("/v1/teams", status_code=201, tags=["teams"])
    async def create_team(body: TeamIn, who: Auth) -> dict[str, Any]:
        who.need_admin()
        team, token = await hub.create_team(body.name, settings=body.settings)
        return {"name": team.name, "created_at": team.created_at, "user_token": token}

    @app.get("/v1/teams", tags=["teams"])
    async def list_teams(who: Auth) -> dict[str, Any]:
        if who.member is not None:
            names = [who.member.team]
        else:
            names = [t.name for t in await hub.list_teams()]
        return {"teams": [{"name": n} for n in names]}

    @app.post("/v1/teams/{team}/members", status_code=201, tags=["teams"])
    async def add_member(team: TeamName, body: MemberIn, who: Auth) -> dict[str, Any]:
        who.need_admin()
        member, token = await hub.add_member(
            team, body.name, body.kind, delivery=body.delivery, settings=body.settings
        )
        return {"name": member.name, "team": member.team, "kind": member.kind.value, "token": token}

    @app.patch("/v1/teams/{team}/members/{name}", tags=["teams"])
    async def update_member(
        team: TeamName, name: MemberName, body: MemberPatch, who: Auth
    ) -> dict[str, Any]:
        """Change a member's delivery setting or settings (admin)."""
        who.need_admin()
        m = await hub.update_member(team, name, delivery=body.delivery, settings=body.settings)
        return {
            "name": m.name,
            "team": m.team,
            "kind": m.kind.value,
            "delivery": dict(m.delivery),
            "settings": dict(m.settings),
        }

    @app.get("/v1/teams/{team}/members", tags=["teams"])
    async def list_members(team: TeamName, who: Auth) -> dict[str, Any]:
        who.need_team(team)
        members = await hub.list_members(team)
        states = await hub.member_states(team)  # from Claude Code inbox traffic
        return {
            "members": [
                {
                    "name": m.name,
                    "kind": m.kind.value,
                    "created_at": m.created_at,
                    **({"presence": states[m.name]} if m.name in states else {}),
                }
                for m in members
            ]
        }

    # -- messages ----------------------------------------------------------------
    @app.post("/v1/messages", status_code=201, tags=["messages"], responses=REPLAYED)
    async def send(body: MessageIn, who: Auth) -> JSONResponse:
        me = who.need_member()
        result = await hub.send(
            me.team,
            me.name,
            body.to,
            body.text,
            summary=body.summary,
            message_id=body.message_id,
            to_session=body.session,
            sender_session=body.from_session,
            link=body.link,
            close_link=body.close_link,
            link_budget=body.link_budget,
        )
        return JSONResponse(result.to_json(), status_code=200 if result.replayed else 201)

    @app.get("/v1/messages/{message_id}", tags=["messages"])
    async def message_status(message_id: MessageId, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        status = await hub.message_status(me.team, message_id, viewer=me.name)
        return status.to_json()

    @app.get("/v1/inbox", tags=["inbox"])
    async def inbox(
        who: Auth,
        request: Request,
        wait: Annotated[
            float, Query(ge=0, le=3600, description="seconds to wait for the first")
        ] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 10,
        session: SessionQuery = None,
        lease: Annotated[float | None, Query(gt=0, le=86400)] = None,
        pinned_only: bool = False,
    ) -> dict[str, Any]:
        me = who.need_member()
        gone = asyncio.Event()

        async def watch_client() -> None:
            # a long-poll whose client went away must not lease messages nobody reads
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch_client()) if wait > 0 else None
        try:
            got = await hub.receive(
                me.team,
                me.name,
                session=session,
                limit=limit,
                wait=wait,
                lease_seconds=lease,
                pinned_only=pinned_only,
                stop=gone,
            )
        finally:
            if watcher is not None:
                watcher.cancel()
        if got and (gone.is_set() or await request.is_disconnected()):
            await hub.release(me.team, me.name, [m.message.message_id for m in got])
            return {"messages": []}
        return {"messages": [m.to_json() for m in got]}

    @app.get("/v1/inbox/pending", tags=["inbox"])
    async def pending(who: Auth) -> dict[str, int]:
        """How many of your messages are not acked yet (queued or leased)."""
        me = who.need_member()
        return {"pending": await hub.pending(me.team, me.name)}

    @app.post("/v1/inbox/ack", tags=["inbox"])
    async def ack(body: AckIn, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        result = await hub.ack(me.team, me.name, body.message_ids)
        return {"acked": len(result.acked), "not_held": list(result.not_held)}

    @app.post("/v1/inbox/release", tags=["inbox"])
    async def release(body: AckIn, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        return {"released": await hub.release(me.team, me.name, body.message_ids)}

    @app.get("/v1/inbox/stream", tags=["inbox"], response_class=EventStream)
    async def inbox_stream(
        who: Auth, request: Request, session: SessionQuery = None
    ) -> StreamingResponse:
        """Server-sent events: each message is leased and sent as ``event: message``;
        ack it with ``POST /v1/inbox/ack``. A comment line every 15 s keeps it open."""
        me = who.need_member()

        async def events() -> AsyncIterator[str]:
            yield ": connected\n\n"
            while not await request.is_disconnected():
                got = await hub.receive(me.team, me.name, session=session, limit=32, wait=15.0)
                if not got:
                    yield ": keep-alive\n\n"
                for m in got:
                    # ids are checked whole on the way in; the line is kept one line anyway
                    mid = m.message.message_id.replace("\r", "").replace("\n", "")
                    yield f"event: message\nid: {mid}\ndata: {json.dumps(m.to_json())}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=_SSE_HEADERS)

    @app.get("/v1/teams/{team}/events", tags=["teams"], response_class=EventStream)
    async def team_events(
        team: TeamName,
        who: Auth,
        request: Request,
        after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    ) -> StreamingResponse:
        """Server-sent events: the team's traffic (sends, leases, acks, dead letters)."""
        who.need_team(team)
        await hub.get_team(team)

        async def events() -> AsyncIterator[str]:
            yield ": connected\n\n"
            stream = hub.watch(team, after)
            pending: asyncio.Future[FeedItem] | None = None
            try:
                while not await request.is_disconnected():
                    if pending is None:
                        pending = asyncio.ensure_future(anext(stream))
                    # asyncio.wait does not cancel the read, so a quiet spell keeps the feed
                    done, _ = await asyncio.wait({pending}, timeout=15.0)
                    if not done:
                        yield ": keep-alive\n\n"
                        continue
                    item = pending.result()
                    pending = None
                    yield f"event: traffic\nid: {item.cursor}\ndata: {json.dumps(item.to_json())}\n\n"
            finally:
                if pending is not None:
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending
                await stream.aclose()

        return StreamingResponse(events(), media_type="text/event-stream", headers=_SSE_HEADERS)

    # -- links -------------------------------------------------------------------
    @app.get("/v1/links", tags=["links"])
    async def list_links(
        who: Auth, member: MemberQuery = None, open_only: bool = False
    ) -> dict[str, Any]:
        me = who.need_member()
        links = await hub.list_links(me.team, member=member, open_only=open_only)
        return {"links": [link.to_json() for link in links]}

    @app.get("/v1/links/{link_id}", tags=["links"])
    async def get_link(link_id: ItemId, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        return (await hub.get_link(me.team, link_id)).to_json()

    # -- delegation --------------------------------------------------------------
    @app.post("/v1/delegations", status_code=201, tags=["delegation"])
    async def delegate(body: DelegateIn, who: Auth) -> dict[str, Any]:
        """Call another agent as an asynchronous tool; returns at once, pending."""
        me = who.need_member()
        d = await hub.delegate(
            me.team,
            me.name,
            body.session,
            body.to,
            body.task,
            timeout_s=body.timeout_s,
            tool_use_id=body.tool_use_id,
        )
        return d.to_json()

    @app.get("/v1/delegations", tags=["delegation"])
    async def list_delegations(who: Auth, member: MemberQuery = None) -> dict[str, Any]:
        me = who.need_member()
        found = await hub.list_delegations(me.team, member=member)
        return {"delegations": [d.to_json() for d in found]}

    @app.get("/v1/delegations/{delegation_id}", tags=["delegation"])
    async def get_delegation(delegation_id: ItemId, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        return (await hub.get_delegation(me.team, delegation_id)).to_json()

    async def chat(body: ChatIn, who: Auth) -> JSONResponse:
        """Another hub asks one of this team's agents to do a task; the answer goes to
        the caller's registered callback service with its bearer token."""
        me = who.need_member()
        d = await hub.accept_chat(
            me.team,
            me.name,
            body.agent,
            body.message,
            reply_service=body.reply.callbackService,
            reply_token=body.reply.bearerToken,
            session_id=body.session_id,
            tool_use_id=body.tool_use_id,
            timeout_s=body.timeout_s,
        )
        return JSONResponse(
            {
                "delegation_id": d.delegation_id,
                "status": d.state.value,
                "session": d.callee_session,
            },
            status_code=202,
        )

    async def tool_response(body: ToolResponseIn, request: Request) -> dict[str, Any]:
        """A callee hub answers a delegation; ``Authorization: Bearer`` carries the
        one-time reply token this hub issued."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(
                "missing bearer token: send the reply token as 'Authorization: Bearer <token>'"
            )
        d = await hub.accept_tool_response(token.strip(), body.result)
        return {"delegation_id": d.delegation_id, "state": d.state.value}

    for prefix in ("/api", "/v1"):
        app.add_api_route(
            f"{prefix}/chat", chat, methods=["POST"], status_code=202, tags=["delegation"]
        )
        app.add_api_route(
            f"{prefix}/tools/response", tool_response, methods=["POST"], tags=["delegation"]
        )

    # -- timers ------------------------------------------------------------------
    @app.post("/v1/timers", status_code=201, tags=["timers"])
    async def set_timer(body: TimerIn, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        minutes = body.minutes
        if minutes is None and body.seconds is None and body.intent == "anchor":
            minutes = DEFAULT_ANCHOR_MINUTES  # an anchor without a time: the default
        if (minutes is None) == (body.seconds is None):
            raise InvalidRequest("give exactly one of minutes or seconds", field="minutes")
        seconds = body.seconds if body.seconds is not None else float(minutes or 0) * 60
        timer = await hub.set_timer(
            me.team, me.name, body.session, body.intent, seconds, body.note, body.target
        )
        return timer.to_json(hub.clock.now())

    @app.get("/v1/timers", tags=["timers"])
    async def list_timers(
        who: Auth, member: MemberQuery = None, session: SessionQuery = None, all: bool = False
    ) -> dict[str, Any]:
        me = who.need_member()
        timers = await hub.list_timers(
            me.team, member=member, session_id=session, pending_only=not all
        )
        now = hub.clock.now()
        return {"timers": [t.to_json(now) for t in timers]}

    @app.delete("/v1/timers/{timer_id}", tags=["timers"])
    async def cancel_timer(
        timer_id: Annotated[int, Path(ge=1, le=MAX_INT)], who: Auth
    ) -> dict[str, Any]:
        me = who.need_member()
        return (await hub.cancel_timer(me.team, me.name, timer_id)).to_json()

    # -- sessions ----------------------------------------------------------------
    @app.post("/v1/sessions", status_code=201, tags=["sessions"])
    async def open_session(body: SessionIn, who: Auth) -> dict[str, Any]:
        """Open a session, or resume one by id (same state, links and timers)."""
        me = who.need_member()
        return session_json(await hub.open_session(me.team, me.name, body.session_id))

    @app.get("/v1/sessions", tags=["sessions"])
    async def list_sessions(who: Auth, member: MemberQuery = None) -> dict[str, Any]:
        me = who.need_member()
        return {"sessions": [session_json(s) for s in await hub.list_sessions(me.team, member)]}

    @app.get("/v1/sessions/{session_id}", tags=["sessions"])
    async def get_session(session_id: SessionId, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        return session_json(await hub.get_session(me.team, session_id))

    @app.post("/v1/sessions/{session_id}/events", tags=["sessions"])
    async def report_event(session_id: SessionId, body: EventIn, who: Auth) -> dict[str, Any]:
        """Report a runtime event: turn_start, thought, tool_call, tool_result,
        agent_output or agent_stop (whose text is the closing text, routed)."""
        me = who.need_member()
        return await hub.report_event(me.team, me.name, session_id, body.kind, body.text, body.data)

    @app.post("/v1/sessions/{session_id}/terminate", tags=["sessions"])
    async def terminate(session_id: SessionId, body: TerminateIn, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        return session_json(await hub.terminate_session(me.team, me.name, session_id, body.reason))

    @app.get("/v1/sessions/{session_id}/transcript", tags=["sessions"])
    async def transcript(
        session_id: SessionId,
        who: Auth,
        since: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
        until: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
        tail_chars: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
        max_chars: Annotated[int, Query(ge=1, le=1_000_000)] = 20_000,
    ) -> dict[str, Any]:
        """A teammate's full transcript (get_session_data), paged and capped."""
        me = who.need_member()
        return await hub.get_session_data(
            me.team,
            session_id,
            since=since,
            until=until,
            tail_chars=tail_chars,
            max_chars=max_chars,
        )

    @app.post("/v1/messages/{message_id}/reactions", tags=["messages"])
    async def react(message_id: MessageId, body: ReactionIn, who: Auth) -> dict[str, Any]:
        me = who.need_member()
        await hub.react(me.team, me.name, message_id, body.emoji)
        return {"message_id": message_id, "emoji": body.emoji}

    # The hottest endpoints skip FastAPI's dependency machinery (about half of their
    # cost): the same functions, the same model validation and the same errors, with the
    # routes above kept for the OpenAPI description.
    async def _body(request: Request, model: type[_M]) -> _M:
        try:
            return model.model_validate_json(await request.body() or b"null")
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None

    async def fast_send(request: Request) -> Response:
        who = await principal(request)
        return await send(await _body(request, MessageIn), who)

    async def fast_ack(request: Request) -> Response:
        who = await principal(request)
        return JSONResponse(await ack(await _body(request, AckIn), who))

    app.router.routes.insert(0, Route("/v1/messages", fast_send, methods=["POST"]))
    app.router.routes.insert(0, Route("/v1/inbox/ack", fast_ack, methods=["POST"]))

    from backchannel.interfaces.admin_http import mount_admin_routes
    from backchannel.interfaces.agents_http import mount_agent_routes
    from backchannel.interfaces.budgets_http import mount_budget_routes
    from backchannel.interfaces.dashboard import mount_dashboard

    mount_agent_routes(app)  # hook receivers and the MCP endpoint
    mount_budget_routes(app)
    mount_admin_routes(app)  # token rotation, member and team removal
    mount_dashboard(app)
    from backchannel.interfaces.a2a import mount_a2a

    mount_a2a(app)  # every member as an A2A agent, when a2a-sdk is installed
    app.add_middleware(BodyLimit, limit=limit)
    document_errors(app.routes)
    return app


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    """Server-sent events (so the OpenAPI document names the media type)."""

    media_type = "text/event-stream"
