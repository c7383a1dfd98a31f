"""Admin routes for credentials and removal (``backchannel.hub.admin`` over HTTP).

* ``POST /v1/teams/{team}/members/{name}/token`` gives the member a new token (shown
  only in this answer); the old one answers 401 from then on.
* ``DELETE /v1/teams/{team}/members/{name}`` removes a member: copies still waiting for
  it become dead letters (senders told), its links close (peers told), its timers are
  cancelled, its token stops working. The answer counts what was settled.
* ``DELETE /v1/teams/{team}`` removes a team and everything stored for it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Query

from backchannel.hub import Hub
from backchannel.interfaces.http import Auth


def mount_admin_routes(app: FastAPI) -> None:
    """Add the credential and removal routes to ``app``."""
    hub: Hub = app.state.hub

    @app.post("/v1/teams/{team}/members/{name}/token", tags=["teams"])
    async def rotate_token(team: str, name: str, who: Auth) -> dict[str, Any]:
        """Rotate a member's token (admin); the old token fails at once."""
        who.need_admin()
        token = await hub.rotate_token(team, name)
        return {"name": name, "team": team, "token": token}

    @app.delete("/v1/teams/{team}/members/{name}", tags=["teams"])
    async def remove_member(
        team: str,
        name: str,
        who: Auth,
        reason: Annotated[str, Query(max_length=500)] = "",
    ) -> dict[str, Any]:
        """Remove a member (admin); what was waiting for it becomes dead letters."""
        who.need_admin()
        return (await hub.remove_member(team, name, reason=reason)).to_json()

    @app.delete("/v1/teams/{team}", tags=["teams"])
    async def remove_team(team: str, who: Auth) -> dict[str, Any]:
        """Remove a team and everything stored for it (admin)."""
        who.need_admin()
        return (await hub.remove_team(team)).to_json()
