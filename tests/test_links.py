"""Bidirectional links: turns cross to the peer, privately, within a budget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from backchannel.errors import Forbidden, InvalidRequest
from backchannel.hub import Hub
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import InboxMessage, LinkState, MessageKind


async def _team(hub: Hub, *members: str, settings: dict[str, object] | None = None) -> None:
    # the anchor rule has tests of its own (test_timers.py); here it stays out of the way
    await hub.create_team("t", settings={"anchor_policy": "off", **(settings or {})})
    for m in members:
        await hub.add_member("t", m)
        await hub.open_session("t", m, f"{m}-s")


async def _take(hub: Hub, member: str) -> list[InboxMessage]:
    got = await hub.receive("t", member, session=f"{member}-s", limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return got


async def _turn(
    hub: Hub, member: str, closing: str, *, send: tuple[str, str] | None = None
) -> dict[str, object]:
    await hub.report_event("t", member, f"{member}-s", "turn_start")
    if send is not None:
        await hub.send("t", member, send[0], send[1], sender_session=f"{member}-s")
    return await hub.report_event("t", member, f"{member}-s", "agent_stop", closing)


async def _open(hub: Hub, a: str, b: str, text: str = "let's talk", **kw: object) -> None:
    await hub.report_event("t", a, f"{a}-s", "turn_start")
    await hub.send("t", a, b, text, sender_session=f"{a}-s", **kw)  # type: ignore[arg-type]
    await hub.report_event("t", a, f"{a}-s", "agent_stop", "")


async def test_send_from_a_turn_opens_a_link_and_both_get_the_rules(hub: Hub) -> None:
    await _team(
        hub, "a", "b", settings={"link_rules": "Linked with {peer} for {budget} turns. Be brief."}
    )
    await _open(hub, "a", "b")
    [link] = await hub.list_links("t")
    assert (link.initiator, link.initiator_session, link.responder, link.responder_session) == (
        "a",
        "a-s",
        "b",
        "b-s",
    )
    assert (link.state, link.budget, link.turns_used) == (LinkState.OPEN, 8, 0)
    a_sys = [g.message for g in await _take(hub, "a")]
    b_in = [g.message for g in await _take(hub, "b")]
    assert [m.text for m in a_sys] == ["Linked with b for 8 turns. Be brief."]
    assert a_sys[0].kind is MessageKind.SYSTEM
    assert [(m.kind, m.text) for m in b_in] == [
        (MessageKind.DIRECT, "let's talk"),
        (MessageKind.SYSTEM, "Linked with a for 8 turns. Be brief."),
    ]


async def test_default_rules_text(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    text = (await _take(hub, "a"))[0].message.text
    for rule in (
        "contribute before acknowledging",
        "never restate the peer",
        "ask only what blocks you",
        "silence is valid",
        "does not oblige a reply",
    ):
        assert rule in text


async def test_output_crosses_framed_and_thoughts_never_do(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    await _take(hub, "a"), await _take(hub, "b")
    await hub.report_event("t", "b", "b-s", "turn_start")
    await hub.report_event("t", "b", "b-s", "thought", "secret reasoning")
    await hub.report_event("t", "b", "b-s", "tool_call", "rm -rf /tmp/x")
    await hub.report_event("t", "b", "b-s", "agent_output", "intermediate")
    stop = await hub.report_event(
        "t", "b", "b-s", "agent_stop", 'Here is my view.\n<message to="user">fyi</message>'
    )
    got = [g.message for g in await _take(hub, "a")]
    assert [(m.kind, m.text, m.sender) for m in got] == [
        (MessageKind.LINK, "[From b] Here is my view.", "b")
    ]
    assert stop["crossed"] == [
        {"link_id": got[0].meta["link_id"], "to": "a", "turns_used": 1, "budget": 8}
    ]


async def _ping_pong(hub: Hub, rounds: int, seen: list[str] | None = None) -> list[str]:
    """Two agents that always answer whatever arrives."""
    log: list[str] = []
    for i in range(rounds):
        progressed = False
        for me in ("b", "a"):
            got = await _take(hub, me)
            if seen is not None:
                seen.extend(g.message.text for g in got)
            inputs = [g for g in got if g.message.kind in (MessageKind.LINK, MessageKind.DIRECT)]
            if inputs:
                progressed = True
                await _turn(hub, me, f"{me} reply {i}")
                log.append(f"{me}:{i}")
        if not progressed:
            break
    return log


async def test_two_always_answering_agents_stop_at_exactly_the_budget(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b", link_budget=5)
    seen: list[str] = []
    log = await _ping_pong(hub, 20, seen)
    [link] = await hub.list_links("t")
    assert link.turns_used == 5
    assert (link.state, link.close_reason) == (LinkState.CLOSED, "budget_exhausted")
    crossings = [h for h in link.history if h["event"] == "crossing"]
    assert len(crossings) == 5
    assert len(log) == 6  # b answers the opening message, then turns cross until the 5th
    # both were told, and nothing else arrives afterwards
    seen += [g.message.text for m in ("a", "b") for g in await _take(hub, m)]
    assert sum("budget of 5 turns is spent" in t for t in seen) == 2


async def test_team_budget_setting(hub: Hub) -> None:
    await _team(hub, "a", "b", settings={"link_budget": 2})
    await _open(hub, "a", "b")
    await _ping_pong(hub, 10)
    [link] = await hub.list_links("t")
    assert (link.turns_used, link.state) == (2, LinkState.CLOSED)


async def test_checkpoint_turns_cross_nothing_and_use_no_budget(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t")
        await hub.add_member(
            "t", "a", settings={"checkpoint": {"idle_seconds": 60, "text": "status?"}}
        )
        await hub.add_member("t", "b")
        for m in ("a", "b"):
            await hub.open_session("t", m, f"{m}-s")
        await _open(hub, "a", "b")
        await _take(hub, "a"), await _take(hub, "b")
        clock.advance(61)
        await hub.maintain()
        prompt = await _take(hub, "a")
        assert [g.message.kind for g in prompt] == [MessageKind.CHECKPOINT]
        stop = await _turn(hub, "a", "still working on the plan")
        assert stop["crossed"] == []
        assert await _take(hub, "b") == []
        [link] = await hub.list_links("t")
        assert (link.turns_used, link.state) == (0, LinkState.OPEN)
        await _turn(hub, "a", "real output")
        assert [g.message.text for g in await _take(hub, "b")] == ["[From a] real output"]


async def test_only_the_initiator_closes(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    with pytest.raises(Forbidden, match=r"only 'a', who opened link .* can close it"):
        await hub.send("t", "b", "a", "bye", close_link=True)
    assert [
        g.message.text for g in await _take(hub, "a") if g.message.kind is MessageKind.DIRECT
    ] == []
    r = await hub.send("t", "a", "b", "thanks, done", close_link=True)
    [link] = await hub.list_links("t")
    assert (link.state, link.close_reason) == (LinkState.CLOSED, "closed_by_initiator")
    b_got = [g.message for g in await _take(hub, "b")]
    assert [m.message_id for m in b_got if m.kind is MessageKind.DIRECT][-1] == r.message_id
    assert any("closed by a" in m.text for m in b_got if m.kind is MessageKind.SYSTEM)
    with pytest.raises(InvalidRequest, match="no open link between 'a' and 'b'"):
        await hub.send("t", "a", "b", "again", close_link=True)


async def test_terminating_a_session_closes_its_links_and_the_peer_is_told(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    await _take(hub, "a")
    await hub.terminate_session("t", "b", "b-s")
    [link] = await hub.list_links("t")
    assert (link.state, link.close_reason) == (LinkState.CLOSED, "session_terminated")
    told = [g.message.text for g in await _take(hub, "a")]
    assert told == ["Your link with b is closed: a session on it terminated."]


async def test_a_restarted_session_keeps_its_link(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    await _take(hub, "a"), await _take(hub, "b")
    await hub.report_event("t", "a", "a-s", "turn_start")
    await hub.open_session("t", "a", "a-s")  # the process died mid-turn and came back
    await _turn(hub, "a", "back again")
    assert [g.message.text for g in await _take(hub, "b")] == ["[From a] back again"]


async def test_fifty_concurrent_first_sends_open_one_link(tmp_path: object) -> None:
    from backchannel.stores.sqlite import SqliteStore

    async with Hub(SqliteStore(f"{tmp_path}/l.db"), background=False) as hub:
        await _team(hub, "a", "b")
        await hub.report_event("t", "a", "a-s", "turn_start")
        await asyncio.gather(
            *(hub.send("t", "a", "b", f"hi {i}", sender_session="a-s") for i in range(50))
        )
        links = await hub.list_links("t")
        assert len(links) == 1


async def test_fan_out_to_three_peers(hub: Hub) -> None:
    await _team(hub, "lead", "w1", "w2", "w3")
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    for w in ("w1", "w2", "w3"):
        await hub.send("t", "lead", w, "start", sender_session="lead-s")
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "plan: split by directory")
    assert len(await hub.list_links("t", open_only=True)) == 3
    for w in ("w1", "w2", "w3"):
        texts = [g.message.text for g in await _take(hub, w)]
        assert "[From lead] plan: split by directory" in texts


async def test_output_already_sent_to_the_peer_is_not_injected_again(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    await _take(hub, "b")
    stop = await _turn(hub, "a", "the answer is 42", send=("b", "the  answer is\n42"))
    assert stop["crossed"] == []
    texts = [g.message.text for g in await _take(hub, "b")]
    assert texts == ["the  answer is\n42"]
    [link] = await hub.list_links("t")
    assert link.turns_used == 0
    assert link.history[-1]["event"] == "repeat_not_injected"


async def test_empty_output_crosses_nothing(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    await _take(hub, "b")
    await _turn(hub, "b", '  <message to="user">only a block</message>  ')
    assert [g.message.kind for g in await _take(hub, "a")] == [MessageKind.SYSTEM]
    [link] = await hub.list_links("t")
    assert link.turns_used == 0


async def test_link_opt_out_and_no_link_outside_a_turn(hub: Hub) -> None:
    await _team(hub, "a", "b", "c")
    await hub.report_event("t", "a", "a-s", "turn_start")
    await hub.send("t", "a", "b", "no link please", sender_session="a-s", link=False)
    await hub.report_event("t", "a", "a-s", "agent_stop", "done")
    await hub.send("t", "c", "b", "from outside any turn")
    assert await hub.list_links("t") == []


async def test_crossing_waits_for_the_peers_turn_to_end(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    await _take(hub, "b"), await _take(hub, "a")
    await hub.report_event("t", "b", "b-s", "turn_start")
    await _turn(hub, "a", "news for b")
    assert await hub.receive("t", "b", session="b-s") == []
    await hub.report_event("t", "b", "b-s", "agent_stop", "")
    assert [g.message.text for g in await _take(hub, "b")] == ["[From a] news for b"]


AlwaysAnswer = Callable[[str], str]


async def test_a_send_to_oneself_opens_no_link_and_nothing_crosses_back(hub: Hub) -> None:
    """A note to self from a turn opened a link from the agent to itself: it was told
    twice that it is linked with itself, and every turn's output came back to it as
    ``[From a] ...`` input, a loop with itself."""
    await _team(hub, "a")
    await _turn(hub, "a", "my output", send=("a", "note to self"))
    assert await hub.list_links("t") == []
    got = [(g.message.kind, g.message.text) for g in await _take(hub, "a")]
    assert got == [(MessageKind.DIRECT, "note to self")], got


@pytest.mark.parametrize("closing", ["\u200b", " \ufeff\n\u2060 ", "\u200b\u200c\u200d"])
async def test_output_of_invisible_characters_only_crosses_nothing(hub: Hub, closing: str) -> None:
    """Zero-width characters are no whitespace to ``str.split``: a closing text of them
    alone crossed as an empty-looking message and spent a turn of the budget."""
    await _team(hub, "a", "b")
    await _open(hub, "a", "b")
    await _take(hub, "b")
    await _turn(hub, "a", closing)
    assert await _take(hub, "b") == []
    [link] = await hub.list_links("t")
    assert link.turns_used == 0
