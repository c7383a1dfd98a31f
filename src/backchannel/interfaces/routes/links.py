"""Links: the conversations between sessions of the caller's team."""

from __future__ import annotations

from fastapi import APIRouter

from backchannel.interfaces.routes.deps import AsMember
from backchannel.interfaces.wire import ItemId, MemberQuery, StrictRoute
from backchannel.models import Link, LinkList

router = APIRouter(route_class=StrictRoute, tags=["links"])


@router.get("/v1/links")
async def list_links(
    api: AsMember, member: MemberQuery = None, open_only: bool = False
) -> LinkList:
    """Your team's links: peers, turns used of the budget, state, why closed."""
    return await api.links(member=member, open_only=open_only)


@router.get("/v1/links/{link_id}")
async def get_link(link_id: ItemId, api: AsMember) -> Link:
    return await api.link(link_id)
