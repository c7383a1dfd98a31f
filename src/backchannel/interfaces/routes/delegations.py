"""Delegation: one agent called as an asynchronous tool by another."""

from __future__ import annotations

from fastapi import APIRouter

from backchannel.interfaces.routes.deps import AsMember
from backchannel.interfaces.wire import ItemId, MemberQuery, StrictRoute
from backchannel.models import DelegateIn, Delegation, DelegationList

router = APIRouter(route_class=StrictRoute, tags=["delegation"])


@router.post("/v1/delegations", status_code=201)
async def delegate(body: DelegateIn, api: AsMember) -> Delegation:
    """Call another agent as an asynchronous tool; returns at once, pending."""
    return await api.delegate(
        body.to,
        body.task,
        timeout_s=body.timeout_s,
        session=body.session,
        tool_use_id=body.tool_use_id,
    )


@router.get("/v1/delegations")
async def list_delegations(api: AsMember, member: MemberQuery = None) -> DelegationList:
    return await api.delegations(member=member)


@router.get("/v1/delegations/{delegation_id}")
async def get_delegation(delegation_id: ItemId, api: AsMember) -> Delegation:
    return await api.delegation(delegation_id)
