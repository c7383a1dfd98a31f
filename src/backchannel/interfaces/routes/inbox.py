"""Receiving: lease messages (long-poll or server-sent events), ack, release.

``POST /v1/inbox/ack/batch`` acks many ids and answers each on its own (``acked``,
``not_held`` or ``invalid``), so a malformed id loses none of the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from backchannel.interfaces.routes.deps import AsMember
from backchannel.interfaces.routes.messages import fast_call
from backchannel.interfaces.routes.stream import SSE_HEADERS, EventStream
from backchannel.interfaces.wire import SSE_EVENT, SessionQuery, StrictRoute
from backchannel.models import (
    AckBatchIn,
    Acked,
    AckedBatch,
    AckIn,
    Inbox,
    Pending,
    Released,
)

router = APIRouter(route_class=StrictRoute, tags=["inbox"])


@router.get("/v1/inbox")
async def inbox(
    api: AsMember,
    request: Request,
    wait: Annotated[float, Query(ge=0, le=3600, description="seconds to wait for the first")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    session: SessionQuery = None,
    lease: Annotated[float | None, Query(gt=0, le=86400)] = None,
    pinned_only: bool = False,
) -> Inbox:
    """Lease up to ``limit`` messages, waiting up to ``wait`` seconds for the first;
    each comes back after its lease unless acked."""
    gone = asyncio.Event()

    async def watch_client() -> None:
        # a long-poll whose client went away must not lease messages nobody reads
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch_client()) if wait > 0 else None
    try:
        got = await api.receive(
            session=session,
            limit=limit,
            wait=wait,
            lease=lease,
            pinned_only=pinned_only,
            stop=gone,
        )
    finally:
        if watcher is not None:
            watcher.cancel()
    if got and (gone.is_set() or await request.is_disconnected()):
        await api.release([m.message_id for m in got])
        return Inbox(messages=[])
    return Inbox(messages=got)


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


@router.get("/v1/inbox/stream", response_class=EventStream, responses=SSE_EVENT)
async def inbox_stream(
    api: AsMember, request: Request, session: SessionQuery = None
) -> StreamingResponse:
    """Server-sent events: each message is leased and sent as ``event: message``;
    ack it with ``POST /v1/inbox/ack``. A comment line every 15 s keeps it open."""

    async def events() -> AsyncIterator[str]:
        yield ": connected\n\n"
        while not await request.is_disconnected():
            got = await api.receive(session=session, limit=32, wait=15.0)
            if not got:
                yield ": keep-alive\n\n"
            for m in got:
                # ids are checked whole on the way in; the line is kept one line anyway
                mid = m.message_id.replace("\r", "").replace("\n", "")
                data = m.model_dump_json(by_alias=True)
                yield f"event: message\nid: {mid}\ndata: {data}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def fast_ack(request: Request) -> Response:
    api, body = await fast_call(request, AckIn)
    acked = await api.ack(body.message_ids)
    return JSONResponse(acked.model_dump())
