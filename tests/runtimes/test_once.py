"""Into the model exactly once: what a hook answer hands over stays leased until the
session's next event settles it; a copy the session already has is never shown again."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backchannel.hub import Hub
from backchannel.runtimes import seen
from backchannel.testing import FakeClock
from tests.conftest import Server, start_server

from .agents import hook_cmd, hook_http, make_team
from .helpers import PROMPT_EVENT, STOP_EVENT, call, fixture, session_of

RUNTIMES = ["claude-code", "codex", "gemini"]
TOOL_EVENT = {"claude-code": "PreToolUse", "codex": "PreToolUse", "gemini": "BeforeTool"}


async def _team(hub: Hub, runtime: str) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "w", runtime)
    await hub.add_member("t", "lead")


async def _state(hub: Hub, mid: str) -> tuple[str, list[str]]:
    status = await hub.message_status("t", mid)
    copy = next(d for d in status.deliveries if d.recipient.member == "w")
    return copy.state.value, [h.event for h in status.history if h.member == "w"]


def _continued(runtime: str, answer: dict[str, Any]) -> str:
    if "hookSpecificOutput" in answer:
        return str(answer["hookSpecificOutput"]["additionalContext"])
    return str(answer.get("reason", ""))


async def _handed_at_stop(hub: Hub, runtime: str, text: str, **stop: Any) -> str:
    """A turn whose stop answer hands ``text`` over; returns the message id."""
    await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime], **stop))
    sent = await hub.send("t", "lead", "w", text)
    result = await call(hub, "t", "w", runtime, fixture(runtime, STOP_EVENT[runtime], **stop))
    assert text in _continued(runtime, result.answer)
    assert result.delivered == (sent.message_id,)
    return sent.message_id


# -- without a record (HTTP hooks): the event itself settles ---------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_the_next_event_acks_what_the_stop_answer_handed_over(hub: Hub, runtime: str) -> None:
    await _team(hub, runtime)
    mid = await _handed_at_stop(hub, runtime, "also count the tests")
    assert (await _state(hub, mid))[0] == "leased"
    await call(hub, "t", "w", runtime, fixture(runtime, TOOL_EVENT[runtime]))
    assert await _state(hub, mid) == ("acked", ["queued", "leased", "acked"])
    # the rest of the turn changes nothing, and the copy never comes again
    await call(hub, "t", "w", runtime, fixture(runtime, TOOL_EVENT[runtime]))
    end = await call(hub, "t", "w", runtime, fixture(runtime, STOP_EVENT[runtime]))
    assert end.answer == {}
    assert await _state(hub, mid) == ("acked", ["queued", "leased", "acked"])


async def test_gemini_repeating_before_agent_for_the_continuation_acks_it(hub: Hub) -> None:
    await _team(hub, "gemini")
    mid = await _handed_at_stop(hub, "gemini", "also count the tests")
    again = await call(hub, "t", "w", "gemini", fixture("gemini", "BeforeAgent", prompt="x"))
    assert again.answer == {}
    assert (await _state(hub, mid))[0] == "acked"


@pytest.mark.parametrize("runtime", ["claude-code", "codex"])
async def test_a_new_prompt_after_a_stop_answer_gives_it_back(hub: Hub, runtime: str) -> None:
    # the stop hook's answer never reached the runtime (its process died): the session
    # stopped, and the user's next prompt opens a turn (the hub still ran the
    # continuation, so that turn is a retry); its stop is the next chance
    await _team(hub, runtime)
    mid = await _handed_at_stop(hub, runtime, "also count the tests")
    prompt = await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime]))
    assert prompt.answer == {}
    assert (await _state(hub, mid))[0] == "queued"
    stop = await call(hub, "t", "w", runtime, fixture(runtime, STOP_EVENT[runtime]))
    assert "[From lead] also count the tests" in _continued(runtime, stop.answer)
    assert stop.delivered == (mid,)
    await call(hub, "t", "w", runtime, fixture(runtime, TOOL_EVENT[runtime]))
    state, history = await _state(hub, mid)
    assert (state, history.count("acked"), history.count("released")) == ("acked", 1, 1)


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_session_that_dies_before_its_next_event_gets_it_after_the_lease(
    hub: Hub, clock: FakeClock, runtime: str
) -> None:
    await _team(hub, runtime)
    mid = await _handed_at_stop(hub, runtime, "also count the tests")
    clock.advance(31)  # the hub's lease in these tests is 30 s
    await hub.maintain()
    assert (await _state(hub, mid))[0] == "queued"
    # resumed: SessionStart proves nothing; the next prompt hands the copy over again
    resumed = fixture(runtime, "SessionStart", source="resume")
    await call(hub, "t", "w", runtime, resumed)
    prompt = await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime]))
    assert "also count the tests" in prompt.answer["hookSpecificOutput"]["additionalContext"]
    await call(hub, "t", "w", runtime, fixture(runtime, STOP_EVENT[runtime]))
    assert (await _state(hub, mid))[0] == "acked"


async def test_session_end_right_after_a_stop_answer_gives_it_back(hub: Hub) -> None:
    await _team(hub, "codex")
    mid = await _handed_at_stop(hub, "codex", "also count the tests")
    await call(hub, "t", "w", "codex", fixture("codex", "SessionEnd"))
    assert (await _state(hub, mid))[0] == "queued"


# -- with the command hook's record --------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_copy_the_record_shows_is_never_shown_again(
    hub: Hub, clock: FakeClock, runtime: str
) -> None:
    await _team(hub, runtime)
    mid = await _handed_at_stop(hub, runtime, "also count the tests", backchannel_had=[])
    other = await hub.send("t", "lead", "w", "a second note")
    # the runtime took the answer in and the hook recorded it, then the process died
    # before its next event; the lease runs out
    clock.advance(31)
    await hub.maintain()
    assert (await _state(hub, mid))[0] == "queued"
    had = {seen.HAD_FIELD: [mid]}
    await call(hub, "t", "w", runtime, fixture(runtime, "SessionStart", source="resume", **had))
    prompt = await call(hub, "t", "w", runtime, fixture(runtime, PROMPT_EVENT[runtime], **had))
    context = prompt.answer["hookSpecificOutput"]["additionalContext"]
    assert "a second note" in context and "also count the tests" not in context
    assert prompt.delivered == (other.message_id,)
    assert (await _state(hub, mid))[0] == "acked"


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_an_answer_the_record_lacks_was_never_printed_and_comes_again(
    hub: Hub, runtime: str
) -> None:
    await _team(hub, runtime)
    mid = await _handed_at_stop(hub, runtime, "also count the tests", backchannel_had=[])
    # the next event says the session was shown nothing: the hook died before printing
    # (for a stop answer the runtime then stops; its next stop is the next chance)
    tool = fixture(runtime, TOOL_EVENT[runtime], backchannel_had=[])
    await call(hub, "t", "w", runtime, tool)
    assert (await _state(hub, mid))[0] == "queued"
    stop = fixture(runtime, STOP_EVENT[runtime], backchannel_had=[])
    result = await call(hub, "t", "w", runtime, stop)
    assert "also count the tests" in _continued(runtime, result.answer)
    await call(hub, "t", "w", runtime, fixture(runtime, TOOL_EVENT[runtime], backchannel_had=[mid]))
    assert (await _state(hub, mid))[0] == "acked"


@pytest.mark.parametrize("runtime", ["claude-code", "gemini"])
async def test_a_prompt_answer_is_settled_the_same_way(hub: Hub, runtime: str) -> None:
    await _team(hub, runtime)
    sent = await hub.send("t", "lead", "w", "the build is red")
    first = fixture(runtime, PROMPT_EVENT[runtime], backchannel_had=[])
    prompt = await call(hub, "t", "w", runtime, first)
    assert prompt.delivered == (sent.message_id,)
    assert (await _state(hub, sent.message_id))[0] == "leased"
    had = [sent.message_id]
    await call(hub, "t", "w", runtime, fixture(runtime, TOOL_EVENT[runtime], backchannel_had=had))
    assert (await _state(hub, sent.message_id))[0] == "acked"


# -- the record itself -------------------------------------------------------------------


def test_the_record_is_private_bounded_and_per_session(tmp_path: Path) -> None:
    os.environ["BACKCHANNEL_STATE_DIR"] = str(tmp_path / "state")
    try:
        assert seen.recorded("claude-code", "s-1") == []
        seen.remember("claude-code", "s-1", ["m-1", "m-2"])
        seen.remember("claude-code", "s-1", ["m-2", "m-3"])
        assert seen.recorded("claude-code", "s-1") == ["m-1", "m-2", "m-3"]
        assert seen.recorded("claude-code", "s-2") == seen.recorded("codex", "s-1") == []
        seen.remember("claude-code", "s-1", [f"x-{i}" for i in range(seen.KEEP + 5)])
        kept = seen.recorded("claude-code", "s-1")
        assert len(kept) == seen.KEEP and kept[-1] == f"x-{seen.KEEP + 4}"
        folder = tmp_path / "state"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        files = list(folder.iterdir())
        assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
        payload = seen.add_record("claude-code", {"session_id": "s-2"})
        assert payload == {"session_id": "s-2", seen.HAD_FIELD: []}
        files[0].write_text("not json")
        assert seen.recorded("claude-code", "s-1") == []  # unreadable counts as empty
    finally:
        del os.environ["BACKCHANNEL_STATE_DIR"]


def _remember_many(state: str, who: int, start: Any, count: int) -> None:
    os.environ["BACKCHANNEL_STATE_DIR"] = state
    start.wait()
    for i in range(count):
        seen.remember("claude-code", "s-1", [f"p{who}-{i}"])


def test_hook_processes_of_one_session_at_once_lose_no_id_of_the_record(tmp_path: Path) -> None:
    # a Stop hook and a UserPromptSubmit hook (or two of any kind) of one session may
    # run at once: each adds what it printed, and neither may drop what the other added
    # (an id missing from the record is handed over, and shown, again)
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers, count = 6, 25
    assert writers * count <= seen.KEEP
    procs = [
        ctx.Process(target=_remember_many, args=(str(tmp_path / "state"), w, start, count))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    os.environ["BACKCHANNEL_STATE_DIR"] = str(tmp_path / "state")
    try:
        kept = set(seen.recorded("claude-code", "s-1"))
    finally:
        del os.environ["BACKCHANNEL_STATE_DIR"]
    lost = {f"p{w}-{i}" for w in range(writers) for i in range(count)} - kept
    assert not lost, f"{len(lost)} id(s) dropped from the record: {sorted(lost)[:5]}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("once") / "home")
    try:
        yield s
    finally:
        s.stop()


def test_the_state_directories_it_creates_are_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BACKCHANNEL_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    seen.remember("claude-code", "s-1", ["m-1"])
    assert seen.recorded("claude-code", "s-1") == ["m-1"]
    made = [tmp_path / ".local", tmp_path / ".local" / "state"]
    made += [made[-1] / "backchannel", made[-1] / "backchannel" / "seen"]
    assert [oct(stat.S_IMODE(d.stat().st_mode)) for d in made] == [oct(0o700)] * 4


def test_the_command_hook_records_what_it_printed_and_sends_it_along(
    srv: Server, tmp_path: Path
) -> None:
    tokens = make_team(srv, "once", "w:claude-code", "lead")
    env = {
        "BACKCHANNEL_URL": srv.url,
        "BACKCHANNEL_TOKEN": tokens["w"],
        "BACKCHANNEL_STATE_DIR": str(tmp_path / "state"),
    }
    sid = "once-1"

    def hook(name: str, **changes: Any) -> dict[str, Any]:
        run = hook_cmd("claude-code", json.dumps(fixture("claude-code", name, **changes)), env=env)
        assert run.returncode == 0, run.stderr
        answer: dict[str, Any] = json.loads(run.stdout)
        return answer

    assert hook("UserPromptSubmit", session_id=sid) == {}
    with srv.client(tokens["lead"]) as c:
        r = c.post("/v1/messages", json={"to": "w", "text": "the report is due"})
        mid = r.json()["message_id"]
    answer = hook("Stop", session_id=sid)
    assert "the report is due" in answer["reason"]
    os.environ["BACKCHANNEL_STATE_DIR"] = env["BACKCHANNEL_STATE_DIR"]
    try:
        assert seen.recorded("claude-code", sid) == [mid]
    finally:
        del os.environ["BACKCHANNEL_STATE_DIR"]

    def state() -> str:
        with srv.client(tokens["lead"]) as c:
            body = c.get(f"/v1/messages/{mid}").json()
        return str(body["deliveries"][0]["state"])

    assert state() == "leased"
    assert hook("PreToolUse", session_id=sid) == {}
    assert state() == "acked"


def test_session_of_is_what_the_fixtures_share() -> None:
    # the tests above drive each runtime's fixtures as one session
    for runtime in RUNTIMES:
        sid = session_of(runtime)
        assert fixture(runtime, STOP_EVENT[runtime])["session_id"] == sid
        assert fixture(runtime, TOOL_EVENT[runtime])["session_id"] == sid


class _Held:
    """A loopback TCP proxy to the hub that passes requests on at once but holds the
    hub's answers until :meth:`release`: a hook whose answer is on its way back."""

    def __init__(self, url: str) -> None:
        import socket
        import threading
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._open = threading.Event()
        self.answered = threading.Event()  # the hub's answer reached the proxy
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target, timeout=30)

            def up(a: socket.socket = client, b: socket.socket = upstream) -> None:
                with contextlib.suppress(OSError):
                    while data := a.recv(65536):
                        b.sendall(data)

            def down(a: socket.socket = upstream, b: socket.socket = client) -> None:
                held = b""
                with contextlib.suppress(OSError):
                    while data := a.recv(65536):
                        held += data
                        self.answered.set()
                self._open.wait(60)
                with contextlib.suppress(OSError):
                    b.sendall(held)
                    b.shutdown(socket.SHUT_RDWR)

            threading.Thread(target=up, daemon=True).start()
            threading.Thread(target=down, daemon=True).start()

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.set()
        self._listener.close()


def test_a_hook_of_the_session_running_while_an_answer_is_on_its_way_does_not_give_it_back(
    srv: Server, tmp_path: Path
) -> None:
    # the Stop hook's answer hands a message over and is on its way to the hook when a
    # UserPromptSubmit hook of the same session starts: that one must not read the
    # record before the Stop hook wrote it, or it tells the hub the message was never
    # shown, the hub puts it back, and the session is shown it twice
    import subprocess
    import time

    from backchannel.testing import eventually_blocking
    from tests.conftest import BIN

    tokens = make_team(srv, "held", "w:claude-code", "lead")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")},
        "BACKCHANNEL_TOKEN": tokens["w"],
        "BACKCHANNEL_STATE_DIR": str(tmp_path / "state"),
    }
    sid = "held-1"

    def start(name: str, url: str) -> subprocess.Popen[str]:
        payload = json.dumps(fixture("claude-code", name, session_id=sid))
        return subprocess.Popen(
            [str(BIN), "hook", "claude-code", payload],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "BACKCHANNEL_URL": url},
        )

    def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        answer: dict[str, Any] = json.loads(out)
        return answer

    assert finish(start("UserPromptSubmit", srv.url)) == {}
    with srv.client(tokens["lead"]) as c:
        mid = c.post("/v1/messages", json={"to": "w", "text": "the report is due"}).json()[
            "message_id"
        ]
    held = _Held(srv.url)
    try:
        stop = start("Stop", held.url)
        eventually_blocking(held.answered.is_set, what="the hub to answer the Stop hook")
        prompt = start("UserPromptSubmit", srv.url)
        until = time.monotonic() + 3  # its chance to reach the hub before the Stop hook prints
        while prompt.poll() is None and time.monotonic() < until:
            time.sleep(0.05)
        held.release()
        assert "the report is due" in finish(stop)["reason"]
        finish(prompt)
    finally:
        held.close()
    with srv.client(tokens["lead"]) as c:
        body = c.get(f"/v1/messages/{mid}").json()
    history = [h["event"] for h in body["history"] if h["to"] == "w"]
    assert (body["deliveries"][0]["state"], history) == ("acked", ["queued", "leased", "acked"])


# -- a hub restarted between an answer and the events that settle it --------------------


class _Restartable:
    """A real ``backchannel serve`` on its own SQLite file, restarted in place."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.srv = start_server(home)

    def restart(self) -> None:
        self.srv.stop()
        self.srv = start_server(self.home)

    def hook(self, token: str, name: str, **fields: Any) -> dict[str, Any]:
        return hook_http(self.srv, token, "claude-code", fixture("claude-code", name, **fields))

    def copy_of(self, token: str, mid: str) -> tuple[str, list[str]]:
        with self.srv.client(token) as c:
            body = c.get(f"/v1/messages/{mid}").json()
        history = [h["event"] for h in body["history"] if h["to"] == "w"]
        return body["deliveries"][0]["state"], history


@pytest.fixture
def hub_home(tmp_path: Path) -> Iterator[_Restartable]:
    hub = _Restartable(tmp_path / "home")
    try:
        yield hub
    finally:
        hub.srv.stop()


def _stop_answer(hub: _Restartable, tokens: dict[str, str], text: str) -> str:
    """A turn of ``w`` (plain HTTP hooks) whose ``Stop`` answer hands ``text`` over."""
    assert hub.hook(tokens["w"], "UserPromptSubmit") == {}
    with hub.srv.client(tokens["lead"]) as c:
        mid = str(c.post("/v1/messages", json={"to": "w", "text": text}).json()["message_id"])
    assert text in hub.hook(tokens["w"], "Stop")["reason"]
    return mid


def test_a_hub_restarted_before_the_continuations_first_event_settles_the_answer_once(
    hub_home: _Restartable,
) -> None:
    tokens = make_team(hub_home.srv, "t", "w:claude-code", "lead")
    mid = _stop_answer(hub_home, tokens, "also count the tests")
    hub_home.restart()
    assert hub_home.hook(tokens["w"], "PreToolUse") == {}
    assert hub_home.copy_of(tokens["lead"], mid) == ("acked", ["queued", "leased", "acked"])
    hub_home.restart()
    # the rest of the continuation, and the session's end, change nothing
    assert hub_home.hook(tokens["w"], "PostToolUse") == {}
    assert hub_home.hook(tokens["w"], "Stop", last_assistant_message="Counted.") == {}
    assert hub_home.hook(tokens["w"], "SessionEnd") == {}
    assert hub_home.copy_of(tokens["lead"], mid) == ("acked", ["queued", "leased", "acked"])


def test_an_answer_given_back_before_a_hub_restart_is_not_taken_as_had_after_it(
    hub_home: _Restartable,
) -> None:
    # the Stop answer never ran: the runtime was started again (resume) before the
    # continuation's first event, which gives the copy back. The hub restarts; the
    # resumed session is compacted (/compact), which after an answer shows the model had
    # it, but this answer was settled already: the copy must wait for the next answer,
    # not be acked unseen
    tokens = make_team(hub_home.srv, "t", "w:claude-code", "lead")
    mid = _stop_answer(hub_home, tokens, "also count the tests")
    assert "hookSpecificOutput" in hub_home.hook(tokens["w"], "SessionStart", source="resume")
    assert hub_home.copy_of(tokens["lead"], mid)[0] == "queued"
    hub_home.restart()
    hub_home.hook(tokens["w"], "SessionStart", source="compact")
    assert hub_home.copy_of(tokens["lead"], mid)[0] == "queued"
    prompt = hub_home.hook(tokens["w"], "UserPromptSubmit")
    assert "also count the tests" in prompt["hookSpecificOutput"]["additionalContext"]
    assert hub_home.hook(tokens["w"], "PreToolUse") == {}
    state, history = hub_home.copy_of(tokens["lead"], mid)
    assert (state, history.count("acked"), history.count("released")) == ("acked", 1, 1)


def _transcript_of_a_prompt(path: Path, context: str, after: list[dict[str, Any]]) -> None:
    """A Claude Code transcript whose last prompt got ``context`` from its
    ``UserPromptSubmit`` hook, followed by the entries ``after``."""
    entries: list[dict[str, Any]] = [
        {"type": "user", "uuid": "u1", "message": {"role": "user", "content": "PROMPT-ONE"}},
        {
            "type": "attachment",
            "uuid": "a1",
            "parentUuid": "u1",
            "attachment": {
                "type": "hook_additional_context",
                "hookName": "UserPromptSubmit",
                "hookEvent": "UserPromptSubmit",
                "content": [context],
            },
        },
        {"type": "api-request"},
        *after,
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))


INTERRUPTED = {
    "type": "user",
    "uuid": "u2",
    "parentUuid": "a1",
    "message": {
        "role": "user",
        "content": [{"type": "text", "text": "[Request interrupted by user]"}],
    },
}


@pytest.mark.parametrize(("after", "again"), [([], True), ([INTERRUPTED], False)])
def test_a_prompt_taken_back_before_any_answer_gets_its_messages_again(
    srv: Server, tmp_path: Path, after: list[dict[str, Any]], again: bool
) -> None:
    """Esc before Claude Code's model answered puts the prompt back in the input, with
    the context its ``UserPromptSubmit`` hook added: the model never saw the messages the
    hook handed over, and the next turn's ``Stop`` hands them over again. Esc after the
    answer began keeps the prompt and its context (and says "[Request interrupted by
    user]"): they are not handed over twice."""
    tokens = make_team(srv, f"back-{again}", "w:claude-code", "lead")
    home = tmp_path / "home"
    env = {
        "BACKCHANNEL_URL": srv.url,
        "BACKCHANNEL_TOKEN": tokens["w"],
        "BACKCHANNEL_STATE_DIR": str(tmp_path / "state"),
        "HOME": str(home),
    }
    sid = f"back-{again}"
    transcript = home / ".claude" / "projects" / "-proj" / f"{sid}.jsonl"

    def hook(name: str, **changes: Any) -> dict[str, Any]:
        payload = fixture("claude-code", name, session_id=sid, **changes)
        payload["transcript_path"] = str(transcript)
        run = hook_cmd("claude-code", json.dumps(payload), env=env)
        assert run.returncode == 0, run.stderr
        assert "backchannel hook" not in run.stderr, run.stderr
        answer: dict[str, Any] = json.loads(run.stdout)
        return answer

    with srv.client(tokens["lead"]) as c:
        mid = c.post("/v1/messages", json={"to": "w", "text": "MARK: the build is red"}).json()[
            "message_id"
        ]
    context = hook("UserPromptSubmit")["hookSpecificOutput"]["additionalContext"]
    assert "[From lead] MARK: the build is red" in context
    _transcript_of_a_prompt(transcript, context, after)

    hook("UserPromptSubmit")  # the user's next prompt, after Esc
    answer = hook("Stop", last_assistant_message="Noted.")
    handed = json.dumps(answer)
    assert ("[From lead] MARK: the build is red" in handed) is again, answer
    hook("PreToolUse")  # the continuation goes on: what it was handed is acked
    with srv.client(tokens["lead"]) as c:
        status = c.get(f"/v1/messages/{mid}").json()
    events = [h["event"] for h in status["history"]]
    assert status["deliveries"][0]["state"] == "acked"
    assert events.count("leased") == (2 if again else 1), events


@pytest.mark.parametrize("kept", [False, True])
def test_a_continuation_killed_before_claude_code_kept_it_comes_again_on_resume(
    srv: Server, tmp_path: Path, kept: bool
) -> None:
    """Claude Code killed while its model works on what a ``Stop`` answer handed over
    writes nothing of that continuation to its transcript, so the conversation
    ``claude --resume`` rebuilds never had it: the resume's ``SessionStart`` gives it
    back and the next prompt hands it over again. A continuation the transcript keeps is
    in the resumed conversation: it is not handed over twice."""
    tokens = make_team(srv, f"killed-{kept}", "w:claude-code", "lead")
    home = tmp_path / "home"
    env = {
        "BACKCHANNEL_URL": srv.url,
        "BACKCHANNEL_TOKEN": tokens["w"],
        "BACKCHANNEL_STATE_DIR": str(tmp_path / "state"),
        "HOME": str(home),
    }
    sid = f"killed-{kept}"
    transcript = home / ".claude" / "projects" / "-proj" / f"{sid}.jsonl"
    transcript.parent.mkdir(parents=True)
    transcript.write_text(json.dumps({"type": "user", "uuid": "u1"}) + "\n")

    def hook(name: str, **changes: Any) -> dict[str, Any]:
        payload = fixture("claude-code", name, session_id=sid, **changes)
        payload["transcript_path"] = str(transcript)
        run = hook_cmd("claude-code", json.dumps(payload), env=env)
        assert run.returncode == 0, run.stderr
        answer: dict[str, Any] = json.loads(run.stdout)
        return answer

    hook("UserPromptSubmit")
    with srv.client(tokens["lead"]) as c:
        r = c.post("/v1/messages", json={"to": "w", "text": "MARK: the build is red"})
        mid = r.json()["message_id"]
    answer = hook("Stop", last_assistant_message="Noted.")
    context = _continued("claude-code", answer)
    assert "[From lead] MARK: the build is red" in context
    if kept:  # Claude Code went on with it and wrote it down, then was killed
        entry = {
            "type": "attachment",
            "uuid": "a2",
            "attachment": {
                "type": "hook_additional_context",
                "content": [context],
                "hookName": "Stop",
                "hookEvent": "Stop",
            },
        }
        with transcript.open("a") as f:
            f.write(json.dumps(entry) + "\n")
    hook("SessionStart", source="resume")  # a new process, the turn crashed
    again = hook("UserPromptSubmit")
    handed = json.dumps(again)
    assert ("[From lead] MARK: the build is red" in handed) is not kept, again
    hook("Stop", last_assistant_message="Done.")
    with srv.client(tokens["lead"]) as c:
        status = c.get(f"/v1/messages/{mid}").json()
    events = [h["event"] for h in status["history"]]
    assert status["deliveries"][0]["state"] == "acked"
    assert events.count("leased") == (1 if kept else 2), events
