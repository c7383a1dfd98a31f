"""Delegation: one agent called as an asynchronous tool by another."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.interfaces.routes.deps import AsMember
from backchannel.interfaces.wire import ItemId, MemberQuery, StrictRoute
from backchannel.models import DelegateIn, Delegation, DelegationList
from backchannel.types import MESSAGE_ID_PATTERN

router = APIRouter(route_class=StrictRoute, tags=["delegation"])


#: The extra success of an idempotent delegate: the same tool_use_id again answers 200.
REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {
        "model": Delegation,
        "description": "Replayed: this tool_use_id already made this delegation",
    }
}


@router.post("/v1/delegations", status_code=201, response_model=Delegation, responses=REPLAYED)
async def delegate(body: DelegateIn, api: AsMember) -> Response:
    """Call another agent as an asynchronous tool; returns at once, pending: 201, or 200
    and ``replayed`` when the same call is made again under its ``tool_use_id``."""
    d = await api.delegate(
        body.to,
        body.task,
        timeout_s=body.timeout_s,
        session=body.session,
        tool_use_id=body.tool_use_id,
    )
    return Response(
        d.model_dump_json(by_alias=True),
        status_code=200 if d.replayed else 201,
        media_type="application/json",
    )


@router.get("/v1/delegations")
async def list_delegations(
    api: AsMember,
    member: MemberQuery = None,
    pending_only: Annotated[
        bool, Query(description="only the delegations still waiting for their answer")
    ] = False,
    after: Annotated[
        str | None,
        Query(pattern=MESSAGE_ID_PATTERN, description="the next_after of the page before"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
) -> DelegationList:
    """The delegations you made or were asked (the team's human: all of the team's;
    ``pending_only``: those still waiting for their answer), in the order they were made,
    a page at a time: at most ``limit``, after delegation ``after``; the answer's
    ``next_after`` is where the next page starts (null: this page is the last)."""
    return await api.delegations(member=member, pending_only=pending_only, after=after, limit=limit)


@router.get("/v1/delegations/{delegation_id}")
async def get_delegation(delegation_id: ItemId, api: AsMember) -> Delegation:
    return await api.delegation(delegation_id)
