"""The built-in runner driving a model through the providers' SDKs, against a local
server that speaks their wire formats (``tests.test_providers.FakeProvider``): what a
model's odd answers do to the turn loop."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from backchannel.client import Client, attach
from backchannel.hub import Hub
from backchannel.runner.command import run_team
from backchannel.runner.host import Runner
from backchannel.runner.teamfile import TeamFile, parse_team
from backchannel.testing import MemoryStore, eventually
from tests.conftest import BIN, Server
from tests.test_providers import DROP, Answer, FakeProvider, provider

__all__ = ["provider"]  # the fixture, used here too


def _chat(content: str | None, calls: Sequence[tuple[str, str, str]] = ()) -> dict[str, Any]:
    """A Chat Completions answer: ``content``, and tool calls as (id, name, arguments)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


async def _openai_team(url: str, extra: str = "", helper: str = "") -> tuple[Hub, Runner, Client]:
    team = parse_team(
        "team: t\nmembers:\n"
        f"  - {{name: w, model: openai, model_name: m, base_url: '{url}/v1'{extra}}}\n" + helper
    )
    hub = Hub(MemoryStore())
    await hub.start()
    await hub.create_team("t", settings=team.settings())
    clients = {}
    for m in team.members:
        _, token = await hub.add_member("t", m.name)
        clients[m.name] = attach(hub, token)
        await clients[m.name].start()
    user = attach(hub, (await hub.add_member("t", "boss", "human"))[1])
    await user.start()
    runner = Runner(team, clients, workspace=Path("."), quiet_seconds=0.5, timeout=30)
    return hub, runner, user


def _tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


async def test_tool_call_arguments_that_are_not_json_are_named_so_to_the_model(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """A model that writes broken JSON for a tool's arguments hears that, not that an
    argument is missing (which would send it looking for the wrong mistake)."""
    cut = '{"to": "boss", "message": "hi'
    srv = provider(
        lambda body, n: (
            (200, _chat(None, [("call_1", "send_message", cut)]), {})
            if n == 1
            else (200, _chat("done"), {})
        )
    )
    hub, runner, user = await _openai_team(srv.url)
    try:
        await runner.run("say hi to boss", user)
        [result] = _tool_results(srv.requests[1][1])
        assert "not valid JSON" in result, result
        assert cut in result
        # the call goes back to the model as it wrote it
        [call] = [m for m in srv.requests[1][1]["messages"] if m.get("tool_calls")]
        assert call["tool_calls"][0]["function"]["arguments"] == cut
    finally:
        await hub.close()


async def test_a_call_to_an_unknown_tool_is_answered_as_an_error(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    srv = provider(
        lambda body, n: (
            (200, _chat(None, [("call_1", "rm_rf", json.dumps({"path": "/"}))]), {})
            if n == 1
            else (200, _chat("done"), {})
        )
    )
    hub, runner, user = await _openai_team(srv.url)
    try:
        await runner.run("clean up", user)
        [result] = _tool_results(srv.requests[1][1])
        assert result.startswith("unknown tool 'rm_rf'; available: ")
        assert len(srv.requests) == 2
    finally:
        await hub.close()


OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def _anthropic_text(text: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


@contextlib.asynccontextmanager
async def _anthropic_worker(url: str) -> AsyncIterator[tuple[TeamFile, Hub, Client, Client]]:
    """A team of one runner agent, ``w``, on an Anthropic API at ``url``, and its human."""
    team = parse_team(
        "team: t\nmembers:\n"
        f"  - {{name: w, model: anthropic, model_name: claude-sonnet-5-5, base_url: '{url}'}}\n"
    )
    hub = Hub(MemoryStore())
    await hub.start()
    try:
        await hub.create_team("t", settings=team.settings())
        worker = attach(hub, (await hub.add_member("t", "w"))[1])
        user = attach(hub, (await hub.add_member("t", "boss", "human"))[1])
        await worker.start()
        await user.start()
        yield team, hub, worker, user
    finally:
        await hub.close()


async def test_an_overloaded_model_api_that_recovers_does_not_stop_the_agent(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """529 (overloaded) seven times, then answers: the turn waits for the API and goes
    on, its input handed to the model once, and the agent does not stop."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(
        lambda body, n: (
            (529, OVERLOADED, {"retry-after-ms": "10"})
            if n <= 7
            else (200, _anthropic_text("done at last"), {})
        )
    )
    async with _anthropic_worker(srv.url) as (team, hub, worker, user):
        runner = Runner(
            team,
            {"w": worker},
            workspace=Path("."),
            quiet_seconds=0.5,
            timeout=60,
            model_pause=0.01,
        )
        assert await runner.run("do it", user) == "the team is quiet"
        loop = runner.loops["w-main"]
        assert loop.stats.stopped is None, loop.stats.stopped
        assert loop.stats.last_output == "done at last"
        assert loop.stats.turns == 1
        assert len(srv.requests) == 8
        assert await hub.pending("t", "w") == 0


async def test_a_model_api_overloaded_past_the_runners_patience_gives_the_input_back(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(lambda body, n: (529, OVERLOADED, {"retry-after-ms": "10"}))
    async with _anthropic_worker(srv.url) as (team, hub, worker, user):
        runner = Runner(
            team,
            {"w": worker},
            workspace=Path("."),
            quiet_seconds=0.5,
            timeout=60,
            model_patience=1.5,
            model_pause=0.5,
        )
        assert await runner.run("do it", user) == "every agent stopped"
        assert runner.loops["w-main"].stats.stopped == "model error"
        assert len(srv.requests) > 1, "tried again"
        got = await hub.receive("t", "w", session="w-main")
        assert [g.message.text for g in got] == ["do it"], "given back, not lost"


def _anthropic_cut_tool_use(message: str, stop: str = "max_tokens") -> dict[str, Any]:
    """An answer cut (at ``max_tokens``, or by the API's ``refusal``) in the middle of a
    ``send_message`` call: the tool_use block holds only what came before the cut."""
    return {
        **_anthropic_text("Sending the report."),
        "content": [
            {"type": "text", "text": "Sending the report."},
            {
                "type": "tool_use",
                "id": "toolu_cut",
                "name": "send_message",
                "input": {"to": "boss", "message": message},
            },
        ],
        "stop_reason": stop,
    }


@pytest.mark.parametrize("stop", ["max_tokens", "refusal", "model_context_window_exceeded"])
async def test_a_tool_call_cut_at_max_tokens_is_not_run(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """An answer cut short by the output limit (or stopped by the API's safety filter,
    ``refusal``, or at the model's context window, ``model_context_window_exceeded``)
    may end in a tool call the model had not finished writing: run, it would send the
    first half of a message as if it were the whole. It is not run; the model hears
    why, and writes it again."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(
        lambda body, n: (
            (200, _anthropic_cut_tool_use("The survey found three probl", stop), {})
            if n == 1
            else (200, _anthropic_text("done"), {})
        )
    )
    async with _anthropic_worker(srv.url) as (team, hub, worker, user):
        runner = Runner(team, {"w": worker}, workspace=Path("."), quiet_seconds=0.5, timeout=30)
        assert await runner.run("report to boss", user) == "the team is quiet"
        assert await user.receive(limit=10) == [], "no half a message sent"
        assert await hub.pending("t", "w") == 0
        assert len(srv.requests) == 2
        [result] = [
            b
            for m in srv.requests[1][1]["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_result"
        ]
        assert result["tool_use_id"] == "toolu_cut"
        assert result["is_error"] is True
        assert f"({stop})" in result["content"], result


RATE_LIMITED = {"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}}


async def _one_agent(kind: str, url: str) -> tuple[Hub, Runner, Client]:
    """A team of one runner agent, ``w``, on the ``kind`` provider's API at ``url``
    (Anthropic's key from the test's environment)."""
    if kind == "openai":
        return await _openai_team(url)
    team = parse_team(
        "team: t\nmembers:\n"
        f"  - {{name: w, model: anthropic, model_name: claude-sonnet-5-5, base_url: '{url}'}}\n"
    )
    hub = Hub(MemoryStore())
    await hub.start()
    await hub.create_team("t", settings=team.settings())
    worker = attach(hub, (await hub.add_member("t", "w"))[1])
    user = attach(hub, (await hub.add_member("t", "boss", "human"))[1])
    await worker.start()
    await user.start()
    runner = Runner(team, {"w": worker}, workspace=Path("."), quiet_seconds=0.5, timeout=30)
    return hub, runner, user


def _text_answer(kind: str, text: str) -> dict[str, Any]:
    return _chat(text) if kind == "openai" else _anthropic_text(text)


def _busy_answer(kind: str) -> dict[str, Any]:
    return {"error": {"message": "overloaded"}} if kind == "openai" else OVERLOADED


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_the_runner_not_the_sdk_tries_again_what_passes(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """An overloaded API (529, 503), a connection closed with no answer, and a 500: the
    runner makes every try itself, each one named in its note with the wait before the
    next (none hidden inside the SDK, whose own tries would follow the SDK's rules, not
    the runner's patience), and the input reaches the model once, in the answered call."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    busy = 529 if kind == "anthropic" else 503
    script: dict[int, tuple[int, dict[str, Any], dict[str, str]]] = {
        1: (busy, _busy_answer(kind), {}),
        2: (DROP, {}, {}),
        3: (500, _busy_answer(kind), {"retry-after-ms": "10"}),
    }
    srv = provider(lambda body, n: script.get(n, (200, _text_answer(kind, "done"), {})))
    hub, runner, user = await _one_agent(kind, srv.url)
    notes: list[str] = []
    runner._note = notes.append
    runner.model_pause = 0.01
    try:
        assert await runner.run("do it", user) == "the team is quiet"
        assert len(srv.requests) == 4
        assert len([n for n in notes if "trying again in" in n]) == 3, notes
        loop = runner.loops["w-main"]
        assert (loop.stats.stopped, loop.stats.turns, loop.stats.last_output) == (None, 1, "done")
        assert json.dumps(srv.requests[-1][1]["messages"]).count("do it") == 1
        assert await hub.pending("t", "w") == 0
    finally:
        await hub.close()


def _error_in_a_200(kind: str) -> dict[str, Any]:
    """A 200 whose body is an error that passes: what OpenRouter sends when the model
    failed after it took the request (``error.code`` 502), and a proxy in front of the
    Messages API its ``overloaded_error``."""
    if kind == "openai":
        return {"error": {"code": 502, "message": "Provider returned error"}}
    return {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_an_error_that_passes_in_a_200_is_tried_again(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A router that took the request answers 200 when the model fails after it (its
    status is sent by then), the error in the body. It was taken for no answer of the
    API at all, with a hint to check base_url, and the agent stopped on an error that
    passes. It is the API's error: one that passes is tried again, as a 502 is, and an
    error that does not is told as the API's, not as a proxy page."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(
        lambda body, n: (
            (200, _error_in_a_200(kind), {}) if n == 1 else (200, _text_answer(kind, "done"), {})
        )
    )
    hub, runner, user = await _one_agent(kind, srv.url)
    notes: list[str] = []
    runner._note = notes.append
    runner.model_pause = 0.01
    try:
        assert await runner.run("do it", user) == "the team is quiet"
        loop = runner.loops["w-main"]
        assert (loop.stats.stopped, loop.stats.last_output) == (None, "done")
        assert len(srv.requests) == 2
        [tried] = [n for n in notes if "trying again in" in n]
        assert ("Provider returned error" if kind == "openai" else "Overloaded") in tried, tried
        assert "base_url" not in tried, tried
    finally:
        await hub.close()


async def test_an_error_that_does_not_pass_in_a_200_is_the_apis_error(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    srv = provider(lambda body, n: (200, {"error": {"code": 400, "message": "bad tools"}}, {}))
    hub, runner, user = await _one_agent("openai", srv.url)
    try:
        assert await runner.run("do it", user) == "every agent stopped"
        assert len(srv.requests) == 1
        failure = runner.loops["w-main"].stats.failure
        assert "bad tools" in failure and "base_url" not in failure, failure
    finally:
        await hub.close()


@pytest.mark.parametrize(("kind", "wait"), [("anthropic", 3600), ("openai", 60)])
async def test_a_rate_limit_longer_than_the_runners_patience_is_not_hammered(
    provider: Callable[[Answer], FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    wait: int,
) -> None:
    """A 429 that asks for a wait past the runner's patience: no call is made before it
    (a call made sooner is refused again and may count against the limit), nor does
    the SDK sit out the wait inside one call (Anthropic's waits whatever it is, OpenAI's
    up to two minutes a try), which would hold the turn past the runner's patience. The
    runner gives the input back at once, and its note says how long the API asked."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(lambda body, n: (429, RATE_LIMITED, {"retry-after": str(wait)}))
    hub, runner, user = await _one_agent(kind, srv.url)
    notes: list[str] = []
    runner.model_patience, runner.model_pause, runner.timeout = 5.0, 0.05, 10.0
    runner._note = notes.append
    try:
        assert await runner.run("do it", user) == "every agent stopped"
        assert len(srv.requests) == 1, "called again before the API's retry-after"
        assert runner.loops["w-main"].stats.stopped == "model error"
        assert any(f"wait {wait} s" in n for n in notes), notes
        got = await hub.receive("t", "w", session="w-main")
        assert [g.message.text for g in got] == ["do it"], "given back, not lost"
    finally:
        await hub.close()


QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}


async def test_a_rate_limit_that_is_a_spent_quota_is_not_tried_again(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """OpenAI's 429 for a spent quota (``insufficient_quota``: the plan or the billing,
    not the rate) does not pass with waiting. It was tried again for the runner's whole
    patience (five minutes by default, ten calls), a note each time saying it would try
    again, before the agent stopped. It stops at once, its note naming the API's
    reason, and its input is a dead letter its sender is told of, naming it."""
    srv = provider(lambda body, n: (429, QUOTA, {}))
    hub, runner, user = await _openai_team(srv.url)
    notes: list[str] = []
    runner._note = notes.append
    runner.model_patience, runner.model_pause = 5.0, 0.05
    try:
        assert await runner.run("do it", user) == "every agent stopped"
        assert len(srv.requests) == 1, "a spent quota was tried again"
        assert not any("trying again" in n for n in notes), notes
        loop = runner.loops["w-main"]
        assert loop.stats.stopped == "model error"
        assert "exceeded your current quota" in loop.stats.failure, loop.stats.failure
        assert await hub.pending("t", "w") == 0
        told = [g.message.text for g in await hub.receive("t", "boss")]
        assert len(told) == 1 and "was not delivered" in told[0], told
        assert "exceeded your current quota" in told[0], told
    finally:
        await hub.close()


async def test_the_runners_own_pause_honours_retry_after(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """The runner's next call waits at least as long as the API's last answer asked,
    however short the runner's own pause."""
    times: list[float] = []

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        times.append(time.monotonic())
        if n == 1:
            return 429, RATE_LIMITED, {"retry-after": "0.5"}
        return 200, _chat("done"), {}

    srv = provider(answer)
    hub, runner, user = await _openai_team(srv.url)
    runner.model_pause = 0.01
    try:
        assert await runner.run("do it", user) == "the team is quiet"
        assert len(times) == 2
        assert times[1] - times[0] >= 0.5, "the runner's call came before the retry-after"
        assert runner.loops["w-main"].stats.last_output == "done"
    finally:
        await hub.close()


def test_a_run_whose_agent_stopped_on_a_model_failure_says_so_and_fails(
    provider: Callable[[Answer], FakeProvider], tmp_path: Path
) -> None:
    """A model API that refuses for good (a model name it does not have): the task
    never reached a model. ``backchannel run`` must not end as a success with a report
    that says nothing: the report names why the session stopped, the dead letter the
    task became, and the way to have it done, and the exit status is 1."""
    missing = {"error": {"message": "model 'm' does not exist", "type": "invalid_request_error"}}
    srv = provider(lambda body, n: (404, missing, {}))
    (tmp_path / "team.yaml").write_text(
        f"team: t\nmembers:\n  - {{name: w, model: openai, model_name: m, base_url: '{srv.url}/v1'}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    home = str(tmp_path / ".backchannel")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN), *args, "--home", home],
            capture_output=True,
            text=True,
            env={**env, "COLUMNS": "200"},
            cwd=tmp_path,
            timeout=60,
        )

    assert cli("init").returncode == 0
    r = cli("run", "team.yaml", "do it", "--timeout", "30")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "ended because every agent stopped" in r.stdout
    assert "w-main stopped: model error: " in r.stdout and "does not exist" in r.stdout, r.stdout
    assert "was not delivered: w's model failed for good" in r.stdout, r.stdout
    assert "--team NEW_NAME" in r.stdout, r.stdout
    assert len(srv.requests) == 1, "a 404 is not tried again"


async def test_a_model_server_that_reuses_tool_call_ids_can_delegate_again(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """Some OpenAI-compatible servers number tool calls within each answer (Kimi K2's
    ``functions.delegate:0``), so two delegations of one session, in two answers, come
    under one id. The hub keys a delegation on its ``tool_use_id`` within the session:
    the second would be refused as a conflict (or, for the same task, answered with the
    first delegation, already over). Each delegation is its own."""
    reused = "functions.delegate:0"

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        msgs = body["messages"]
        if msgs[-1]["role"] == "tool":
            return 200, _chat("asked"), {}
        users = sum(m["role"] == "user" for m in msgs)
        if users <= 2:  # the task, then the first answer: delegate (again)
            task = json.dumps({"to": "helper", "task": f"part {users}"})
            return 200, _chat(None, [(reused, "delegate", task)]), {}
        return 200, _chat("both parts done"), {}

    srv = provider(answer)
    hub, runner, user = await _openai_team(srv.url, helper="  - {name: helper, policy: echo}\n")
    try:
        assert await runner.run("do it in two parts", user) == "the team is quiet"
        results = [r for _, body, _ in srv.requests for r in _tool_results(body)]
        assert not any("failed" in r for r in results), results
        dels = await runner.clients["w"].delegations()
        assert sorted((d["task"], d["state"]) for d in dels) == [
            ("part 1", "answered"),
            ("part 2", "answered"),
        ]
        assert runner.loops["w-main"].stats.last_output == "both parts done"
    finally:
        await hub.close()


def _call_without(field: str, kind: str, how: str) -> dict[str, Any]:
    """An answer whose one tool call (a send to ``boss``) has no ``field`` (``id`` or
    ``name``): ``how`` is ``missing`` (no field) or ``null``."""
    args = {"to": "boss", "message": "hi"}
    if kind == "openai":
        answer = _chat(None, [("call_1", "send_message", json.dumps(args))])
        call = answer["choices"][0]["message"]["tool_calls"][0]
        where = call if field == "id" else call["function"]
    else:
        block = {"type": "tool_use", "id": "toolu_1", "name": "send_message", "input": args}
        answer = {**_anthropic_text(""), "content": [block], "stop_reason": "tool_use"}
        where = block
    if how == "missing":
        where.pop(field)
    else:
        where[field] = None
    return answer


def _results(kind: str, body: dict[str, Any]) -> list[str]:
    """The tool results a request sends the model."""
    if kind == "openai":
        return _tool_results(body)
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    return [b["content"] for b in blocks if b["type"] == "tool_result"]


def _call_ids(kind: str, body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The ids of the tool calls a request sends back, and those its results answer."""
    if kind == "openai":
        calls = [c["id"] for m in body["messages"] for c in m.get("tool_calls") or []]
        results = [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
        return calls, results
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
    return calls, [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]


@pytest.mark.parametrize("how", ["missing", "null"])
@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_tool_call_with_no_id_is_run_once_and_answered(
    provider: Callable[[Answer], FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    how: str,
) -> None:
    """Some compatible servers and proxies give a tool call no id (none, or null). The
    session crashed on it, the turn's input acked with no answer. The call is run once,
    under an id the runner gives it, and goes back to the model with its result under
    that same id, so the turn goes on to its close."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(
        lambda body, n: (
            (200, _call_without("id", kind, how), {})
            if n == 1
            else (200, _text_answer(kind, "done"), {})
        )
    )
    hub, runner, user = await _one_agent(kind, srv.url)
    try:
        assert await runner.run("say hi to boss", user) == "the team is quiet"
        loop = runner.loops["w-main"]
        assert (loop.stats.stopped, loop.stats.last_output) == (None, "done")
        assert [m.text for m in await user.receive(limit=10)] == ["hi"]
        calls, results = _call_ids(kind, srv.requests[1][1])
        assert calls == results and len(calls) == 1, (calls, results)
        assert isinstance(calls[0], str) and calls[0], calls
    finally:
        await hub.close()


@pytest.mark.parametrize("how", ["missing", "null"])
@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_tool_call_with_no_name_is_answered_as_an_error(
    provider: Callable[[Answer], FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    how: str,
) -> None:
    """A tool call with no name (none, or null) crashed the session, the turn's input
    acked with no answer and the agent lost for the run. It is a call to no tool the
    agent has: not run, the model hears so with the tools it has, and the turn goes on."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(
        lambda body, n: (
            (200, _call_without("name", kind, how), {})
            if n == 1
            else (200, _text_answer(kind, "done"), {})
        )
    )
    hub, runner, user = await _one_agent(kind, srv.url)
    try:
        assert await runner.run("say hi to boss", user) == "the team is quiet"
        loop = runner.loops["w-main"]
        assert (loop.stats.stopped, loop.stats.last_output) == (None, "done")
        assert await user.receive(limit=10) == [], "nothing was run"
        [result] = _results(kind, srv.requests[1][1])
        assert result.startswith("unknown tool ''; available: "), result
    finally:
        await hub.close()


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_tool_call_arguments_in_the_other_apis_form_are_read(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Compatible servers and proxies that translate between the two APIs give a tool
    call's arguments in the other one's form: an object where Chat Completions has a
    string of JSON, a string of JSON where the Messages API has an object. The first
    refused the model's whole answer as not the API's (the input given back, the agent
    stopped); the second told the model its arguments were not JSON. Both are read."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    args = {"to": "boss", "message": "hi"}
    if kind == "openai":
        first = _chat(None, [("call_1", "send_message", "")])
        first["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = args
    else:
        block = {"type": "tool_use", "id": "toolu_1", "name": "send_message"}
        block["input"] = json.dumps(args)
        first = {**_anthropic_text(""), "content": [block], "stop_reason": "tool_use"}
    srv = provider(
        lambda body, n: (200, first, {}) if n == 1 else (200, _text_answer(kind, "done"), {})
    )
    hub, runner, user = await _one_agent(kind, srv.url)
    try:
        assert await runner.run("say hi to boss", user) == "the team is quiet"
        loop = runner.loops["w-main"]
        assert (loop.stats.stopped, loop.stats.last_output) == (None, "done")
        assert [m.text for m in await user.receive(limit=10)] == ["hi"]
        [result] = _results(kind, srv.requests[1][1])
        assert result.startswith("sent "), result
    finally:
        await hub.close()


@pytest.mark.parametrize("usage", ["partial", "null counts", "none"])
@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_an_answer_with_token_counts_missing_is_taken(
    provider: Callable[[Answer], FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    usage: str,
) -> None:
    """Compatible servers and proxies give usage with counts missing or null, or none at
    all. The answer was refused as not the API's (the turn's input given back and the
    agent stopped), or, taken, crashed the session adding None to its token count. The
    answer is taken and the counts it does give are counted; those it does not are
    estimated (about four characters a token), never counted as none."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    answer = _text_answer(kind, "done")
    first = "prompt_tokens" if kind == "openai" else "input_tokens"
    second = "completion_tokens" if kind == "openai" else "output_tokens"
    if usage == "partial":
        answer["usage"] = {first: 7}
    elif usage == "null counts":
        answer["usage"] = {first: 7, second: None}
    else:
        answer.pop("usage")
    srv = provider(lambda body, n: (200, answer, {}))
    hub, runner, user = await _one_agent(kind, srv.url)
    try:
        assert await runner.run("do it", user) == "the team is quiet"
        loop = runner.loops["w-main"]
        assert (loop.stats.stopped, loop.stats.last_output) == (None, "done")
        # "done": one token by the estimate
        assert loop.stats.usage.output_tokens == 1
        if usage != "none":
            assert loop.stats.usage.input_tokens == 7
        else:
            # the turn's input, framed, and the tools' definitions the request carried
            # (without them the estimate erred short: 4 tokens for a request of thousands)
            ((_, body, _),) = srv.requests
            tools = json.dumps(body["tools"])
            least = (len("[From boss] do it") + sum(len(d) for d in _descriptions(body))) // 4
            assert least <= loop.stats.usage.input_tokens <= len(json.dumps(body)) // 4, (
                loop.stats.usage.input_tokens,
                least,
                len(tools),
            )
        assert await hub.pending("t", "w") == 0
    finally:
        await hub.close()


def _descriptions(body: dict[str, Any]) -> list[str]:
    """The tools' descriptions a request to the Anthropic or OpenAI API carried."""
    return [t.get("description") or t["function"]["description"] for t in body["tools"]]


async def test_a_token_budget_holds_against_answers_without_token_counts(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """A compatible server that gives no ``usage``: every answer counted as no tokens,
    so an agent's ``max_tokens`` never stopped it, whatever it spent (here a model
    that calls a tool step after step, on a long input). The counts it does not give
    are estimated (about four characters a token), the agent stops at its budget, and
    the runner says the budget counts an estimate."""
    long_task = "check every file. " * 200  # about 900 tokens by the estimate

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        a = _chat(None, [(f"call_{n}", "list_members", "{}")])
        a.pop("usage")
        return 200, a, {}

    srv = provider(answer)
    hub, runner, user = await _openai_team(srv.url, ", max_tokens: 3000, max_steps: 40")
    notes: list[str] = []
    runner._note = notes.append
    try:
        assert await runner.run(long_task, user) == "every agent stopped"
        loop = runner.loops["w-main"]
        assert loop.stats.stopped == "budget", (loop.stats.stopped, len(srv.requests))
        assert len(srv.requests) < 10, "the budget let the model go on"
        assert loop.stats.usage.input_tokens >= 3000 - loop.stats.usage.output_tokens
        assert "estimate" in loop.stats.last_output, loop.stats.last_output
        assert sum("no token counts" in n for n in notes) == 1, notes
    finally:
        await hub.close()


async def test_check_inbox_mid_turn_does_not_tell_the_model_nothing_came(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """The hub hands a session nothing while its turn runs, so a runner agent's
    ``check_inbox`` (always called within a turn) answered "(no messages)" even with a
    message waiting for it: a model polling for a teammate's answer was told none came.
    The answer says that what arrives during the turn comes as the next input once the
    turn ends, and that message does come, once."""
    asked, sent = threading.Event(), threading.Event()

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        if n == 1:
            asked.set()
            sent.wait(10)
            return 200, _chat(None, [("call_1", "check_inbox", "{}")]), {}
        return 200, _chat("done"), {}

    srv = provider(answer)
    hub, runner, user = await _openai_team(srv.url)
    run = asyncio.create_task(runner.run("wait for the note", user))
    try:
        await eventually(asked.is_set, what="the turn's first model call")
        await user.send("w", "the note you wait for", session="w-main", link=False)
        sent.set()
        assert await run == "the team is quiet"
        [result] = _tool_results(srv.requests[1][1])
        assert result != "(no messages)", "told nothing came, with a message waiting"
        assert "next input" in result and "this turn ends" in result, result
        inputs = [
            m["content"] for r in srv.requests for m in r[1]["messages"][-1:] if m["role"] == "user"
        ]
        assert sum("the note you wait for" in i for i in inputs) == 1, inputs
        assert await hub.pending("t", "w") == 0
    finally:
        sent.set()
        if not run.done():
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
        await hub.close()


MISSING = {"error": {"message": "model 'helper' does not exist", "type": "invalid_request_error"}}


async def _lead_and_helper(url: str) -> tuple[Hub, Runner, Client]:
    """A lead on model ``lead`` and a helper on model ``helper``, both served at ``url``."""
    team = parse_team(
        "team: t\nmembers:\n"
        f"  - {{name: lead, model: openai, model_name: lead, base_url: '{url}/v1'}}\n"
        f"  - {{name: helper, model: openai, model_name: helper, base_url: '{url}/v1'}}\n"
    )
    hub = Hub(MemoryStore())
    await hub.start()
    await hub.create_team("t", settings=team.settings())
    clients = {}
    for m in team.members:
        clients[m.name] = attach(hub, (await hub.add_member("t", m.name))[1])
        await clients[m.name].start()
    user = attach(hub, (await hub.add_member("t", "boss", "human"))[1])
    await user.start()
    return hub, Runner(team, clients, workspace=Path("."), quiet_seconds=0.5, timeout=30), user


def _lead_calls(tool: str, args: dict[str, Any]) -> Answer:
    """The lead calls ``tool`` on its task, then says what it heard; the helper's model
    does not exist."""

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        if body["model"] == "helper":
            return 404, MISSING, {}
        msgs = body["messages"]
        if msgs[-1]["role"] == "tool":
            return 200, _chat("asked"), {}
        if sum(m["role"] == "user" for m in msgs) == 1:
            return 200, _chat(None, [("call_1", tool, json.dumps(args))]), {}
        return 200, _chat("lead heard: " + msgs[-1]["content"]), {}

    return answer


async def test_a_delegation_whose_callees_model_fails_is_answered_with_the_failure(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """The callee's model fails for good before it saw the task: the caller hears that
    (not that the agent answered with no text), and the task does not go back to a
    sub-session nobody will serve, where it held the run open until its timeout."""
    srv = provider(_lead_calls("delegate", {"to": "helper", "task": "part 1", "timeout_s": 60}))
    hub, runner, user = await _lead_and_helper(srv.url)
    try:
        assert await runner.run("go", user) == "the team is quiet"
        heard = runner.loops["lead-main"].stats.last_output
        assert "does not exist" in heard, heard
        assert "no text" not in heard, heard
        [d] = await runner.clients["lead"].delegations()
        assert d["state"] == "answered"
        assert await hub.pending("t", "helper") == 0
    finally:
        await hub.close()


async def test_a_message_for_an_agent_whose_model_failed_is_a_dead_letter_its_sender_hears(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """The helper's model fails for good (a model that does not exist) on a lead's
    message. The message was given back to the hub, where it waited for a model that
    would never read it, and the lead was never told: it went on as if heard. It is a
    dead letter naming why, the lead's model reads that notice, the helper's session
    stops, and the run ends when the rest of the team is quiet, not at its timeout."""
    srv = provider(_lead_calls("send_message", {"to": "helper", "message": "check this"}))
    hub, runner, user = await _lead_and_helper(srv.url)
    try:
        assert await runner.run("go", user) == "the team is quiet"
        assert runner.loops["helper-main"].stats.stopped == "model error"
        assert runner.loops["lead-main"].stats.stopped is None
        heard = runner.loops["lead-main"].stats.last_output
        assert "lead heard: " in heard and "was not delivered" in heard, heard
        assert "helper's model failed for good" in heard and "does not exist" in heard, heard
        assert await hub.pending("t", "helper") == 0, "left waiting for a model that failed"
        # the helper's session ended, closing its link: the lead's turns, each answering
        # a notice, did not spend the link's budget crossing to an agent that cannot read
        dead, _ = await hub.dead_letters("t", 20)
        said = {d.message.text for d in dead if d.message and d.message.sender == "lead"}
        assert "check this" in said and said <= {"check this", "[From lead] asked"}, said
        [link] = await user.links()
        assert link.state == "closed" and link.turns_used <= 1, link
    finally:
        await hub.close()


async def test_a_message_sent_after_an_agents_model_failed_for_good_comes_back(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """Once an agent's model has failed for good, a message sent to it later in the run
    waited in the hub and its sender heard nothing, as if the agent would read it. While
    the run lasts, it comes back as a dead letter that names why, without another call
    of the model."""
    srv = provider(_lead_calls("send_message", {"to": "helper", "message": "check this"}))
    hub, runner, user = await _lead_and_helper(srv.url)
    runner.quiet_seconds = 60.0  # the run stays up until the test ends it
    run = asyncio.create_task(runner.run("go", user))
    try:
        await eventually(
            lambda: (
                "helper-main" in runner.loops
                and runner.loops["helper-main"].stats.stopped == "model error"
            ),
            what="the helper's model failed",
        )
        await _sent_later_comes_back(
            srv, user, "later-1", "model failed for good", "does not exist"
        )
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await hub.close()


async def _sent_later_comes_back(srv: FakeProvider, user: Any, mid: str, *words: str) -> None:
    """A message sent to the stopped helper comes back to its sender at once as a dead
    letter whose notice names it and ``words``, without a call of the model for it."""
    calls = len(srv.requests)
    await user.send("helper", "and this too", message_id=mid)
    got = await user.receive(limit=5, wait=10.0)
    assert len(got) == 1 and got[0].kind == "system", got
    for word in (mid, *words):
        assert word in got[0].text, got[0].text
    assert (await user.status(mid)).status == "dead"
    later = [r for r in srv.requests[calls:] if "and this too" in json.dumps(r[1])]
    assert not later, "the model was called again"


async def test_a_message_after_a_model_failed_for_good_mid_turn_comes_back(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """The helper's model fails for good mid-turn, after it read its input (its context
    is full once a tool result is added): the turn closes saying so, but what was sent
    to the helper afterwards waited in the hub, its sender told nothing. It comes back
    as a dead letter naming the failure, without another call of the model."""
    full = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    lead = _lead_calls("send_message", {"to": "helper", "message": "check this"})

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        if body["model"] != "helper":
            return lead(body, n)
        if body["messages"][-1]["role"] == "tool":
            return 400, full, {}
        return 200, _chat(None, [("call_h", "list_members", "{}")]), {}

    srv = provider(answer)
    hub, runner, user = await _lead_and_helper(srv.url)
    runner.quiet_seconds = 60.0  # the run stays up until the test ends it
    run = asyncio.create_task(runner.run("go", user))
    try:
        await eventually(
            lambda: (
                "helper-main" in runner.loops
                and runner.loops["helper-main"].stats.stopped == "model error"
            ),
            what="the helper's model failed",
        )
        assert "maximum context length" in runner.loops["helper-main"].stats.last_output
        await _sent_later_comes_back(srv, user, "later-2", "maximum context length")
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await hub.close()


async def test_a_message_to_an_agent_stopped_by_its_budget_comes_back(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """An agent that spent its ``max_tokens`` stops, saying so in its closing text; a
    message sent to it afterwards waited in the hub, its sender told nothing, for an
    agent that would not take it in this run. It comes back as a dead letter naming
    the spent budget, without another call of the model."""
    srv = provider(_lead_calls("send_message", {"to": "helper", "message": "check this"}))
    team = parse_team(
        "team: t\nmembers:\n"
        f"  - {{name: lead, model: openai, model_name: lead, base_url: '{srv.url}/v1'}}\n"
        f"  - {{name: helper, model: openai, model_name: lead, base_url: '{srv.url}/v1',"
        " max_tokens: 10}\n"
    )
    hub = Hub(MemoryStore())
    await hub.start()
    await hub.create_team("t", settings=team.settings())
    clients = {}
    for m in team.members:
        clients[m.name] = attach(hub, (await hub.add_member("t", m.name))[1])
        await clients[m.name].start()
    user = attach(hub, (await hub.add_member("t", "boss", "human"))[1])
    await user.start()
    runner = Runner(team, clients, workspace=Path("."), quiet_seconds=60.0, timeout=30)
    run = asyncio.create_task(runner.run("go", user))
    try:
        await eventually(
            lambda: (
                "helper-main" in runner.loops
                and runner.loops["helper-main"].stats.stopped == "budget"
            ),
            what="the helper spent its budget",
        )
        await _sent_later_comes_back(srv, user, "later-3", "budget")
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await hub.close()


async def test_a_long_error_from_the_model_api_still_makes_a_dead_letter(
    provider: Callable[[Answer], FakeProvider], server: Server
) -> None:
    """A model API whose refusal for good comes with a long message (a proxy's page, a
    list of the models it has), the runner on a hub over HTTP: the hub refuses a
    dead letter's reason past its bound, so the task went back and its sender was told
    nothing. The reason is cut to fit, and the sender is told."""
    long = {"error": {"message": "model 'm' does not exist; have: " + "x" * 3000}}
    srv = provider(lambda body, n: (404, long, {}))
    team = parse_team(
        f"team: t\nmembers:\n  - {{name: w, model: openai, model_name: m, base_url: '{srv.url}/v1'}}\n"
    )
    tokens = server.team("t", "w")
    async with Client(server.url, tokens["w"]) as w, Client(server.url, tokens["user"]) as user:
        runner = Runner(team, {"w": w}, workspace=Path("."), quiet_seconds=0.5, timeout=30)
        assert await runner.run("do it", user) == "every agent stopped"
        assert await w.pending() == 0
        told = [m.text for m in await user.receive(limit=5)]
        assert len(told) == 1 and "does not exist" in told[0], told


async def test_a_model_call_that_never_answers_is_named_while_the_run_waits(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """A model API that takes the request and never answers: the SDK waits ten minutes
    a try. The runner says, while it waits, that the model has not answered
    and the way out, and the run's timeout gives the input back."""
    hang = threading.Event()

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        hang.wait(60)
        return 200, _chat("too late"), {}

    srv = provider(answer)
    hub, runner, user = await _openai_team(srv.url)
    notes: list[str] = []
    runner._note = notes.append
    runner.timeout, runner.model_slow = 3.0, 0.5
    try:
        assert await runner.run("do it", user) == "timeout after 3 s"
        assert any("w: the model has not answered in 0.5 s" in n for n in notes), notes
        assert any("--timeout" in n and "Ctrl-C" in n for n in notes), notes
        got = await hub.receive("t", "w", session="w-main")
        assert [(g.message.text, g.attempt) for g in got] == [("do it", 2)], "given back"
    finally:
        hang.set()
        await hub.close()


async def test_a_try_again_that_never_answers_ends_with_the_runners_patience(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """The patience counts from a step's first failure, but only a failure ended a
    try: an API that was overloaded, then took the next try and never answered, held
    the turn (and its input, leased) for the SDK's ten minutes a try and past, however
    short the patience the notes named. A try made within the patience ends with it:
    the input goes back and the note says the API did not answer within it."""
    hang = threading.Event()

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        if n == 1:
            return 503, {"error": {"message": "overloaded"}}, {}
        hang.wait(60)
        return 200, _chat("too late"), {}

    srv = provider(answer)
    hub, runner, user = await _openai_team(srv.url)
    notes: list[str] = []
    runner._note = notes.append
    runner.timeout, runner.model_patience, runner.model_pause = 20.0, 1.0, 0.05
    try:
        assert await runner.run("do it", user) == "every agent stopped"
        assert runner.loops["w-main"].stats.stopped == "model error"
        assert any("did not answer within the runner's patience (1 s)" in n for n in notes), notes
        got = await hub.receive("t", "w", session="w-main")
        assert [(g.message.text, g.attempt) for g in got] == [("do it", 2)], "given back"
    finally:
        hang.set()
        await hub.close()


async def test_ctrl_c_mid_turn_says_where_the_input_went(
    provider: Callable[[Answer], FakeProvider], tmp_path: Path
) -> None:
    """Ctrl-C while the model works on the task: the task goes back to the hub, unseen,
    in a team the next run does not reuse. The run says so before it ends, with the way
    to run again, rather than ending with nothing printed."""
    hang = threading.Event()

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        hang.wait(60)
        return 200, _chat("too late"), {}

    srv = provider(answer)
    team = parse_team(
        f"team: t\nmembers:\n  - {{name: w, model: openai, model_name: m, base_url: '{srv.url}/v1'}}\n"
    )
    shown = io.StringIO()
    run = asyncio.create_task(
        run_team(
            team,
            "do it",
            url=f"sqlite:///{tmp_path}/hub.db",
            admin_token=None,
            workspace=tmp_path,
            time_limit=60,
            console=Console(file=shown, width=200),
        )
    )
    try:
        await eventually(lambda: bool(srv.requests), what="the model is asked")
        run.cancel()  # what asyncio.run does with a Ctrl-C
        with pytest.raises(asyncio.CancelledError):
            await run
    finally:
        hang.set()
    out = shown.getvalue()
    assert "1 message for w never reached its model" in out, out
    assert "--team NEW_NAME" in out, out


def _cut_text(kind: str, text: str, stop: str | None = None) -> dict[str, Any]:
    """A text-only answer stopped by ``stop`` (by default the output limit: Anthropic's
    ``max_tokens``, OpenAI's ``length``)."""
    if kind == "openai":
        answer = _chat(text)
        answer["choices"][0]["finish_reason"] = stop or "length"
        return answer
    return {**_anthropic_text(text), "stop_reason": stop or "max_tokens"}


def _said_last(kind: str, body: dict[str, Any]) -> str:
    """The text of the last message of a request: what the model was told last."""
    last = body["messages"][-1]
    assert last["role"] == "user"
    content = last["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_closing_text_cut_at_the_output_limit_is_finished_by_the_model(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """An answer of text only, cut at the output limit, would close the turn with half a
    report, sent on (to a delegation's caller, say) as if it were the whole. The model
    is asked to go on from where it stopped, and the closing text is the whole of it."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(
        lambda body, n: (
            (200, _cut_text(kind, "The survey found three probl"), {})
            if n == 1
            else (200, _text_answer(kind, "ems in the parser."), {})
        )
    )
    hub, runner, user = await _one_agent(kind, srv.url)
    try:
        assert await runner.run("survey it", user) == "the team is quiet"
        loop = runner.loops["w-main"]
        assert loop.stats.last_output == "The survey found three problems in the parser."
        assert len(srv.requests) == 2
        told = _said_last(kind, srv.requests[1][1])
        assert "cut at the output limit" in told and "where it stopped" in told, told
        assert json.dumps(srv.requests[1][1]["messages"]).count("survey it") == 1
    finally:
        await hub.close()


async def test_a_closing_text_still_cut_after_the_model_went_on_says_so(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """A model that is cut at the output limit every time it goes on: the runner asks it
    three times, then closes the turn with what it wrote, marked as cut, so whoever
    reads it knows it may be incomplete."""
    srv = provider(lambda body, n: (200, _cut_text("openai", f"part {n}; "), {}))
    hub, runner, user = await _one_agent("openai", srv.url)
    try:
        assert await runner.run("write it all", user) == "the team is quiet"
        assert len(srv.requests) == 4, "asked to go on three times"
        out = runner.loops["w-main"].stats.last_output
        assert out.startswith("part 1; part 2; part 3; part 4; "), out
        assert out.endswith("[cut short: the answer reached the output limit (length)]"), out
    finally:
        await hub.close()


@pytest.mark.parametrize(
    ("text", "stop", "why"),
    [
        ("", "refusal", "was stopped by the API's safety filter (refusal)"),
        ("I can help with the fi", "refusal", "was stopped by the API's safety filter (refusal)"),
        (
            "The survey found three probl",
            "model_context_window_exceeded",
            "reached the model's context window (model_context_window_exceeded)",
        ),
    ],
)
async def test_a_closing_text_stopped_by_the_apis_filter_says_so(
    provider: Callable[[Answer], FakeProvider],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    stop: str,
    why: str,
) -> None:
    """An answer the API's safety filter stopped (empty, or cut), or cut at the model's
    context window: the model is not asked to go on past the filter, nor in a context
    with no room left; the closing text says it was stopped rather than read as the
    agent's whole answer (an empty one as no answer at all)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(lambda body, n: (200, _cut_text("anthropic", text, stop), {}))
    hub, runner, user = await _one_agent("anthropic", srv.url)
    try:
        assert await runner.run("do it", user) == "the team is quiet"
        assert len(srv.requests) == 1
        out = runner.loops["w-main"].stats.last_output
        assert out.startswith(text)
        assert out.endswith(f"[cut short: the answer {why}]"), out
    finally:
        await hub.close()


async def test_agents_refused_together_do_not_come_back_together(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """Ten agents of one run share one API key; a rate limit refuses each one's first
    call at once. Were each to wait exactly the runner's pause, they would all call again
    in the same instant and be refused together again, every time: each draws its pause
    from the upper half of the doubling pause instead, so their second calls spread out."""
    first: dict[str, float] = {}
    gaps: dict[str, float] = {}

    def answer(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, str]]:
        found = re.search(r"task-\d+", json.dumps(body["messages"]))
        assert found, body
        who = found.group()
        if who not in first:
            first[who] = time.monotonic()
            return 429, RATE_LIMITED, {}
        gaps.setdefault(who, time.monotonic() - first[who])
        return 200, _chat("done"), {}

    srv = provider(answer)
    helpers = "".join(
        f"  - {{name: w{i}, model: openai, model_name: m, base_url: '{srv.url}/v1'}}\n"
        for i in range(1, 10)
    )
    hub, runner, user = await _openai_team(srv.url, helper=helpers)
    runner.model_pause = 1.0
    try:
        for i in range(1, 10):
            await user.send(f"w{i}", f"task-{i}")
        assert await runner.run("task-0", user) == "the team is quiet"
        assert len(gaps) == 10, gaps
        assert min(gaps.values()) >= 0.5 - 0.05, sorted(gaps.values())
        # without the draw the gaps all sit at the pause, within the loop's own noise
        assert max(gaps.values()) - min(gaps.values()) > 0.1, gaps
    finally:
        await hub.close()


async def test_a_cut_answer_carried_on_keeps_its_turns_input_in_a_small_context(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """A turn near the member's ``context_chars``: its input and the model's cut first
    part, then the runner's "go on". The bound drops old turns whole, never the turn in
    progress; the "go on" is not a turn of its own, or the model would be asked to carry
    on an answer to a task it is no longer shown, with none of what it wrote."""
    task = "survey it: " + "y" * 560
    srv = provider(
        lambda body, n: (
            (200, _cut_text("openai", "The survey found three probl" + "z" * 500), {})
            if n == 1
            else (200, _chat("ems in the parser."), {})
        )
    )
    hub, runner, user = await _openai_team(srv.url, extra=", context_chars: 1000")
    try:
        assert await runner.run(task, user) == "the team is quiet"
        assert len(srv.requests) == 2
        carried = json.dumps(srv.requests[1][1]["messages"])
        assert task in carried and "three probl" in carried, carried[:300]
    finally:
        await hub.close()
