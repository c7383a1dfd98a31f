"""``/healthz`` and ``/v1/me``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from backchannel.interfaces.routes.deps import Auth, hub_of
from backchannel.interfaces.wire import StrictRoute
from backchannel.member import AdminApi, MemberApi
from backchannel.models import Health, Me

router = APIRouter(route_class=StrictRoute, tags=["meta"])


@router.get("/healthz", response_model_exclude_none=True)
async def healthz(request: Request) -> Health:
    maintenance = hub_of(request).maintenance
    jobs, leases = len(maintenance.failing()), len(maintenance.failing_leases())
    skew = round(maintenance.skew, 3) if maintenance.skewed else None
    if jobs or leases or skew is not None:
        return Health(
            status="degraded",
            failing_jobs=jobs or None,
            failing_leases=leases or None,
            clock_skew=skew,
        )
    return Health(status="ok")


@router.head("/healthz", include_in_schema=False)
async def healthz_head(request: Request) -> Response:
    """``HEAD /healthz`` for health checkers that ask with HEAD (load balancers, ``curl
    -I``): the status code of ``GET``, no body. Kept out of the API's schema, which
    lists ``GET``."""
    health = await healthz(request)
    return Response(status_code=200, headers={"x-health": health.status})


@router.get("/v1/me")
async def me(who: Auth, request: Request) -> Me:
    """Who the token is: the administrator, or a member of a team."""
    if who.member is None:
        return AdminApi.me()
    return MemberApi(hub_of(request), who.member).me()
