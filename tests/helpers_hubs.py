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


async def pass_the_chain_until_spent(hub: Hub, team: str = "t") -> None:
    """Members ``a`` and ``b`` (sessions ``a-s``, ``b-s``; a message for ``a`` waiting)
    pass the chain once each way, so that ``a``'s turn then works in it at hop 2: spent
    at a ``chain_budget`` of 2."""

    async def turn(who: str) -> None:
        got = await hub.receive(team, who, session=f"{who}-s", limit=10)
        await hub.ack(team, who, [g.message.message_id for g in got])
        shown = "\n".join(g.message.text for g in got if g.message.chain_id)
        await hub.report_event(team, who, f"{who}-s", "turn_start", shown)

    await turn("a")
    await hub.send(team, "a", "b", "hop one", sender_session="a-s", link=False)
    await hub.report_event(team, "a", "a-s", "agent_stop", "")
    await turn("b")
    await hub.send(team, "b", "a", "hop two", sender_session="b-s", link=False)
    await hub.report_event(team, "b", "b-s", "agent_stop", "")
    await turn("a")  # a's turn works in the spent chain, at hop 2
