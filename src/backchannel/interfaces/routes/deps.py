"""Who is calling, as FastAPI dependencies the routers share.

``Authorization: Bearer <token>`` is the admin token or a member token. ``Auth`` gives
the :class:`Principal`; ``AsMember`` the :class:`~backchannel.member.MemberApi` of the
calling member (403 for the admin token); ``AsAdmin`` the
:class:`~backchannel.member.AdminApi` (403 for a member token).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
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
            raise Forbidden(
                "this call needs the admin token, and the token sent is member "
                f"{self.member.team}/{self.member.name}'s: send the admin token (the file "
                "admin.token in the data directory of the hub's `serve`)"
            )

    def need_team(self, team: str) -> None:
        """Admins see every team; a member only its own (others look nonexistent)."""
        if self.member is not None and self.member.team != team:
            raise UnknownTeam(f"unknown team {team!r}", team=team)


#: How to send credentials, the end of every refusal of credentials sent wrongly.
_HOW = (
    "send 'Authorization: Bearer <token>' with a member token (from `backchannel member "
    "add`) or the admin token ($BACKCHANNEL_HOME/admin.token)"
)

#: Query parameters a client may have put a token in; named in the refusal.
_QUERY_TOKENS = ("token", "access_token")


def bearer_token(headers: list[str], query: Iterable[str] = (), how: str = _HOW) -> str:
    """The token of the one ``Authorization: Bearer`` header among ``headers`` (the
    request's ``Authorization`` values), or :class:`Unauthorized` naming what is wrong:
    none, several (which one counts is not guessed: a proxy in front may have checked
    another), another scheme, a token without its scheme, a token in the query string
    (``query``: the request's parameter names; never taken, it would be logged). ``how``
    ends each refusal: how to send this endpoint's token."""
    if len(headers) > 1:
        raise Unauthorized(f"send one Authorization header, not {len(headers)}: {how}")
    header = headers[0].strip() if headers else ""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        return token
    if not header:
        if any(name in _QUERY_TOKENS for name in query):
            raise Unauthorized(
                f"a token in the query string is not accepted (it would be written to logs): {how}"
            )
        raise Unauthorized(f"missing bearer token: {how}")
    if not token and scheme.lower() != "bearer":
        raise Unauthorized(f"the Authorization header lacks the scheme 'Bearer ': {how}")
    if scheme.lower() != "bearer":
        shown = scheme if scheme.isascii() and scheme.isalnum() and len(scheme) <= 20 else "?"
        raise Unauthorized(f"unsupported scheme {shown!r} in the Authorization header: {how}")
    raise Unauthorized(f"missing bearer token: {how}")


async def principal(request: Request) -> Principal:
    """Resolve the bearer token to the administrator or a member (constant-time compare)."""
    hub: Hub = request.app.state.hub
    admin_token: str = request.app.state.admin_token
    token = bearer_token(request.headers.getlist("authorization"), request.query_params.keys())
    if hmac.compare_digest(token.encode(), admin_token.encode()):
        return Principal(None)
    member = await hub.authenticate(token)
    if member is None:
        raise Unauthorized(
            "invalid token: it belongs to no member and is not the admin token. A member's "
            "token stops working when it is rotated or its member removed: ask the admin "
            "for the current one (`backchannel member rotate-token` makes a new one)"
        )
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
