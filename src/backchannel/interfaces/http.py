"""HTTP API v1 (FastAPI): the app, its limits and its error answers.

The routes live in :mod:`.routes`, one router per resource; each translates a request
to a :class:`~backchannel.member.MemberApi` (or ``AdminApi``) call and answers with its
typed model (:mod:`backchannel.models`), so the OpenAPI document shows every answer.

Auth: ``Authorization: Bearer <token>``. The admin token manages teams and members; a
member token acts as that member, and the sender of a message is always the member
the token belongs to. A member never learns of another team: every team-scoped path
answers 404 for another team, exactly as for a team that does not exist.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from backchannel.errors import BackchannelError, TooLarge
from backchannel.hub import Hub
from backchannel.interfaces.routes import hot_routes, include_routes
from backchannel.interfaces.routes.deps import Auth, Principal, principal
from backchannel.interfaces.routes.stream import EventStream
from backchannel.interfaces.wire import (
    NAME_SHAPES,
    REFUSED,
    SHAPES,
    StrictRoute,
    body_limit,
    document_errors,
    error_components,
)

__all__ = [
    "Auth",
    "EventStream",
    "HotPaths",
    "Principal",
    "body_limit",
    "create_app",
    "on_error",
    "on_invalid",
    "principal",
]

log = logging.getLogger("backchannel.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


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


class FailureLog:
    """Says each failure of the hub's (a 5xx) once a minute at most, however many
    requests it fails: a store that is away (a full disk, a stopped database) fails
    every send, receive and ack until it is back, and a line for each buried the rest
    of the log under thousands of copies of one story. The first request a failure
    fails logs it as before; the ones after it within ``every`` seconds only count
    (at debug), and the first after that logs it again with their count. Failures are
    told apart by their message (which names the store and the way out)."""

    def __init__(self, every: float = 60.0, keep: int = 256) -> None:
        self.every, self.keep = every, keep
        self._said: dict[str, tuple[float, int]] = {}  # message -> (said at, quiet since)

    def failed(self, what: str, message: str) -> None:
        now = time.monotonic()
        said = self._said.get(message)
        if said is not None and now - said[0] < self.every:
            self._said[message] = (said[0], said[1] + 1)
            log.debug("%s failed: %s", what, message)
            return
        if said is not None and said[1]:
            log.warning(
                "%s failed: %s (and %d other requests the same way in the %.0f s before)",
                what, message, said[1], now - said[0],
            )  # fmt: skip
        else:
            log.warning(
                "%s failed: %s (other requests failing the same way are logged once a "
                "minute, with their count)",
                what, message,
            )  # fmt: skip
        if len(self._said) >= self.keep:
            self._said = {m: v for m, v in self._said.items() if now - v[0] < self.every}
            if len(self._said) >= self.keep:
                self._said.clear()
        self._said[message] = (now, 0)


async def on_error(request: Request, exc: BackchannelError) -> JSONResponse:
    """The hub's own errors: their status and the error model; a failure of the hub's
    (5xx) is logged as :class:`FailureLog` says."""
    if exc.status >= 500:
        what = f"{request.method} {request.url.path}"
        failures = getattr(request.app.state, "failures", None)
        if isinstance(failures, FailureLog):
            failures.failed(what, exc.message)
        else:
            log.warning("%s failed: %s", what, exc.message)
    return _error_response(exc)


async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body or parameter the schema refuses: 422 naming each problem."""
    message, problems = _validation_message(exc)
    names = any(
        e.get("type") == "string_pattern_mismatch"
        and e.get("ctx", {}).get("pattern") in NAME_SHAPES
        for e in exc.errors()
    )
    code = "invalid_name" if names else "invalid_request"
    body = {"error": {"code": code, "message": message, "problems": problems}}
    return JSONResponse(body, status_code=422)


class HotPaths:
    """The hottest requests (a send, an ack, a receive that acks) go straight to their
    fast endpoints, past the router and the exception middleware, which cost about a
    third of such a request. Inside :class:`BodyLimit`; the same endpoints, errors and
    answers as through the router, which keeps the same routes for any other path
    spelling (a ``root_path``)."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]],
    ) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self.routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        )
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response: Response = await endpoint(request)
        except BackchannelError as exc:
            response = await on_error(request, exc)
        except RequestValidationError as exc:
            response = await on_invalid(request, exc)
        except ClientDisconnect:
            return  # gone before its body came whole: nobody to answer
        await response(scope, receive, send)


def _clip(text: str, size: int = 80) -> str:
    return text if len(text) <= size else text[: size - 3] + "..."


def create_app(
    hub: Hub,
    admin_token: str,
    *,
    max_body: int | None = None,
    title: str = "backchannel",
    opentelemetry: bool | None = None,
) -> FastAPI:
    """The ASGI app serving the API for ``hub``. FastAPI's own OpenTelemetry spans and
    metrics are off unless ``opentelemetry`` (by default: ``BACKCHANNEL_OPENTELEMETRY``
    set to ``1``) turns them on: off, no request looks the global providers up."""
    limit = max_body if max_body is not None else body_limit(hub.config.max_text)
    if opentelemetry is None:
        opentelemetry = os.environ.get("BACKCHANNEL_OPENTELEMETRY", "") in ("1", "true", "yes")
    telemetry: Any = {} if opentelemetry else {"tracing": False, "metrics": False, "logs": False}

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
        telemetry=telemetry,
    )
    app.router.route_class = StrictRoute  # strict JSON bodies on every route added below
    app.state.hub = hub
    app.state.admin_token = admin_token
    app.state.failures = FailureLog()

    app.add_exception_handler(BackchannelError, on_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_invalid)  # type: ignore[arg-type]

    @app.exception_handler(ClientDisconnect)
    async def on_gone(request: Request, exc: ClientDisconnect) -> Response:
        # a route that reads its own body (a hook's) and whose client hung up meanwhile:
        # an answer nobody reads, not an error of the hub's
        return Response(status_code=400)

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

    include_routes(app)

    from backchannel.interfaces.agents_http import mount_agent_routes
    from backchannel.interfaces.dashboard import mount_dashboard

    mount_agent_routes(app)  # hook receivers and the MCP endpoint
    mount_dashboard(app)
    from backchannel.interfaces.a2a import mount_a2a

    mount_a2a(app)  # every member as an A2A agent, when a2a-sdk is installed
    app.add_middleware(HotPaths, routes=hot_routes())
    app.add_middleware(BodyLimit, limit=limit)
    document_errors(app.routes)
    describe = app.openapi

    def openapi() -> dict[str, Any]:
        # the error responses point at the error model; put it where they point
        if app.openapi_schema is None:
            doc = describe()
            doc.setdefault("components", {}).setdefault("schemas", {}).update(error_components())
        return app.openapi_schema or describe()

    app.openapi = openapi  # type: ignore[method-assign]
    return app
