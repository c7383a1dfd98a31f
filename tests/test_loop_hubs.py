"""No endless loops between hubs: agents that always answer, on two hubs or across routes
that leave one hub, stop at a budget, and the count of what got through is exactly it.

The other hub is played in process: its side of ``/api/chat`` is the outbox job this hub
queues (read back as its body), and its answer is ``accept_tool_response`` with the
chain the other hub's turn went on in (the task's hop, one further), as a real hub sends
it. Each ring runs to a deadline in rounds, never a sleep.
"""

from __future__ import annotations

from typing import Any

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as drules
from backchannel.errors import BudgetExhausted
from backchannel.hub import Hub
from backchannel.testing import FakeClock, MemoryStore

SECRET = "test-secret-0123456789"
FAST = drules.RetryPolicy(start=0.05, factor=2, cap=0.2, budget=5, timeout=2)


def _cfg() -> CallbackConfig:
    return CallbackConfig(
        secret=SECRET, services={"hub-b": Service("hub-b", "http://127.0.0.1:9")}, retry=FAST
    )


async def _chat_bodies(hub: Hub) -> dict[str, dict[str, Any]]:
    jobs = await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox", pending_only=False))
    return {
        j.payload["body"]["tool_use_id"]: j.payload["body"]
        for j in jobs
        if j.payload["purpose"] == "chat"
    }


def _hub_b_answers(body: dict[str, Any], n: int) -> dict[str, Any]:
    """The chain hub B's answer names: its turn's, one hop further. A task that named no
    chain started one at hop 0 there, so the answer names that one at hop 1."""
    chain = body.get("chain")
    if chain is None:
        return {"id": f"b-chain-{n}", "hop": 1}
    return {"id": chain["id"], "hop": chain["hop"] + 1}


async def test_a_lead_in_one_shot_sessions_that_asks_another_hub_on_every_answer_stops(
    clock: FakeClock,
) -> None:
    """lead runs one session per turn (``claude -p``: the session ends with its turn).
    Each turn asks worker@hub-b; the answer comes back after the session that asked has
    ended, so it reaches the member's next session, not the one its chain was raised on.
    That session's turn goes on in the answer's chain: the ring stops at the chain budget
    instead of starting a fresh chain on every answer."""
    budget = 6
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=_cfg()) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": budget, "pair_budget": 1000}
        )
        await hub.add_member("t", "lead")
        await hub.add_member("t", "hub-b")
        start = await hub.send("t", "user", "lead", "start")
        tasks: list[tuple[str | None, int | None]] = []
        refused: list[BudgetExhausted] = []
        for n in range(4 * budget):  # a deadline in rounds: past it, it never stopped
            sid = f"lead-{n}"
            await hub.open_session("t", "lead", sid)
            got = await hub.receive("t", "lead", session=sid, limit=20)
            assert got, f"round {n}: nothing reached lead's new session"
            await hub.ack("t", "lead", [g.message.message_id for g in got])
            text = "\n".join(g.message.text for g in got)
            await hub.report_event("t", "lead", sid, "turn_start", text)
            try:
                await hub.delegate(
                    "t", "lead", sid, "worker@hub-b", f"ask {n}", tool_use_id=f"tu_{n}"
                )
            except BudgetExhausted as exc:
                refused.append(exc)
            await hub.report_event("t", "lead", sid, "agent_stop", "")
            await hub.terminate_session("t", "lead", sid)
            if refused:
                break
            body = (await _chat_bodies(hub))[f"tu_{n}"]
            chain = body.get("chain")
            tasks.append((chain["id"], chain["hop"]) if chain else (None, None))
            await hub.accept_tool_response(
                body["reply"]["bearerToken"], f"answer {n}", chain=_hub_b_answers(body, n)
            )
        else:
            raise AssertionError(f"still asking after {len(tasks)} tasks: {tasks}")
        # every task in the human's chain, two hops apart (a task, then its answer)
        assert tasks == [(start.message_id, hop) for hop in range(1, budget + 1, 2)]
        assert refused[0].details["budget"] == "chain"
        assert refused[0].details["key"] == f"chain:{start.message_id}"
