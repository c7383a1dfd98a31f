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
import logging
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Receive, Scope, Send

from backchannel.core.ids import new_receive_id
from backchannel.core.messages import MAX_LEASE, MAX_LIMIT, MAX_WAIT
from backchannel.errors import BackchannelError, InvalidState
from backchannel.interfaces.guard import ABORT
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
from backchannel.types import MESSAGE_ID_PATTERN, SESSION_PATTERN, Lease

router = APIRouter(route_class=StrictRoute, tags=["inbox"])
log = logging.getLogger(__name__)


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
    "the same attempt and in the order it sent them, all those still leased to it "
    "(after the one Last-Event-ID names, when it names one of them or one acked): a "
    "proxy may have cut the connection after the hub wrote them"
)

#: what ``limit`` is to the event stream
STREAM_LIMIT = (
    "how many messages the stream holds unacked at most: it leases more only as you ack "
    "them, so a stream whose reader is gone without a word holds no more than these"
)

#: seconds between the comment lines that keep a quiet stream open
KEEP_ALIVE = 15.0


class _Stalled:
    """Set by :class:`_BoundedWrites` when a write to the reader did not drain in time."""

    stalled = False


class _BoundedWrites(EventStream):
    """An event stream whose every write must be taken by the reader within
    ``write_timeout`` seconds. One that is not (the reader stopped reading, or a proxy
    stopped forwarding, with the connection still open: nothing else tells the hub)
    ends the stream: ``state.stalled`` is set and the body's generator closed, whose
    cleanup gives back what the stream holds, and the connection is cut (when the server
    offers the :data:`~backchannel.interfaces.guard.ABORT` extension, as ``backchannel
    serve``'s does): closed, it would stay open until the reader took what is buffered
    for it. ``end`` runs when the response is over, if the body's cleanup did not (the
    client left before the body started)."""

    def __init__(
        self,
        content: AsyncGenerator[str, None],
        write_timeout: float,
        state: _Stalled,
        end: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._body = content
        self._end = end
        self.write_timeout = write_timeout
        self.state = state
        self._abort: Callable[[], None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._abort = scope.get("extensions", {}).get(ABORT)
        try:
            await super().__call__(scope, receive, send)
        finally:
            # a client gone before the body started (while the first batch was leased):
            # the body never ran, nor its end, which gives back what the stream holds
            await asyncio.shield(self._end())

    async def stream_response(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        async with contextlib.aclosing(self._body) as body:
            async for chunk in body:
                data = chunk.encode(self.charset)
                message = {"type": "http.response.body", "body": data, "more_body": True}
                try:
                    await asyncio.wait_for(send(message), self.write_timeout)
                except TimeoutError:
                    self.state.stalled = True
                    log.warning(
                        "an inbox stream's reader took nothing for %s s: the stream ends, "
                        "what it holds goes back untried, and its connection is cut",
                        self.write_timeout,
                    )
                    break  # closing the body gives its leases back
        if self.state.stalled:
            # a close would wait for the reader to take what is buffered for it, which
            # it never does: the connection (a socket, its buffers) would stay open for
            # as long as the reader keeps it
            if self._abort is not None:
                self._abort()
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _give_back_leased(api: MemberApi, leases: Mapping[str, Lease], untried: bool) -> None:
    """Give back what an event stream holds, each copy under the lease it holds it by
    (untried: the hub knows its reader took none of them in; otherwise counted, as a
    lease's end counts it): a copy the stream opened again under its name has sent
    since is under a lease of that one, and stays with it."""
    with contextlib.suppress(BackchannelError):  # a removed member's copies are dead
        await api.give_back_leased(leases, untried=untried)


@router.get("/v1/inbox/stream", response_class=EventStream, responses=SSE_EVENT)
async def inbox_stream(
    api: AsMember,
    request: Request,
    session: SessionQuery = None,
    receive_id: Annotated[
        str | None, Query(pattern=MESSAGE_ID_PATTERN, description=STREAM_RECEIVE_ID)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description=STREAM_LIMIT)] = 32,
) -> StreamingResponse:
    """Server-sent events: each message is leased and sent as ``event: message`` (its
    ``id:`` the message id); ack it with ``POST /v1/inbox/ack``. A comment line every
    15 s keeps it open. A session that is not yours is refused before the stream
    starts; one that ends while it is open ends it with ``event: error``, and so does
    the token's rotation (or its member's removal), at once (by another hub process on
    the same store, once this one hears of it).

    The stream holds at most ``limit`` messages unacked: it leases more as acks come
    in, so the others go to the member's other receivers meanwhile. A reader that
    takes nothing written to it for the hub's write bound (10 s; gone without a word, a
    proxy that stopped forwarding) ends the stream and its connection, and what it holds
    goes back at once, untried (so does what it leased for a client gone before the
    stream started); a stream whose messages stay unacked for their whole lease ends with
    ``event: error`` (they go back, as a lease's end gives them back), instead of
    leasing them again to a reader that does not ack.

    With ``receive_id``, what the stream leases is leased to that name, and the stream
    opened again under it (a proxy cut the connection after the hub wrote to it) sends
    first all that is still leased to the name, in the order it was sent, the same
    attempt, instead of leaving it to its lease: those after the message
    ``Last-Event-ID`` names when it names one of them or one the reader acked (it saw
    that one and those before it), all of them otherwise. Each copy it sends again is its own (the
    old connection's end does not put it back in the queue), and it supersedes a
    stream still open under the name: that one ends with ``event: error`` (at once on
    this hub; on another hub of the same store as soon as that hub hears of it, within
    a second when the old stream had sent anything) and what it leased and never wrote
    goes back at once."""
    hub = hub_of(request)
    name = receive_id if receive_id is not None else new_receive_id()
    last = request.headers.get("last-event-id", "").strip() or None
    lease = hub.config.lease_seconds
    # a few seconds before the lease ends: a copy still held then was not acked in time
    margin = min(1.0, lease / 4)
    # set when the token is revoked, the stream superseded, or another hub changed the
    # member's inbox (the stream looks at its window: see below)
    gone = asyncio.Event()
    # a stream open under the name on this hub (its reader gone, its end not yet seen)
    # is superseded by this one: it leases nothing more and ends; what it leased and
    # wrote, this one sends again; what it leased and never wrote goes back at once
    # (an unnamed stream's name is its own: no other stream is opened under it)
    hold = None if receive_id is None else hub.open_stream(api.team, api.name, name, gone)
    superseded = asyncio.Event() if hold is None else hold.superseded

    def let_go() -> None:
        if hold is not None:
            hub.close_stream(api.team, api.name, name, hold)

    try:
        # the first lease, before the stream starts, refuses a session that is not
        # yours (a name that holds its whole window already leases nothing more)
        room = limit - len(await api.holding(name, limit))
        first: list[tuple[Received, Lease]] = []
        if room > 0:
            first = await api.stream_receive(name, session=session, limit=room)
    except BaseException:
        let_go()
        raise
    state = _Stalled()
    loop = asyncio.get_running_loop()

    unsent: collections.deque[Received] = collections.deque()
    sent: dict[str, float] = {}  # written and still held: when it was written
    # the lease each copy this stream holds (unsent or sent) is held by: a give-back
    # names it, so it never takes back a copy the stream opened again has sent since
    leases: dict[str, Lease] = {}

    elsewhere = False  # superseded by a stream opened again on another hub

    def take(got: Sequence[tuple[Received, Lease]]) -> None:
        for m, held in got:
            unsent.append(m)
            leases[m.message_id] = held

    def of(ids: Iterable[str]) -> dict[str, Lease]:
        return {mid: leases[mid] for mid in ids if mid in leases}

    ended = False

    async def end() -> None:
        # a batch is leased whole: those of it not written when the stream ends (the
        # reader went away, a proxy cut it, or the client left before the body started)
        # are given back at once, not left leased to nobody until the lease ends; one
        # written may have been read, and stays leased (unless the reader stopped taking
        # what is written: then all goes back)
        nonlocal ended
        if ended:
            return
        ended = True
        let_go()
        if not started:  # nothing was written: the first batch goes back as it was leased
            leases.update((m.message_id, held) for m, held in first)
            unsent.extend(m for m, _ in first)
        # stalled: the reader took nothing in, not even what was written
        back = of(leases if state.stalled else (m.message_id for m in unsent))
        if back:
            await asyncio.shield(_give_back_leased(api, back, untried=True))
        # superseded from another hub: the reader is on the stream opened again there,
        # which sent again (under leases of its own) all the name held when it
        # opened; what this one wrote after goes back (counted: it was written), for
        # that one to send. (On this hub this one wrote nothing after it opened.)
        written_after = of(sent) if elsewhere and not state.stalled else {}
        if written_after:
            await asyncio.shield(_give_back_leased(api, written_after, untried=False))

    started = False

    async def events() -> AsyncGenerator[str, None]:
        nonlocal started
        started = True
        try:
            yield ": connected\n\n"
            with hub.watch_revocation(api.member.token_hash, gone, api.member.team):
                async with contextlib.aclosing(batches()) as chunks:
                    async for chunk in chunks:
                        yield chunk
        finally:
            await end()

    def written(m: Received) -> str:
        sent[m.message_id] = loop.time()
        # ids are checked whole on the way in; the line is kept one line anyway
        mid = m.message_id.replace("\r", "").replace("\n", "")
        data = m.model_dump_json(by_alias=True)
        return f"event: message\nid: {mid}\ndata: {data}\n\n"

    async def flush() -> AsyncGenerator[str, None]:
        while unsent:
            # the server takes what is written to a connection that is gone and
            # drops it: no more of the batch is written into it (nor into one a
            # stream opened again under the name has superseded)
            if superseded.is_set() or await request.is_disconnected():
                return
            yield written(unsent.popleft())

    def superseded_error() -> str:
        error = InvalidState(
            f"another stream was opened under receive_id {name!r}: it sends what this "
            "one held, and this one ends; open one stream at a time under a name",
            field="receive_id",
        )
        return f"event: error\ndata: {json.dumps(error.to_json())}\n\n"

    async def batches() -> AsyncGenerator[str, None]:
        if receive_id is None:
            take(first)
        else:  # all the name holds, in the order it was sent: ``first`` comes last;
            # each copy sent again is held anew, under a lease of this stream's own
            # closed early, what it handed anew and not yet answered goes back at once
            async with contextlib.aclosing(api.held_again_since(receive_id, last)) as pages:
                async for page in pages:
                    take(page)
                    async for chunk in flush():
                        yield chunk
                    if unsent:
                        if superseded.is_set():
                            yield superseded_error()
                        return
        quiet_since = loop.time()
        while True:
            async for chunk in flush():
                yield chunk
                quiet_since = loop.time()
            if superseded.is_set():
                yield superseded_error()
                return
            if unsent or await request.is_disconnected():
                return
            holds = await api.held_leases(name, max(limit, len(sent)))
            for mid in [k for k in sent if k not in holds]:
                del sent[mid]  # acked (or released)
                leases.pop(mid, None)
            if any(holds[mid] != leases.get(mid) for mid in sent):
                # sent again by the stream opened again under the name on another hub
                nonlocal elsewhere
                elsewhere = True
                superseded.set()
                yield superseded_error()
                return
            held = set(holds)
            now = loop.time()
            oldest = min(sent.values(), default=now + lease)
            if oldest + lease - margin <= now:
                unacked = InvalidState(
                    f"{len(sent)} message(s) this stream sent were not acked within their "
                    f"lease ({lease:g} s): the stream ends and they go back to the inbox; "
                    "ack each message (POST /v1/inbox/ack) once it is handled, and open the "
                    "stream again",
                    field="ack",
                )
                await _give_back_leased(api, of(sent), untried=False)
                yield f"event: error\ndata: {json.dumps(unacked.to_json())}\n\n"
                return
            wait = max(0.0, min(KEEP_ALIVE - (now - quiet_since), oldest + lease - margin - now))
            room = limit - len(held)
            got: list[tuple[Received, Lease]] = []
            if room <= 0:  # the window is full: wait for an ack
                await api.holding(name, limit, wait=min(wait, 1.0), stop=gone)
            else:
                try:
                    got = await api.stream_receive(
                        name, session=session, limit=room, wait=wait, stop=gone
                    )
                except BackchannelError as exc:  # the session ended meanwhile
                    yield f"event: error\ndata: {json.dumps(exc.to_json())}\n\n"
                    return
            take(got)
            # what set it is looked at from here: a revocation just below, a stream
            # superseded or a look asked for (another hub changed the member's inbox: a
            # stream opened again there may have taken what this one sent) at the top
            gone.clear()
            if (error := await revoked(request)) is not None:
                yield f"event: error\ndata: {json.dumps(error.to_json())}\n\n"
                return  # what it just leased goes back, unsent
            if not got and loop.time() - quiet_since >= KEEP_ALIVE:
                yield ": keep-alive\n\n"
                quiet_since = loop.time()

    return _BoundedWrites(events(), hub.config.stream_write_timeout, state, end)


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
