"""The built-in runner: scripted teams end to end over a real hub; budgets; interruption."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from rich.console import Console

from backchannel.client import Client, attach
from backchannel.errors import ModelError
from backchannel.hub import Hub
from backchannel.runner.command import print_line, run_team
from backchannel.runner.host import Runner, SessionLoop
from backchannel.runner.scripted import call, use
from backchannel.runner.teamfile import load_team, parse_team
from backchannel.testing import MemoryStore, ScriptContext, eventually, say
from tests.conftest import Server, free_port, start_server

if TYPE_CHECKING:
    from backchannel.runner.teamfile import TeamFile
    from tests.test_sdk_faults import Faulty

ROOT = Path(__file__).resolve().parent.parent


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "a.py").write_text("import os\n\n# TODO: handle errors\nprint(os.name)\n")
    (ws / "pkg" / "b.py").write_text("x = 1  # FIXME: magic number\n")
    (ws / "notes.md").write_text("# Notes\n\nnothing to do\n")
    return ws


async def test_survey_team_end_to_end_over_a_real_hub(server: Server, tmp_path: Path) -> None:
    team = load_team(ROOT / "examples" / "survey-team.yaml")
    shown = io.StringIO()
    result = await run_team(
        team,
        "Survey this repository.",
        url=server.url,
        admin_token=server.admin_token,
        workspace=_workspace(tmp_path),
        time_limit=60,
        console=Console(file=shown, width=200),
    )
    story = shown.getvalue()
    for line in (
        "lead delegates to counter: Count this repository's code by language. (deadline 30 s)",
        "lead delegates to finder:",
        "lead-main: delegation results arrive: counter answered; finder timed out",
        "link crossing: reviewer's output -> lead (turn 2 of 2); budget spent, link closed",
        "hub drops lead's closing message to reviewer: it repeats what the turn sent",
        "lead-main: timer fired, ANCHOR: return to the repository survey",
        "lead-main: late answer from finder arrives after its deadline",
    ):
        assert line in story, line
    assert "messages 0 " not in story, "the live footer counts delivered messages"
    assert result.ended_because == "the team is quiet"
    states = {d["callee"]: d["state"] for d in result.delegations}
    assert states == {"counter": "answered", "finder": "late"}
    [link] = result.links
    assert (link["initiator"], link["responder"]) == ("lead", "reviewer")
    assert (link["turns_used"], link["budget"], link["close_reason"]) == (2, 2, "budget_exhausted")
    assert result.duplicates_dropped == 1
    [report] = [m for m in result.to_user if m["from"] == "lead"]
    assert "Code by language (8 lines in all)" in report["text"]
    assert "the totals match" in report["text"]
    assert "2 TODO/FIXME comments" in report["text"]
    # the whole of each answer, not its heading
    assert "Python: 2 files, 5 lines" in report["text"]
    assert "pkg/a.py:3: TODO handle errors" in report["text"]
    assert "pkg/b.py:1: FIXME magic number" in report["text"]
    sessions = {s["session"]: s for s in result.sessions}
    assert sessions["reviewer-main"]["turns"] >= 1
    assert any(k.startswith("lead-main--") for k in sessions), "delegations ran in sub-sessions"


async def test_off_a_terminal_the_table_and_the_story_are_printed_whole(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written to a file or a pipe (no terminal, so no width to fit but rich's 80
    columns), the progress table shows every session id whole on one row (a
    delegation's sub-session id is longer than a column), and each line of the run's
    story is one line of output, however long: split in two, a reader grepping the log
    for an id or a task would not find it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    team = load_team(ROOT / "examples" / "survey-team.yaml")
    shown = io.StringIO()
    console = Console(file=shown)
    assert not console.is_terminal and console.width == 80
    result = await run_team(
        team,
        "Survey this repository.",
        url=server.url,
        admin_token=server.admin_token,
        workspace=_workspace(tmp_path),
        time_limit=60,
        team_name="survey-plain",
        console=console,
    )
    lines = shown.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "team survey" in line)
    table = lines[start:]
    ids = [s["session"] for s in result.sessions]
    assert any(len(i) >= 40 for i in ids), ids  # sub-sessions of delegations
    for sid in ids:
        rows = [line for line in table if f" {sid} " in line]
        assert len(rows) == 1, (sid, table)
    assert not any("\u2026" in line for line in table), table
    whole = "lead delegates to counter: Count this repository's code by language. (deadline 30 s)"
    assert len(whole) > 70, "with its time in front, wider than 80 columns"
    for story in (
        whole,
        "lead-main: delegation results arrive: counter answered; finder timed out",
        "link crossing: reviewer's output -> lead (turn 2 of 2); budget spent, link closed",
        "hub drops lead's closing message to reviewer: it repeats what the turn sent",
    ):
        assert any(story in line for line in lines[:start]), (story, lines)


async def _hub_with(team_yaml: str) -> tuple[Hub, Runner, dict[str, object]]:
    team = parse_team(team_yaml)
    hub = Hub(MemoryStore())
    await hub.start()
    await hub.create_team(team.team, settings=team.settings())
    clients = {}
    for m in team.members:
        _, token = await hub.add_member(team.team, m.name)
        clients[m.name] = attach(hub, token)
        await clients[m.name].start()
    _, user_token = await hub.create_team("other")  # a second team proves nothing leaks
    runner = Runner(team, dict(clients), workspace=Path("."), quiet_seconds=0.5, timeout=30)
    return hub, runner, {"user": user_token}


async def test_a_budget_stops_the_agent_with_a_clear_message() -> None:
    hub, runner, _ = await _hub_with(
        "team: b\nmembers:\n  - {name: talker, policy: echo, max_tokens: 5}\n"
    )
    try:
        user = await _boss(hub, "b")
        ended = await runner.run("a long task description that costs tokens", user)
        assert ended in ("every agent stopped", "the team is quiet")
        loop = runner.loops["talker-main"]
        assert loop.stats.stopped == "budget"
        assert "Budget spent" in loop.stats.last_output
        assert "talker stops here" in loop.stats.last_output
        data = await hub.get_session_data("b", "talker-main")
        stops = [e for e in data["events"] if e["kind"] == "agent_stop"]
        assert "Budget spent" in stops[-1]["text"]
        # then the session ends: what is sent to it comes back, naming the budget
        assert data["events"][-1]["kind"] == "session", data["events"][-1]
        assert "budget is spent" in data["events"][-1]["text"]
    finally:
        await hub.close()


async def _boss(hub: Hub, team: str) -> Client:
    """The human ``boss`` of ``team``, attached and started: the one a run starts from."""
    user = attach(hub, (await hub.add_member(team, "boss", "human"))[1])
    await user.start()
    return user


_signals: dict[str, asyncio.Event] = {}


async def _stuck(ctx: ScriptContext) -> object:
    _signals["started"].set()
    await asyncio.sleep(3600)
    return say("never")


async def test_interrupting_a_turn_loses_nothing() -> None:
    _signals["started"] = asyncio.Event()
    hub, runner, _ = await _hub_with(
        "team: c\nmembers:\n  - {name: worker, policy: 'tests.test_runner:_stuck'}\n"
    )
    try:
        user = await _boss(hub, "c")
        run = asyncio.create_task(runner.run("do the thing", user))
        await asyncio.wait_for(_signals["started"].wait(), 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        s = await hub.get_session("c", "worker-main")
        assert s.state.value == "idle", "the interrupted turn is closed"
        assert await hub.pending("c", "worker") == 1, "its input is back in the queue"
        got = await hub.receive("c", "worker", session="worker-main")
        assert [g.message.text for g in got] == ["do the thing"]
        assert got[0].attempt == 2
        data = await hub.get_session_data("c", "worker-main")
        stops = [e for e in data["events"] if e["kind"] == "agent_stop"]
        assert stops[-1]["data"] == {"interrupted": True}
    finally:
        await hub.close()


def test_the_todo_hunt_finds_comments_not_the_word(tmp_path: Path) -> None:
    from backchannel.runner.tools import find_todo_lines

    (tmp_path / "a.py").write_text(
        '"""Lists TODO and FIXME comments."""\n'
        'TODO_RE = "TODO"\n'
        'write("# TODO: not a comment, a string")\n'
        "x = 1  # TODO: a real one\n"
        "# FIXME: another\n"
    )
    (tmp_path / "b.js").write_text("let y = 2; // TODO js too\n")
    assert find_todo_lines(tmp_path, tmp_path) == [
        "a.py:4: TODO a real one",
        "a.py:5: FIXME another",
        "b.js:1: TODO js too",
    ]


def _model_down(ctx: ScriptContext) -> object:
    """A failure that passes (a 503), past the runner's patience (set to none)."""
    raise ModelError("the model service answered 503 after its retries", retryable=True)


def _policy_bug(ctx: ScriptContext) -> object:
    raise RuntimeError("a bug in the policy")


@pytest.mark.parametrize(
    ("policy", "stopped"),
    [
        ("_model_down", "model error"),
        ("_policy_bug", "crashed: RuntimeError('a bug in the policy')"),
    ],
)
async def test_a_turn_whose_model_call_fails_gives_its_inputs_back(
    policy: str, stopped: str
) -> None:
    hub, runner, _ = await _hub_with(
        f"team: f\nmembers:\n  - {{name: worker, policy: 'tests.test_runner:{policy}'}}\n"
    )
    runner.model_patience = 0.0
    try:
        user = await _boss(hub, "f")
        assert await runner.run("do the thing", user) == "every agent stopped"
        loop = runner.loops["worker-main"]
        assert loop.stats.stopped == stopped
        assert not loop.stats.working
        s = await hub.get_session("f", "worker-main")
        assert s.state.value == "idle", "the failed turn is closed"
        got = await hub.receive("f", "worker", session="worker-main")
        assert [g.message.text for g in got] == ["do the thing"], "not acked, not leased"
        assert got[0].attempt == 2
    finally:
        await hub.close()


async def test_a_session_whose_model_failed_stops_once_its_input_is_given_back() -> None:
    """The run must not end while a turn whose model failed is giving its input back to
    the hub: ended then, it cancelled the give-back (the input stayed leased, for the
    next runner only when the lease ran out) and its report said the session was
    ``interrupted``, not stopped by a model error."""
    hub, runner, _ = await _hub_with(
        "team: f\nmembers:\n  - {name: worker, policy: 'tests.test_runner:_model_down'}\n"
    )
    runner.model_patience = 0.0
    giving_back, let_go = asyncio.Event(), asyncio.Event()
    release = runner.release
    busy = runner._busy
    looked = 0

    async def slow_release(client: Client, ids: list[str]) -> None:
        giving_back.set()
        await let_go.wait()
        await release(client, ids)

    async def counted_busy() -> bool:
        nonlocal looked
        looked += 1
        return await busy()

    runner.release = slow_release  # type: ignore[method-assign]
    runner._busy = counted_busy  # type: ignore[method-assign]
    try:
        user = await _boss(hub, "f")
        run = asyncio.create_task(runner.run("do the thing", user))
        await eventually(giving_back.is_set, what="the turn gives its input back")
        seen = looked
        await eventually(lambda: run.done() or looked >= seen + 3, what="the run looks on, or ends")
        assert not run.done(), "the run ended while the input was being given back"
        let_go.set()
        assert await run == "every agent stopped"
        assert runner.loops["worker-main"].stats.stopped == "model error"
        got = await hub.receive("f", "worker", session="worker-main")
        assert [g.message.text for g in got] == ["do the thing"], "given back"
    finally:
        let_go.set()
        await hub.close()


def _bug_after_a_tool_call(ctx: ScriptContext) -> object:
    if ctx.step == 0:
        return use(call("list_members"))
    raise RuntimeError("a bug in the policy, after the model answered")


async def _stuck_after_a_tool_call(ctx: ScriptContext) -> object:
    if ctx.step == 0:
        return use(call("list_members"))
    _signals["answered"].set()
    await asyncio.sleep(3600)
    return say("never")


@pytest.mark.parametrize("how", ["crash", "interrupt"])
async def test_a_turn_that_fails_after_the_model_answered_hands_nothing_twice(how: str) -> None:
    """Once the model has answered in a turn, its inputs reached it: a failure or an
    interruption later in the turn closes the turn and acks them, and never gives them
    back for a model to be handed again."""
    _signals["answered"] = asyncio.Event()
    policy = "_bug_after_a_tool_call" if how == "crash" else "_stuck_after_a_tool_call"
    hub, runner, _ = await _hub_with(
        f"team: g\nmembers:\n  - {{name: worker, policy: 'tests.test_runner:{policy}'}}\n"
    )
    try:
        user = await _boss(hub, "g")
        if how == "crash":
            assert await runner.run("do the thing", user) == "every agent stopped"
        else:
            run = asyncio.create_task(runner.run("do the thing", user))
            await asyncio.wait_for(_signals["answered"].wait(), 10)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        s = await hub.get_session("g", "worker-main")
        assert s.state.value == "idle", "the turn is closed"
        data = await hub.get_session_data("g", "worker-main")
        stops = [e for e in data["events"] if e["kind"] == "agent_stop"]
        assert stops[-1]["data"] == {"interrupted": True}
        assert await hub.pending("g", "worker") == 0, "the model saw its input: acked"
        feed = await hub.feed("g", 0)
        [task] = {i.event.message_id for i in feed if i.message and i.message.sender == "boss"}
        [copy] = (await hub.message_status("g", task)).deliveries
        assert copy.state.value == "acked"
    finally:
        await hub.close()


_sent_sizes: list[tuple[int, str]] = []


class _Recording:
    """Wraps a session's model: records what each call is sent (characters, last input)."""

    def __init__(self, model: object) -> None:
        self.model = model
        self.name = "recording"

    async def complete(self, system: str, messages: list[Any], tools: list[Any]) -> Any:
        _sent_sizes.append((sum(len(m.text) for m in messages), messages[-1].text))
        assert messages[0].role == "user", "a conversation starts with a turn's input"
        return await self.model.complete(system, messages, tools)  # type: ignore[attr-defined]


async def test_a_long_conversation_sends_the_model_a_bounded_context() -> None:
    """Every turn adds to a session's conversation; what the model is sent (and what
    the session keeps) stays within ``context_chars``, dropping the oldest turns whole,
    and always holds the turn in progress."""
    _sent_sizes.clear()
    hub, runner, _ = await _hub_with(
        "team: h\nmembers:\n  - {name: worker, policy: echo, context_chars: 4000}\n"
    )
    try:
        user = await _boss(hub, "h")
        client = runner.clients["worker"]
        await client.open_session("worker-main")
        loop = SessionLoop(runner, runner.team.members[0], client, "worker-main")
        loop.model = _Recording(loop.model)  # type: ignore[assignment]
        for n in range(40):
            await user.send("worker", f"task {n}: " + "x" * 500, session="worker-main")
            got = await client.receive(session="worker-main", limit=5)
            await loop.turn(got)
        assert len(_sent_sizes) == 40
        # each turn is its input (about 530 characters) and the echo of it
        assert max(size for size, _ in _sent_sizes) <= 4000
        assert all(last.startswith("[From boss]") for _, last in _sent_sizes)
        assert _sent_sizes[-1][1].endswith("task 39: " + "x" * 500)
        # the session forgets too: what it keeps is the bound and the last turn's answer
        assert sum(len(m.text) for m in loop.history) <= 4000 + 600
        assert sum(1 for m in loop.history if m.role == "user") <= 8
        assert await hub.pending("h", "worker") == 0
    finally:
        await hub.close()


async def _thinks_through_a_restart(ctx: ScriptContext) -> object:
    if ctx.turn == 1:  # the hub restarts while the model thinks about the first input
        _signals["thinking"].set()
        await _signals["restarted"].wait()
    return say(f"Got: {ctx.text}")


async def test_the_runner_rides_out_a_hub_restart(tmp_path: Path) -> None:
    """``backchannel serve`` restarts (an upgrade, a crash) while the runner hosts a
    team over HTTP, in the middle of a turn: the runner waits for the hub to come back
    and carries on. The turn ends and its input is acked; the session does not stop,
    and a message sent after the restart reaches the model."""
    _signals["thinking"], _signals["restarted"] = asyncio.Event(), asyncio.Event()
    port = free_port()
    home = tmp_path / "home"
    srv = await asyncio.to_thread(start_server, home, None, port=port)
    tokens = srv.team("rs", "worker")
    team = parse_team(
        "team: rs\nmembers:\n"
        "  - {name: worker, policy: 'tests.test_runner:_thinks_through_a_restart'}\n"
    )
    worker, user = Client(srv.url, tokens["worker"]), Client(srv.url, tokens["user"])
    runner = Runner(team, {"worker": worker}, workspace=tmp_path, quiet_seconds=60, timeout=90)
    run = asyncio.create_task(runner.run("before the restart", user))
    try:
        await asyncio.wait_for(_signals["thinking"].wait(), 10)
        loop = runner.loops["worker-main"]
        srv.stop()
        await asyncio.sleep(1.5)  # the runner's calls meet a closed port meanwhile
        srv = await asyncio.to_thread(start_server, home, None, port=port)
        _signals["restarted"].set()
        await eventually(
            lambda: loop.stats.turns == 1 and not loop.stats.working,
            what="the first turn to end",
            within=30,
            show=lambda: (loop.stats, run.done() and run.exception()),
        )
        assert "before the restart" in loop.stats.last_output
        await user.send("worker", "after the restart", session="worker-main")
        await eventually(
            lambda: loop.stats.turns == 2 and not loop.stats.working,
            what="turn 2",
            within=30,
            show=lambda: (loop.stats, run.done() and run.exception()),
        )
        assert loop.stats.stopped is None, loop.stats.stopped
        assert "after the restart" in loop.stats.last_output
        assert not run.done(), "the runner goes on"
        with srv.client(tokens["worker"]) as c:
            assert c.get("/v1/inbox/pending").json()["pending"] == 0
            events = c.get("/v1/sessions/worker-main/transcript").json()["events"]
        kinds = [e["kind"] for e in events if e["kind"] in ("turn_start", "agent_stop")]
        assert kinds == ["turn_start", "agent_stop"] * 2, kinds
    finally:
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
        await worker.close()
        await user.close()
        srv.stop()


_seen_inputs: list[str] = []


async def _records_and_waits(ctx: ScriptContext) -> object:
    if ctx.step == 0:
        _seen_inputs.extend(t for text in ctx.inputs for t in text.split("\n\n"))
    if ctx.turn == 1:
        _signals["in_turn"].set()
        await _signals["go_on"].wait()
    return say(f"done {ctx.turn}")


async def test_a_message_that_arrives_while_a_turn_runs_is_the_next_turns_input_once() -> None:
    """Messages sent while a turn runs wait for it to end, then start the next turn
    together: each handed to the model once, none lost."""
    _signals["in_turn"], _signals["go_on"] = asyncio.Event(), asyncio.Event()
    _seen_inputs.clear()
    hub, runner, _ = await _hub_with(
        "team: m\nmembers:\n  - {name: worker, policy: 'tests.test_runner:_records_and_waits'}\n"
    )
    try:
        user = await _boss(hub, "m")
        run = asyncio.create_task(runner.run("first", user))
        await asyncio.wait_for(_signals["in_turn"].wait(), 10)
        await user.send("worker", "second, sent during the first turn")
        await user.send("worker", "third, sent during the first turn")
        _signals["go_on"].set()
        assert await run == "the team is quiet"
        assert _seen_inputs == [
            "[From boss] first",
            "[From boss] second, sent during the first turn",
            "[From boss] third, sent during the first turn",
        ], _seen_inputs
        assert runner.loops["worker-main"].stats.turns == 2
        assert await hub.pending("m", "worker") == 0
    finally:
        await hub.close()


_handed: list[str] = []


async def _answers_then_loses_the_hub(ctx: ScriptContext) -> object:
    """Turn 1: answers with a tool call once the hub is gone; every turn's inputs are
    recorded in ``_handed`` (what the member's model was handed, across runners)."""
    if ctx.step == 0:
        _handed.extend(t for text in ctx.inputs for t in text.split("\n\n"))
    if ctx.turn == 1 and ctx.step == 0 and "first" in ctx.text:
        _signals["answering"].set()
        await _signals["hub_gone"].wait()
        return use(call("list_members"))
    return say(f"done {ctx.turn}")


async def test_inputs_the_model_saw_before_the_runner_gave_up_on_the_hub_are_not_handed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub goes away after the model answered in a turn and stays away past the
    runner's patience: the runner gives up with the turn's inputs leased and unacked.
    When a runner for the member starts again, those inputs (back in the queue once
    their lease ran out) are acked, not handed to the member's model a second time."""
    import backchannel.runner.host as host

    monkeypatch.setattr(host, "LEASE", 1.0)  # the lease runs out while the hub is away
    _signals["answering"], _signals["hub_gone"] = asyncio.Event(), asyncio.Event()
    _handed.clear()
    port = free_port()
    home = tmp_path / "home"
    srv = await asyncio.to_thread(start_server, home, None, port=port)
    tokens = srv.team("gu", "worker")
    team = parse_team(
        "team: gu\nmembers:\n"
        "  - {name: worker, policy: 'tests.test_runner:_answers_then_loses_the_hub'}\n"
    )
    clients = [Client(srv.url, tokens[m], retry_within=0.2) for m in ("worker", "user")]
    worker, user = clients
    try:
        runner = Runner(
            team, {"worker": worker}, workspace=tmp_path, quiet_seconds=60, hub_patience=0.5
        )
        run = asyncio.create_task(runner.run("first task", user))
        await asyncio.wait_for(_signals["answering"].wait(), 10)
        srv.stop()
        _signals["hub_gone"].set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, 30)
        assert runner.loops["worker-main"].stats.stopped is not None, "the runner gave up"
        await asyncio.sleep(1.2)  # past the lease of the turn's input
        srv = await asyncio.to_thread(start_server, home, None, port=port)
        again = Runner(team, {"worker": worker}, workspace=tmp_path, quiet_seconds=0.5)
        assert await asyncio.wait_for(again.run("second task", user), 30) == "the team is quiet"
        assert _handed == ["[From user] first task", "[From user] second task"], _handed
        with srv.client(tokens["worker"]) as c:
            assert c.get("/v1/inbox/pending").json()["pending"] == 0
    finally:
        for c in clients:
            await c.close()
        srv.stop()


_sends_tried: list[str] = []


def _sends_until_sent(ctx: ScriptContext) -> object:
    """Sends one message; a send the tool reports failed is made again, as a model does."""
    send = call("send_message", to="peer", message="the build is green")
    if "report" not in ctx.text:  # the hub's notice of the link the send opened
        return say("")
    if ctx.step == 0:
        return use(call("set_timer", intent="anchor", note="the report"), send)
    _sends_tried.append(ctx.result())
    if ctx.result().startswith("send_message failed") and len(_sends_tried) < 3:
        return use(send)
    return say("")


@contextlib.asynccontextmanager
async def _behind_a_faulty_proxy(
    tmp_path: Path, team_name: str, policy: str
) -> AsyncIterator[tuple[Server, Faulty, dict[str, str], TeamFile, Client, Client]]:
    """A real hub with team ``team_name`` of ``worker`` (running this module's ``policy``)
    and ``peer``; worker's client calls it through a faulty proxy and does not try again
    itself, the human's calls it directly. Yields the hub, the proxy, the tokens, the
    team, worker's client and the human's; all closed after."""
    from tests.test_sdk_faults import Faulty

    srv = await asyncio.to_thread(start_server, tmp_path / "home")
    proxy = Faulty(srv.url)
    tokens = srv.team(team_name, "worker", "peer")
    team = parse_team(
        f"team: {team_name}\nmembers:\n  - {{name: worker, policy: 'tests.test_runner:{policy}'}}\n"
    )
    worker = Client(proxy.url, tokens["worker"], retry_within=0)
    user = Client(srv.url, tokens["user"])
    try:
        yield srv, proxy, tokens, team, worker, user
    finally:
        await worker.close()
        await user.close()
        proxy.close()
        srv.stop()


async def test_a_send_whose_answer_was_lost_reaches_its_recipient_once(tmp_path: Path) -> None:
    """A tool's send reaches the hub, and its answer is lost (the connection is cut after
    the hub took it, past the SDK's own retries): the runner makes the send again with
    the same ``message_id``, so the hub answers it ``replayed`` and the peer gets the
    message once, whatever the model does when told the send failed."""
    _sends_tried.clear()
    async with _behind_a_faulty_proxy(tmp_path, "ls", "_sends_until_sent") as (
        srv,
        proxy,
        tokens,
        team,
        worker,
        user,
    ):
        proxy.faults.append(("POST", "/v1/messages", "cut"))
        runner = Runner(team, {"worker": worker}, workspace=tmp_path, quiet_seconds=60)
        run = asyncio.create_task(runner.run("report", user))
        await eventually(
            lambda: (
                "worker-main" in runner.loops
                and runner.loops["worker-main"].stats.turns >= 1
                and not runner.loops["worker-main"].stats.working
            ),
            what="the worker's turn to end",
            within=30,
            show=lambda: (
                runner.loops["worker-main"].stats,
                _sends_tried,
                run.done() and run.exception(),
            ),
        )
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        assert runner.loops["worker-main"].stats.stopped in (None, "interrupted")
        with srv.client(tokens["peer"]) as c:
            got = c.get("/v1/inbox", params={"limit": 50}).json()["messages"]
        sent = [m["text"] for m in got if m["from"] == "worker"]
        assert sent == ["the build is green"], (sent, _sends_tried)
        assert not _sends_tried[0].startswith("send_message failed"), _sends_tried


def _through_cuts(ctx: ScriptContext) -> object:
    """Sets an anchor and delegates, cancels the anchor, then ends the turn with a block
    to the peer."""
    if ctx.step == 0:
        return use(
            call("set_timer", intent="anchor", note="the report"),
            call("delegate", to="peer", task="count the lines"),
        )
    if ctx.step == 1:
        timer = next(r.text for r in ctx.results if r.text.startswith("timer "))
        return use(call("cancel_timer", id=int(timer.split()[1])))
    _cancels_told.append(ctx.result())
    return say('done <message to="peer">ship it</message>')


_cancels_told: list[str] = []  # what the cancel_timer tool told the model


async def test_a_turn_whose_answers_are_lost_goes_on_and_does_everything_once(
    tmp_path: Path,
) -> None:
    """The answers of the session's open, its turn's start and end, a timer's set and
    cancel and a delegation are lost after the hub did them (the SDK does not try again here): the
    runner makes each again under the same id, the session goes on, and the hub did
    each once (one turn, one timer, one delegation, the closing block sent once)."""
    async with _behind_a_faulty_proxy(tmp_path, "lc", "_through_cuts") as (
        srv,
        proxy,
        tokens,
        team,
        worker,
        user,
    ):
        events = "/v1/sessions/worker-main/events"
        proxy.faults += [
            ("POST", "/v1/sessions", "cut"),
            ("POST", events, "cut", "turn_start"),
            ("POST", "/v1/timers", "cut"),
            ("POST", "/v1/delegations", "cut"),
            ("DELETE", "/v1/timers/", "cut"),
            ("POST", events, "cut", "agent_stop"),
        ]
        runner = Runner(team, {"worker": worker}, workspace=tmp_path, quiet_seconds=60)
        run = asyncio.create_task(runner.run("report", user))
        await eventually(
            lambda: (
                (
                    "worker-main" in runner.loops
                    and runner.loops["worker-main"].stats.turns == 1
                    and not runner.loops["worker-main"].stats.working
                )
                or run.done()
            ),
            what="the worker's turn to end",
            within=30,
            show=lambda: (proxy.seen, run.done() and run.exception()),
        )
        assert not run.done(), run.exception()
        assert runner.loops["worker-main"].stats.stopped is None, runner.loops["worker-main"].stats
        assert proxy.faults == [], "every answer was lost once"
        async with Client(srv.url, tokens["worker"]) as w:
            assert [s.session_id for s in await w.list_sessions("worker")] == ["worker-main"]
            assert (await w.session("worker-main")).turn == 1
            [timer] = await w.timers(all=True)
            assert timer.state == "cancelled", timer
            assert len(await w.delegations()) == 1
        assert _cancels_told == [f"timer {timer.timer_id} cancelled"], _cancels_told
        with srv.client(tokens["peer"]) as c:
            got = c.get("/v1/inbox", params={"limit": 50}).json()["messages"]
        assert [m["text"] for m in got if m["from"] == "worker"] == ["ship it"]
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


_delegations_told: list[str] = []  # what the delegate tool told the model


def _delegates_once(ctx: ScriptContext) -> object:
    """Delegates one task to the peer, then ends the turn."""
    if ctx.step == 0:
        return use(call("delegate", to="peer", task="count the lines"))
    _delegations_told.append(ctx.result())
    return say("")


async def test_a_delegation_whose_answer_was_lost_is_told_to_the_model_as_the_same_one(
    tmp_path: Path,
) -> None:
    """A delegation reaches the hub and its answer is lost: the runner makes it again
    under the same ``tool_use_id`` and the hub answers ``replayed``. The tool says so
    (the delegation the first try made, which runs once), as the MCP tool does, so the
    model waits for one answer and does not take the hub for having made a second."""
    _delegations_told.clear()
    async with _behind_a_faulty_proxy(tmp_path, "ld", "_delegates_once") as (
        srv,
        proxy,
        tokens,
        team,
        worker,
        user,
    ):
        proxy.faults.append(("POST", "/v1/delegations", "cut"))
        runner = Runner(team, {"worker": worker}, workspace=tmp_path, quiet_seconds=60)
        run = asyncio.create_task(runner.run("report", user))
        await eventually(
            lambda: bool(_delegations_told) or run.done(),
            what="the delegate tool's answer",
            within=30,
            show=lambda: (proxy.seen, run.done() and run.exception()),
        )
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        assert proxy.faults == [], "the delegation's answer was lost once"
        async with Client(srv.url, tokens["worker"]) as w:
            [d] = await w.delegations()
        [told] = _delegations_told
        assert told.startswith(f"delegated to peer as {d.delegation_id} (pending)"), told
        assert "the same delegation" in told and "runs once" in told, told


@pytest.mark.parametrize("style", ["", "red"], ids=["story", "note"])
def test_a_story_or_note_line_is_printed_as_written(style: str) -> None:
    """A note is an error's words, a story line may quote a model's: rich markup in
    them dropped what looked like a tag (a name's rule ``[a-z0-9-]``, a ``[From
    user]``-like id ``[tu_1]``) and a closing tag (``[/b]``) failed the run with a
    ``MarkupError``; a terminal control sequence went to the terminal as is."""
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    line = "lead: name must match [a-z0-9-]+, [tu_1] refused [/b] \x1b[2J"
    print_line(console, line, style=style)
    out = shown.getvalue()
    assert "must match [a-z0-9-]+, [tu_1] refused [/b]" in out, out
    assert "\x1b[2J" not in out, repr(out)


async def test_the_check_inbox_tool_says_when_more_messages_may_wait(
    server: Server, tmp_path: Path
) -> None:
    """A hosted agent's ``check_inbox`` reads a bounded batch; a full one ends by saying
    more may wait and how to read them, so the model does not stop at the first batch."""
    from backchannel.runner.tools import CHECK_INBOX_BATCH, NOTHING_NOW, ToolContext, check_inbox

    tokens = server.team("deep", "worker")
    total = CHECK_INBOX_BATCH + 3
    with server.client(tokens["user"]) as c:
        for i in range(total):
            c.post("/v1/messages", json={"to": "worker", "text": f"item {i}"}).raise_for_status()
    async with Client(server.url, tokens["worker"]) as worker:
        session = (await worker.open_session("worker-main")).session_id
        ctx = ToolContext(worker, "worker", session, tmp_path)
        first = await check_inbox(ctx, {})
        assert first.count("item ") == CHECK_INBOX_BATCH
        assert first.endswith("(more messages may wait: call check_inbox again to read them)")
        rest = await check_inbox(ctx, {})
        assert rest.count("item ") == 3 and "more messages may wait" not in rest
        assert await check_inbox(ctx, {}) == NOTHING_NOW


async def test_the_report_shows_every_message_to_the_user_not_the_first_hundred() -> None:
    """The run's report reads what its agents sent the human a bounded page at a time
    until none is left: each one shown once, none left unread behind the report."""
    from backchannel.runner.command import report

    hub, runner, _ = await _hub_with("team: r\nmembers:\n  - {name: talker, policy: echo}\n")
    try:
        user = await _boss(hub, "r")
        helper = attach(hub, (await hub.add_member("r", "helper", "human"))[1])
        await helper.start()
        total = 250
        for i in range(total):
            await helper.send("boss", f"finding {i}")
        result = await report(runner, runner.clients, user, "r", "the team is quiet")
        assert [m["text"] for m in result.to_user] == [f"finding {i}" for i in range(total)]
        assert await user.pending() == 0
        await helper.close()
        await user.close()
    finally:
        await hub.close()


async def test_check_inbox_never_acks_a_message_the_model_is_not_shown_whole(
    server: Server, tmp_path: Path
) -> None:
    """A tool's answer is cut at MAX_RESULT characters; ``check_inbox`` acks what it
    read, so a cut there would drop the messages past it for good. It shows the
    messages that fit whole, gives the rest back (said, and read by the next call), and
    a single message longer than the room is shown in parts, never cut."""
    from backchannel.runner.tools import MAX_RESULT, ToolContext, run_tool

    tokens = server.team("long", "worker")
    size = MAX_RESULT * 4 // 10  # two fit in one answer, three do not
    texts = [f"part {i} " + chr(ord("a") + i) * size for i in range(3)]
    huge = "huge " + "z" * (MAX_RESULT + 5_000)
    with server.client(tokens["user"]) as c:
        for text in [*texts, huge]:
            c.post("/v1/messages", json={"to": "worker", "text": text}).raise_for_status()
    async with Client(server.url, tokens["worker"]) as worker:
        session = (await worker.open_session("worker-main")).session_id
        ctx = ToolContext(worker, "worker", session, tmp_path)
        allowed = frozenset({"check_inbox"})
        first, failed = await run_tool(ctx, "check_inbox", {}, allowed)
        assert not failed and "cut at" not in first
        assert texts[0] in first and texts[1] in first and "part 2" not in first
        assert "more messages may wait" in first
        second, _ = await run_tool(ctx, "check_inbox", {}, allowed)
        assert texts[2] in second and "huge" not in second and "cut at" not in second
        third, _ = await run_tool(ctx, "check_inbox", {}, allowed)
        assert "huge zzz" in third and "cut at" not in third and "part=2" in third
        assert await worker.pending() == 0


async def test_a_message_longer_than_one_answer_is_read_whole_with_read_message(
    server: Server, tmp_path: Path
) -> None:
    """A 100,000-character message was the whole of one ``check_inbox`` answer, and acked:
    past a small model's context (a local server drops what is past its window) its end
    was never read. ``check_inbox`` now answers its first part, in bytes, with the
    ``read_message`` call that gives the next, and the parts joined are the message."""
    from backchannel.runner.tools import (
        DEFAULT_TOOLS,
        MAX_RESULT,
        PART_BYTES,
        ToolContext,
        run_tool,
    )

    tokens = server.team("parts", "worker")
    long = "".join(f"{i:05d} 报告的一行 a line of the report\n" for i in range(2500)) + "LAST"
    with server.client(tokens["user"]) as c:
        r = c.post("/v1/messages", json={"to": "worker", "text": long})
        ident = r.json()["message_id"]
    assert "read_message" in DEFAULT_TOOLS
    async with Client(server.url, tokens["worker"]) as worker:
        session = (await worker.open_session("worker-main")).session_id
        ctx = ToolContext(worker, "worker", session, tmp_path)
        allowed = frozenset(DEFAULT_TOOLS)
        first, failed = await run_tool(ctx, "check_inbox", {}, allowed)
        assert not failed and len(first) <= MAX_RESULT and "LAST" not in first
        assert f"call read_message with message_id={ident!r} and part=2" in first
        assert await worker.pending() == 0  # acked with its first part
        read, part = first.removeprefix("[From user] ").partition("\n(message_id")[0], 1
        while f"part={part + 1}" in first:
            part += 1
            first, failed = await run_tool(
                ctx, "read_message", {"message_id": ident, "part": part}, allowed
            )
            assert not failed and len(first.encode()) <= PART_BYTES + 500
            read += first.removeprefix("[From user] ").partition("\n(message_id")[0]
        assert read == long
        said, failed = await run_tool(
            ctx, "read_message", {"message_id": ident, "part": part + 1}, allowed
        )
        assert failed and f"has {part} parts" in said


async def test_messages_check_inbox_gives_back_keep_their_attempts(
    server: Server, tmp_path: Path
) -> None:
    """Messages behind long ones are leased about as many as fit, not all at once and
    given back at every call: each is handed out at most twice before it is read."""
    from backchannel.runner.tools import MAX_RESULT, ToolContext, run_tool

    tokens = server.team("queue", "worker")
    ids = []
    with server.client(tokens["user"]) as c:
        for i in range(30):
            body = {"to": "worker", "text": f"m{i} " + "x" * (MAX_RESULT * 3 // 10)}
            ids.append(c.post("/v1/messages", json=body).json()["message_id"])
    async with Client(server.url, tokens["worker"]) as worker:
        session = (await worker.open_session("worker-main")).session_id
        ctx = ToolContext(worker, "worker", session, tmp_path)
        read = ""
        for _ in range(30):
            got, _ = await run_tool(ctx, "check_inbox", {}, frozenset({"check_inbox"}))
            if got.startswith("(no messages"):
                break
            read += got
        assert [f"m{i} " in read for i in range(30)] == [True] * 30
    with server.client(tokens["user"]) as c:
        attempts = [c.get(f"/v1/messages/{mid}").json()["deliveries"][0]["attempts"] for mid in ids]
    assert max(attempts) <= 2, attempts
