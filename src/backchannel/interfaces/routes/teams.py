"""Teams and members (admin), credentials and removal, budgets, and a team's live feed.

* ``POST /v1/teams/{team}/members/{name}/token`` gives the member a new token (shown
  only in this answer); the old one answers 401 from then on.
* ``DELETE /v1/teams/{team}/members/{name}`` removes a member: copies still waiting for
  it become dead letters (senders told), its links close (peers told), its timers are
  cancelled, its token stops working. The answer counts what was settled.
* ``DELETE /v1/teams/{team}`` removes a team and everything stored for it.
* ``GET /v1/teams/{team}/budgets`` lists the pair and chain budgets that have been used;
  ``POST .../budgets/extend`` lets exactly ``by`` more exchanges (or hops) through: only
  the team's human (``user``) or the admin may. A send over a spent budget is answered
  ``429 budget_exhausted`` by every sending route.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.hub import FeedItem
from backchannel.interfaces.routes.deps import AsAdmin, Auth, hub_of, revoked
from backchannel.interfaces.routes.stream import (
    SSE_HEADERS,
    EventStream,
    check_cursor,
    resume_after,
    skipped,
)
from backchannel.interfaces.wire import MAX_INT, SSE_EVENT, MemberName, StrictRoute, TeamName
from backchannel.member import AdminApi, MemberApi
from backchannel.models import (
    Budget,
    BudgetList,
    ExtendIn,
    MemberCreated,
    MemberIn,
    MemberList,
    MemberPatch,
    MemberUpdated,
    Removal,
    TeamCreated,
    TeamIn,
    TeamList,
    TeamRef,
    TokenRotated,
)
from backchannel.types import NAME_PATTERN

router = APIRouter(route_class=StrictRoute, tags=["teams"])


@router.post("/v1/teams", status_code=201)
async def create_team(body: TeamIn, admin: AsAdmin) -> TeamCreated:
    """Create a team (admin); the answer carries its human member's token, shown once."""
    return await admin.create_team(body.name, body.settings)


@router.get("/v1/teams")
async def list_teams(
    who: Auth,
    request: Request,
    after: Annotated[
        str | None,
        Query(pattern=NAME_PATTERN, description="the next_after of the page before"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
) -> TeamList:
    """The teams (admin), or the caller's own. By name, a page at a time: at most
    ``limit``, after the name ``after``; the answer's ``next_after`` is where the next
    page starts (null: this page is the last)."""
    if who.member is not None:
        own = who.member.team
        return TeamList(teams=[TeamRef(name=own)] if after is None or own > after else [])
    return await AdminApi(hub_of(request)).teams(after=after, limit=limit)


@router.post("/v1/teams/{team}/members", status_code=201)
async def add_member(team: TeamName, body: MemberIn, admin: AsAdmin) -> MemberCreated:
    """Add a member (admin); the answer carries its token, shown only once."""
    return await admin.add_member(
        team, body.name, body.kind, delivery=body.delivery, settings=body.settings
    )


@router.patch("/v1/teams/{team}/members/{name}")
async def update_member(
    team: TeamName, name: MemberName, body: MemberPatch, admin: AsAdmin
) -> MemberUpdated:
    """Change a member's delivery setting or settings (admin)."""
    return await admin.update_member(team, name, delivery=body.delivery, settings=body.settings)


@router.get("/v1/teams/{team}/members")
async def list_members(
    team: TeamName,
    who: Auth,
    request: Request,
    after: Annotated[
        str | None,
        Query(pattern=NAME_PATTERN, description="the next_after of the page before"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
) -> MemberList:
    """A team's members (its own members or the admin); the admin also sees each one's
    delivery setting, its secrets redacted. By name, a page at a time: at most
    ``limit``, after the name ``after``; the answer's ``next_after`` is where the next
    page starts (null: this page is the last)."""
    who.need_team(team)
    if who.member is not None:
        return await MemberApi(hub_of(request), who.member).members(after=after, limit=limit)
    return await AdminApi(hub_of(request)).members(team, after=after, limit=limit)


@router.post("/v1/teams/{team}/members/{name}/token")
async def rotate_token(team: TeamName, name: MemberName, admin: AsAdmin) -> TokenRotated:
    """Rotate a member's token (admin); the old token fails at once."""
    return await admin.rotate_token(team, name)


@router.delete("/v1/teams/{team}/members/{name}")
async def remove_member(
    team: TeamName,
    name: MemberName,
    admin: AsAdmin,
    reason: Annotated[str, Query(max_length=500)] = "",
) -> Removal:
    """Remove a member (admin); what was waiting for it becomes dead letters."""
    return await admin.remove_member(team, name, reason=reason)


@router.delete("/v1/teams/{team}")
async def remove_team(team: TeamName, admin: AsAdmin) -> Removal:
    """Remove a team and everything stored for it (admin)."""
    return await admin.remove_team(team)


@router.get("/v1/teams/{team}/budgets", tags=["budgets"])
async def list_budgets(
    team: TeamName,
    who: Auth,
    request: Request,
    after: Annotated[
        str | None,
        Query(min_length=1, max_length=300, description="the next_after of the page before"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
) -> BudgetList:
    """Used conversation budgets: per pair (exchanges in the window) and per chain. By
    key, a page at a time: at most ``limit``, after the key ``after``; the answer's
    ``next_after`` is where the next page starts (null: this page is the last)."""
    who.need_team(team)
    return await AdminApi(hub_of(request)).budgets(team, after=after, limit=limit)


@router.post("/v1/teams/{team}/budgets/extend", tags=["budgets"])
async def extend_budget(team: TeamName, body: ExtendIn, who: Auth, request: Request) -> Budget:
    """Let exactly ``by`` more exchanges (or hops) through: the team's human or the
    admin only."""
    who.need_team(team)
    hub = hub_of(request)
    if who.member is None:
        return await AdminApi(hub).extend_budget(
            team, body.key, body.by, request_id=body.request_id
        )
    return await MemberApi(hub, who.member).extend_budget(
        body.key, body.by, request_id=body.request_id
    )


@router.get("/v1/teams/{team}/events", response_class=EventStream, responses=SSE_EVENT)
async def team_events(
    team: TeamName,
    who: Auth,
    request: Request,
    after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
) -> StreamingResponse:
    """Server-sent events: the team's traffic (sends, leases, acks, dead letters), each
    with its cursor as ``id:``, from cursor ``after`` on, or from the ``Last-Event-ID`` a
    reconnecting client sends when that is later. A member's stream ends with ``event: error`` once its token is rotated (or the member
    removed), at once (by another hub process on the same store, once this one hears
    of it)."""
    who.need_team(team)
    hub = hub_of(request)
    await hub.get_team(team)
    after = await check_cursor(hub, team, request, resume_after(request, after))
    gap = await skipped(hub, team, after)
    gone = asyncio.Event()  # set when a member's token is revoked

    async def events() -> AsyncIterator[str]:
        yield ": connected\n\n"
        if gap is not None:
            yield gap
        stream = hub.watch(team, after)
        pending: asyncio.Future[FeedItem] | None = None
        revocation = asyncio.ensure_future(gone.wait())
        watching = (
            hub.watch_revocation(who.member.token_hash, gone, team)
            if who.member is not None
            else contextlib.nullcontext()
        )
        try:
            with watching:
                while not await request.is_disconnected():
                    if pending is None:
                        pending = asyncio.ensure_future(anext(stream))
                    # asyncio.wait does not cancel the read, so a quiet spell keeps the feed
                    waits: set[asyncio.Future[Any]] = {pending, revocation}
                    done, _ = await asyncio.wait(
                        waits, timeout=15.0, return_when=asyncio.FIRST_COMPLETED
                    )
                    if (error := await revoked(request)) is not None:
                        yield f"event: error\ndata: {json.dumps(error.to_json())}\n\n"
                        return
                    if pending not in done:
                        yield ": keep-alive\n\n"
                        continue
                    item = pending.result()
                    pending = None
                    yield f"event: traffic\nid: {item.cursor}\ndata: {json.dumps(item.to_json())}\n\n"
        finally:
            revocation.cancel()
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            await stream.aclose()

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)
