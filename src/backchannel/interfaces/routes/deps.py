"""Who is calling, as FastAPI dependencies the routers share.

``Authorization: Bearer <token>`` is the admin token or a member token. ``Auth`` gives
the :class:`Principal`; ``AsMember`` the :class:`~backchannel.member.MemberApi` of the
calling member (403 for the admin token); ``AsAdmin`` the
:class:`~backchannel.member.AdminApi` (403 for a member token).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Any, cast

from fastapi import Depends, Request

from backchannel.errors import Forbidden, Unauthorized, UnknownTeam, token_revoked
from backchannel.hub import Hub
from backchannel.member import AdminApi, MemberApi
from backchannel.types import Member


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the administrator, or one member of one team."""

    member: Member | None

    @property
    def is_admin(self) -> bool:
        return self.member is None

    def need_member(self) -> Member:
        if self.member is None:
            raise Forbidden(
                "this call acts as a member; use a member token (the admin token manages "
                "teams and members only)"
            )
        return self.member

    def need_admin(self) -> None:
        if self.member is not None:
            raise Forbidden("this call needs the admin token (from $BACKCHANNEL_HOME/admin.token)")

    def need_team(self, team: str) -> None:
        """Admins see every team; a member only its own (others look nonexistent)."""
        if self.member is not None and self.member.team != team:
            raise UnknownTeam(f"unknown team {team!r}", team=team)


async def principal(request: Request) -> Principal:
    """Resolve the bearer token to the administrator or a member (constant-time compare)."""
    hub: Hub = request.app.state.hub
    admin_token: str = request.app.state.admin_token
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "missing bearer token: send 'Authorization: Bearer <token>' with a member token "
            "(from `backchannel member add`) or the admin token ($BACKCHANNEL_HOME/admin.token)"
        )
    if hmac.compare_digest(token.encode(), admin_token.encode()):
        return Principal(None)
    member = await hub.authenticate(token)
    if member is None:
        raise Unauthorized("invalid token: it belongs to no member and is not the admin token")
    return Principal(member)


Auth = Annotated[Principal, Depends(principal)]


async def revoked(request: Request) -> Unauthorized | None:
    """Why the request's token no longer acts as its member (rotated, or the member
    removed), or None. A token is checked when its request comes; a long-poll or a
    stream that outlives a rotation asks again before it hands messages over."""
    try:
        await principal(request)
    except Unauthorized:
        return token_revoked("the request waited")
    return None


def hub_of(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


class _Refused:
    """Stands in for the API a token may not use. The refusal is raised on first use,
    inside the route, so a malformed request is answered 422 before a wrong token's 403
    (FastAPI solves dependencies before it checks the body), as the fast paths do."""

    def __init__(self, error: Forbidden) -> None:
        self._error = error

    def __getattr__(self, name: str) -> Any:
        raise self._error


async def member_api(request: Request, who: Auth) -> MemberApi:
    try:
        return MemberApi(hub_of(request), who.need_member())
    except Forbidden as exc:
        return cast(MemberApi, _Refused(exc))


async def admin_api(request: Request, who: Auth) -> AdminApi:
    try:
        who.need_admin()
    except Forbidden as exc:
        return cast(AdminApi, _Refused(exc))
    return AdminApi(hub_of(request))


AsMember = Annotated[MemberApi, Depends(member_api)]
AsAdmin = Annotated[AdminApi, Depends(admin_api)]
