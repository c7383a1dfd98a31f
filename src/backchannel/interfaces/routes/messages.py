"""Sending: one message, many in one request, a message's state, reactions.

``POST /v1/messages`` answers 201 with the send, or 200 with the first answer when the
same ``message_id`` comes again (an idempotent replay). ``POST /v1/messages/batch``
sends up to :data:`~backchannel.models.MAX_BATCH` messages: every item is checked and
answered on its own (its status, the send or the error), so one bad item loses none of
the others; the request as a whole fails only when it is not a batch at all (422) or
its body is over the size limit (413).
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from backchannel.interfaces.routes.deps import AsMember, hub_of, principal
from backchannel.interfaces.strict import parse_error
from backchannel.interfaces.wire import REPLAYED, MessageId, StrictRoute, parse_json
from backchannel.member import MemberApi
from backchannel.models import (
    MessageBatchIn,
    MessageIn,
    MessageReport,
    Reaction,
    ReactionIn,
    Sent,
    SentBatch,
)

M = TypeVar("M", bound=BaseModel)

router = APIRouter(route_class=StrictRoute, tags=["messages"])


def sent_response(sent: Sent) -> Response:
    return Response(
        sent.model_dump_json(by_alias=True),
        status_code=200 if sent.replayed else 201,
        media_type="application/json",
    )


async def send_body(api: MemberApi, body: MessageIn) -> Sent:
    return await api.send(
        body.to,
        body.text,
        summary=body.summary,
        message_id=body.message_id,
        session=body.session,
        from_session=body.from_session,
        link=body.link,
        close_link=body.close_link,
        link_budget=body.link_budget,
    )


@router.post("/v1/messages", status_code=201, response_model=Sent, responses=REPLAYED)
async def send(body: MessageIn, api: AsMember) -> Response:
    """Send as the authenticated member: 201, or 200 on an idempotent replay."""
    return sent_response(await send_body(api, body))


@router.post("/v1/messages/batch")
async def send_batch(body: MessageBatchIn, api: AsMember) -> SentBatch:
    """Send many messages in one request; each item is answered on its own."""
    return await api.send_batch(body.messages)


@router.get("/v1/messages/{message_id}")
async def message_status(message_id: MessageId, api: AsMember) -> MessageReport:
    """Delivery state and history of a message you sent or received."""
    return await api.status(message_id)


@router.post("/v1/messages/{message_id}/reactions")
async def react(message_id: MessageId, body: ReactionIn, api: AsMember) -> Reaction:
    return await api.react(message_id, body.emoji)


# The hottest endpoints skip FastAPI's dependency machinery (about half of their cost):
# the same functions, the same model validation and the same errors, with the routes
# above kept for the OpenAPI description.


def json_typed(request: Request, raw: bytes) -> None:
    """Refuse a body not sent as JSON (``text/plain``, a form, no content type) as the
    documented routes do (FastAPI reads such a body as bytes, which no model takes): 422
    naming the content type to use. The usual header costs one compare; an empty body
    needs none (as there)."""
    kind = request.headers.get("content-type")
    if kind == "application/json" or not raw or (kind and _is_json(kind)):
        return
    problem = {
        "type": "model_attributes_type",
        "loc": ("body",),
        "msg": "Input should be a valid dictionary or object to extract fields from",
        "input": raw,
    }
    raise RequestValidationError([problem])


def _is_json(kind: str) -> bool:
    """``kind`` names JSON as FastAPI reads it: ``application/json`` or
    ``application/*+json``, with any parameters."""
    message = email.message.Message()
    message["content-type"] = kind
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def read_body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    json_typed(request, raw)
    raw = raw or b"null"
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors()
        for err in errors:  # the parser's words, as the documented routes put them
            if err.get("type") == "json_invalid" and isinstance(err.get("ctx"), dict):
                err["ctx"] = {**err["ctx"], "error": parse_error(raw, str(err["ctx"]["error"]))}
        raise RequestValidationError(errors) from None


async def read_python(request: Request, model: type[M]) -> M:
    """:func:`read_body` for the batches: the body parsed as the documented routes parse
    it (:func:`parse_json`), then validated as Python, so a bad item is named in the
    same words ("a valid list", not "a valid array")."""
    raw = await request.body()
    json_typed(request, raw)
    try:
        value = parse_json(raw) if raw else None
    except json.JSONDecodeError as e:
        error = {
            "type": "json_invalid",
            "loc": ("body", e.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": e.msg},
        }
        raise RequestValidationError([error]) from None
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


async def fast_call(
    request: Request, model: type[M], read: Callable[[Request, type[M]], Awaitable[M]] = read_body
) -> tuple[MemberApi, M]:
    """The caller (401 first), its body (422), then its right to act as a member (403)."""
    who = await principal(request)
    body = await read(request, model)
    return MemberApi(hub_of(request), who.need_member()), body


async def fast_send(request: Request) -> Response:
    api, body = await fast_call(request, MessageIn)
    return sent_response(await send_body(api, body))


async def fast_send_batch(request: Request) -> Response:
    api, body = await fast_call(request, MessageBatchIn, read_python)
    return as_documented(await api.send_batch(body.messages), every_field=True)


def as_documented(answer: BaseModel, every_field: bool = False) -> Response:
    """A 200 answer as the documented routes give it: wire names, and only the fields
    set, except for the batches' items, which FastAPI gives whole (``null`` included)."""
    return Response(
        answer.model_dump_json(by_alias=True, exclude_unset=not every_field),
        media_type="application/json",
    )
