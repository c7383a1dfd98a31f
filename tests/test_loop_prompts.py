"""No endless loops when a turn's reported prompt is not the text the hub handed over.

An SDK agent or a wrapper often reports its turn's prompt in its own words: each message
wrapped in a template, summarised, several folded into one, or a made-up prompt on
purpose. The hub cannot find what it handed over in such a prompt, and once took every
such turn for one a human typed: a fresh chain, so a ring of three never stopped. A turn
now goes on in the chain of what its member was handed and has not yet started a turn
on, while that is recent; a human who comes back to a session later with a task of their
own still starts a chain of their own.
"""

from __future__ import annotations

from typing import Any

import pytest

from backchannel.errors import BudgetExhausted
from backchannel.hub import Hub
from backchannel.runtimes.receiver import handle_hook
from backchannel.testing import FakeClock, MemoryStore
from tests.conftest import Server
from tests.runtimes.agents import make_team
from tests.test_budget import _agent_messages, _kick, _team
from tests.test_link_crossings import _hook

NEXT = {"a": "b", "b": "c", "c": "a"}
BUDGET = 5


def _prompt(how: str, member: str, got: list[dict[str, Any]]) -> str:
    """The prompt a wrapper reports for a turn on ``got``, in its own words."""
    if how == "summary":  # what it read, summarised: none of the words it was handed
        return f"You are {member}. {len(got)} new item(s) from your team; act on them."
    if how == "template":  # every message rewritten into the wrapper's own template
        return "\n".join(
            f"<item sender={m['from']!r}>{m['text'].upper().replace(' ', '_')}</item>" for m in got
        )
    return "continue"  # a prompt made up on purpose


def _ring_over_http(server: Server, run: str, how: str) -> tuple[int, list[dict[str, Any]], str]:
    """Three members in a ring on a real ``backchannel serve``, each passing on what it
    gets to the next, driven through the HTTP API: it receives (in its own session, or for
    the member and then in a new session per run), reports ``turn_start`` with its prompt
    in its own words, sends, and reports ``agent_stop``. Returns the sends that got
    through, the refusals, and the chain the human started."""
    tokens = make_team(server, "t", *NEXT, chain_budget=BUDGET, pair_budget=100)
    http = {n: server.client(tokens[n]) for n in tokens}
    try:
        if run == "session":
            for n in NEXT:
                r = http[n].post("/v1/sessions", json={"session_id": f"{n}-s"})
                r.raise_for_status()
        start = http["user"].post("/v1/messages", json={"to": "a", "text": "start"}).json()
        sent, refusals = 0, []
        for r_ in range(6 * BUDGET):  # a deadline in rounds: past it, it never stopped
            progressed = False
            for n in NEXT:
                params: dict[str, Any] = {"wait": 0, "limit": 20}
                if run == "session":
                    params["session"] = f"{n}-s"
                got = http[n].get("/v1/inbox", params=params).json()["messages"]
                if not got:
                    continue
                progressed = True
                ids = [m["message_id"] for m in got]
                http[n].post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()
                sid = f"{n}-s" if run == "session" else f"{n}-run-{r_}"
                if run != "session":
                    http[n].post("/v1/sessions", json={"session_id": sid}).raise_for_status()
                events = f"/v1/sessions/{sid}/events"
                start_turn = {"kind": "turn_start", "text": _prompt(how, n, got)}
                http[n].post(events, json=start_turn).raise_for_status()
                body = {"to": NEXT[n], "text": f"{n} passes it on ({r_})", "from_session": sid}
                out = http[n].post("/v1/messages", json=body)
                if out.status_code == 201:
                    sent += 1
                else:
                    assert out.status_code == 429, out.text
                    refusals.append(out.json()["error"])
                stop = {"kind": "agent_stop", "text": ""}
                http[n].post(events, json=stop).raise_for_status()
            if not progressed:
                break
        else:
            raise AssertionError(f"still talking after {6 * BUDGET} rounds: {sent} sends")
        return sent, refusals, start["message_id"]
    finally:
        for c in http.values():
            c.close()


@pytest.mark.parametrize(
    ("run", "how"), [("session", "template"), ("session", "forged"), ("one-shot", "summary")]
)
def test_a_ring_reporting_prompts_in_its_own_words_stops_at_the_chain_budget(
    server: Server, run: str, how: str
) -> None:
    """Each member's turn reports a prompt that carries none of the texts it was handed
    (summarised, rewritten into a template, or made up), whether it runs in one session
    that leases its own messages or in a new session per run on what the member leased.
    The turn goes on in the chain it was handed, so the ring stops at the chain budget
    with a refusal that names it, in the one chain the human started."""
    sent, refusals, chain = _ring_over_http(server, run, how)
    assert sent == BUDGET, (sent, refusals)
    assert refusals and {e["budget"] for e in refusals} == {"chain"}
    assert {e["key"] for e in refusals} == {f"chain:{chain}"}
    assert all("chain_budget" in e["message"] for e in refusals)


def test_a_ring_forging_the_prompts_of_claude_code_hooks_stops_at_the_chain_budget(
    server: Server,
) -> None:
    """The same ring through the Claude Code hook endpoint: each member submits a made-up
    prompt (``UserPromptSubmit``), is answered with what waits for it as the prompt's
    context, passes it on and stops. What was handed with the prompt is recent, so the
    turn goes on in its chain rather than in one of the prompt's own."""
    tokens = make_team(
        server, "t", *(f"{n}:claude-code" for n in NEXT), chain_budget=BUDGET, pair_budget=100
    )
    http = {n: server.client(tokens[n]) for n in tokens}
    try:
        start = http["user"].post("/v1/messages", json={"to": "a", "text": "start"}).json()
        sent, refusals = 0, []
        for r in range(6 * BUDGET):  # a deadline in rounds: past it, it never stopped
            progressed = False
            for n in NEXT:
                sid = f"{n}-s"
                answer = _hook(http[n], "UserPromptSubmit", sid, prompt="continue")
                context = (answer.get("hookSpecificOutput") or {}).get("additionalContext")
                if context and ("passes it on" in context or "start" in context):
                    progressed = True
                    body = {"to": NEXT[n], "text": f"{n} passes it on ({r})", "from_session": sid}
                    out = http[n].post("/v1/messages", json=body)
                    if out.status_code == 201:
                        sent += 1
                    else:
                        assert out.status_code == 429, out.text
                        refusals.append(out.json()["error"])
                while _hook(http[n], "Stop", sid, last_assistant_message="").get("decision"):
                    pass  # what came meanwhile, handed to a continuation that sends nothing
            if not progressed:
                break
        else:
            raise AssertionError(f"still talking after {6 * BUDGET} rounds: {sent} sends")
        assert sent == BUDGET, (sent, refusals)
        assert refusals and {e["key"] for e in refusals} == {f"chain:{start['message_id']}"}
    finally:
        for c in http.values():
            c.close()


# -- a human's own task is still a chain of its own ------------------------------------------


async def _spend_a_chain_on_b(hub: Hub) -> str:
    """a sends b the chain's last hop, which b's session is handed; the chain is spent."""
    start = await _kick(hub, "a")
    await hub.receive("t", "a", session="a-s", limit=5)
    await hub.report_event("t", "a", "a-s", "turn_start", "[From user] start")
    await hub.send("t", "a", "b", "one", sender_session="a-s", link=False)  # hop 1
    await hub.report_event("t", "a", "a-s", "agent_stop", "")
    got = await hub.receive("t", "b", session="b-s", limit=5)
    await hub.ack("t", "b", [g.message.message_id for g in got])
    return start.message_id


async def test_a_human_coming_back_the_next_day_starts_a_chain_of_their_own(
    clock: FakeClock,
) -> None:
    """b's session was handed the last hop of a chain and never ran a turn on it. A turn
    that starts on something else within the hour goes on in that chain (and is refused
    past it); a human who types a task of their own the next day starts a new chain."""
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", chain_budget=1, pair_budget=100)
        chain = await _spend_a_chain_on_b(hub)
        clock.advance(86_400)
        await hub.report_event("t", "b", "b-s", "turn_start", "write the release notes")
        sent = await hub.send("t", "b", "a", "notes are done", sender_session="b-s", link=False)
        m = (await hub.message_status("t", sent.message_id)).message
        assert (m.chain_id, m.hop) == (sent.message_id, 1)
        assert m.chain_id != chain


async def test_a_turn_in_its_own_words_soon_after_goes_on_in_the_chain(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", chain_budget=1, pair_budget=100)
        chain = await _spend_a_chain_on_b(hub)
        clock.advance(60)
        await hub.report_event("t", "b", "b-s", "turn_start", "1 new item from your team")
        with pytest.raises(BudgetExhausted) as refused:
            await hub.send("t", "b", "a", "passing it on", sender_session="b-s", link=False)
        assert refused.value.details["key"] == f"chain:{chain}"
        # the turn took what it was handed: the next turn in its own words is the human's
        await hub.report_event("t", "b", "b-s", "agent_stop", "")
        await hub.report_event("t", "b", "b-s", "turn_start", "now a task of my own")
        sent = await hub.send("t", "b", "a", "my own task", sender_session="b-s", link=False)
        m = (await hub.message_status("t", sent.message_id)).message
        assert (m.chain_id, m.hop) == (sent.message_id, 1)


async def test_a_prompt_typed_into_claude_code_the_next_day_starts_its_own_chain(
    clock: FakeClock,
) -> None:
    """Messages of a spent chain (its last hop, the hub's notice that it is spent) waited
    for b's idle Claude Code session overnight. The human's prompt the next morning gets
    them as its context, and its turn is a chain of its own: never refused for yesterday's."""
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off", "chain_budget": 1})
        await hub.add_member("t", "a")
        member, _ = await hub.add_member("t", "b", kind="claude-code")
        await hub.open_session("t", "b", "b-s")
        await hub.send("t", "a", "b", "one", link=False)  # hop 1: spends the chain
        clock.advance(86_400)
        base = {"session_id": "b-s", "cwd": "/w", "transcript_path": "/w/t.jsonl"}
        prompt = {**base, "hook_event_name": "UserPromptSubmit", "prompt": "fix the parser"}
        out = await handle_hook(hub, member, "claude-code", prompt)
        assert "one" in str(out.answer), out.problem
        sent = await hub.send("t", "b", "a", "parser fixed", sender_session="b-s", link=False)
        m = (await hub.message_status("t", sent.message_id)).message
        assert (m.chain_id, m.hop) == (sent.message_id, 1)


async def test_agents_rings_bound_once_messages_are_taken(clock: FakeClock) -> None:
    """What a member was handed without a session binds one turn only: once a run took
    it, a later run in its own words (a human's own task) is a chain of its own."""
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off", "chain_budget": 1})
        for n in ("a", "b"):
            await hub.add_member("t", n)
        first = await hub.send("t", "a", "b", "hop one", link=False)  # spends the chain
        got = await hub.receive("t", "b", limit=5)
        await hub.ack("t", "b", [g.message.message_id for g in got])
        await hub.start_session("t", "b", "b-run0", recover=False)
        await hub.report_event("t", "b", "b-run0", "turn_start", "1 item from a")
        with pytest.raises(BudgetExhausted):
            await hub.send("t", "b", "a", "passing on", sender_session="b-run0", link=False)
        await hub.report_event("t", "b", "b-run0", "agent_stop", "")
        await hub.exit_session("t", "b", "b-run0", "the run ended")
        await hub.start_session("t", "b", "b-run1", recover=False)
        await hub.report_event("t", "b", "b-run1", "turn_start", "write the release notes")
        sent = await hub.send("t", "b", "a", "notes", sender_session="b-run1", link=False)
        m = (await hub.message_status("t", sent.message_id)).message
        assert (m.chain_id, m.hop) == (sent.message_id, 1)
        assert (await _agent_messages(hub, "a", "b"))[0].chain_id == first.message_id


async def test_what_a_live_session_took_binds_no_session_started_later(clock: FakeClock) -> None:
    """b's adapter leases for the member while b's turns run in its live session, which
    takes the copy it was handed. A new session a human starts minutes later on a task of
    their own does not take the same messages again: it starts a chain of its own."""
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b", chain_budget=1, pair_budget=100)
        await hub.send("t", "a", "b", "hop one", link=False)  # spends its chain
        got = await hub.receive("t", "b", limit=5)  # the adapter: no session named
        await hub.ack("t", "b", [g.message.message_id for g in got])
        await hub.report_event("t", "b", "b-s", "turn_start", "[From a] hop one")
        await hub.report_event("t", "b", "b-s", "agent_stop", "")
        clock.advance(120)
        await hub.start_session("t", "b", "b-new", recover=False)
        await hub.report_event("t", "b", "b-new", "turn_start", "write the release notes")
        sent = await hub.send("t", "b", "a", "notes", sender_session="b-new", link=False)
        m = (await hub.message_status("t", sent.message_id)).message
        assert (m.chain_id, m.hop) == (sent.message_id, 1)
