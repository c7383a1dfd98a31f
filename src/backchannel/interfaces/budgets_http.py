"""HTTP routes for conversation budgets.

``GET /v1/teams/{team}/budgets`` lists the pair and chain budgets that have been used
(any member of the team, or the admin). ``POST /v1/teams/{team}/budgets/extend``
``{"key": "pair:a|b" | "chain:<id>", "by": N}`` lets exactly ``N`` more exchanges
(or hops) through; only the team's human (``user``) or the admin may. A send over a
spent budget is answered ``429 budget_exhausted`` by every sending route.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from backchannel.hub import Hub
from backchannel.interfaces.http import Auth


class ExtendIn(BaseModel):
    key: str = Field(
        min_length=3,
        max_length=300,
        description="the budget: 'pair:<a>|<b>' or 'chain:<chain_id>'",
    )
    by: int = Field(ge=1, le=1000, description="how many more exchanges (or hops) to let through")


def mount_budget_routes(app: FastAPI) -> None:
    hub: Hub = app.state.hub

    @app.get("/v1/teams/{team}/budgets", tags=["budgets"])
    async def list_budgets(team: str, who: Auth) -> dict[str, Any]:
        """Used conversation budgets: per pair (exchanges in the window) and per chain."""
        who.need_team(team)
        return {"budgets": await hub.list_budgets(team)}

    @app.post("/v1/teams/{team}/budgets/extend", tags=["budgets"])
    async def extend_budget(team: str, body: ExtendIn, who: Auth) -> dict[str, Any]:
        """Let exactly ``by`` more exchanges (or hops) through: the team's human or the
        admin only."""
        who.need_team(team)
        by_whom = "admin" if who.member is None else who.member.name
        return await hub.extend_budget(team, body.key, body.by, by_whom=by_whom)
