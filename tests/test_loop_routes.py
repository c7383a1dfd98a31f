"""No endless loops when a ring mixes its routes: always-answering agents that pass the
conversation on by a link crossing, a send, a closing block, a delegation and a timer
stop at the chain budget, in the one chain a human started, and are told.

The agents are those of ``tests/test_budget.py``; each ring here runs until nobody has
anything left to do (a deadline in rounds, never a sleep) and counts what got through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from backchannel.core.budget import ChainRef
from backchannel.delivery.claude_inbox import InboxWriter
from backchannel.delivery.inbox_watch import InboxBridge
from backchannel.errors import BudgetExhausted
from backchannel.hub import Hub
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import InboxMessage, MessageKind, SessionState
from tests.conftest import Server
from tests.helpers_hubs import pass_the_chain_until_spent
from tests.runtimes.agents import http_mcp, make_team, text
from tests.test_budget import Agent, _agent_messages, _kick, _run, _team, _user_told
from tests.test_link_crossings import _hook


async def _run_with_timers(hub: Hub, clock: FakeClock, *agents: Agent, cap: int = 400) -> int:
    """Run ``agents`` until nothing is left to do, firing due timers between rounds
    (the clock moves on a second whenever every agent is idle). Returns the rounds."""
    for n in range(cap):
        progressed = False
        for a in agents:
            progressed = await a.step() or progressed
        if progressed:
            continue
        if not await hub.list_timers("t"):
            return n
        clock.advance(1)
        await hub.maintain()
    raise AssertionError(f"still talking after {cap} rounds: the loop was not stopped")


async def test_a_ring_of_link_send_and_delegation_stops_at_the_chain_budget(
    clock: FakeClock,
) -> None:
    """a's closing text crosses its link to b; b passes it to c by send_message; c
    delegates it to a (a Claude Code member: whichever turn of a's session takes the task
    answers it), and a's turn ends again, crossing to b. No pair ever answers its partner
    often enough for the pair budget: only the chain stops it."""
    budget = 9

    async def answer(a: Agent, got: list[InboxMessage]) -> str:
        kinds = {g.message.kind for g in got}
        if a.name == "a":
            return f"a says {a.turns}"  # crosses the link to b, answers c's task
        if a.name == "b" and kinds & {MessageKind.LINK, MessageKind.DIRECT}:
            await a.send("c", f"b passes on {a.turns}", link=False)
        if a.name == "c" and MessageKind.DIRECT in kinds:
            await a.delegate("a", f"c asks a {a.turns}")
        return ""

    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": budget, "pair_budget": 100}
        )
        await hub.add_member("t", "a", "claude-code")
        for n in ("b", "c"):
            await hub.add_member("t", n)
        for n in "abc":
            await hub.open_session("t", n, f"{n}-s")
        agents = [Agent(hub, n, "", answer) for n in "abc"]
        start = await _kick(hub, "a")
        # a's first turn opens the link to b by a send; every later turn crosses it
        await hub.receive("t", "a", session="a-s")
        await hub.report_event("t", "a", "a-s", "turn_start", "[From user] start")
        await hub.send("t", "a", "b", "a starts", sender_session="a-s")
        await hub.report_event("t", "a", "a-s", "agent_stop", "")
        await _run(*agents)
        msgs = await _agent_messages(hub, "a", "b", "c")
        assert {m.chain_id for m in msgs} == {start.message_id}, "one chain on every route"
        sent = [m for m in msgs if m.kind is not MessageKind.TOOL_RESULT]
        assert max(m.hop for m in sent) == budget
        # a delegation's answer is owed: the task at the budget still gets it, one hop on
        assert max(m.hop for m in msgs) == budget + 1
        kinds = {m.kind for m in msgs}
        assert {MessageKind.LINK, MessageKind.DIRECT, MessageKind.DELEGATION} <= kinds
        refused = [e for ag in agents for e in ag.refused]
        assert (
            refused
            or any(ag.refused_blocks for ag in agents)
            or any(link.close_reason == "conversation_budget" for link in await hub.list_links("t"))
        ), "the send past the budget was refused"
        assert await _user_told(hub, "chain")


async def test_a_ring_of_three_relaying_through_timers_stops_at_the_chain_budget(
    clock: FakeClock,
) -> None:
    """Each agent answers a peer's message by setting a 1 s timer in its own session, and
    the timer's turn passes the conversation on to the next. No pair answers its partner
    (a→b, b→c, c→a: one exchange each), so only the chain can stop the ring: a timer set
    on a turn goes on in that turn's chain instead of starting a fresh one."""
    nxt = {"a": "b", "b": "c", "c": "a"}
    budget = 8

    async def answer(a: Agent, got: list[InboxMessage]) -> str:
        kinds = {g.message.kind for g in got}
        if MessageKind.TIMER in kinds:
            await a.send(nxt[a.name], f"{a.name} passes it on ({a.turns})", link=False)
        elif kinds & {MessageKind.DIRECT, MessageKind.LINK}:
            await hub.set_timer("t", a.name, a.session, "anchor", 1, "pass it on")
        return ""

    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", "c", chain_budget=budget, pair_budget=100)
        agents = [Agent(hub, n, nxt[n], answer) for n in "abc"]
        start = await _kick(hub, "a")
        await _run_with_timers(hub, clock, *agents)
        msgs = await _agent_messages(hub, "a", "b", "c")
        assert len(msgs) == budget, [(m.sender, m.to, m.chain_id, m.hop) for m in msgs]
        assert [m.hop for m in msgs] == list(range(1, budget + 1))
        assert {m.chain_id for m in msgs} == {start.message_id}
        refused = [e for ag in agents for e in ag.refused]
        assert refused and {e.details["budget"] for e in refused} == {"chain"}
        assert await _user_told(hub, "chain")
        sessions = [s for n in "abc" for s in await hub.list_sessions("t", n)]
        assert all(s.state is not SessionState.ACTIVE for s in sessions)


async def test_two_agents_relaying_through_timers_stop_at_the_pair_budget(
    clock: FakeClock,
) -> None:
    """The same with two: each answers the other only from its timer's turn."""
    budget = 6

    async def answer(a: Agent, got: list[InboxMessage]) -> str:
        kinds = {g.message.kind for g in got}
        if MessageKind.TIMER in kinds:
            await a.send(a.peer, f"{a.name} answers ({a.turns})", link=False)
        elif kinds & {MessageKind.DIRECT, MessageKind.LINK}:
            await hub.set_timer("t", a.name, a.session, "anchor", 1, "answer")
        return ""

    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", pair_budget=budget)
        a, b = Agent(hub, "a", "b", answer), Agent(hub, "b", "a", answer)
        await _kick(hub, "a")
        await _run_with_timers(hub, clock, a, b)
        msgs = await _agent_messages(hub, "a", "b")
        assert len(msgs) == budget
        assert a.told("pair") and b.told("pair") and await _user_told(hub, "pair")


async def test_a_ring_through_an_inbox_file_and_hub_sends_stops_at_the_chain_budget(
    tmp_path: Path,
) -> None:
    """a and b are Claude Code teammates: a writes to b's inbox file itself (the hub takes
    the entry in for the record; b reads its own file), b's turn on it passes it to c by
    send_message, c's to a, and a's turn writes to b's file again. The file is how b was
    handed the message: b's turn on it goes on in its chain, so the sends the hub carries
    stop at the chain budget instead of each starting a fresh chain."""
    budget = 7
    root = tmp_path / "teams"
    writer = InboxWriter(root)
    hub = Hub(MemoryStore(), check_delivery=False, background=False)
    await hub.start()
    bridge = InboxBridge(hub, watch=False)
    try:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": budget, "pair_budget": 100}
        )
        for n in ("a", "b"):
            await hub.add_member(
                "t", n, "claude-code", delivery={"type": "inbox-file", "root": str(root)}
            )
        await hub.add_member("t", "c")
        for n in "abc":
            await hub.open_session("t", n, f"{n}-s")
        await bridge.start()
        start = await _kick(hub, "a")
        sent, refused = 0, []
        for n in range(6 * budget):  # a deadline in rounds: past it, it never stopped
            progressed = False
            # a: whatever the hub hands it, its turn writes to b's inbox file
            got = await hub.receive("t", "a", session="a-s", limit=20)
            if got:
                progressed = True
                await hub.ack("t", "a", [g.message.message_id for g in got])
                text = "\n".join(g.message.text for g in got)
                await hub.report_event("t", "a", "a-s", "turn_start", text)
                writer.append("t", "b", msg_id=f"a-to-b-{n}", from_="a", text=f"a passes {n}")
                await hub.report_event("t", "a", "a-s", "agent_stop", "")
            for result in await bridge.scan():
                for _eid, why in result.refused:
                    refused.append(why)
                for eid in result.messages:
                    # b reads its own file: the entry's text is its next turn's prompt
                    progressed = True
                    m = (await hub.message_status("t", eid)).message
                    prompt = f'<teammate-message teammate_id="a">{m.text}</teammate-message>'
                    await hub.report_event("t", "b", "b-s", "turn_start", prompt)
                    try:
                        await hub.send(
                            "t", "b", "c", f"b passes {n}", sender_session="b-s", link=False
                        )
                        sent += 1
                    except BudgetExhausted as exc:
                        refused.append(exc.details["budget"])
                    await hub.report_event("t", "b", "b-s", "agent_stop", "")
            got = await hub.receive("t", "c", session="c-s", limit=20)
            if got:
                progressed = True
                await hub.ack("t", "c", [g.message.message_id for g in got])
                await hub.report_event("t", "c", "c-s", "turn_start", got[-1].message.text)
                try:
                    await hub.send("t", "c", "a", f"c passes {n}", sender_session="c-s", link=False)
                    sent += 1
                except BudgetExhausted as exc:
                    refused.append(exc.details["budget"])
                await hub.report_event("t", "c", "c-s", "agent_stop", "")
            if not progressed:
                break
        else:
            raise AssertionError(f"still talking after {6 * budget} rounds: {sent} sends")
        msgs = await _agent_messages(hub, "a", "b", "c")
        assert {m.chain_id for m in msgs} == {start.message_id}
        assert max(m.hop for m in msgs) == budget
        assert "chain" in refused
        assert await _user_told(hub, "chain")
    finally:
        await bridge.stop()
        await hub.close()


async def test_an_extended_chain_goes_on_exactly_as_far_as_extended(clock: FakeClock) -> None:
    """A ring of three stops at the chain budget; the human extends the chain by three
    hops. The member the chain stopped at is told, in the chain, and the ring goes on
    exactly three hops further, then stops again, told again."""
    nxt = {"a": "b", "b": "c", "c": "a"}
    budget, by = 6, 3

    async def answer(a: Agent, got: list[InboxMessage]) -> str:
        await a.send(nxt[a.name], f"{a.name} passes it on ({a.turns})", link=False)
        return ""

    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", "c", chain_budget=budget, pair_budget=100)
        agents = [Agent(hub, n, nxt[n], answer) for n in "abc"]
        start = await _kick(hub, "a")
        await _run(*agents)
        msgs = await _agent_messages(hub, "a", "b", "c")
        assert [m.hop for m in msgs] == list(range(1, budget + 1))
        assert len(await _user_told(hub, "chain")) == 1
        out = await hub.extend_budget("t", f"chain:{start.message_id}", by, by_whom="user")
        assert (out["used"], out["limit"], out["spent"]) == (budget, budget + by, False)
        await _run(*agents)
        msgs = await _agent_messages(hub, "a", "b", "c")
        assert {m.chain_id for m in msgs} == {start.message_id}
        assert [m.hop for m in msgs] == list(range(1, budget + by + 1)), "exactly `by` more"
        stops = [m for m in await _user_told(hub, "chain") if "extended_by" not in m.meta]
        assert len(stops) == 1, "the second stop is told too"
        told = [m for ag in agents for m in ag.inputs if m.meta.get("extended_by") == by]
        assert len(told) == 1, "the member the chain stopped at is told of the extension"


async def test_a_ring_handed_over_without_a_session_stops_at_the_chain_budget(
    clock: FakeClock,
) -> None:
    """An adapter that names no session (an inbox file, a pane, a webhook without a
    ``session`` setting) leases for the member, while the member's turns run in its
    hook-attached session: those turns go on in the chain of what the member was handed,
    so a ring of such members stops at the chain budget."""
    nxt = {"a": "b", "b": "c", "c": "a"}
    budget = 6
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", "c", chain_budget=budget, pair_budget=100)
        start = await _kick(hub, "a")
        sent, refused = 0, []
        for _ in range(6 * budget):  # a deadline in rounds: past it, it never stopped
            progressed = False
            for n in nxt:
                got = await hub.receive("t", n, limit=20)  # the adapter: no session named
                if not got:
                    continue
                progressed = True
                await hub.ack("t", n, [g.message.message_id for g in got])
                shown = "\n".join(f"[From {g.message.sender}] {g.message.text}" for g in got)
                await hub.report_event("t", n, f"{n}-s", "turn_start", shown)
                try:
                    await hub.send(
                        "t", n, nxt[n], f"{n} passes it on", sender_session=f"{n}-s", link=False
                    )
                    sent += 1
                except BudgetExhausted as exc:
                    refused.append(exc.details["budget"])
                await hub.report_event("t", n, f"{n}-s", "agent_stop", "")
            if not progressed:
                break
        else:
            raise AssertionError(f"still talking after {6 * budget} rounds: {sent} sends")
        msgs = await _agent_messages(hub, "a", "b", "c")
        assert {m.chain_id for m in msgs} == {start.message_id}
        assert sent == budget and "chain" in refused
        assert await _user_told(hub, "chain")


async def test_a_ring_of_broadcast_and_link_stops_and_an_extension_wakes_the_broadcaster(
    clock: FakeClock,
) -> None:
    """a answers c by broadcasting; b's turn on a broadcast ends with text that crosses
    its link to c; c answers a link crossing by a send to a. The broadcast at the budget
    spends the chain and reached everyone, so no one recipient holds it: the chain is
    held by a, the broadcaster, and an extension wakes a in the chain at the hop it
    stopped at; the ring goes on exactly as far as extended."""
    budget, by = 7, 1  # hops 1, 4, 7 are a's broadcasts

    async def answer(a: Agent, got: list[InboxMessage]) -> str:
        broadcast = any(g.message.to == "*" for g in got)
        kinds = {g.message.kind for g in got}
        if a.name == "a":
            await a.send("*", f"a to all ({a.turns})", link=False)
        elif a.name == "b" and broadcast:
            return f"b passes it on ({a.turns})"  # crosses the link to c
        elif a.name == "c" and MessageKind.LINK in kinds:
            await a.send("a", f"c passes it on ({a.turns})", link=False)
        return ""

    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", "c", chain_budget=budget, pair_budget=100)
        await hub.report_event("t", "b", "b-s", "turn_start", "set up")
        await hub.send("t", "b", "c", "let's talk", sender_session="b-s")  # opens the link
        await hub.report_event("t", "b", "b-s", "agent_stop", "")
        for n in "bc":
            got = await hub.receive("t", n, session=f"{n}-s", limit=20)
            await hub.ack("t", n, [g.message.message_id for g in got])
        agents = [Agent(hub, n, "", answer) for n in "abc"]
        start = await _kick(hub, "a")
        await _run(*agents)
        msgs = [m for m in await _agent_messages(hub, "a", "b", "c") if m.hop]
        ring = [m for m in msgs if m.chain_id == start.message_id]
        assert [m.hop for m in ring] == list(range(1, budget + 1))
        assert ring[-1].to == "*", "the broadcast spent the chain"
        assert {m.kind for m in ring} >= {MessageKind.LINK, MessageKind.DIRECT}
        assert len(await _user_told(hub, "chain")) == 1
        await hub.extend_budget("t", f"chain:{start.message_id}", by, by_whom="user")
        await _run(*agents)
        ring = [
            m for m in await _agent_messages(hub, "a", "b", "c") if m.chain_id == start.message_id
        ]
        assert [m.hop for m in ring] == list(range(1, budget + by + 1)), "exactly `by` more"
        told = [m for ag in agents for m in ag.inputs if m.meta.get("extended_by") == by]
        assert [m.to for m in told] == ["a"], "the broadcaster is told of the extension"
        stops = [m for m in await _user_told(hub, "chain") if "extended_by" not in m.meta]
        assert len(stops) == 1, "the second stop is told too"


@asynccontextmanager
async def _hubs(
    where: str, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Hub, Hub]]:
    """One hub on the memory store, or two hubs on one PostgreSQL database (two processes
    of a deployment behind one load balancer: each agent talks to one of them)."""
    if where == "memory":
        async with Hub(MemoryStore(), clock=clock, background=False) as hub:
            yield hub, hub
        return
    from backchannel.stores.postgres import PostgresStore

    url = request.getfixturevalue("new_postgres_url")()
    async with (
        Hub(PostgresStore(url), clock=clock, background=False) as one,
        Hub(PostgresStore(url), clock=clock, background=False) as two,
    ):
        yield one, two


@pytest.mark.parametrize(
    "where", ["memory", pytest.param("two hubs on one postgres", marks=pytest.mark.postgres)]
)
async def test_a_ring_of_link_timer_and_delegation_stops_at_the_chain_budget(
    clock: FakeClock, where: str, request: pytest.FixtureRequest
) -> None:
    """a's closing text crosses its link to b; b answers a crossing by setting a timer,
    and its timer's turn delegates to c; c (a Claude Code member: its own session takes
    the task) passes it to a by a send and answers b. Every pair but b and c speaks once
    a round, and b and c's is far from its budget: only the chain stops the ring, in the
    one chain the human started, with a link crossing, a timer, a task, an answer and a
    send in it. On PostgreSQL a and c talk to one hub and b to the other: the budget is
    the database's, not a process's."""
    budget = 11

    async def answer(ag: Agent, got: list[InboxMessage]) -> str:
        kinds = {g.message.kind for g in got}
        if ag.name == "a" and kinds & {MessageKind.DIRECT, MessageKind.LINK}:
            return f"a says {ag.turns}"  # crosses the link to b
        if ag.name == "b" and MessageKind.TIMER in kinds:
            await ag.delegate("c", f"b asks c {ag.turns}")
        elif ag.name == "b" and MessageKind.LINK in kinds:
            await ag.hub.set_timer("t", "b", ag.session, "anchor", 1, "pass it on")
        if ag.name == "c" and MessageKind.DELEGATION in kinds:
            await ag.send("a", f"c passes on {ag.turns}", link=False)
            return f"c did it {ag.turns}"  # the answer to b's task
        return ""

    async with _hubs(where, clock, request) as (one, two):
        await one.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": budget, "pair_budget": 100}
        )
        await one.add_member("t", "a")
        await one.add_member("t", "b")
        await one.add_member("t", "c", "claude-code")
        for n in "abc":
            await one.open_session("t", n, f"{n}-s")
        at = {"a": one, "b": two, "c": one}
        agents = [Agent(at[n], n, "", answer) for n in "abc"]
        # a's first turn opens the link to b by a send; every later turn crosses it
        await one.report_event("t", "a", "a-s", "turn_start", "set up")
        await one.send("t", "a", "b", "let's talk", sender_session="a-s")
        await one.report_event("t", "a", "a-s", "agent_stop", "")
        for n in "ab":
            got = await one.receive("t", n, session=f"{n}-s", limit=20)
            await one.ack("t", n, [g.message.message_id for g in got])
        start = await _kick(one, "a")
        await _run_with_timers(two, clock, *agents)
        msgs = [
            m for m in await _agent_messages(one, "a", "b", "c") if m.chain_id == start.message_id
        ]
        kinds = {m.kind for m in msgs}
        assert {
            MessageKind.LINK, MessageKind.DELEGATION, MessageKind.TOOL_RESULT, MessageKind.DIRECT
        } <= kinds  # fmt: skip
        sent = [m for m in msgs if m.kind is not MessageKind.TOOL_RESULT]
        assert sorted(m.hop for m in sent) == list(range(1, budget + 1)), "one send a hop"
        refused = [e for ag in agents for e in ag.refused]
        assert (
            refused
            or any(ag.refused_blocks for ag in agents)
            or any(link.close_reason == "conversation_budget" for link in await one.list_links("t"))
        ), "the send past the budget was refused"
        assert await _user_told(one, "chain")


async def _one_shot_turn(hub: Hub, member: str, sid: str, prompt: str) -> None:
    """A one-shot run (``claude -p``, ``codex exec``) of ``member``: its own new session,
    whose runtime reports the prompt it was started on."""
    await hub.start_session("t", member, sid, recover=False)
    await hub.report_event("t", member, sid, "turn_start", prompt)


@pytest.mark.parametrize("reports", ["prompt", "no text", "no turn"])
async def test_a_ring_of_one_shot_runs_stops_at_the_chain_budget(
    clock: FakeClock, reports: str
) -> None:
    """Each member's wrapper takes what the hub hands the member (no session named) and
    starts a one-shot run on it in a new session, which sends to the next member and
    exits. The run's prompt carries what the member was handed (or its runtime reports
    no prompt text, or no turn at all: an SDK wrapper that opens a session per task): its
    turn goes on in that chain, so the ring stops at the chain budget instead of starting
    a fresh chain with every run (the pair budget never sees a ring: each pair has one
    speaker)."""
    nxt = {"a": "b", "b": "c", "c": "a"}
    budget = 6
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team(
            "t", settings={"anchor_policy": "off", "chain_budget": budget, "pair_budget": 100}
        )
        for n in nxt:
            await hub.add_member("t", n)
        start = await _kick(hub, "a")
        sent, refused = 0, []
        for r in range(6 * budget):  # a deadline in rounds: past it, it never stopped
            progressed = False
            for n in nxt:
                got = await hub.receive("t", n, limit=20)  # the wrapper: no session named
                if not got:
                    continue
                progressed = True
                await hub.ack("t", n, [g.message.message_id for g in got])
                sid = f"{n}-run{r}"
                shown = "\n".join(f"[From {g.message.sender}] {g.message.text}" for g in got)
                if reports == "no turn":
                    await hub.open_session("t", n, sid)
                else:
                    prompt = f"You are {n}. Act on this:\n{shown}" if reports == "prompt" else ""
                    await _one_shot_turn(hub, n, sid, prompt)
                try:
                    await hub.send(
                        "t", n, nxt[n], f"{n} passes it on", sender_session=sid, link=False
                    )
                    sent += 1
                except BudgetExhausted as exc:
                    refused.append(exc.details["budget"])
                if reports != "no turn":
                    await hub.report_event("t", n, sid, "agent_stop", "")
                await hub.exit_session("t", n, sid, "the run ended")
            if not progressed:
                break
        else:
            raise AssertionError(f"still talking after {6 * budget} rounds: {sent} sends")
        msgs = await _agent_messages(hub, "a", "b", "c")
        assert {m.chain_id for m in msgs} == {start.message_id}
        assert sent == budget and refused and set(refused) == {"chain"}
        told = await _user_told(hub, "chain")
        assert told and "backchannel budget extend" in told[0].text


async def test_a_one_shot_run_a_human_started_begins_its_own_chain(clock: FakeClock) -> None:
    """A new session whose prompt is not what the member was handed (a human started the
    run on a task of their own) is no turn on the handed chain, even a spent one."""
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off", "chain_budget": 2})
        for n in ("a", "b"):
            await hub.add_member("t", n)
        await hub.send("t", "a", "b", "hop one", link=False)  # hop 1
        got = await hub.receive("t", "b", limit=5)
        await hub.ack("t", "b", [g.message.message_id for g in got])
        await _one_shot_turn(hub, "b", "b-run0", "[From a] hop one")
        await hub.send("t", "b", "a", "hop two", link=False)  # hop 2: spends the chain
        await hub.report_event("t", "b", "b-run0", "agent_stop", "")
        await hub.exit_session("t", "b", "b-run0", "the run ended")
        await _one_shot_turn(hub, "b", "b-run1", "write the release notes and tell a")
        sent = await hub.send("t", "b", "a", "release notes are done", link=False)
        status = (await hub.message_status("t", sent.message_id)).message
        assert status.chain_id == sent.message_id and status.hop == 1


@pytest.mark.slow
async def test_a_ring_of_claude_p_runs_over_a_real_hub_stops_at_the_chain_budget(
    server: Server,
) -> None:
    """The same ring on a real ``backchannel serve``: each member's wrapper long-polls the
    member's inbox over HTTP (no session named) and starts a ``claude -p`` run on what it
    got, which the hub hears through the Claude Code hooks of a new session; the run
    passes the message on with the MCP server's ``send_message`` (streamable HTTP) and
    ends. The ring stops at the chain budget, the refusal names it, and the team's human
    is told how to extend it."""
    budget = 5
    nxt = {"a": "b", "b": "c", "c": "a"}
    tokens = make_team(
        server, "t", *(f"{n}:claude-code" for n in nxt), chain_budget=budget, pair_budget=100
    )
    http = {n: server.client(tokens[n]) for n in tokens}
    try:
        start = http["user"].post("/v1/messages", json={"to": "a", "text": "start"}).json()
        sent, refusals = 0, []
        for r in range(6 * budget):  # a deadline in rounds: past it, it never stopped
            progressed = False
            for n in nxt:
                got = http[n].get("/v1/inbox", params={"wait": 0, "limit": 20}).json()["messages"]
                got = [m for m in got if m["kind"] != "system"]  # notices start no run
                if not got:
                    continue
                progressed = True
                ids = [m["message_id"] for m in got]
                http[n].post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()
                sid = f"{n}-run-{r}"
                shown = "\n".join(f"[From {m['from']}] {m['text']}" for m in got)
                _hook(http[n], "SessionStart", sid, source="startup")
                _hook(http[n], "UserPromptSubmit", sid, prompt=f"Act on this:\n{shown}")
                async with http_mcp(server.url, tokens[n]) as s:
                    out = await s.call_tool(
                        "send_message", {"to": nxt[n], "message": f"{n} passes it on ({r})"}
                    )
                if out.is_error:
                    refusals.append(text(out))
                else:
                    sent += 1
                while _hook(http[n], "Stop", sid, last_assistant_message="").get("decision"):
                    pass  # what waited for the session, handed to its run (notices)
                _hook(http[n], "SessionEnd", sid, reason="other")
            if not progressed:
                break
        else:
            raise AssertionError(f"still talking after {6 * budget} rounds: {sent} sends")
        assert sent == budget, (sent, refusals)
        assert refusals and all("chain_budget" in why for why in refusals), refusals
        feed = http["user"].get("/v1/teams/t/budgets").json()["budgets"]
        chains = [b for b in feed if b["scope"] == "chain"]
        assert [(b["key"], b["spent"]) for b in chains] == [(f"chain:{start['message_id']}", True)]
        told = [
            m
            for m in http["user"].get("/v1/inbox", params={"limit": 50}).json()["messages"]
            if "budget extend" in m["text"]
        ]
        assert told, "the team's human was not told how to extend the chain"
    finally:
        for c in http.values():
            c.close()


async def test_a_chain_named_for_a_send_never_lets_through_what_its_own_chain_refuses(
    clock: FakeClock,
) -> None:
    """The A2A front and ``/api/chat`` take the chain a message names (``backchannel.chain``
    in an A2A message's metadata). An agent whose turn works in a spent chain that names
    another chain, one the human extended, with a hop no lower than its own, would have
    gone on under that chain's extension: the send is refused by its own chain."""
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", "c", chain_budget=2, pair_budget=100)
        other = await _kick(hub, "c", "the chain the human extended")
        await hub.extend_budget("t", f"chain:{other.message_id}", 100, by_whom="user")
        start = await _kick(hub, "a")

        await pass_the_chain_until_spent(hub)
        with pytest.raises(BudgetExhausted) as refused:
            await hub.send(
                "t", "a", "b", "go on under the other chain", sender_session="a-s",
                link=False, chain=ChainRef(other.message_id, 3),
            )  # fmt: skip
        assert refused.value.details["key"] == f"chain:{start.message_id}"
        # the named chain still carries a send whose own chain has room
        await hub.report_event("t", "a", "a-s", "agent_stop", "")
        await hub.report_event("t", "a", "a-s", "turn_start", "a task of the human's own")
        sent = await hub.send(
            "t", "a", "b", "under the other chain", sender_session="a-s", link=False,
            chain=ChainRef(other.message_id, 3),
        )  # fmt: skip
        m = (await hub.message_status("t", sent.message_id)).message
        assert (m.chain_id, m.hop) == (other.message_id, 3)
