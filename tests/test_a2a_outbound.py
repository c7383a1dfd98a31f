"""Delegating to an A2A agent: a hub calls a small a2a-sdk server started by the test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a.server.routes")

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as rules
from backchannel.errors import InvalidRequest, UnknownService
from backchannel.hub import Hub
from backchannel.testing import FakeClock, MemoryStore, eventually, eventually_blocking
from backchannel.types import DelegationState, MessageKind
from tests.conftest import Server, free_port, start_server
from tests.test_delegation_http import (
    _member,
    _pass_on,
    ask_again_to_the_budget,
    first_delegation,
    ring_to_the_budget,
)


class Forecaster(AgentExecutor):
    """Answers "forecast for X" with "sunny in X", once the test releases it; "fail" fails."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.seen: list[tuple[str, str]] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id
        assert context.context_id
        assert context.message is not None
        text = context.get_user_input()
        self.seen.append((context.message.message_id, text))
        await event_queue.enqueue_event(
            Task(
                id=context.task_id,
                context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message],
            )
        )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        if "slow" in text:
            await asyncio.to_thread(self.release.wait, 30)
        if "fail" in text:
            msg = updater.new_agent_message([Part(text="no data for that place")])
            await updater.failed(msg)
            return
        await updater.add_artifact([Part(text=f"sunny in {text.split()[-1]}")], name="forecast")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


class Recorder:
    """Records each request's credentials; answers the next ``fail_posts`` POSTs 503, as
    an agent behind a proxy that restarts would."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.auth: list[str] = []
        self.fail_posts = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.auth.append(headers.get(b"authorization", b"").decode())
            if scope["method"] == "POST" and self.fail_posts > 0:
                self.fail_posts -= 1
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b"restarting"})
                return
        await self.app(scope, receive, send)


class Peer:
    def __init__(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        card = AgentCard(
            name="forecaster",
            description="weather",
            version="1.0.0",
            supported_interfaces=[
                AgentInterface(
                    url=f"{self.url}/", protocol_binding="JSONRPC", protocol_version="1.0"
                ),
            ],
            skills=[AgentSkill(id="forecast", name="forecast", description="weather", tags=["w"])],
            capabilities=AgentCapabilities(streaming=True),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
        )
        self.agent = Forecaster()
        handler = DefaultRequestHandler(
            agent_executor=self.agent, task_store=InMemoryTaskStore(), agent_card=card
        )
        app = Starlette(
            routes=[
                *create_agent_card_routes(card),
                *create_jsonrpc_routes(handler, "/"),
                *create_rest_routes(handler),
            ]
        )
        self.app = Recorder(app)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        eventually_blocking(lambda: self.server.started, what="the A2A test server to start")

    def close(self) -> None:
        self.agent.release.set()
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


FAST = rules.RetryPolicy(start=0.05, factor=2, cap=0.2, budget=5, timeout=5)


async def _hub(clock: FakeClock, url: str) -> Hub:
    cfg = CallbackConfig(
        services={"weather": Service("weather", url, "tok-weather", "a2a")}, retry=FAST
    )
    hub = Hub(MemoryStore(), clock=clock, background=False, callbacks=cfg)
    await hub.start()
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "lead")
    await hub.open_session("t", "lead", "lead-s")
    return hub


async def _results(hub: Hub) -> list[Any]:
    got = await hub.receive("t", "lead", session="lead-s", limit=10)
    if got:
        await hub.ack("t", "lead", [g.message.message_id for g in got])
    return [g.message for g in got if g.message.kind is MessageKind.TOOL_RESULT]


async def test_delegate_to_an_a2a_agent_answer_timeout_late(peer: Peer) -> None:
    clock = FakeClock()
    hub = await _hub(clock, peer.url)
    try:
        # an answer in time is the caller's tool result
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate(
            "t", "lead", "lead-s", "forecaster@weather", "forecast for Oslo", tool_use_id="tu_1"
        )
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        await hub.maintain()  # the outbox makes the call
        [result] = await eventually(lambda: _results(hub), what="the tool result", within=20)
        assert result.text == "Result of delegate(to='forecaster@weather') [tu_1]:\nsunny in Oslo"
        assert peer.agent.seen == [(d.delegation_id, "forecast for Oslo")]
        assert set(peer.app.auth) == {"Bearer tok-weather"}  # the registered token

        # past the deadline: a synthesized error, then the late answer
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate(
            "t",
            "lead",
            "lead-s",
            "forecaster@weather",
            "slow forecast for Rome",
            timeout_s=30,
            tool_use_id="tu_2",
        )
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        await hub.maintain()
        await eventually(
            lambda: _seen(peer, "slow forecast for Rome"), what="the slow request", within=20
        )
        clock.advance(31)
        await hub.maintain()
        [timeout] = await eventually(lambda: _results(hub), what="the time-out result", within=20)
        [r] = timeout.meta["results"]
        assert (r["reason"], r["tool_use_id"]) == ("timeout", "tu_2")
        peer.agent.release.set()
        [late] = await eventually(lambda: _results(hub), what="the late answer", within=20)
        assert late.meta["late"] is True
        assert late.text.startswith("Late result of delegate(to='forecaster@weather') [tu_2]")
        assert "sunny in Rome" in late.text
        states = {x.tool_use_id: x.state for x in await hub.list_delegations("t")}
        assert states == {"tu_1": DelegationState.ANSWERED, "tu_2": DelegationState.LATE}

        # a failed task fails the delegation with the agent's words
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate(
            "t", "lead", "lead-s", "forecaster@weather", "fail for Atlantis", tool_use_id="tu_3"
        )
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        await hub.maintain()
        [failed] = await eventually(lambda: _results(hub), what="the failed result", within=20)
        [r] = failed.meta["results"]
        assert "failed: no data for that place" in r["error"]
        # the agent took the task and failed it: its end, not a refusal of either hub
        assert r["error"].startswith("the A2A agent's task ended failed"), r["error"]
        assert "refused" not in r["error"], r["error"]
    finally:
        await hub.close()


async def _seen(peer: Peer, text: str) -> bool:
    return any(t == text for _, t in peer.agent.seen)


async def test_an_a2a_task_that_never_ends_is_not_followed_forever(peer: Peer) -> None:
    """An agent whose task stays working is polled until its answer could no longer be
    taken as a late result (the deadline and the token's grace), then given up on."""
    from backchannel.a2a_peer import GIVE_UP_AFTER
    from backchannel.hub.outbox import OUTBOX_JOB

    clock = FakeClock()
    hub = await _hub(clock, peer.url)
    try:
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate(
            "t", "lead", "lead-s", "forecaster@weather", "slow forecast for Lima", timeout_s=30
        )
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        await hub.maintain()
        await eventually(
            lambda: _seen(peer, "slow forecast for Lima"), what="the slow request", within=20
        )
        clock.advance(30 + GIVE_UP_AFTER + 1)

        async def given_up() -> str | None:
            jobs = await hub.store.read(
                lambda tx: tx.list_jobs("t", kind=OUTBOX_JOB, pending_only=False)
            )
            [job] = jobs
            return str(job.payload.get("last")) if job.state.value != "pending" else None

        last = await eventually(given_up, what="the call to be given up", within=20)
        assert "no answer long after the deadline" in last, last
        # the caller's record says the agent took the task and never finished it, not
        # that a hub refused it
        [d] = await hub.list_delegations("t")
        assert d.error is not None and d.error.startswith("no answer long after"), d.error
        assert "refused" not in d.error and "took the task" in d.error, d.error
    finally:
        await hub.close()


async def test_a_fault_late_in_a_long_a2a_task_is_retried_not_fatal(peer: Peer) -> None:
    """The retry budget is for failures in a row, not for the task's whole run: a poll
    that fails once after the agent worked longer than the budget is tried again, and the
    answer still arrives."""
    clock = FakeClock()
    hub = await _hub(clock, peer.url)
    try:
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate(
            "t",
            "lead",
            "lead-s",
            "forecaster@weather",
            "slow forecast for Rome",
            timeout_s=600,
            tool_use_id="tu_long",
        )
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        await hub.maintain()
        await eventually(
            lambda: _seen(peer, "slow forecast for Rome"), what="the slow request", within=20
        )
        from backchannel.hub.outbox import OUTBOX_JOB

        async def task_in_hand() -> bool:  # the send answered: the hub follows the task
            jobs = await hub.store.read(lambda tx: tx.list_jobs("t", kind=OUTBOX_JOB))
            return any(j.payload.get("a2a_task") for j in jobs)

        await eventually(task_in_hand, what="the hub to follow the task", within=20)
        # the agent works past the retry budget, within the job's lease (the retry
        # policy's timeout + 5 s): a clock moved past the lease would start the job again
        # beside the one following the task, and that one would send the message anew
        clock.advance(FAST.budget * 1.5)
        peer.app.fail_posts = 1  # its next poll meets a 503

        async def retried_or_over() -> bool:
            await hub.maintain()
            current = await hub.get_delegation("t", d.delegation_id)
            if current.state is not DelegationState.PENDING:
                return True
            jobs = await hub.store.read(lambda tx: tx.list_jobs("t", kind=OUTBOX_JOB))
            return peer.app.fail_posts == 0 and any(j.payload.get("attempt") for j in jobs)

        await eventually(retried_or_over, what="the failed poll to be judged", within=20)
        current = await hub.get_delegation("t", d.delegation_id)
        assert current.state is DelegationState.PENDING, current.error
        peer.agent.release.set()

        async def answered() -> list[Any] | None:
            clock.advance(1)
            await hub.maintain()  # the retry, when due
            return await _results(hub) or None

        [result] = await eventually(answered, what="the answer after the retry", within=30)
        assert result.text.endswith("sunny in Rome"), result.text
        assert [t for _, t in peer.agent.seen] == ["slow forecast for Rome"], "sent once"
    finally:
        await hub.close()


async def test_a2a_services_need_no_callback_secret_and_refuse_foreign_cards() -> None:
    from backchannel.a2a_peer import _Final, check_card

    card = AgentCard(
        supported_interfaces=[AgentInterface(url="http://10.9.9.9:80/", protocol_binding="JSONRPC")]
    )
    with pytest.raises(_Final, match="outside the registered service"):
        check_card(card, "http://127.0.0.1:9999")


def test_config_yaml_declares_a2a_services(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "callbacks:\n"
        "  weather: {type: a2a, url: 'http://127.0.0.1:9999'}\n"
        "  ops: {type: a2a, url: 'http://127.0.0.1:8765/a2a/ops/{agent}', token: bc_x}\n"
        "  hub-b: {url: 'http://127.0.0.1:8766'}\n"
    )
    cfg = CallbackConfig.load(tmp_path, env={})
    assert cfg.secret is None  # A2A services need no callback secret
    weather, ops = cfg.resolve("weather"), cfg.resolve("ops")
    assert (weather.kind, weather.agent_url("forecaster")) == ("a2a", "http://127.0.0.1:9999")
    assert (ops.kind, ops.agent_url("deployer"), ops.token) == (
        "a2a",
        "http://127.0.0.1:8765/a2a/ops/deployer",
        "bc_x",
    )
    assert cfg.resolve("hub-b").kind == "backchannel"
    (tmp_path / "config.yaml").write_text("callbacks:\n  x: {type: grpc, url: 'http://h'}\n")
    with pytest.raises(InvalidRequest, match="unknown type 'grpc'; use one of backchannel, a2a"):
        CallbackConfig.load(tmp_path, env={})


async def test_a_hub_without_a_secret_delegates_to_an_a2a_service(peer: Peer) -> None:
    hub = await _hub(FakeClock(), peer.url)
    try:
        assert hub.callbacks.secret is None
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate("t", "lead", "lead-s", "forecaster@weather", "forecast for Kyiv")
        assert d.state is DelegationState.PENDING
        with pytest.raises(UnknownService, match="unknown callback service 'wether'"):
            await hub.delegate("t", "lead", "lead-s", "forecaster@wether", "forecast")
    finally:
        await hub.close()


# -- two hubs whose agents delegate to each other over A2A ---------------------------------


def _a2a_registry(home: Path, other: str, other_url: str, team: str) -> None:
    """Hub ``home`` knows ``other`` as an A2A service: the members of ``team`` there."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(
        f"callbacks:\n  {other}: {{type: a2a, url: '{other_url}/a2a/{team}/{{agent}}'}}\n"
    )


def _start_hubs_over_a2a(
    tmp_path: Path,
    chain_budget: int,
    chain_budget_b: int | None = None,
    pair_budget: int | None = None,
) -> tuple[Server, Server, dict[str, str]]:
    """``lead`` on hub A (team ``leads``) and ``worker`` on hub B (team ``workers``), each
    hub an A2A service of the other, calling with its member token there. Hub A starts
    again once hub B's token for it exists. ``chain_budget_b``: hub B's team's own chain
    budget, when it is not hub A's."""
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    settings: dict[str, Any] = {"anchor_policy": "off", "chain_budget": chain_budget}
    if pair_budget is not None:
        settings["pair_budget"] = pair_budget
    settings_b = {**settings, "chain_budget": chain_budget_b or chain_budget}
    _a2a_registry(tmp_path / "a", "hub-b", url_b, "workers")
    _a2a_registry(tmp_path / "b", "hub-a", url_a, "leads")
    hub_a = start_server(tmp_path / "a", port=port_a, env={"BACKCHANNEL_SERVICE_NAME": "hub-a"})
    with hub_a.client() as admin:
        made = admin.post("/v1/teams", json={"name": "leads", "settings": settings}).json()
        tokens = {"user_a": made["user_token"], "lead": _member(admin, "leads", "lead")}
        b_on_a = _member(admin, "leads", "hub-b")
    hub_b = start_server(
        tmp_path / "b",
        port=port_b,
        env={"BACKCHANNEL_SERVICE_NAME": "hub-b", "BACKCHANNEL_CALLBACK_TOKENS": f"hub-a={b_on_a}"},
    )
    with hub_b.client() as admin:
        made = admin.post("/v1/teams", json={"name": "workers", "settings": settings_b}).json()
        tokens["user_b"] = made["user_token"]
        tokens["worker"] = _member(admin, "workers", "worker")
        tokens["a_on_b"] = _member(admin, "workers", "hub-a")
    hub_a.stop()  # again, now with its token on hub B
    hub_a = start_server(
        tmp_path / "a",
        port=port_a,
        env={
            "BACKCHANNEL_SERVICE_NAME": "hub-a",
            "BACKCHANNEL_CALLBACK_TOKENS": f"hub-b={tokens['a_on_b']}",
        },
    )
    return hub_a, hub_b, tokens


@pytest.mark.slow
def test_agents_of_two_hubs_that_always_delegate_over_a2a_stop_at_the_chain_budget(
    tmp_path: Path,
) -> None:
    """lead (hub A) delegates to worker (hub B) over A2A, whose turn on the task delegates
    back to lead over A2A, and so on: each A2A message names its chain, one hop further,
    until the delegation past chain_budget is refused like a send of its own hub. A
    message that names the spent chain at hop 0 does not start it again."""
    budget = 4
    hub_a, hub_b, tokens = _start_hubs_over_a2a(tmp_path, budget)
    try:
        with ring_to_the_budget(hub_a, hub_b, tokens, budget) as ring:
            lead, worker, start = ring.lead, ring.worker, ring.start
            # every task sent was answered over A2A (none was lost on the way)

            def all_answered() -> list[dict[str, Any]] | None:
                ds: list[dict[str, Any]] = lead.get("/v1/delegations").json()["delegations"]
                return ds if all(d["state"] == "answered" for d in ds) else None

            answered = eventually_blocking(
                all_answered, what="hub A's delegations to be answered", within=30
            )
            assert len(answered) == budget // 2
            # the spent chain named again at hop 0, as hub A's member on hub B: the task
            # goes on at the budget, and the worker's turn on it can delegate no further
            forged = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {
                    "message": {
                        "messageId": "m-forged",
                        "role": "ROLE_USER",
                        "parts": [{"text": "start over"}],
                        "metadata": {"backchannel.chain": {"id": start["message_id"], "hop": 0}},
                    },
                    "configuration": {"returnImmediately": True},
                },
            }
            r = httpx.post(
                f"{hub_b.url}/a2a/workers/worker/",
                json=forged,
                headers={"Authorization": f"Bearer {tokens['a_on_b']}", "A2A-Version": "1.0"},
                timeout=30,
            )
            assert "result" in r.json(), r.text
            task, again = _pass_on(worker, "worker", "lead@hub-a", 99)
            assert task["text"].endswith("start over")
            assert (task["chain_id"], task["hop"]) == (start["message_id"], budget)
            assert again.status_code == 429, again.text
            assert again.json()["error"]["key"] == f"chain:{start['message_id']}"
    finally:
        hub_a.stop()
        hub_b.stop()


@pytest.mark.slow
def test_a_lead_that_asks_over_a2a_again_on_every_answer_stops_at_the_chain_budget(
    tmp_path: Path,
) -> None:
    """The A2A answer names the chain it goes on in (``backchannel.chain`` in its
    metadata): lead's next task goes on from there instead of leaving at the same hop."""
    budget = 5
    hub_a, hub_b, tokens = _start_hubs_over_a2a(tmp_path, budget)
    try:
        ask_again_to_the_budget(hub_a, hub_b, tokens, budget)
    finally:
        hub_a.stop()
        hub_b.stop()


@pytest.mark.slow
def test_a_task_past_the_callee_hubs_chain_budget_over_a2a_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """Hub B's team keeps a smaller chain budget than hub A's: the task hub A lets through
    arrives past hub B's budget and is refused there. The refusal opens no session for the
    worker and hands it nothing (the task is rejected), and hub A's caller hears the
    refusal, naming the chain budget and the way out, as the delegation's error."""
    hub_a, hub_b, tokens = _start_hubs_over_a2a(tmp_path, 8, chain_budget_b=2)
    try:
        with (
            hub_a.client(tokens["lead"]) as lead,
            hub_b.client(tokens["worker"]) as worker,
            hub_a.client(tokens["user_a"]) as user_a,
        ):
            start = first_delegation(lead, user_a)
            # hop 1 on hub B, hop 2 (hub B's budget, spent there) back on hub A
            task, r = _pass_on(worker, "worker", "lead@hub-a", 1)
            assert (task["chain_id"], task["hop"], r.status_code) == (start["message_id"], 1, 201)
            before = {s["session_id"] for s in worker.get("/v1/sessions").json()["sessions"]}
            # hop 3: under hub A's budget, past hub B's
            task, r = _pass_on(lead, "lead", "worker@hub-b", 2)
            assert (task["hop"], r.status_code) == (2, 201), r.text

            def failed() -> dict[str, Any] | None:
                ds = lead.get("/v1/delegations").json()["delegations"]
                d = next(x for x in ds if x["tool_use_id"] == "tu_2")
                return d if d["state"] == "failed" else None

            d = eventually_blocking(failed, what="the refused delegation to fail", within=30)
            assert "not sent: this conversation chain" in d["error"], d
            assert "chain_budget" in d["error"], d
            # hub B rejected the task (A2A's refusal), and the way out came along
            assert "the A2A agent rejected the task: not sent" in d["error"], d
            key = f"chain:{start['message_id']}"
            assert f"backchannel budget extend workers {key} --by N" in d["error"], d

            def told() -> str | None:
                for s in lead.get("/v1/sessions").json()["sessions"]:
                    params = {"session": s["session_id"], "limit": 20}
                    for m in lead.get("/v1/inbox", params=params).json()["messages"]:
                        if m["kind"] == "tool_result" and "tu_2" in m["text"]:
                            return str(m["text"])
                return None

            # the caller hears a refusal, not a failure
            result = eventually_blocking(told, what="lead's tool result", within=30)
            assert "ERROR (refused): the callee's hub refused the task" in result, result
            # hub B: no session was opened for the refused task, nothing was handed over
            after = {s["session_id"] for s in worker.get("/v1/sessions").json()["sessions"]}
            assert after == before, after - before
            got = worker.get("/v1/inbox", params={"limit": 20}).json()["messages"]
            assert [m for m in got if m["kind"] == "delegation"] == []
    finally:
        hub_a.stop()
        hub_b.stop()


async def test_a_service_dropped_from_the_registry_is_not_told_as_the_callees_refusal(
    peer: Peer,
) -> None:
    """The registry lost the callee's service between the delegation and the turn's
    end: this hub did not send the task, and says so, naming the service, instead of
    quoting its own registry as the other hub's refusal."""
    hub = await _hub(FakeClock(), peer.url)
    try:
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate(
            "t", "lead", "lead-s", "forecaster@weather", "forecast for Bern", tool_use_id="tu_1"
        )
        del hub.callbacks.services["weather"]  # the operator's registry changed since
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        [failed] = await eventually(lambda: _results(hub), what="the failed result", within=20)
        [r] = failed.meta["results"]
        assert r["error"].startswith("this hub did not send the task:"), r["error"]
        assert "'weather'" in r["error"], r["error"]
        assert "refused the task" not in r["error"], r["error"]
        assert peer.agent.seen == [], "nothing was sent"
    finally:
        await hub.close()


async def test_a2a_sdk_missing_on_this_hub_is_not_told_as_the_agents_refusal(
    peer: Peer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This hub cannot speak A2A (the extra is not installed where it runs): the task
    fails naming what to install and where, not as the agent's refusal."""
    import sys

    hub = await _hub(FakeClock(), peer.url)
    try:
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.delegate(
            "t", "lead", "lead-s", "forecaster@weather", "forecast for Turin", tool_use_id="tu_1"
        )
        monkeypatch.setitem(sys.modules, "a2a.client", None)  # as if a2a-sdk were absent
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        await hub.maintain()  # the outbox makes the call
        [failed] = await eventually(lambda: _results(hub), what="the failed result", within=20)
        [r] = failed.meta["results"]
        assert r["error"].startswith("this hub did not send the task:"), r["error"]
        assert "pip install 'backchannel[a2a]'" in r["error"], r["error"]
        assert "refused" not in r["error"], r["error"]
        assert peer.agent.seen == [], "nothing was sent"
    finally:
        await hub.close()
