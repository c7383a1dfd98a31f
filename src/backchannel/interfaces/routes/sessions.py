"""Sessions: open or resume, report runtime events, terminate, read transcripts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.interfaces.routes.deps import AsMember
from backchannel.interfaces.wire import MAX_INT, MemberQuery, SessionId, StrictRoute
from backchannel.models import (
    Alive,
    AliveIn,
    EventAnswer,
    EventIn,
    SessionIn,
    SessionInfo,
    SessionList,
    TerminateIn,
    Transcript,
)
from backchannel.types import SESSION_PATTERN

router = APIRouter(route_class=StrictRoute, tags=["sessions"])


@router.post("/v1/sessions", status_code=201)
async def open_session(body: SessionIn, api: AsMember) -> SessionInfo:
    """Open a session, or resume one by id (same state, links and timers)."""
    return await api.open_session(body.session_id)


@router.get("/v1/sessions")
async def list_sessions(
    api: AsMember,
    member: MemberQuery = None,
    active_only: Annotated[
        bool, Query(description="only the sessions whose turn runs now")
    ] = False,
    live_only: Annotated[
        bool, Query(description="only the sessions that have not ended (not terminated)")
    ] = False,
    after: Annotated[
        str | None,
        Query(pattern=SESSION_PATTERN, description="the next_after of the page before"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
) -> SessionList:
    """Your team's sessions (or one member's; with ``active_only``, those whose turn
    runs now; with ``live_only``, those not terminated), in the order they were opened, a
    page at a time: at most ``limit``, after session ``after``; the answer's
    ``next_after`` is where the next page starts (null: this page is the last)."""
    return await api.sessions(
        member=member, active_only=active_only, live_only=live_only, after=after, limit=limit
    )


@router.post("/v1/sessions/alive")
async def runtime_alive(body: AliveIn, api: AsMember) -> Alive:
    """A runtime process of yours is alive (its MCP server beats while it runs): your
    live sessions that run under it are too, even idle or in one long tool call."""
    return await api.runtime_alive(body.runtime)


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: SessionId, api: AsMember) -> SessionInfo:
    return await api.session(session_id)


@router.post("/v1/sessions/{session_id}/events")
async def report_event(session_id: SessionId, body: EventIn, api: AsMember) -> EventAnswer:
    """Report a runtime event: turn_start, thought, tool_call, tool_result,
    agent_output or agent_stop (whose text is the closing text, routed)."""
    return await api.report_event(
        session_id, body.kind, body.text, body.data, request_id=body.request_id
    )


@router.post("/v1/sessions/{session_id}/terminate")
async def terminate(session_id: SessionId, body: TerminateIn, api: AsMember) -> SessionInfo:
    return await api.terminate_session(session_id, body.reason)


@router.get("/v1/sessions/{session_id}/transcript")
async def transcript(
    session_id: SessionId,
    api: AsMember,
    since: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    until: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    tail_chars: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    max_chars: Annotated[int, Query(ge=1, le=1_000_000)] = 20_000,
) -> Transcript:
    """A teammate's full transcript (get_session_data), paged and capped."""
    return await api.transcript(
        session_id, since=since, until=until, tail_chars=tail_chars, max_chars=max_chars
    )
