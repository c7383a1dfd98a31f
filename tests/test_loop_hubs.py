"""No endless loops between hubs: agents that always answer, on two hubs or across routes
that leave one hub, stop at a budget, and the count of what got through is exactly it.

The other hub is played in process: its side of ``/api/chat`` is the outbox job this hub
queues (read back as its body), and its answer is ``accept_tool_response`` with the
chain the other hub's turn went on in (the task's hop, one further), as a real hub sends
it. Each ring runs to a deadline in rounds, never a sleep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as drules
from backchannel.errors import BudgetExhausted, InvalidRequest
from backchannel.hub import Hub
from backchannel.testing import FakeClock, MemoryStore, eventually_blocking
from backchannel.types import MessageKind
from tests.conftest import Server
from tests.helpers_hubs import budget_notices, chat_bodies, pass_the_chain_until_spent
from tests.test_delegation_http import (
    _delegate_on,
    _start_hubs_both_ways,
    _task_waiting,
    first_delegation,
)

SECRET = "test-secret-0123456789"
FAST = drules.RetryPolicy(start=0.05, factor=2, cap=0.2, budget=5, timeout=2)


def _cfg() -> CallbackConfig:
    return CallbackConfig(
        secret=SECRET, services={"hub-b": Service("hub-b", "http://127.0.0.1:9")}, retry=FAST
    )


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
            body = (await chat_bodies(hub))[f"tu_{n}"]
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
    await _ring_across_hubs(clock, _cfg(), "hub-b")


async def test_a_service_whose_member_is_named_otherwise_stops_at_one_pair_budget(
    clock: FakeClock,
) -> None:
    """As above, but the operator added hub B to this team as ``peer-b``, unlike the
    service ``hub-b`` lead addresses worker by, and said so with the service's
    ``member:``. A task out and a task in are exchanges of one pair, lead and peer-b, so
    the ring stops at the pair budget, not at twice it (two pairs, one per direction)."""
    cfg = CallbackConfig(
        secret=SECRET,
        services={"hub-b": Service("hub-b", "http://127.0.0.1:9", member="peer-b")},
        retry=FAST,
    )
    await _ring_across_hubs(clock, cfg, "peer-b")


async def _ring_across_hubs(clock: FakeClock, cfg: CallbackConfig, peer: str) -> None:
    """lead and hub B's worker, hub B a member of the team as ``peer``, always answer
    each other, each route in turn; the ring stops at exactly the pair budget."""
    budget = 7
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": 1000, "pair_budget": budget}
        )
        await hub.add_member("t", "lead")
        await hub.add_member("t", peer)  # hub B, as a member of this team
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
                    body = (await chat_bodies(hub)).get(f"tu_{n}")
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
                                "t", peer, "lead", f"worker asks back {n}",
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
        assert refused[0].details["key"] == "pair:" + "|".join(sorted([peer, "lead"]))
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
                body = (await chat_bodies(hub)).get(f"tu_{n}")
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
                body = (await chat_bodies(hub)).get(f"tu_{n}")
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


def _answered_out(c: httpx.Client, member: str) -> None:
    """Wait until every task ``member`` sent to the other hub has its answer (or failed),
    so the answer crossing back is counted before ``member`` speaks again."""

    def settled() -> bool:
        ds = c.get("/v1/delegations").json()["delegations"]
        return all(d["state"] != "pending" for d in ds if d["caller"] == member)

    eventually_blocking(settled, what=f"the answers to {member}'s tasks", within=30)


def _two_hubs(route: str, tmp_path: Path, pair: int) -> tuple[Server, Server, dict[str, str]]:
    if route == "http":
        return _start_hubs_both_ways(tmp_path, 1000, pair_budget=pair)
    pytest.importorskip("a2a.server.routes")
    from tests.test_a2a_outbound import _start_hubs_over_a2a

    return _start_hubs_over_a2a(tmp_path, 1000, pair_budget=pair)


def _pass_on_or_refused(
    c: httpx.Client, member: str, to: str, n: int, sender: httpx.Client, sender_name: str
) -> tuple[dict[str, Any] | None, httpx.Response | dict[str, Any]]:
    """Play ``member`` as ``_pass_on`` does, unless the task ``tu_{n-1}`` that
    ``sender_name`` sent it was refused at the door of ``member``'s hub: then ``(None,
    the failed delegation)``. Which comes first is the hubs' race (a turn's task and its
    answer to the task before are sent together, and both are one speaker)."""

    def ready() -> tuple[str, Any] | None:
        task = _task_waiting(c, member)
        if task is not None:
            return task
        ds = sender.get("/v1/delegations").json()["delegations"]
        sent = [d for d in ds if d["caller"] == sender_name and d["tool_use_id"] == f"tu_{n - 1}"]
        if sent and sent[0]["state"] == "failed":
            return "", sent[0]
        return None

    sid, m = eventually_blocking(ready, what=f"task {n} for {member}", within=30)
    if not sid:
        return None, m
    return m, _delegate_on(c, sid, m, to, n)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["http", "a2a"])
def test_agents_of_two_hubs_that_always_delegate_to_each_other_stop_at_the_pair_budget(
    tmp_path: Path, route: str
) -> None:
    """lead (hub A) delegates to worker (hub B), whose turn on the task delegates back to
    lead and answers it, and so on, over HTTP callbacks or over A2A, with a chain budget
    out of reach. Each hub counts the round trips against the pair of its member and the
    other hub's member: every task is a change of speaker, and its answer is the same
    speaker as the task sent with it. The ring stops at exactly the pair budget on the hub
    that refuses: its agent's next delegation is refused (429), or the other hub's task
    is refused at its door when that task's answer to the one before arrived first and
    spent the pair; both are told as the pair's."""
    pair = 6
    hub_a, hub_b, tokens = _two_hubs(route, tmp_path, pair)
    try:
        with (
            hub_a.client(tokens["lead"]) as lead,
            hub_b.client(tokens["worker"]) as worker,
            hub_a.client(tokens["user_a"]) as user_a,
            hub_b.client(tokens["user_b"]) as user_b,
        ):
            start = first_delegation(lead, user_a)
            players = [(worker, "worker", "lead@hub-a"), (lead, "lead", "worker@hub-b")]
            taken: list[tuple[str, str, int]] = []
            why: dict[str, Any] | None = None
            for n in range(1, 4 * pair):  # a deadline in rounds: past it, it never stopped
                c, member, to = players[(n - 1) % 2]
                sender, sender_name, _ = players[n % 2]
                _answered_out(c, member)
                task, r = _pass_on_or_refused(c, member, to, n, sender, sender_name)
                if task is None:
                    assert isinstance(r, dict)
                    why = {"budget": "pair", "message": r["error"]}
                    break
                assert isinstance(r, httpx.Response)
                taken.append((member, task["chain_id"], task["hop"]))
                if r.status_code != 201:
                    assert r.status_code == 429, r.text
                    why = r.json()["error"]
                    break
            else:
                raise AssertionError(f"still delegating after {len(taken)} tasks")
            assert why is not None and why["budget"] == "pair", why
            assert "pair_budget" in why["message"], why
            assert {chain for _, chain, _ in taken} == {start["message_id"]}
            assert pair - 1 <= len(taken) <= pair, taken
            # the hub that refused counted exactly the pair budget of exchanges
            spent = []
            for user, team in ((user_a, "leads"), (user_b, "workers")):
                got = user.get(f"/v1/teams/{team}/budgets").json()["budgets"]
                spent += [
                    (b["used"], b["limit"]) for b in got if b["scope"] == "pair" and b["spent"]
                ]
            assert spent and set(spent) == {(pair, pair)}, spent
            for user in (user_a, user_b)[: 2 if len(spent) == 2 else 1]:
                notes = budget_notices(user, "pair")
                assert "budget extend" in notes[0]["text"]
    finally:
        hub_a.stop()
        hub_b.stop()


async def test_a_ring_through_an_inbox_file_and_an_a2a_agent_stops_at_the_pair_budget(
    tmp_path: Path,
) -> None:
    """a and b are Claude Code teammates: a's turn writes to b's inbox file; b's turn on
    it asks the A2A agent forecaster@weather (which always answers, naming no chain),
    asks it again on the answer, and on the second answer sends to c by the hub; c's turn
    sends to a. No pair of members answers its partner (a→b, b→c, c→a), and the agent's
    answers name no chain, so b's tasks leave at the same hop every time and the chain
    (its budget out of reach here) goes on slowly: the pair of b and
    ``forecaster@weather`` (no member stands for the service) counts each task and each
    answer, and stops the ring at exactly its budget."""
    pytest.importorskip("a2a.server.routes")
    from backchannel.delivery.claude_inbox import InboxWriter
    from backchannel.delivery.inbox_watch import InboxBridge
    from backchannel.testing import eventually
    from backchannel.types import MessageKind
    from tests.test_a2a_outbound import Peer

    pair = 6
    peer = Peer()
    root = tmp_path / "teams"
    writer = InboxWriter(root)
    cfg = CallbackConfig(
        services={"weather": Service("weather", peer.url, "tok-weather", "a2a")}, retry=FAST
    )
    hub = Hub(MemoryStore(), check_delivery=False, background=False, callbacks=cfg)
    await hub.start()
    bridge = InboxBridge(hub, watch=False)
    try:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": 1000, "pair_budget": pair}
        )
        for n in ("a", "b"):
            await hub.add_member(
                "t", n, "claude-code", delivery={"type": "inbox-file", "root": str(root)}
            )
            await hub.open_session("t", n, f"{n}-s")
        await hub.add_member("t", "c")
        await hub.open_session("t", "c", "c-s")
        await bridge.start()
        await hub.send("t", "user", "a", "start")
        asked, answers, refused = 0, 0, []

        async def b_turn(prompt: str, then: str) -> None:
            nonlocal asked
            await hub.report_event("t", "b", "b-s", "turn_start", prompt)
            try:
                if then == "ask":
                    await hub.delegate(
                        "t", "b", "b-s", "forecaster@weather", f"forecast for Oslo {asked}"
                    )
                    asked += 1
                else:
                    await hub.send(
                        "t", "b", "c", "b passes it on", sender_session="b-s", link=False
                    )
            except BudgetExhausted as exc:
                refused.append(exc)
            await hub.report_event("t", "b", "b-s", "agent_stop", "")
            if then == "ask" and not refused:
                await hub.maintain()  # the outbox makes the call

        for n in range(6 * pair):  # a deadline in rounds: past it, it never stopped
            got = await hub.receive("t", "a", session="a-s", limit=20)
            if not got:
                break
            await hub.ack("t", "a", [g.message.message_id for g in got])
            await hub.report_event("t", "a", "a-s", "turn_start", got[-1].message.text)
            writer.append("t", "b", msg_id=f"a-to-b-{n}", from_="a", text=f"a passes {n}")
            await hub.report_event("t", "a", "a-s", "agent_stop", "")
            for result in await bridge.scan():
                for eid in result.messages:  # b reads its own file
                    m = (await hub.message_status("t", eid)).message
                    prompt = f'<teammate-message teammate_id="a">{m.text}</teammate-message>'
                    await b_turn(prompt, "ask")
            for then in ("ask", "send"):  # b's turns on the agent's two answers
                if refused:
                    break

                async def result() -> list[Any]:
                    got = await hub.receive("t", "b", session="b-s", limit=20)
                    if got:
                        await hub.ack("t", "b", [g.message.message_id for g in got])
                    return [g for g in got if g.message.kind is MessageKind.TOOL_RESULT]

                [r] = await eventually(result, what="the agent's answer", within=20)
                answers += 1
                await b_turn(r.message.text, then)
            if refused:
                break
            got = await hub.receive("t", "c", session="c-s", limit=20)
            await hub.ack("t", "c", [g.message.message_id for g in got])
            await hub.report_event("t", "c", "c-s", "turn_start", got[-1].message.text)
            await hub.send("t", "c", "a", "c passes it on", sender_session="c-s", link=False)
            await hub.report_event("t", "c", "c-s", "agent_stop", "")
        else:
            raise AssertionError(f"still asking after {asked} tasks")
        assert asked + answers == pair, (asked, answers)
        assert refused[0].details["key"] == "pair:b|forecaster@weather"
        got = await hub.receive("t", "user", limit=100)
        assert [g for g in got if g.message.meta.get("budget") == "pair"], "the human is told"
    finally:
        await bridge.stop()
        await hub.close()
        peer.close()


async def test_a_service_member_that_names_no_agent_of_the_team_refuses_the_task(
    clock: FakeClock,
) -> None:
    """A ``member:`` that names no member of the caller's team (a typo, a member not
    added yet) or a human there would leave a task out and a task in two pairs: the task
    is refused at ``delegate``, naming the setting and the way out, and nothing is sent.
    Once the other hub is the team's agent member of that name, the task goes."""
    url = "http://127.0.0.1:9"
    cfg = CallbackConfig(
        secret=SECRET,
        services={
            "hub-b": Service("hub-b", url, member="peer-b"),
            "hub-h": Service("hub-h", url, member="boss"),
        },
        retry=FAST,
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "lead")
        await hub.add_member("t", "hub-b")  # named like the service: not the one named
        await hub.add_member("t", "boss", kind="human")
        await hub.open_session("t", "lead", "lead-s")
        await hub.report_event("t", "lead", "lead-s", "turn_start", "go")
        for service, member, what in [
            ("hub-b", "peer-b", "no member of team 't'"),
            ("hub-h", "boss", "a human of team 't'"),
        ]:
            with pytest.raises(InvalidRequest) as refused:
                await hub.delegate("t", "lead", "lead-s", f"worker@{service}", "x")
            text = refused.value.message
            assert f"'{member}' is {what}" in text, text
            assert "member:" in text and f"BACKCHANNEL_CALLBACK_MEMBERS={service}=" in text
            assert refused.value.details["field"] == "to"
        assert await hub.store.read(lambda tx: tx.list_delegations("t")) == []
        await hub.add_member("t", "peer-b")
        d = await hub.delegate("t", "lead", "lead-s", "worker@hub-b", "x", tool_use_id="tu_ok")
        assert d.callee == "worker@hub-b"


def test_the_config_file_and_the_environment_name_a_services_member(tmp_path: Path) -> None:
    """``member:`` in the config file, ``BACKCHANNEL_CALLBACK_MEMBERS`` (winning) in the
    environment; a value that is no member name, or a service not registered, is refused
    when the hub starts, saying what to write."""
    (tmp_path / "config.yaml").write_text(
        "callbacks:\n"
        "  hub-b: {url: 'http://127.0.0.1:1', member: peer-b}\n"
        "  hub-c: 'http://127.0.0.1:2'\n"
    )
    cfg = CallbackConfig.load(tmp_path, env={})
    assert (cfg.services["hub-b"].member, cfg.services["hub-c"].member) == ("peer-b", None)
    cfg = CallbackConfig.load(tmp_path, env={"BACKCHANNEL_CALLBACK_MEMBERS": "hub-c=peer-c"})
    assert (cfg.services["hub-b"].member, cfg.services["hub-c"].member) == ("peer-b", "peer-c")
    for bad in ("[peer-b]", "''", "'has space'", "1"):
        (tmp_path / "config.yaml").write_text(
            f"callbacks:\n  hub-b: {{url: 'http://127.0.0.1:1', member: {bad}}}\n"
        )
        with pytest.raises(InvalidRequest, match="must be a member name"):
            CallbackConfig.load(tmp_path, env={})
    with pytest.raises(InvalidRequest, match="not a registered callback service"):
        CallbackConfig.load(None, env={"BACKCHANNEL_CALLBACK_MEMBERS": "nope=peer"})
    with pytest.raises(InvalidRequest, match="must be a member name"):
        CallbackConfig.load(
            None,
            env={
                "BACKCHANNEL_CALLBACKS": "hub-b=http://127.0.0.1:1",
                "BACKCHANNEL_CALLBACK_MEMBERS": "hub-b=no good",
            },
        )


async def test_a_member_in_a_spent_chain_cannot_name_a_fresh_one_on_api_chat(
    clock: FakeClock,
) -> None:
    """``/api/chat`` is how another hub asks for a task, with the chain it goes on in; a
    member of the team may call it too, with its own token. From a turn of a spent chain,
    a task naming a fresh chain at hop 0 would have restarted the conversation as if a
    human had: the chain named may raise the hop of the caller's turn, never lower it, so
    the task is refused as a send of that turn is, naming the chain budget."""
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=_cfg()) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": 2, "pair_budget": 100}
        )
        for n in ("a", "b", "c"):
            await hub.add_member("t", n)
            await hub.open_session("t", n, f"{n}-s")
        start = await hub.send("t", "user", "a", "start")

        await pass_the_chain_until_spent(hub)
        with pytest.raises(BudgetExhausted) as refused:
            await hub.accept_chat(
                "t", "a", "c", "do it anyway", reply_service="hub-b",
                reply_token="t" * 32, chain={"id": "a-fresh-chain", "hop": 0},
            )  # fmt: skip
        assert refused.value.details["key"] == f"chain:{start.message_id}"
        assert "chain_budget" in str(refused.value)
        assert await hub.list_delegations("t") == []


async def test_a_task_from_another_hub_is_not_refused_for_a_chain_spent_days_ago(
    clock: FakeClock,
) -> None:
    """The member that stands for hub B here (``hub-b``, named like the service) is also
    sent local messages, which an adapter leases for the member: the last was the final
    hop of a chain, which spent it. The next day hub B's human starts a task and hub B
    asks for it over ``/api/chat`` in a new chain at hop 0. The chain its member was
    handed a day ago is no turn of the caller's: the task is not refused for it, and goes
    on in the chain it names."""
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=_cfg()) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": 1, "pair_budget": 100}
        )
        for n in ("a", "c", "hub-b"):
            await hub.add_member("t", n)
        await hub.send("t", "a", "hub-b", "the last hop", link=False)  # spends its chain
        got = await hub.receive("t", "hub-b", limit=5)  # hub B's adapter: no session
        await hub.ack("t", "hub-b", [g.message.message_id for g in got])
        clock.advance(86_400)
        d = await hub.accept_chat(
            "t", "hub-b", "c", "a new task of hub B's human", reply_service="hub-b",
            reply_token="t" * 32, chain={"id": "b-new-task", "hop": 0},
        )  # fmt: skip
        [task] = [
            i.message
            for i in await hub.feed("t", 0, 1000)
            if i.message is not None and i.message.kind is MessageKind.DELEGATION
        ]
        assert (d.callee, task.text) == ("c", "a new task of hub B's human")
        assert (task.chain_id, task.hop) == ("b-new-task", 0)
