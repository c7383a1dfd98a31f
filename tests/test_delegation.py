"""Agents as asynchronous tools: delegate, answers, gathering, deadlines, tokens, outbox."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as rules
from backchannel.errors import (
    BudgetExhausted,
    Conflict,
    InvalidRequest,
    Unauthorized,
    UnknownRecipient,
    UnknownService,
)
from backchannel.hub import Hub
from backchannel.testing import FakeClock, MemoryStore, eventually
from backchannel.types import Delegation, DelegationState, MessageKind
from tests.helpers_hubs import chat_bodies
from tests.peers import Peer, QuietHandler

SECRET = "test-secret-0123456789"


async def _team(hub: Hub) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    for m in ("lead", "counter", "lister"):
        await hub.add_member("t", m)
    await hub.open_session("t", "lead", "lead-s")


async def _answer(hub: Hub, member: str, text: str) -> list[str]:
    """Play the callee: take each task waiting in the member's sessions and answer it."""
    done = []
    for s in await hub.list_sessions("t", member):
        got = await hub.receive("t", member, session=s.session_id, limit=10)
        for g in got:
            if g.message.kind is MessageKind.DELEGATION:
                await hub.ack("t", member, [g.message.message_id])
                await hub.report_event("t", member, s.session_id, "turn_start", g.message.text)
                await hub.report_event(
                    "t", member, s.session_id, "agent_stop", text.format(task=g.message.text)
                )
                done.append(s.session_id)
    return done


async def _results(hub: Hub) -> list[Any]:
    got = await hub.receive("t", "lead", session="lead-s", limit=10)
    await hub.ack("t", "lead", [g.message.message_id for g in got]) if got else None
    return [g.message for g in got if g.message.kind is MessageKind.TOOL_RESULT]


async def test_delegate_returns_at_once_and_the_answer_comes_back(hub: Hub) -> None:
    await _team(hub)
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    d = await hub.delegate(
        "t", "lead", "lead-s", "counter", "count the Python files", tool_use_id="tu_1"
    )
    assert (d.state, d.callee_session) == (DelegationState.PENDING, "lead-s--tu_1")
    # the callee sees an ordinary task: no reply route, no trace of being a tool
    task = await hub.receive("t", "counter", session="lead-s--tu_1")
    assert [(g.message.kind, g.message.text, g.message.sender) for g in task] == [
        (MessageKind.DELEGATION, "count the Python files", "lead")
    ]
    assert "tu_1" not in task[0].message.text
    await hub.release("t", "counter", [task[0].message.message_id])
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "waiting for the count")
    assert await _answer(hub, "counter", "There are 12 Python files.") == ["lead-s--tu_1"]
    [result] = await _results(hub)
    assert result.text == "Result of delegate(to='counter') [tu_1]:\nThere are 12 Python files."
    assert result.meta["results"] == [
        {
            "tool_use_id": "tu_1",
            "delegation_id": d.delegation_id,
            "to": "counter",
            "result": "There are 12 Python files.",
        }
    ]
    assert (await hub.get_delegation("t", d.delegation_id)).state is DelegationState.ANSWERED


async def test_three_concurrent_delegations_each_answered_to_the_right_request(hub: Hub) -> None:
    await _team(hub)
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    ds = await asyncio.gather(
        hub.delegate("t", "lead", "lead-s", "counter", "count src/", tool_use_id="tu_a"),
        hub.delegate("t", "lead", "lead-s", "counter", "count tests/", tool_use_id="tu_b"),
        hub.delegate("t", "lead", "lead-s", "lister", "list TODOs", tool_use_id="tu_c"),
    )
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    await _answer(hub, "counter", "answer to: {task}")
    assert await _results(hub) == [], "gathered: nothing until every delegation of the turn is in"
    await _answer(hub, "lister", "answer to: {task}")
    [result] = await _results(hub)
    by_id = {r["tool_use_id"]: r["result"] for r in result.meta["results"]}
    assert by_id == {
        "tu_a": "answer to: count src/",
        "tu_b": "answer to: count tests/",
        "tu_c": "answer to: list TODOs",
    }
    assert {d.delegation_id for d in ds} == {r["delegation_id"] for r in result.meta["results"]}


async def test_results_that_arrive_during_the_turn_wait_for_its_end(hub: Hub) -> None:
    await _team(hub)
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    await hub.delegate("t", "lead", "lead-s", "counter", "quick one", tool_use_id="tu_q")
    await _answer(hub, "counter", "done")
    assert await hub.receive("t", "lead", session="lead-s") == []  # never mid-turn
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    [result] = await _results(hub)
    assert "done" in result.text


async def test_deadline_synthesizes_an_error_then_the_late_answer_arrives(
    hub: Hub, clock: FakeClock
) -> None:
    await _team(hub)
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    await hub.delegate(
        "t", "lead", "lead-s", "counter", "slow job", timeout_s=30, tool_use_id="tu_slow"
    )
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    clock.advance(31)
    await hub.maintain()
    [timeout] = await _results(hub)
    [r] = timeout.meta["results"]
    assert (r["reason"], r["tool_use_id"]) == ("timeout", "tu_slow")
    assert "did not answer within 30 s" in r["error"]
    await _answer(hub, "counter", "finally: 7")
    [late] = await _results(hub)
    assert late.meta["late"] is True
    assert late.text.startswith("Late result of delegate(to='counter') [tu_slow]")
    assert "finally: 7" in late.text
    states = [d.state for d in await hub.list_delegations("t")]
    assert states == [DelegationState.LATE]


async def test_bad_delegations_are_refused(hub: Hub) -> None:
    await _team(hub)
    with pytest.raises(InvalidRequest, match="has no open turn"):
        await hub.delegate("t", "lead", "lead-s", "counter", "x")
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    with pytest.raises(UnknownRecipient, match="did you mean 'counter'"):
        await hub.delegate("t", "lead", "lead-s", "countr", "x")
    with pytest.raises(InvalidRequest, match="task is empty"):
        await hub.delegate("t", "lead", "lead-s", "counter", "  ")
    with pytest.raises(InvalidRequest, match="timeout_s"):
        await hub.delegate("t", "lead", "lead-s", "counter", "x", timeout_s=0)
    with pytest.raises(UnknownService, match="unknown callback service 'nowhere'"):
        await hub.delegate("t", "lead", "lead-s", "agent@nowhere", "x")
    first = await hub.delegate("t", "lead", "lead-s", "counter", "x", tool_use_id="tu_1")
    assert not first.replayed
    # the same call again (its answer lost on the way) answers the delegation it made,
    # and says so
    again = await hub.delegate("t", "lead", "lead-s", "counter", "x", tool_use_id="tu_1")
    assert again == first and again.replayed
    assert not (await hub.get_delegation("t", first.delegation_id)).replayed
    with pytest.raises(Conflict, match="'tu_1' was already used in session 'lead-s'"):
        await hub.delegate("t", "lead", "lead-s", "counter", "y", tool_use_id="tu_1")
    assert [d.delegation_id for d in await hub.list_delegations("t")] == [first.delegation_id]


# -- tokens -------------------------------------------------------------------------------


def _claims() -> dict[str, Any]:
    return {
        "session_id": "s",
        "tool_use_id": "tu",
        "tool_id": "t/d",
        "name": "delegate",
        "total_tools": 1,
    }


def test_token_roundtrip_and_refusals() -> None:
    token = rules.make_token(SECRET, _claims(), now=1000.0, ttl=60)
    claims = rules.verify_token(SECRET, token, now=1010.0)
    assert {k: claims[k] for k in _claims()} == _claims()
    assert claims["exp"] == 1060
    assert len(claims["jti"]) >= 16
    payload, sig = token.split(".")
    tampered = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1] + "." + sig
    with pytest.raises(Unauthorized):
        rules.verify_token(SECRET, tampered, now=1010.0)
    with pytest.raises(Unauthorized, match="signature"):
        rules.verify_token("other-secret", token, now=1010.0)
    with pytest.raises(Unauthorized, match="expired"):
        rules.verify_token(SECRET, token, now=1060.0)
    with pytest.raises(Unauthorized, match="no callback secret"):
        rules.verify_token(None, token, now=1010.0)
    with pytest.raises(Unauthorized, match="malformed"):
        rules.verify_token(SECRET, "garbage", now=1010.0)


def test_retry_policy() -> None:
    p = rules.RetryPolicy()
    assert [p.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 15, 15]
    assert rules.next_try(p, 1, first_at=0.0, now=0.0) == 1.0
    assert rules.next_try(p, 9, first_at=0.0, now=110.0) is None
    assert [
        rules.classify(s) for s in (None, 200, 204, 301, 400, 404, 408, 425, 429, 500, 503)
    ] == [
        rules.Outcome.RETRY,
        rules.Outcome.DONE,
        rules.Outcome.DONE,
        rules.Outcome.DEAD,
        rules.Outcome.DEAD,
        rules.Outcome.DEAD,
        rules.Outcome.RETRY,
        rules.Outcome.RETRY,
        rules.Outcome.RETRY,
        rules.Outcome.RETRY,
        rules.Outcome.RETRY,
    ]


# -- a scripted callback server (a real socket) --------------------------------------------


class Scripted(Peer):
    """An HTTP server whose answers a test scripts, recording every request."""

    def __init__(self, answer: Callable[[str, dict[str, Any], int], tuple[int, float]]) -> None:
        self.answer = answer
        self.body = b"{}"  # what every answer carries
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
                outer.requests.append((self.path, body, dict(self.headers)))
                status, delay = outer.answer(self.path, body, len(outer.requests))
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(outer.body)

        self.serve(Handler)


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def make(answer: Callable[[str, dict[str, Any], int], tuple[int, float]]) -> Scripted:
        made.append(Scripted(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


FAST = rules.RetryPolicy(start=0.05, factor=2, cap=0.2, budget=5, timeout=2)


async def _callee_hub(services: dict[str, str], retry: rules.RetryPolicy = FAST) -> Hub:
    cfg = CallbackConfig(
        secret=SECRET,
        service_name="hub-b",
        services={name: Service(name, url) for name, url in services.items()},
        retry=retry,
    )
    hub = Hub(MemoryStore(), callbacks=cfg)
    await hub.start()
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "worker")
    await hub.add_member("t", "hub-a")  # the remote caller, as a member of this team
    return hub


async def _outbox_idle(hub: Hub) -> bool:
    return await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox")) == []


async def _task_taken(
    hub: Hub,
    tool_use_id: str,
    *,
    task: str | None = None,
    service: str = "caller",
    reply_token: str | None = None,
) -> Delegation:
    """hub-a hands worker a task (``task {tool_use_id}`` unless named), answered to
    ``service``; worker takes it and its turn on it starts. Returns the delegation, whose
    callee session is where the turn runs."""
    d = await hub.accept_chat(
        "t",
        "hub-a",
        "worker",
        task if task is not None else f"task {tool_use_id}",
        reply_service=service,
        reply_token=reply_token if reply_token is not None else "tok-" + tool_use_id,
        session_id="remote-s",
        tool_use_id=tool_use_id,
    )
    assert d.callee_session is not None
    got = await hub.receive("t", "worker", session=d.callee_session)
    await hub.ack("t", "worker", [g.message.message_id for g in got])
    await hub.report_event("t", "worker", d.callee_session, "turn_start")
    return d


async def _inbound(hub: Hub, tool_use_id: str, service: str = "caller") -> str:
    d = await _task_taken(hub, tool_use_id, service=service)
    assert d.callee_session is not None
    await hub.report_event("t", "worker", d.callee_session, "agent_stop", f"answer {tool_use_id}")
    return d.delegation_id


async def test_answer_retried_on_503_then_delivered_once(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(lambda path, body, n: (503 if n <= 2 else 200, 0))
    hub = await _callee_hub({"caller": srv.url})
    try:
        await _inbound(hub, "tu_1")
        await eventually(lambda: len(srv.requests) >= 3, what="three POSTs")
        # once the outbox job has ended, nothing is left that could make a fourth POST
        await eventually(lambda: _outbox_idle(hub), what="the outbox job to end")
        assert len(srv.requests) == 3
        path, body, headers = srv.requests[-1]
        assert (path, body["result"]) == ("/api/tools/response", "answer tu_1")
        # the task named no chain, so it started one at hop 0; the answer goes on at 1
        assert body["chain"]["hop"] == 1
        assert headers["Authorization"] == "Bearer tok-tu_1"
    finally:
        await hub.close()


async def test_a_request_kept_before_requests_were_kept_per_caller_is_found_by_its_caller() -> None:
    """A delegation stored under the caller's bare session id (as before the callee hub
    kept requests per caller) is what a repeat from its caller finds: it is not run again.
    Another caller with the same ids gets a delegation of its own; a session of the team
    named like a caller's request is never handed to that caller."""
    hub = await _callee_hub({"caller": "http://127.0.0.1:9"})

    async def chat(caller: str, session_id: str, tool_use_id: str) -> Any:
        return await hub.accept_chat(
            "t", caller, "worker", "task", reply_service="caller", reply_token="tok",
            session_id=session_id, tool_use_id=tool_use_id,
        )  # fmt: skip

    try:
        await hub.add_member("t", "hub-c")
        first = await chat("hub-a", "remote-s", "tu_1")
        assert (first.caller_session, first.callee_session) == (
            "hub-a:remote-s",
            "hub-a:remote-s--tu_1",
        )
        old = dataclasses.replace(
            first,
            delegation_id="dlg_stored_before",
            tool_use_id="tu_old",
            caller_session="remote-s",
            callee_session="remote-s--tu_old",
            batch="remote-s#inbound",
        )
        await hub.store.transact(lambda tx: tx.insert_delegation(old))
        assert (await chat("hub-a", "remote-s", "tu_old")).delegation_id == "dlg_stored_before"
        other = await chat("hub-c", "remote-s", "tu_old")
        assert other.delegation_id != "dlg_stored_before"
        assert (other.caller, other.caller_session) == ("hub-c", "hub-c:remote-s")
        # a delegation of this team's own session named "hub-a:mine" is not hub-a's
        await hub.open_session("t", "worker", "hub-a:mine")
        await hub.report_event("t", "worker", "hub-a:mine", "turn_start")
        await hub.delegate("t", "worker", "hub-a:mine", "hub-c", "x", tool_use_id="tu_same")
        with pytest.raises(Conflict) as exc:
            await chat("hub-a", "mine", "tu_same")
        assert "new tool_use_id" in exc.value.message
        assert len(await hub.list_delegations("t")) == 4
    finally:
        await hub.close()


async def test_a_bearer_token_that_is_not_visible_ascii_is_refused_at_ingress() -> None:
    hub = await _callee_hub({"caller": "http://127.0.0.1:9"})
    try:
        for token in ("t\u00f8ken", "two words", "line\nbreak", "x" * 5000):
            with pytest.raises(InvalidRequest) as exc:
                await hub.accept_chat(
                    "t", "hub-a", "worker", "x", reply_service="caller", reply_token=token
                )
            assert exc.value.status == 422
            assert exc.value.details["field"] == "reply.bearerToken"
        assert await hub.list_delegations("t") == []
    finally:
        await hub.close()


async def test_an_outbox_job_that_raises_goes_dead_with_the_reason(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda path, body, n: (200, 0))
    budget = rules.RetryPolicy(start=0.05, factor=2, cap=0.1, budget=0.3, timeout=2)
    hub = await _callee_hub({"caller": srv.url}, retry=budget)
    try:
        d = await hub.accept_chat(
            "t",
            "hub-a",
            "worker",
            "task",
            reply_service="caller",
            reply_token="tok",
            session_id="remote-s",
            tool_use_id="tu_bad",
        )
        # a reply token stored before tokens were checked: httpx cannot put it in a header
        bad = dataclasses.replace(d, reply_token="t\u00f8ken")
        await hub.store.transact(lambda tx: tx.update_delegation(bad))
        assert d.callee_session is not None
        got = await hub.receive("t", "worker", session=d.callee_session)
        await hub.ack("t", "worker", [g.message.message_id for g in got])
        await hub.report_event("t", "worker", d.callee_session, "turn_start")
        await hub.report_event("t", "worker", d.callee_session, "agent_stop", "the answer")

        async def failed() -> bool:
            return (await hub.get_delegation("t", d.delegation_id)).state is DelegationState.FAILED

        await eventually(failed, what="the delegation to fail")
        error = (await hub.get_delegation("t", d.delegation_id)).error or ""
        assert "could not send the POST" in error and "UnicodeEncodeError" in error
        assert srv.requests == []
        notes = await hub.receive("t", "worker", limit=10)
        assert any("could not be delivered" in g.message.text for g in notes)
        jobs = await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox"))
        assert jobs == []  # nothing left pending to re-run
    finally:
        await hub.close()


async def test_404_goes_to_dead_letters_without_a_retry_storm(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda path, body, n: (404, 0))
    hub = await _callee_hub({"caller": srv.url})
    try:
        did = await _inbound(hub, "tu_1")

        async def failed() -> bool:
            return (await hub.get_delegation("t", did)).state is DelegationState.FAILED

        await eventually(failed, what="the delegation to fail")
        assert len(srv.requests) == 1
        d = await hub.get_delegation("t", did)
        assert "HTTP 404" in (d.error or "")
        notes = await hub.receive("t", "worker", limit=10)
        assert any("could not be delivered" in g.message.text for g in notes)
    finally:
        await hub.close()


async def test_a_hanging_callback_server_does_not_delay_another(
    scripted: Callable[..., Scripted],
) -> None:
    hang = scripted(lambda path, body, n: (200, 3.0))
    fast = scripted(lambda path, body, n: (200, 0))
    hub = await _callee_hub({"slow": hang.url, "fast": fast.url})
    try:
        await _inbound(hub, "tu_slow", service="slow")
        await eventually(lambda: len(hang.requests) == 1, what="the slow POST")
        started = time.monotonic()
        await _inbound(hub, "tu_fast", service="fast")
        # well before the slow one ends
        await eventually(lambda: len(fast.requests) == 1, what="the fast POST", within=2.5)
        assert time.monotonic() - started < 2.5
    finally:
        await hub.close()


async def test_unknown_reply_service_is_refused_at_ingress() -> None:
    hub = await _callee_hub({})
    try:
        with pytest.raises(UnknownService) as exc:
            await hub.accept_chat(
                "t", "hub-a", "worker", "x", reply_service="evil", reply_token="t"
            )
        assert exc.value.status == 400
        assert await hub.list_delegations("t") == []
    finally:
        await hub.close()


async def test_tool_response_tokens_tampered_expired_replayed(clock: FakeClock) -> None:
    cfg = CallbackConfig(
        secret=SECRET, services={"hub-b": Service("hub-b", "http://127.0.0.1:9")}, retry=FAST
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await _team(hub)
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate(
            "t", "lead", "lead-s", "worker@hub-b", "remote task", timeout_s=60, tool_use_id="tu_r"
        )
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")  # the task goes out
        jobs = await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox"))
        token = jobs[0].payload["body"]["reply"]["bearerToken"]
        assert jobs[0].payload["body"]["reply"]["callbackService"] == "backchannel"
        payload, sig = token.split(".")
        with pytest.raises(Unauthorized):
            await hub.accept_tool_response(payload + "." + sig[::-1], "forged")
        done = await hub.accept_tool_response(token, "the remote answer")
        assert done.state is DelegationState.ANSWERED
        # the callee hub lost our acknowledgement and sends the same answer again: taken
        # once, acknowledged twice; a different answer on the spent token is a conflict
        again = await hub.accept_tool_response(token, "the remote answer")
        assert (again.state, again.result) == (DelegationState.ANSWERED, "the remote answer")
        with pytest.raises(Conflict, match="already answered with a different result") as exc:
            await hub.accept_tool_response(token, "another answer")
        assert exc.value.status == 409
        [result] = await _results(hub)
        assert "the remote answer" in result.text
        assert await _results(hub) == [], "the repeat delivered nothing a second time"
        # a token signed for a delegation this hub does not have is refused as unknown
        stray = rules.make_token(
            SECRET,
            {**_claims(), "tool_id": "t/dlg_unknown"},
            now=clock.now(),
            ttl=60,
        )
        with pytest.raises(Unauthorized, match="matches no delegation"):
            await hub.accept_tool_response(stray, "x")
        # a token outlives the deadline (late answers are accepted) but not forever
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d2 = await hub.delegate(
            "t", "lead", "lead-s", "worker@hub-b", "another", timeout_s=60, tool_use_id="tu_e"
        )
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        jobs = await hub.store.read(lambda tx: tx.list_jobs("t", kind="outbox", pending_only=False))
        token2 = next(j for j in jobs if j.payload["ref"].endswith(d2.delegation_id)).payload[
            "body"
        ]["reply"]["bearerToken"]
        clock.advance(60 + rules.TOKEN_GRACE + 1)
        with pytest.raises(Unauthorized, match="expired"):
            await hub.accept_tool_response(token2, "too late")
        assert d.delegation_id != d2.delegation_id


async def test_a_hook_attached_callee_answers_from_its_own_session(hub: Hub) -> None:
    await _team(hub)
    await hub.add_member("t", "cc", "claude-code")
    await hub.open_session("t", "cc", "cc-live")  # a Claude Code session, as its hooks opened it
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    d = await hub.delegate("t", "lead", "lead-s", "cc", "review the diff", tool_use_id="tu_cc")
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    got = await hub.receive("t", "cc", session="cc-live")  # e.g. handed over by a Stop hook
    assert [g.message.text for g in got] == ["review the diff"]
    assert (await hub.get_delegation("t", d.delegation_id)).callee_session == "cc-live"
    await hub.ack("t", "cc", [got[0].message.message_id])
    await hub.report_event("t", "cc", "cc-live", "turn_start")
    await hub.report_event("t", "cc", "cc-live", "agent_stop", "LGTM")
    [result] = await _results(hub)
    assert result.text.endswith("LGTM")


# -- the chain budget across hubs ----------------------------------------------------------


async def _chain_team(hub: Hub, chain_budget: int) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off", "chain_budget": chain_budget})
    await hub.add_member("t", "lead")
    await hub.add_member("t", "hub-b")  # the other hub, as a member of this team
    await hub.open_session("t", "lead", "lead-s")


async def _task_from_hub_b(hub: Hub, tool_use_id: str, chain: Any) -> str:
    """Hub B hands lead a task in ``chain``; lead's turn on it starts. Returns the session."""
    d = await hub.accept_chat(
        "t", "hub-b", "lead", "pass it on", reply_service="hub-b", reply_token="tok",
        session_id="b-s", tool_use_id=tool_use_id, chain=chain,
    )  # fmt: skip
    assert d.callee_session is not None
    got = await hub.receive("t", "lead", session=d.callee_session)
    await hub.ack("t", "lead", [g.message.message_id for g in got])
    await hub.report_event("t", "lead", d.callee_session, "turn_start")
    return d.callee_session


async def test_a_task_for_another_hub_carries_its_chain_and_stops_at_the_budget(
    clock: FakeClock,
) -> None:
    cfg = CallbackConfig(
        secret=SECRET, services={"hub-b": Service("hub-b", "http://127.0.0.1:9")}, retry=FAST
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await _chain_team(hub, chain_budget=3)
        # a turn on nothing the hub handed over has no chain: the task names none
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate("t", "lead", "lead-s", "worker@hub-b", "x", tool_use_id="tu_0")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        # a task at hop 1 of a chain: the turn on it delegates at hop 2
        sub = await _task_from_hub_b(hub, "tu_b1", {"id": "c-1", "hop": 1})
        await hub.delegate("t", "lead", sub, "worker@hub-b", "on", tool_use_id="tu_1")
        await hub.report_event("t", "lead", sub, "agent_stop", "")
        # at hop 2 the task at hop 3 reaches the budget: it goes, and spends it
        sub = await _task_from_hub_b(hub, "tu_b2", {"id": "c-1", "hop": 2})
        await hub.delegate("t", "lead", sub, "worker@hub-b", "on", tool_use_id="tu_2")
        await hub.report_event("t", "lead", sub, "agent_stop", "")
        bodies = await chat_bodies(hub)
        assert "chain" not in bodies["tu_0"]
        assert bodies["tu_1"]["chain"] == {"id": "c-1", "hop": 2}
        assert bodies["tu_2"]["chain"] == {"id": "c-1", "hop": 3}
        got = await hub.receive("t", "user", limit=100)
        [told] = [g.message for g in got if g.message.meta.get("budget") == "chain"]
        assert (told.meta["key"], told.meta["limit"]) == ("chain:c-1", 3)
        # at hop 3 the next task would be past it: refused as a local send would be
        sub = await _task_from_hub_b(hub, "tu_b3", {"id": "c-1", "hop": 3})
        with pytest.raises(BudgetExhausted) as exc:
            await hub.delegate("t", "lead", sub, "worker@hub-b", "on", tool_use_id="tu_3")
        assert exc.value.status == 429
        assert (exc.value.details["budget"], exc.value.details["key"]) == ("chain", "chain:c-1")
        assert "chain_budget" in exc.value.message
        assert "tu_3" not in {d.tool_use_id for d in await hub.list_delegations("t")}
        # a human's extension lets exactly that many more hops through
        await hub.extend_budget("t", "chain:c-1", 1, by_whom="user")
        await hub.delegate("t", "lead", sub, "worker@hub-b", "on", tool_use_id="tu_4")
        await hub.report_event("t", "lead", sub, "agent_stop", "")
        assert (await chat_bodies(hub))["tu_4"]["chain"] == {"id": "c-1", "hop": 4}


async def test_a_task_from_another_hub_goes_on_in_the_chain_it_names(clock: FakeClock) -> None:
    cfg = CallbackConfig(
        secret=SECRET, services={"hub-b": Service("hub-b", "http://127.0.0.1:9")}, retry=FAST
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await _chain_team(hub, chain_budget=5)
        await hub.add_member("t", "helper")
        # a task without a chain starts a new one at hop 0
        d = await hub.accept_chat(
            "t", "hub-b", "lead", "fresh", reply_service="hub-b", reply_token="tok",
            session_id="b-s", tool_use_id="tu_f",
        )  # fmt: skip
        [task] = await hub.receive("t", "lead", session=d.callee_session)
        assert (task.message.chain_id, task.message.hop) == (task.message.message_id, 0)
        # a task in a chain continues it: the turn on it sends one hop further
        sub = await _task_from_hub_b(hub, "tu_c", {"id": "c-2", "hop": 4})
        sent = await hub.send("t", "lead", "helper", "help", sender_session=sub)
        m = (await hub.message_status("t", sent.message_id)).message
        assert (m.chain_id, m.hop) == ("c-2", 5)
        sub = await _task_from_hub_b(hub, "tu_d", {"id": "c-2", "hop": 5})
        with pytest.raises(BudgetExhausted):
            await hub.send("t", "lead", "helper", "more", sender_session=sub)
        # the spent chain named again at a smaller hop is not started again: the task
        # goes on at the budget, and its turn sends nothing further in it
        d = await hub.accept_chat(
            "t", "hub-b", "lead", "start over", reply_service="hub-b", reply_token="tok",
            session_id="b-s", tool_use_id="tu_forged", chain={"id": "c-2", "hop": 0},
        )  # fmt: skip
        [task] = await hub.receive("t", "lead", session=d.callee_session)
        assert (task.message.chain_id, task.message.hop) == ("c-2", 5)
        await hub.ack("t", "lead", [task.message.message_id])
        await hub.report_event("t", "lead", d.callee_session, "turn_start")
        with pytest.raises(BudgetExhausted):
            await hub.send("t", "lead", "helper", "more", sender_session=d.callee_session)
        # a task past this team's budget is refused at ingress, like a send would be
        with pytest.raises(BudgetExhausted) as exc:
            await hub.accept_chat(
                "t", "hub-b", "lead", "too far", reply_service="hub-b", reply_token="tok",
                session_id="b-s", tool_use_id="tu_far", chain={"id": "c-3", "hop": 6},
            )  # fmt: skip
        assert exc.value.details["key"] == "chain:c-3"
        assert "tu_far" not in {d.tool_use_id for d in await hub.list_delegations("t")}


async def test_an_answer_to_another_hub_names_the_chain_its_turn_went_on_in(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(lambda path, body, n: (200, 0))
    hub = await _callee_hub({"caller": srv.url})
    try:
        d = await hub.accept_chat(
            "t", "hub-a", "worker", "task", reply_service="caller", reply_token="tok",
            session_id="remote-s", tool_use_id="tu_c", chain={"id": "c-9", "hop": 4},
        )  # fmt: skip
        assert d.callee_session is not None
        got = await hub.receive("t", "worker", session=d.callee_session)
        await hub.ack("t", "worker", [g.message.message_id for g in got])
        await hub.report_event("t", "worker", d.callee_session, "turn_start", "task")
        await hub.report_event("t", "worker", d.callee_session, "agent_stop", "done")
        await eventually(lambda: len(srv.requests) >= 1, what="the answer's POST")
        _, body, _ = srv.requests[0]
        assert body == {"result": "done", "chain": {"id": "c-9", "hop": 5}}
    finally:
        await hub.close()


async def _remote_call(hub: Hub, session: str, tool_use_id: str) -> str:
    """lead's turn in ``session`` delegates to worker@hub-b and ends: the reply token."""
    await hub.delegate("t", "lead", session, "worker@hub-b", "ask", tool_use_id=tool_use_id)
    await hub.report_event("t", "lead", session, "agent_stop", "")
    body = (await chat_bodies(hub))[tool_use_id]
    token: str = body["reply"]["bearerToken"]
    return token


async def _turn_on_result(hub: Hub, session: str) -> None:
    got = await hub.receive("t", "lead", session=session, limit=20)
    await hub.ack("t", "lead", [g.message.message_id for g in got])
    text = "\n".join(g.message.text for g in got)
    await hub.report_event("t", "lead", session, "turn_start", text)


async def test_an_answer_from_another_hub_carries_its_chain_to_the_callers_next_task(
    clock: FakeClock,
) -> None:
    """lead asks worker@hub-b; the answer comes back at the hop worker's turn reached,
    one further; lead's turn on it asks again from there, never lower; the answer that
    reaches the budget spends it (lead and the human are told), and the next task is
    refused. A malformed chain is refused naming the field, and spends no token."""
    cfg = CallbackConfig(
        secret=SECRET, services={"hub-b": Service("hub-b", "http://127.0.0.1:9")}, retry=FAST
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await _chain_team(hub, chain_budget=6)
        start = await hub.send("t", "user", "lead", "start")
        await _turn_on_result(hub, "lead-s")
        token = await _remote_call(hub, "lead-s", "tu_1")
        assert (await chat_bodies(hub))["tu_1"]["chain"] == {"id": start.message_id, "hop": 1}
        with pytest.raises(InvalidRequest) as exc:
            await hub.accept_tool_response(token, "a", chain={"id": start.message_id, "hop": -1})
        assert exc.value.details["field"] == "chain.hop"
        await hub.accept_tool_response(token, "a", chain={"id": start.message_id, "hop": 2})
        await _turn_on_result(hub, "lead-s")
        token = await _remote_call(hub, "lead-s", "tu_2")
        assert (await chat_bodies(hub))["tu_2"]["chain"] == {"id": start.message_id, "hop": 3}
        # an answer naming a smaller hop lowers nothing: lead's turn stays at hop 2
        await hub.accept_tool_response(token, "b", chain={"id": start.message_id, "hop": 1})
        await _turn_on_result(hub, "lead-s")
        token = await _remote_call(hub, "lead-s", "tu_3")
        assert (await chat_bodies(hub))["tu_3"]["chain"] == {"id": start.message_id, "hop": 3}
        # the answer at the budget spends it: the caller and the human are told
        await hub.accept_tool_response(token, "c", chain={"id": start.message_id, "hop": 6})
        got = await hub.receive("t", "user", limit=100)
        [told] = [g.message for g in got if g.message.meta.get("budget") == "chain"]
        assert told.meta["key"] == f"chain:{start.message_id}"
        await _turn_on_result(hub, "lead-s")
        with pytest.raises(BudgetExhausted) as refused:
            await hub.delegate("t", "lead", "lead-s", "worker@hub-b", "ask", tool_use_id="tu_4")
        assert refused.value.details["key"] == f"chain:{start.message_id}"


@pytest.mark.parametrize(
    ("chain", "field"),
    [
        ("c-1", "chain"),
        (["c-1", 1], "chain"),
        ({"hop": 1}, "chain.id"),
        ({"id": "", "hop": 1}, "chain.id"),
        ({"id": "_c", "hop": 1}, "chain.id"),
        ({"id": "c 1", "hop": 1}, "chain.id"),
        ({"id": "c" * 129, "hop": 1}, "chain.id"),
        ({"id": 7, "hop": 1}, "chain.id"),
        ({"id": "c-1"}, "chain.hop"),
        ({"id": "c-1", "hop": -1}, "chain.hop"),
        ({"id": "c-1", "hop": 1_000_001}, "chain.hop"),
        ({"id": "c-1", "hop": 1.0}, "chain.hop"),
        ({"id": "c-1", "hop": "1"}, "chain.hop"),
        ({"id": "c-1", "hop": True}, "chain.hop"),
    ],
)
async def test_a_bad_chain_from_another_hub_is_refused_naming_the_field(
    clock: FakeClock, chain: Any, field: str
) -> None:
    cfg = CallbackConfig(
        secret=SECRET, services={"hub-b": Service("hub-b", "http://127.0.0.1:9")}, retry=FAST
    )
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await _chain_team(hub, chain_budget=5)
        with pytest.raises(InvalidRequest) as exc:
            await hub.accept_chat(
                "t", "hub-b", "lead", "x", reply_service="hub-b", reply_token="tok",
                chain=chain,
            )  # fmt: skip
        assert exc.value.status == 422
        assert exc.value.details["field"] == field
        assert await hub.list_delegations("t") == []


@pytest.mark.parametrize("budget", ["chain", "pair"])
async def test_a_task_refused_for_a_spent_budget_is_not_retried(
    scripted: Callable[..., Scripted], budget: str
) -> None:
    """A chain does not reset with time, nor a pair within the retries: the other hub's
    429 for either fails the delegation at once (a 429 for anything else is retried)."""
    srv = scripted(lambda path, body, n: (429, 0))
    srv.body = json.dumps(
        {"error": {"code": "budget_exhausted", "message": "not sent", "budget": budget}}
    ).encode()
    cfg = CallbackConfig(secret=SECRET, services={"hub-b": Service("hub-b", srv.url)}, retry=FAST)
    hub = Hub(MemoryStore(), callbacks=cfg)
    await hub.start()
    try:
        await _team(hub)
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate("t", "lead", "lead-s", "worker@hub-b", "x", tool_use_id="tu_s")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")

        async def failed() -> bool:
            got = await hub.get_delegation("t", d.delegation_id)
            return got.state is DelegationState.FAILED

        await eventually(failed, what="the delegation to fail")
        assert len(srv.requests) == 1
        got = await hub.get_delegation("t", d.delegation_id)
        assert got.error is not None and "budget_exhausted" in got.error
    finally:
        await hub.close()


async def test_a_task_for_an_a2a_agent_past_the_chain_budget_is_refused(
    clock: FakeClock,
) -> None:
    services = {
        "hub-b": Service("hub-b", "http://127.0.0.1:9"),
        "agents": Service("agents", "http://127.0.0.1:9/a2a/t/{agent}", kind="a2a"),
    }
    cfg = CallbackConfig(secret=SECRET, services=services, retry=FAST)
    async with Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg) as hub:
        await _chain_team(hub, chain_budget=3)
        sub = await _task_from_hub_b(hub, "tu_b", {"id": "c-4", "hop": 3})
        with pytest.raises(BudgetExhausted) as exc:
            await hub.delegate("t", "lead", sub, "helper@agents", "on", tool_use_id="tu_a")
        assert exc.value.details["key"] == "chain:c-4"
        assert "tu_a" not in {d.tool_use_id for d in await hub.list_delegations("t")}


async def test_the_callee_session_of_the_longest_ids_is_a_session_id_the_callee_can_name(
    hub: Hub,
) -> None:
    """A caller session of 200 characters and a tool_use_id of 128 made a callee session
    of 330: the callee could not name it (``session=`` takes 200 at most), so the task
    waited in a session its agent could not receive from. Each request still gets a
    session of its own."""
    await _team(hub)
    caller = "s" * 200
    await hub.open_session("t", "lead", caller)
    await hub.report_event("t", "lead", caller, "turn_start")
    ids = ["a" * 128, "a" * 127 + "b"]
    made = [
        await hub.delegate("t", "lead", caller, "counter", f"task {i}", tool_use_id=tuid)
        for i, tuid in enumerate(ids)
    ]
    sessions = [d.callee_session for d in made]
    assert len(set(sessions)) == 2
    for i, s in enumerate(sessions):
        assert s is not None and len(s) <= 200
        [task] = await hub.receive("t", "counter", session=s)
        assert task.message.text == f"task {i}"


def test_an_unknown_service_is_named_in_sentences_with_when_the_registry_is_read() -> None:
    """A newcomer who adds a service to config.yaml while the hub runs meets this refusal:
    it says the registry is read when the hub starts, which is the way out."""
    empty = CallbackConfig()
    with pytest.raises(UnknownService) as exc:
        empty.resolve("weather")
    assert exc.value.message == (
        "unknown callback service 'weather'. Known services: none are registered. The "
        "operator registers services in BACKCHANNEL_CALLBACKS or the config file, which "
        "the hub reads when it starts (restart it after a change)."
    )
    one = CallbackConfig(services={"weather": Service("weather", "http://127.0.0.1:9")})
    with pytest.raises(UnknownService) as exc:
        one.resolve("wether")
    assert exc.value.message.startswith(
        "unknown callback service 'wether'; did you mean 'weather'? Known services: weather."
    )
