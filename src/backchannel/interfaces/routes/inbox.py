"""Receiving: lease messages (long-poll or server-sent events), ack, release.

``POST /v1/inbox/ack/batch`` acks many ids and answers each on its own (``acked``,
``not_held`` or ``invalid``), so a malformed id loses none of the others.
``POST /v1/inbox/receive`` acks the messages a receiver is done with and leases the
next ones in one request (and one store transaction): a receiver loop's one round trip
per batch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backchannel.core.messages import MAX_LEASE, MAX_LIMIT, MAX_WAIT
from backchannel.errors import BackchannelError
from backchannel.interfaces.routes.deps import AsMember, hub_of, principal, revoked
from backchannel.interfaces.routes.messages import as_documented, fast_call, read_python
from backchannel.interfaces.routes.stream import SSE_HEADERS, EventStream
from backchannel.interfaces.wire import SSE_EVENT, SessionQuery, StrictRoute
from backchannel.member import MemberApi
from backchannel.models import (
    RECEIVE_ID,
    AckBatchIn,
    Acked,
    AckedBatch,
    AckIn,
    GivenUp,
    GiveUpIn,
    Inbox,
    InboxAcked,
    Pending,
    Received,
    ReceiveIn,
    Released,
)
from backchannel.types import MESSAGE_ID_PATTERN, SESSION_PATTERN

router = APIRouter(route_class=StrictRoute, tags=["inbox"])


class Gone(asyncio.Event):
    """Set when the client went away, or when the request's token stopped working;
    ``watched`` while a task reads the request's messages for the disconnect."""

    watched = False


@contextlib.asynccontextmanager
async def client_watch(request: Request, wait: float) -> AsyncIterator[Gone]:
    """An event set when the client goes away, watched while a long-poll may wait."""
    gone = Gone()
    gone.watched = wait > 0

    async def watch_client() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch_client()) if wait > 0 else None
    try:
        yield gone
    finally:
        if watcher is not None:
            watcher.cancel()


async def kept(api: MemberApi, request: Request, gone: Gone, got: list[Received]) -> list[Received]:
    """The messages to answer: none when the client went away (a long-poll must not
    lease messages nobody reads; they are given back at once). While the watch is on,
    one turn of the loop lets it see a disconnect that has just come; without one (no
    wait), the request is asked (which costs a cancel scope)."""
    if not got:
        return got
    if gone.watched:
        await asyncio.sleep(0)
        away = gone.is_set()
    else:
        away = await request.is_disconnected()
    if away:
        await api.give_back([m.message_id for m in got])
        return []
    return got


async def given_back(api: MemberApi, got: Sequence[Received]) -> None:
    """Release ``got`` for a receiver that will not read them."""
    if got:
        with contextlib.suppress(BackchannelError):  # a removed member's copies are dead
            await api.give_back([m.message_id for m in got])


@router.get("/v1/inbox")
async def inbox(
    api: AsMember,
    request: Request,
    wait: Annotated[
        float, Query(ge=0, le=MAX_WAIT, description="seconds to wait for the first")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 10,
    session: SessionQuery = None,
    lease: Annotated[float | None, Query(gt=0, le=MAX_LEASE)] = None,
    pinned_only: bool = False,
    receive_id: Annotated[
        str | None, Query(pattern=MESSAGE_ID_PATTERN, description=RECEIVE_ID)
    ] = None,
) -> Inbox:
    """Lease up to ``limit`` messages, waiting up to ``wait`` seconds for the first;
    each comes back after its lease unless acked."""
    query = _InboxQuery(
        wait=wait,
        limit=limit,
        session=session,
        lease=lease,
        pinned_only=pinned_only,
        receive_id=receive_id,
    )
    return Inbox(messages=(await leased(api, request, query)).messages)


class _InboxQuery(BaseModel):
    """``GET /v1/inbox``'s query, with the constraints of :func:`inbox`'s parameters
    (the fast path checks the query with it)."""

    model_config = ConfigDict(extra="ignore")

    wait: float = Field(0, ge=0, le=MAX_WAIT)
    limit: int = Field(10, ge=1, le=MAX_LIMIT)
    session: str | None = Field(None, pattern=SESSION_PATTERN)
    lease: float | None = Field(None, gt=0, le=MAX_LEASE)
    pinned_only: bool = False
    receive_id: str | None = Field(None, pattern=MESSAGE_ID_PATTERN)


async def leased(
    api: MemberApi, request: Request, q: _InboxQuery | ReceiveIn, ack: Sequence[str] = ()
) -> InboxAcked:
    """The long-poll both receive routes share: ack ``ack``, lease, and give the
    messages back if the client went away meanwhile. A token rotated away (its member
    or team removed) while the poll waits ends the wait at once (by another hub
    process on the same store, once this one hears of it: the store's wake-up latency)
    and is answered 401, never 200."""
    async with client_watch(request, q.wait) as gone:
        with hub_of(request).watch_revocation(api.member.token_hash, gone, api.member.team):
            got = await api.ack_and_receive(
                ack,
                session=q.session,
                limit=q.limit,
                wait=q.wait,
                lease=q.lease,
                pinned_only=q.pinned_only,
                stop=gone,
                receive_id=q.receive_id,
            )
        got.messages = await kept(api, request, gone, got.messages)
    if q.wait > 0 and (error := await revoked(request)) is not None:
        await given_back(api, got.messages)
        raise error
    return got


@router.post("/v1/inbox/receive")
async def receive(body: ReceiveIn, api: AsMember, request: Request) -> InboxAcked:
    """Ack ``ack`` (messages you are done with), then lease as ``GET /v1/inbox`` does:
    the ack and the first lease are one transaction, committed before any wait. Ids you
    do not hold come back in ``not_held`` and fail nothing; a receive that fails (a
    session that is not yours) acks nothing."""
    return await leased(api, request, body, body.ack)


@router.get("/v1/inbox/pending")
async def pending(api: AsMember) -> Pending:
    """How many of your messages are not acked yet (queued or leased)."""
    return await api.pending()


@router.post("/v1/inbox/ack")
async def ack(body: AckIn, api: AsMember) -> Acked:
    """Ack messages you hold; ``not_held`` names those you did not hold."""
    return await api.ack(body.message_ids)


@router.post("/v1/inbox/ack/batch")
async def ack_batch(body: AckBatchIn, api: AsMember) -> AckedBatch:
    """Ack many ids; each is answered on its own (``acked``, ``not_held``, ``invalid``)."""
    return await api.ack_batch(body.message_ids)


@router.post("/v1/inbox/release")
async def release(body: AckIn, api: AsMember) -> Released:
    """Give leased messages back at once instead of at the lease's end."""
    return await api.release(body.message_ids)


@router.post("/v1/inbox/give-up")
async def give_up(body: GiveUpIn, api: AsMember) -> GivenUp:
    """Give up for good on leased messages you will never handle (your model fails for
    good: a revoked key, a spent quota, a model that does not exist): each is dead with
    ``reason``, and its sender is told by a ``system`` message. Ids you do not hold
    leased are left as they are (``given_up`` counts the others)."""
    return await api.give_up(body.message_ids, body.reason)


#: what ``receive_id`` is to the event stream
STREAM_RECEIVE_ID = (
    "a name for this stream, the same when the client opens it again: every message it "
    "sends is leased to the name, and the stream opened again under it first sends, "
    "the same attempt, those still leased to it (after the one Last-Event-ID names, "
    "when it names one of them): a proxy may have cut the connection after the hub "
    "wrote them"
)


@router.get("/v1/inbox/stream", response_class=EventStream, responses=SSE_EVENT)
async def inbox_stream(
    api: AsMember,
    request: Request,
    session: SessionQuery = None,
    receive_id: Annotated[
        str | None, Query(pattern=MESSAGE_ID_PATTERN, description=STREAM_RECEIVE_ID)
    ] = None,
) -> StreamingResponse:
    """Server-sent events: each message is leased and sent as ``event: message`` (its
    ``id:`` the message id); ack it with ``POST /v1/inbox/ack``. A comment line every
    15 s keeps it open. A session that is not yours is refused before the stream
    starts; one that ends while it is open ends it with ``event: error``, and so does
    the token's rotation (or its member's removal), at once (by another hub process on
    the same store, once this one hears of it).

    With ``receive_id``, what the stream leases is leased to that name, and the stream
    opened again under it (a proxy cut the connection after the hub wrote to it) sends
    first what is still leased to the name, the same attempt, instead of leaving it to
    its lease: those after the message ``Last-Event-ID`` names when it names one of
    them (the reader saw that one and those before it), all of them otherwise."""
    held: list[Received] = []
    if receive_id is not None:  # asked before the lease below adds to what it holds
        held = await api.held(receive_id)
        seen = request.headers.get("last-event-id", "").strip()
        ids = [m.message_id for m in held]
        if seen in ids:
            held = held[ids.index(seen) + 1 :]
    first = held + await api.receive(session=session, limit=32, receive_id=receive_id, fresh=True)
    gone = asyncio.Event()  # set when the token is revoked

    unsent: collections.deque[Received] = collections.deque(first)

    async def events() -> AsyncIterator[str]:
        # a batch is leased whole: those of it not written when the stream ends (the
        # reader went away, a proxy cut it) are given back at once, not left leased to
        # nobody until the lease ends; one written may have been read, and stays leased
        try:
            yield ": connected\n\n"
            with hub_of(request).watch_revocation(api.member.token_hash, gone, api.member.team):
                async with contextlib.aclosing(batches()) as chunks:
                    async for chunk in chunks:
                        yield chunk
        finally:
            if unsent:
                await asyncio.shield(given_back(api, list(unsent)))

    async def batches() -> AsyncGenerator[str, None]:
        while True:
            while unsent:
                # the server takes what is written to a connection that is gone and
                # drops it: no more of the batch is written into it
                if await request.is_disconnected():
                    return
                m = unsent.popleft()
                # ids are checked whole on the way in; the line is kept one line anyway
                mid = m.message_id.replace("\r", "").replace("\n", "")
                data = m.model_dump_json(by_alias=True)
                yield f"event: message\nid: {mid}\ndata: {data}\n\n"
            if await request.is_disconnected():
                return
            try:
                got = await api.receive(
                    session=session,
                    limit=32,
                    wait=15.0,
                    stop=gone,
                    receive_id=receive_id,
                    fresh=True,
                )
            except BackchannelError as exc:  # the session ended meanwhile
                yield f"event: error\ndata: {json.dumps(exc.to_json())}\n\n"
                return
            if (error := await revoked(request)) is not None:
                await given_back(api, got)
                yield f"event: error\ndata: {json.dumps(error.to_json())}\n\n"
                return
            unsent.extend(got)
            if not got:
                yield ": keep-alive\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def fast_ack(request: Request) -> Response:
    api, body = await fast_call(request, AckIn)
    acked = await api.ack(body.message_ids)
    return JSONResponse(acked.model_dump())


async def fast_ack_batch(request: Request) -> Response:
    api, body = await fast_call(request, AckBatchIn, read_python)
    return as_documented(await api.ack_batch(body.message_ids), every_field=True)


async def fast_receive(request: Request) -> Response:
    """``POST /v1/inbox/receive`` (the receiver loop's one request a batch) without the
    dependency machinery: the same checks, errors and answer as :func:`receive`."""
    api, body = await fast_call(request, ReceiveIn)
    return as_documented(await leased(api, request, body, body.ack))


async def fast_inbox(request: Request) -> Response:
    """``GET /v1/inbox`` without the dependency machinery: the caller (401), the query
    (422), the right to act as a member (403), as the documented route checks them,
    with the same errors and answer."""
    who = await principal(request)
    try:
        q = _InboxQuery.model_validate(dict(request.query_params))
    except ValidationError as exc:
        errors = [{**e, "loc": ("query", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from None
    api = MemberApi(hub_of(request), who.need_member())
    return as_documented(Inbox(messages=(await leased(api, request, q)).messages))
