"""Links: the conversations between sessions of the caller's team."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.interfaces.routes.deps import AsMember
from backchannel.interfaces.wire import ItemId, MemberQuery, StrictRoute
from backchannel.models import Link, LinkList
from backchannel.types import MESSAGE_ID_PATTERN

router = APIRouter(route_class=StrictRoute, tags=["links"])


@router.get("/v1/links")
async def list_links(
    api: AsMember,
    member: MemberQuery = None,
    open_only: bool = False,
    after: Annotated[
        str | None,
        Query(pattern=MESSAGE_ID_PATTERN, description="the next_after of the page before"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
) -> LinkList:
    """Your team's links: peers, turns used of the budget, state, why closed; in the
    order they opened, a page at a time: at most ``limit``, after link ``after``; the
    answer's ``next_after`` is where the next page starts (null: this page is the last)."""
    return await api.links(member=member, open_only=open_only, after=after, limit=limit)


@router.get("/v1/links/{link_id}")
async def get_link(link_id: ItemId, api: AsMember) -> Link:
    return await api.link(link_id)
