"""A runtime that runs keeps its sessions; one that is killed loses them.

Real processes: a real ``backchannel serve`` with a short exit grace, and runtimes played
by :mod:`tests.runtimes.stand_in`, each with its own ``backchannel mcp`` child and
command hooks run through a shell. A session with a message waiting for it and no event
for the grace is ended by the hub's ``session_silent`` rule; a runtime idle at its prompt
or in one long tool call reports no event, yet its process is alive and its human comes
back to it."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.runtimes import keeper
from backchannel.runtimes.liveness import RUNTIME_FIELD, running, runtime_key, runtime_keys
from backchannel.testing import eventually_blocking
from tests.conftest import BIN, Server, start_server

from .agents import make_team
from .helpers import fixture

# the exit grace of these tests: a runtime's beats come well within it even on a loaded
# two-core machine running the whole suite (4 s was seen missed there)
GRACE_S = 6
STAND_IN = Path(__file__).with_name("stand_in.py")


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    s = start_server(tmp_path / "home")
    try:
        yield s
    finally:
        s.stop()


class Runtime:
    """One stand-in runtime process of ``member`` (see :mod:`tests.runtimes.stand_in`)."""

    def __init__(
        self, srv: Server, team: str, member: str, token: str, state: Path, setup: str = "stdio"
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
        env |= {"BACKCHANNEL_TOKEN": token, "BACKCHANNEL_STATE_DIR": str(state)}
        self.proc = subprocess.Popen(
            [sys.executable, str(STAND_IN), str(BIN), f"{team}/{member}", srv.url, setup],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: the runtime and its children
        )

    def hook(self, name: str, session: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        payload = fixture("claude-code", name, session_id=session, **fields)
        self.proc.stdin.write(json.dumps(payload) + "\n")
        self.proc.stdin.flush()
        got = json.loads(self.proc.stdout.readline())
        answer: dict[str, Any] = got["answer"]
        return answer

    def kill(self) -> None:
        """``kill -9`` of the runtime and its children (its MCP server)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[list[Runtime]]:
    started: list[Runtime] = []
    yield started
    for r in started:
        r.kill()


def _state(c: httpx.Client, session: str) -> str:
    return str(c.get(f"/v1/sessions/{session}").json()["state"])


def _link_state(c: httpx.Client, peer: str) -> tuple[str, str | None]:
    links = c.get("/v1/links").json()["links"]
    [link] = [x for x in links if peer in (x["initiator"], x["responder"])]
    return link["state"], link.get("close_reason")


@pytest.mark.parametrize(
    ("setup", "busy"),
    [
        ("stdio", False),
        ("stdio", True),
        ("http", False),
        ("http", True),
        ("wrapper", False),
        ("timeout", False),
    ],
    ids=[
        "idle-at-its-prompt",
        "long-tool-call",
        "http-idle-at-its-prompt",
        "http-long-tool-call",
        "mcp-through-a-wrapper-script",
        "mcp-through-timeout",
    ],
)
def test_a_live_runtime_keeps_its_session_and_a_killed_one_ends(
    srv: Server,
    tmp_path: Path,
    runtimes: list[Runtime],
    setup: str,
    busy: bool,
    request: pytest.FixtureRequest,
) -> None:
    """``b``'s runtime lives, idle at its prompt or in one tool call that outlasts the
    exit grace, while ``a``'s crossing waits for it (and ``a``'s runtime, idle too, has
    ``b``'s answer waiting for its next prompt): its session and link stay, and the
    crossing reaches it once it goes on. ``d``'s runtime is killed (``kill -9`` of it and
    its MCP server) while a message waits for its session: the session ends as before.
    The message to ``d`` waits from after ``a``'s crossing, so by the time ``d``'s session
    has ended, the hub has looked at ``b``'s.

    The same in each set-up of :mod:`tests.runtimes.stand_in`: a ``backchannel mcp``
    started directly, through a wrapper script or through ``timeout``, or none at all
    (the HTTP MCP server, with hooks run with ``--keep-alive``, as ``attach --http``
    writes them: a keeper beats instead)."""
    tokens = make_team(
        srv, "t", "a:claude-code", "b:claude-code", "d:claude-code", exit_grace_seconds=GRACE_S
    )
    c = {name: srv.client(token) for name, token in tokens.items()}
    for client in c.values():
        request.addfinalizer(client.close)
    a, b, d = (Runtime(srv, "t", m, tokens[m], tmp_path / f"state-{m}", setup) for m in "abd")
    runtimes += [a, b, d]

    # a links with b; b's turn on it ends
    a.hook("SessionStart", "sa", source="startup")
    a.hook("UserPromptSubmit", "sa", prompt="go")
    b.hook("SessionStart", "sb", source="startup")
    b.hook("UserPromptSubmit", "sb", prompt="go")
    sent = c["a"].post("/v1/messages", json={"to": "b", "text": "hi", "from_session": "sa"})
    sent.raise_for_status()
    b.hook("Stop", "sb", last_assistant_message="b is done")  # continued: it had mail
    b.hook("Stop", "sb", last_assistant_message="")  # the turn ends
    d.hook("SessionStart", "sd", source="startup")
    if busy:  # a tool call that runs past the grace: no event until it ends
        b.hook("UserPromptSubmit", "sb", prompt="build it")
        b.hook("PreToolUse", "sb", tool_name="Bash", tool_input={"command": "make"})

    a.hook("Stop", "sa", last_assistant_message="a's words")  # crosses to b, pinned to sb
    d.kill()
    c["user"].post(
        "/v1/messages", json={"to": "d", "session": "sd", "text": "are you there?"}
    ).raise_for_status()

    eventually_blocking(
        lambda: _state(c["d"], "sd") == "terminated", what="d's session to end", within=60
    )
    assert _state(c["b"], "sb") == ("active" if busy else "idle")
    assert _link_state(c["a"], "b") == ("open", None)

    if busy:
        b.hook("PostToolUse", "sb", tool_name="Bash", tool_response="built")
        answer = b.hook("Stop", "sb", last_assistant_message="built")
    else:
        answer = b.hook("UserPromptSubmit", "sb", prompt="I'm back")
    assert json.dumps(answer).count("a's words") == 1, answer


def test_a_laptop_lid_closed_past_the_grace_ends_no_live_session(
    srv: Server,
    tmp_path: Path,
    runtimes: list[Runtime],
    request: pytest.FixtureRequest,
) -> None:
    """The laptop that runs the hub and ``b``'s runtime sleeps for over twice the exit
    grace (both stopped with SIGSTOP, the runtime's whole process group as a suspended
    job is) while ``a``'s crossing waits for ``b``'s session, then wakes. The hub heard
    no beat while it was stopped itself, so that silence is no sign of death: ``b``'s
    session and link stay, and the crossing reaches it at its next prompt, once. ``d``'s
    runtime was killed before the lid closed, with a message waiting for it: its session
    still ends, a grace after the hub woke (by then the hub has looked at ``b``'s)."""
    tokens = make_team(
        srv, "t", "a:claude-code", "b:claude-code", "d:claude-code", exit_grace_seconds=GRACE_S
    )
    c = {name: srv.client(token) for name, token in tokens.items()}
    for client in c.values():
        request.addfinalizer(client.close)
    a, b, d = (Runtime(srv, "t", m, tokens[m], tmp_path / f"state-{m}") for m in "abd")
    runtimes += [a, b, d]

    a.hook("SessionStart", "sa", source="startup")
    a.hook("UserPromptSubmit", "sa", prompt="go")
    b.hook("SessionStart", "sb", source="startup")
    b.hook("UserPromptSubmit", "sb", prompt="go")
    c["a"].post(
        "/v1/messages", json={"to": "b", "text": "hi", "from_session": "sa"}
    ).raise_for_status()
    b.hook("Stop", "sb", last_assistant_message="b is done")  # continued: it had mail
    b.hook("Stop", "sb", last_assistant_message="")  # the turn ends
    d.hook("SessionStart", "sd", source="startup")
    a.hook("Stop", "sa", last_assistant_message="a's words")  # crosses to b, pinned to sb
    d.kill()
    c["user"].post(
        "/v1/messages", json={"to": "d", "session": "sd", "text": "are you there?"}
    ).raise_for_status()

    os.killpg(b.proc.pid, signal.SIGSTOP)  # the lid closes: everything stops
    srv.proc.send_signal(signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        while time.monotonic() - stopped < 2.5 * GRACE_S:  # the laptop sleeps
            time.sleep(0.5)
    finally:
        srv.proc.send_signal(signal.SIGCONT)  # the lid opens: the hub first, the harder way
        os.killpg(b.proc.pid, signal.SIGCONT)

    eventually_blocking(
        lambda: _state(c["d"], "sd") == "terminated", what="d's session to end", within=60
    )
    assert _state(c["b"], "sb") == "idle"
    assert _link_state(c["a"], "b") == ("open", None)
    answer = b.hook("UserPromptSubmit", "sb", prompt="I'm back")
    assert json.dumps(answer).count("a's words") == 1, answer


def test_a_runtime_suspended_past_the_grace_gets_what_waited_once_when_it_goes_on(
    srv: Server,
    tmp_path: Path,
    runtimes: list[Runtime],
    request: pytest.FixtureRequest,
) -> None:
    """``b``'s runtime alone is suspended (its process group stopped, as Ctrl-Z stops a
    terminal's job) for over the exit grace while ``a``'s crossing waits for ``b``'s
    session. The hub, which ran all along, cannot tell a suspended runtime from a dead
    one: the session ends and the link closes, both sides told (docs/decisions.md, "A
    session that died without saying so"). When the runtime goes on, its next prompt
    gets the crossing, once, with the notice that the link closed: nothing lost,
    nothing twice."""
    tokens = make_team(srv, "t", "a:claude-code", "b:claude-code", exit_grace_seconds=GRACE_S)
    c = {name: srv.client(token) for name, token in tokens.items()}
    for client in c.values():
        request.addfinalizer(client.close)
    a, b = (Runtime(srv, "t", m, tokens[m], tmp_path / f"state-{m}") for m in "ab")
    runtimes += [a, b]
    a.hook("SessionStart", "sa", source="startup")
    a.hook("UserPromptSubmit", "sa", prompt="go")
    b.hook("SessionStart", "sb", source="startup")
    c["a"].post(
        "/v1/messages", json={"to": "b", "text": "hi", "from_session": "sa"}
    ).raise_for_status()
    a.hook("Stop", "sa", last_assistant_message="a's words")  # crosses to b, pinned to sb

    os.killpg(b.proc.pid, signal.SIGSTOP)
    try:
        eventually_blocking(
            lambda: _state(c["b"], "sb") == "terminated", what="b's session to end", within=60
        )
    finally:
        os.killpg(b.proc.pid, signal.SIGCONT)
    assert _link_state(c["a"], "b") == ("closed", "session_silent")

    answer = json.dumps(b.hook("UserPromptSubmit", "sb", prompt="I'm back"))
    assert answer.count("a's words") == 1, answer
    assert "Your link with a is closed" in answer, answer
    again = json.dumps(b.hook("UserPromptSubmit", "sb", prompt="and again"))
    assert "a's words" not in again, again


def test_a_runtime_beats_again_soon_after_the_hub_was_away(
    tmp_path: Path, runtimes: list[Runtime], request: pytest.FixtureRequest
) -> None:
    """The hub goes away for longer than a beat's tries last (10 s: killed and started
    again on its port, as one stopped past the beat's timeout is away) while ``a``'s
    crossing waits for ``b``'s idle session. ``b``'s MCP server tries again at the pace
    the hub last asked for, not a minute later: its session, silent for no more than a
    grace once the hub is back, stays, with its link; ``d``'s, whose runtime was
    killed, ends (by then the hub has looked at ``b``'s)."""
    home = tmp_path / "home"
    srv = start_server(home)
    request.addfinalizer(lambda: srv.stop())
    tokens = make_team(
        srv, "t", "a:claude-code", "b:claude-code", "d:claude-code", exit_grace_seconds=GRACE_S
    )
    a, b, d = (Runtime(srv, "t", m, tokens[m], tmp_path / f"state-{m}") for m in "abd")
    runtimes += [a, b, d]
    a.hook("SessionStart", "sa", source="startup")
    a.hook("UserPromptSubmit", "sa", prompt="go")
    b.hook("SessionStart", "sb", source="startup")
    d.hook("SessionStart", "sd", source="startup")
    with srv.client(tokens["a"]) as c:
        c.post(
            "/v1/messages", json={"to": "b", "text": "hi", "from_session": "sa"}
        ).raise_for_status()
    a.hook("Stop", "sa", last_assistant_message="a's words")  # crosses to b, pinned to sb
    d.kill()
    with srv.client(tokens["user"]) as c:
        c.post(
            "/v1/messages", json={"to": "d", "session": "sd", "text": "are you there?"}
        ).raise_for_status()

    srv.kill()
    away = time.monotonic()
    while time.monotonic() - away < 12:  # longer than a beat's tries (RETRY_WITHIN)
        time.sleep(0.5)
    port = int(srv.url.rsplit(":", 1)[1])
    srv = start_server(home, srv.store_url, port=port)
    request.addfinalizer(lambda: srv.stop())

    c = {name: srv.client(token) for name, token in tokens.items()}
    for client in c.values():
        request.addfinalizer(client.close)
    eventually_blocking(
        lambda: _state(c["d"], "sd") == "terminated", what="d's session to end", within=60
    )
    assert _state(c["b"], "sb") == "idle"
    assert _link_state(c["a"], "b") == ("open", None)


def test_the_hook_and_the_mcp_server_name_the_same_runtime() -> None:
    """The command hook runs through a shell, the MCP server directly: both name the
    process above them that is neither."""
    probe = "from backchannel.runtimes.liveness import runtime_key; print(runtime_key())"
    direct = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    shelled = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c '{probe}'; true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    mine = f"/{os.getpid()}/"
    assert mine in direct and direct == shelled
    assert runtime_key() != direct  # this process's own runtime is another
    assert RUNTIME_FIELD == "backchannel_runtime"


def test_a_key_runs_while_its_process_does_and_not_after() -> None:
    """A beat for a key says its process runs: a process killed (a zombie its parent has
    not reaped yet, then reaped) no longer does, nor does its pid with another start
    time, nor a key from another machine."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        [key] = runtime_keys(proc.pid, 1)
        machine, pid, started = key.split("/")
        assert pid == str(proc.pid) and running(key)
        assert not running(f"{machine}/{pid}/{started}0")
        assert not running(f"another-machine/{pid}/{started}")
        proc.kill()  # not reaped yet: a zombie
        eventually_blocking(lambda: not running(key), what="the killed process to stop")
    finally:
        proc.kill()
        proc.wait(10)
    assert not running(key)


def test_the_mcp_server_behind_a_launcher_names_the_runtime_above_it(tmp_path: Path) -> None:
    """A ``backchannel mcp`` started through a launcher that stays as its parent (a
    wrapper script that does not ``exec``) has the launcher as its nearest ancestor; the
    runtime the hooks name is the next of the keys it beats for."""
    wrapper = tmp_path / "my-launcher"
    wrapper.write_text('#!/bin/sh\n"$@"\n')
    wrapper.chmod(0o700)
    probe = "from backchannel.runtimes.liveness import runtime_keys; print(*runtime_keys())"
    keys = subprocess.run(
        [str(wrapper), sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    mine = f"/{os.getpid()}/"  # this process plays the runtime
    assert mine not in keys[0] and mine in keys[1] and running(keys[1])


def _keepers(key: str) -> list[int]:
    """The pids of the keeper processes that beat for ``key``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"backchannel.runtimes.keeper" in args and key.encode() in args:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="reads /proc")
def test_one_keeper_beats_while_its_runtime_runs_and_leaves_nothing_behind(
    srv: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hooks with ``--keep-alive`` of one runtime process start one keeper between them,
    which the hub hears as that runtime's beat; once the runtime is killed the keeper
    exits and removes its lock file."""
    tokens = make_team(srv, "t", "b:claude-code", exit_grace_seconds=GRACE_S)
    monkeypatch.setenv("BACKCHANNEL_STATE_DIR", str(tmp_path / "state"))
    runtime = subprocess.Popen(["sleep", "600"])  # plays the runtime the hooks run under
    try:
        [key] = runtime_keys(runtime.pid, 1)
        assert keeper.ensure(key, srv.url, tokens["b"])
        eventually_blocking(lambda: len(_keepers(key)) == 1, what="the keeper to start")
        lock = keeper.lock_path(key)
        held = f":{os.stat(lock).st_ino} "  # /proc/locks names the file by its inode
        eventually_blocking(
            lambda: held in Path("/proc/locks").read_text(), what="the keeper's lock"
        )
        for _ in range(3):  # the runtime's later hooks find it running
            assert not keeper.ensure(key, srv.url, tokens["b"])
        assert len(_keepers(key)) == 1
        with srv.client(tokens["b"]) as c:  # the session the hooks named for that runtime
            c.post(
                "/v1/hooks/claude-code",
                json=fixture("claude-code", "SessionStart", session_id="sb", source="startup")
                | {RUNTIME_FIELD: key},
            ).raise_for_status()
            assert c.post("/v1/sessions/alive", json={"runtime": key}).json()["sessions"] == ["sb"]
    finally:
        runtime.kill()
        runtime.wait(10)
    eventually_blocking(lambda: not _keepers(key), what="the keeper to exit", within=30)
    assert not lock.exists()


def test_a_keeper_whose_beat_fails_tries_again_at_the_hubs_last_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A beat that does not go through (the hub away, stopped or restarting) is tried
    again at the pace the hub last asked for, as the MCP server's is, not a minute
    later: a minute could outlast a short exit grace once the hub is back."""
    clock = [0.0]
    beats: list[float] = []
    answers = iter([None, None, 3.0, None, None, 3.0, None])

    def fake_beat(url: str, token: str, key: str) -> float | None:
        beats.append(clock[0])
        return next(answers)

    monkeypatch.setattr(keeper, "beat", fake_beat)
    monkeypatch.setattr(keeper.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(keeper.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(keeper.liveness, "running", lambda key: len(beats) < 7)
    keeper.keep("http://127.0.0.1:9", "tok", "boot/1/2")
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(beats)]
    # before the hub's first answer: soon, doubling; after it: the hub's pace
    assert gaps == [keeper.MIN_BEAT_S, 2 * keeper.MIN_BEAT_S, 3.0, 3.0, 3.0, 3.0]
