"""What the HTTP API accepts off the wire, and what it says it answers.

Every JSON body the API reads goes through :func:`~.strict.parse_json` (the rules are
in :mod:`.strict`, shared with the MCP server on stdio). A body that breaks a rule is
refused with 422 and the error model, before any of it reaches the hub, so nothing the
hub stores can later fail to encode or to load.

:func:`error_responses` gives each operation's error statuses for the OpenAPI document,
all with the one error model ``{"error": {"code", "message", ...}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Annotated, Any

from fastapi import Path, Query, Request, Response
from fastapi.routing import APIRoute

from backchannel.interfaces.strict import MAX_DEPTH, REFUSED, parse_json
from backchannel.models import (
    MAX_INT,
    TO_PATTERN,
    ErrorBody,
    IdField,
    JsonObject,
    JsonValue,
    NameField,
    Sent,
    SessionField,
)
from backchannel.types import MESSAGE_ID_PATTERN, NAME_PATTERN, SESSION_PATTERN

__all__ = [
    "MAX_DEPTH",
    "MAX_INT",
    "REFUSED",
    "TO_PATTERN",
    "IdField",
    "JsonObject",
    "JsonValue",
    "NameField",
    "SessionField",
    "StrictRoute",
    "body_limit",
    "document_errors",
    "parse_json",
]


class StrictRequest(Request):
    """A request whose ``json()`` is :func:`parse_json` (FastAPI reads bodies with it)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class StrictRoute(APIRoute):
    """An API route that reads its JSON body with :func:`parse_json`, and answers with
    the fields its model was given (an answer says what the hub said, no more)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        kwargs.setdefault("response_model_exclude_unset", True)
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictRequest(request.scope, request.receive, request._send))

        return strict


# -- names and ids, as the OpenAPI document publishes them ----------------------------

SHAPES = {
    NAME_PATTERN: "use 1 to 64 letters, digits, '_' or '-', starting with a letter or digit",
    SESSION_PATTERN: (
        "use 1 to 200 letters, digits, '_', '-', '.' or ':', starting with a letter or digit"
    ),
    MESSAGE_ID_PATTERN: (
        "use 1 to 128 letters, digits, '_', '-', '.' or ':', starting with a letter or digit"
    ),
    TO_PATTERN: "use a member name (letters, digits, '_' or '-') or '*' for everyone",
}
NAME_SHAPES = (NAME_PATTERN, SESSION_PATTERN, TO_PATTERN)

TeamName = Annotated[str, Path(pattern=NAME_PATTERN, description="a team name")]
MemberName = Annotated[str, Path(pattern=NAME_PATTERN, description="a member name")]
SessionId = Annotated[str, Path(pattern=SESSION_PATTERN, description="a session id")]
MessageId = Annotated[str, Path(pattern=MESSAGE_ID_PATTERN, description="a message id")]
ItemId = Annotated[str, Path(pattern=MESSAGE_ID_PATTERN, description="an id the hub gave")]
MemberQuery = Annotated[
    str | None, Query(pattern=NAME_PATTERN, description="only this member's [all]")
]
SessionQuery = Annotated[str | None, Query(pattern=SESSION_PATTERN, description="a session id")]


#: JSON escapes one byte of UTF-8 text in at most 6 bytes (``\u0001``; any other
#: character costs at most 3 times its UTF-8 size), so a body this many times the text
#: limit (plus room for the other fields) carries any text within the limit.
ESCAPE_FACTOR = 6
_BODY_ROOM = 64 * 1024
#: The body limit never goes past this, however large the text limit is set.
MAX_BODY = 64 * 1024 * 1024


def body_limit(max_text: int) -> int:
    """The request body limit that lets through every text of at most ``max_text``
    UTF-8 bytes, however it is escaped, up to :data:`MAX_BODY`."""
    return min(ESCAPE_FACTOR * max_text + _BODY_ROOM, max(max_text + _BODY_ROOM, MAX_BODY))


# -- the error model in the OpenAPI document ------------------------------------------


#: The extra success of an idempotent send: the same message_id again answers 200.
REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {"model": Sent, "description": "Replayed: a message with this message_id was sent"}
}
#: A route that sends answers this (201), or the first answer again (200).
SENT: dict[int | str, dict[str, Any]] = {201: {"model": Sent, "description": "Sent"}, **REPLAYED}

ERROR_REF = "#/components/schemas/ErrorBody"
#: One server-sent event as a stream route's answer documents it.
SSE_EVENT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-sent events; each event's data is one JSON object",
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "event": {"type": "string"},
                        "id": {"type": "string"},
                        "data": {"type": "string", "description": "a JSON object"},
                    },
                }
            }
        },
    }
}


def error_components() -> dict[str, Any]:
    """The error model's schemas, for the document's components."""
    schema = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {"ErrorBody": schema, **defs}


_WHY = {
    400: "Bad request (e.g. an unknown callback service)",
    401: "Missing or invalid bearer token",
    403: "Authenticated, but this token may not do this",
    404: "No such team, member, session, message, link, delegation or timer",
    408: "The request's head or body did not arrive in time",
    409: "Conflicts with the current state (exists already, id reused, wrong state)",
    413: "Request body or message text over the limit",
    422: "Invalid request: bad JSON, a field missing, mistyped, out of range or malformed",
    429: "Over a limit: a spent conversation budget, a full inbox or too many timers",
    502: "A peer (another hub or a callback) failed",
    503: "Busy (too many connections) or the store is unavailable; retry after Retry-After",
}


def error_responses(statuses: Iterable[int]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for ``statuses``, each with the error model."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(statuses)):
        entry: dict[str, Any] = {
            "description": _WHY[status],
            "content": {"application/json": {"schema": {"$ref": ERROR_REF}}},
        }
        if status == 503:
            entry["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait before retrying",
                    "schema": {"type": "integer"},
                }
            }
        out[status] = entry
    return out


# Beyond what every route gets from its shape (below), the statuses each operation can
# answer, by endpoint name. 403: a member token on an admin call or the reverse; 404:
# a name or id that does not exist (or another team's); 409: a state conflict.
_EXTRA: dict[str, set[int]] = {
    "healthz": set(),
    "me": set(),
    "list_teams": set(),
    "create_team": {403, 409},
    "add_member": {403, 404, 409},
    "update_member": {403, 404},
    "list_members": {404},
    "send": {403, 404, 409, 429},
    "fast_send": {403, 404, 409, 429},
    "message_status": {403, 404},
    "react": {403, 404},
    "inbox": {403, 404, 409},
    "receive": {403, 404, 409},
    "pending": {403},
    "ack": {403},
    "ack_batch": {403},
    "send_batch": {403},
    "release": {403},
    "inbox_stream": {403, 404, 409},
    "team_events": {404},
    "list_links": {403, 404},
    "get_link": {403, 404},
    "delegate": {403, 404, 409, 429, 502},
    "list_delegations": {403, 404},
    "get_delegation": {403, 404},
    "chat": {400, 403, 404, 409, 429},
    "tool_response": {404, 409},
    "set_timer": {403, 404, 409, 429},
    "list_timers": {403, 404},
    "cancel_timer": {403, 404, 409},
    "get_timer": {403, 404},
    "open_session": {403, 404, 409},
    "list_sessions": {403, 404},
    "get_session": {403, 404},
    "report_event": {403, 404, 409},
    "terminate": {403, 404, 409},
    "transcript": {403, 404},
    "hook": {403},
    # the dashboard's routes
    "ticket": {404},
    "members": {404},
    "team_snapshot": {404},
    "links": {404},
    "timers": {404},
    "delegations": {404},
    "message": {404},
    "session": {404},
    "compose": {403, 404, 409, 429},
    "stream": {401, 404},
}
#: For a route not in the table: what an authenticated call can usually answer.
_UNLISTED = {403, 404, 409}


def document_errors(routes: Iterable[Any]) -> None:
    """Set every API route's error responses in the OpenAPI document: 503 on all
    (busy, store down); 401 where a token is needed; 408, 413 and 422 where a body is
    read; 422 where there are parameters; and the route's own from the table above."""
    for route in routes:
        included = getattr(route, "original_router", None)  # an included APIRouter
        if included is not None:
            document_errors(included.routes)
            continue
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        dep = route.dependant
        statuses = {503}
        if _needs_token(dep) or route.name == "tool_response":
            statuses.add(401)
        if route.body_field is not None or route.name == "hook":
            statuses |= {408, 413, 422}
        if dep.path_params or dep.query_params or dep.header_params:
            statuses.add(422)
        statuses |= _EXTRA.get(route.name, _UNLISTED)
        route.responses = {**error_responses(statuses), **route.responses}


def _needs_token(dependant: Any) -> bool:
    stack = [dependant]
    while stack:
        dep = stack.pop()
        if getattr(dep.call, "__name__", "") in ("principal", "check_ticket"):
            return True
        stack.extend(dep.dependencies)
    return False
