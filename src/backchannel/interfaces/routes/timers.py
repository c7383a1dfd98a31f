"""Timers: heartbeats with intent (``anchor``, ``check``, ``wait``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from backchannel.core.timers import MAX_TIMER_PAGE, TIMER_PAGE
from backchannel.interfaces.routes.deps import AsMember
from backchannel.interfaces.wire import MAX_INT, MemberQuery, SessionQuery, StrictRoute
from backchannel.models import Timer, TimerIn, TimerList

router = APIRouter(route_class=StrictRoute, tags=["timers"])


@router.post("/v1/timers", status_code=201)
async def set_timer(body: TimerIn, api: AsMember) -> Timer:
    """Set a heartbeat: an anchor back to your task, or a check on (a wait for) a peer."""
    return await api.set_timer(
        body.intent,
        body.minutes,
        body.note,
        body.target,
        seconds=body.seconds,
        session=body.session,
        request_id=body.request_id,
    )


@router.get("/v1/timers")
async def list_timers(
    api: AsMember,
    member: MemberQuery = None,
    session: SessionQuery = None,
    all: bool = False,
    after: Annotated[
        int, Query(ge=0, le=MAX_INT, description="the next_after of the page before")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_TIMER_PAGE)] = TIMER_PAGE,
) -> TimerList:
    """Pending timers of your team (``all``: fired and cancelled ones too), in the order
    they were set, a page at a time: at most ``limit``, after timer id ``after``; the
    answer's ``next_after`` is where the next page starts."""
    return await api.timers(member=member, session=session, all=all, after=after, limit=limit)


@router.get("/v1/timers/{timer_id}")
async def get_timer(timer_id: Annotated[int, Path(ge=1, le=MAX_INT)], api: AsMember) -> Timer:
    """One timer of your team (pending, fired or cancelled), its note whole."""
    return await api.timer(timer_id)


@router.delete("/v1/timers/{timer_id}")
async def cancel_timer(timer_id: Annotated[int, Path(ge=1, le=MAX_INT)], api: AsMember) -> Timer:
    return await api.cancel_timer(timer_id)
