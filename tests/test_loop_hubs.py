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


async def _lead_turn(hub: Hub, sid: str, n: int, refused: list[BudgetExhausted]) -> bool:
    """lead's turn on whatever waits in ``sid``: it asks worker@hub-b. Whether it had
    anything to do."""
    got = await hub.receive("t", "lead", session=sid, limit=20)
    if not got:
        return False
    await hub.ack("t", "lead", [g.message.message_id for g in got])
    await hub.report_event("t", "lead", sid, "turn_start", "\n".join(g.message.text for g in got))
    try:
        await hub.delegate("t", "lead", sid, "worker@hub-b", f"ask {n}", tool_use_id=f"tu_{n}")
    except BudgetExhausted as exc:
        refused.append(exc)
    await hub.report_event("t", "lead", sid, "agent_stop", "")
    return True


async def test_two_agents_on_two_hubs_stop_at_the_pair_budget_whichever_route_carries_it(
    clock: FakeClock,
) -> None:
    """lead (this hub) and worker (hub B) always answer each other, and hub B names a
    fresh chain every time (an older hub, or a peer that mints chain ids), so no chain
    budget can see the ring. worker takes turns answering lead's task over
    ``/api/tools/response`` and sending lead a task of its own over ``/api/chat``; lead
    asks again on either. Across hubs the pair is lead and hub B's member of this team
    (the member named like the service lead addresses worker by): every task out, every
    answer in and every task in is a change of speaker between them, so the ring stops
    at exactly the pair budget whatever route each exchange took."""
    budget = 7
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=_cfg()) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": 1000, "pair_budget": budget}
        )
        await hub.add_member("t", "lead")
        await hub.add_member("t", "hub-b")  # hub B, as a member of this team
        await hub.open_session("t", "lead", "lead-s")
        await hub.send("t", "user", "lead", "start")
        refused: list[BudgetExhausted] = []
        routes: list[str] = []  # each exchange that got through, by its route
        sessions = ["lead-s"]
        for n in range(6 * budget):  # a deadline in rounds: past it, it never stopped
            progressed = False
            for sid in list(sessions):
                if await _lead_turn(hub, sid, n, refused):
                    progressed = True
                    body = (await _chat_bodies(hub)).get(f"tu_{n}")
                    if body is None:
                        continue
                    routes.append("task out")
                    chain = {"id": f"b-fresh-{n}", "hop": 1}  # hub B forgets the chain
                    if n % 2 == 0:
                        await hub.accept_tool_response(
                            body["reply"]["bearerToken"], f"answer {n}", chain=chain
                        )
                        routes.append("answer in")
                    else:
                        try:
                            d = await hub.accept_chat(
                                "t", "hub-b", "lead", f"worker asks back {n}",
                                reply_service="hub-b", reply_token="tok", session_id="w-s",
                                tool_use_id=f"tb_{n}", chain=chain,
                            )  # fmt: skip
                        except BudgetExhausted as exc:
                            refused.append(exc)
                            continue
                        routes.append("task in")
                        assert d.callee_session is not None
                        sessions.append(d.callee_session)
            if not progressed:
                break
        else:
            raise AssertionError(f"still talking after {len(routes)} exchanges: {routes}")
        assert {"task out", "answer in", "task in"} <= set(routes)
        assert len(routes) == budget, routes
        assert refused and {e.details["budget"] for e in refused} == {"pair"}
        assert refused[0].details["key"] == "pair:hub-b|lead"
        got = await hub.receive("t", "user", limit=100)
        assert [g for g in got if g.message.meta.get("budget") == "pair"], "the human is told"


async def test_an_agent_no_member_stands_for_is_a_pair_of_its_own_and_can_be_extended(
    clock: FakeClock,
) -> None:
    """lead asks worker@hub-c on every answer, and hub C's answers name no chain (an A2A
    agent, an older hub): lead's session stays at one hop, so only the pair can stop it.
    No member of the team stands for hub C: the pair is lead and ``worker@hub-c``, and
    the human extends it like any pair, by exactly the exchanges given."""
    budget, by = 6, 2
    cfg = CallbackConfig(
        secret=SECRET, services={"hub-c": Service("hub-c", "http://127.0.0.1:9")}, retry=FAST
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": 1000, "pair_budget": budget}
        )
        await hub.add_member("t", "lead")
        await hub.open_session("t", "lead", "lead-s")
        await hub.send("t", "user", "lead", "start")
        refused: list[BudgetExhausted] = []
        exchanges = 0

        async def ring(first: int) -> int:
            n = first
            for n in range(first, first + 6 * budget):  # a deadline in rounds
                got = await hub.receive("t", "lead", session="lead-s", limit=20)
                if not got:
                    return n
                await hub.ack("t", "lead", [g.message.message_id for g in got])
                await hub.report_event("t", "lead", "lead-s", "turn_start", got[-1].message.text)
                try:
                    await hub.delegate(
                        "t", "lead", "lead-s", "worker@hub-c", "again", tool_use_id=f"tu_{n}"
                    )
                except BudgetExhausted as exc:
                    refused.append(exc)
                await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
                body = (await _chat_bodies(hub)).get(f"tu_{n}")
                if body is not None:
                    nonlocal exchanges
                    exchanges += 1
                    assert body.get("chain", {}).get("hop") == 1, "one hop: no chain stops it"
                    await hub.accept_tool_response(body["reply"]["bearerToken"], f"answer {n}")
                    exchanges += 1
            raise AssertionError(f"still asking after {exchanges} exchanges")

        n = await ring(0)
        assert exchanges == budget
        assert refused[-1].details["key"] == "pair:lead|worker@hub-c"
        out = await hub.extend_budget("t", "pair:lead|worker@hub-c", by, by_whom="user")
        assert (out["used"], out["limit"]) == (budget, budget + by)
        await hub.send("t", "user", "lead", "go on")
        await ring(n + 1)
        assert exchanges == budget + by, "exactly the extension more"


async def test_a_chain_a_task_for_another_hub_stopped_is_woken_by_an_extension(
    clock: FakeClock,
) -> None:
    """lead asks worker@hub-b again on every answer. The task at the chain budget spends
    it; its callee is no member of this hub, so the chain is held by lead, the caller: an
    extension tells lead in the chain at the hop it stopped at, and lead's turn on it
    asks again, exactly as many hops further as extended (a task, its answer)."""
    budget, by = 5, 2  # tasks at hops 1, 3, 5; answers at 2, 4, 6
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=_cfg()) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": budget, "pair_budget": 1000}
        )
        await hub.add_member("t", "lead")
        await hub.add_member("t", "hub-b")
        await hub.open_session("t", "lead", "lead-s")
        start = await hub.send("t", "user", "lead", "start")
        refused: list[BudgetExhausted] = []
        hops: list[int] = []

        async def ring(first: int) -> int:
            for n in range(first, first + 4 * budget):  # a deadline in rounds
                if not await _lead_turn(hub, "lead-s", n, refused):
                    return n
                body = (await _chat_bodies(hub)).get(f"tu_{n}")
                if body is not None:
                    hops.append(body["chain"]["hop"])
                    await hub.accept_tool_response(
                        body["reply"]["bearerToken"], f"answer {n}", chain=_hub_b_answers(body, n)
                    )
            raise AssertionError(f"still asking: {hops}")

        n = await ring(0)
        assert hops == [1, 3, 5]
        assert refused and refused[-1].details["key"] == f"chain:{start.message_id}"
        await hub.extend_budget("t", f"chain:{start.message_id}", by, by_whom="user")
        await ring(n + 1)
        assert hops == [1, 3, 5, 6], "lead woken at hop 5 asks at 6; its answer at 7 is the end"
        assert len(refused) == 2
