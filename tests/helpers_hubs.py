"""Helpers the hub-to-hub delegation and loop tests share: what a hub queued for the other
hub, and the budget notice a team's human is sent when a ring stops."""

from __future__ import annotations

from typing import Any

import httpx

from backchannel.hub import Hub
from backchannel.testing import eventually_blocking


async def chat_bodies(hub: Hub) -> dict[str, dict[str, Any]]:
    """The bodies of the ``/api/chat`` calls team ``t`` queued for another hub, by the
    task's tool_use_id: what the other hub would be sent."""
    jobs = await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox", pending_only=False))
    return {
        j.payload["body"]["tool_use_id"]: j.payload["body"]
        for j in jobs
        if j.payload["purpose"] == "chat"
    }


def budget_notices(user: httpx.Client, budget: str) -> list[dict[str, Any]]:
    """Wait for the system notices of a spent ``budget`` ("pair" or "chain") in the
    inbox of the team's human ``user``, and return them."""
    found: list[dict[str, Any]] = eventually_blocking(
        lambda: (
            [
                m
                for m in user.get("/v1/inbox", params={"limit": 100}).json()["messages"]
                if m["kind"] == "system" and m["meta"].get("budget") == budget
            ]
            or None
        ),
        what=f"a {budget} budget notice for the team's human",
        within=10,
    )
    return found
