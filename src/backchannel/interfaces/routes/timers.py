"""Timers: heartbeats with intent (``anchor``, ``check``, ``wait``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

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
    api: AsMember, member: MemberQuery = None, session: SessionQuery = None, all: bool = False
) -> TimerList:
    """Pending timers of your team (``all``: fired and cancelled ones too)."""
    return await api.timers(member=member, session=session, all=all)


@router.delete("/v1/timers/{timer_id}")
async def cancel_timer(timer_id: Annotated[int, Path(ge=1, le=MAX_INT)], api: AsMember) -> Timer:
    return await api.cancel_timer(timer_id)
