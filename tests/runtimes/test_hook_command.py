"""The lean ``backchannel hook`` path: a real process against a real ``serve``, loading
no more than it needs, and handing anything unusual to the full CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Server, start_server

from .agents import hook_cmd, make_team
from .helpers import fixture

HEAVY = ("typer", "rich", "httpx", "backchannel.hub", "backchannel.client", "fastapi")

_PROBE = """
import sys
from backchannel.interfaces import launcher
sys.argv = ["backchannel", "hook", "claude-code"]
launcher.main()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {0!r})), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("hookcmd") / "home")
    try:
        yield s
    finally:
        s.stop()


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    return {**env, **extra}


def test_the_hook_loads_neither_the_cli_framework_nor_the_hub(srv: Server) -> None:
    tokens = make_team(srv, "lean", "w:claude-code", "lead")
    with srv.client(tokens["lead"]) as c:
        c.post("/v1/messages", json={"to": "w", "text": "the report is due"}).raise_for_status()
    tops = {m.split(".")[0] for m in HEAVY}
    run = subprocess.run(
        [sys.executable, "-c", "import json\n" + _PROBE.format(sorted(tops))],
        input=json.dumps(fixture("claude-code", "Stop", session_id="lean-1")),
        capture_output=True,
        text=True,
        env=_clean_env(BACKCHANNEL_URL=srv.url, BACKCHANNEL_TOKEN=tokens["w"]),
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["decision"] == "block" and "the report is due" in answer["reason"]
    loaded = set(json.loads(run.stderr.strip().splitlines()[-1]))
    assert not loaded & set(HEAVY), f"the lean hook loaded {sorted(loaded & set(HEAVY))}"


def test_anything_unusual_goes_to_the_full_cli(srv: Server, tmp_path: Path) -> None:
    run = subprocess.run([str(BIN), "hook", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "Usage" in run.stdout, run.stderr
    # no server: the full CLI takes it, and says where to find a hub (it invents no store)
    home = tmp_path / "nohub"
    stop = json.dumps(fixture("claude-code", "Stop"))
    run = hook_cmd(
        "claude-code", stop, env={"BACKCHANNEL_HOME": str(home), "BACKCHANNEL_TOKEN": "x"}
    )
    assert (run.returncode, run.stdout.strip()) == (0, "{}"), run.stderr
    assert "no hub found" in run.stderr
    assert not home.exists()


def test_a_server_json_left_by_a_dead_server_is_not_used(srv: Server, tmp_path: Path) -> None:
    home = tmp_path / "stale"
    home.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    (home / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": pid}))
    stop = json.dumps(fixture("claude-code", "Stop"))
    run = hook_cmd(
        "claude-code", stop, env={"BACKCHANNEL_HOME": str(home), "BACKCHANNEL_TOKEN": "x"}
    )
    assert (run.returncode, run.stdout.strip()) == (0, "{}"), run.stderr
    assert "cannot reach" not in run.stderr  # the dead server's URL was not used
    assert "no hub found" in run.stderr


def test_a_hub_that_hangs_gets_an_answer_within_the_hooks_budget(tmp_path: Path) -> None:
    # a hub that took the connection and then stalls (stopped, wedged, behind a proxy
    # that trickles) must not hold the agent: the runtime kills a hook at its timeout
    # (attach gives 30 s) and shows the agent an error, so the hook gives up well before
    # that, answers {} and says why
    import socket
    import threading
    import time

    from backchannel.interfaces.hook_command import DEADLINE_S
    from backchannel.runtimes.attach import HOOK_TIMEOUT_S

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    done = threading.Event()

    def trickle() -> None:  # reads the request, then one byte of an answer a second
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 600:
                if done.wait(0.5):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    stop = json.dumps(fixture("claude-code", "Stop", session_id="hang-1"))
    began = time.monotonic()
    try:
        run = subprocess.run(
            [str(BIN), "hook", "claude-code"],
            input=stop,
            capture_output=True,
            text=True,
            env=_clean_env(
                BACKCHANNEL_URL=f"http://127.0.0.1:{port}",
                BACKCHANNEL_TOKEN="x",
                BACKCHANNEL_STATE_DIR=str(tmp_path / "state"),
            ),
            timeout=HOOK_TIMEOUT_S - 5,  # a hook still running here is past its budget
        )
    finally:
        done.set()
        listener.close()
    took = time.monotonic() - began
    assert DEADLINE_S < HOOK_TIMEOUT_S / 2
    assert took < DEADLINE_S + 5, took
    assert (run.returncode, run.stdout.strip()) == (0, "{}"), run.stderr
    assert f"did not answer within {DEADLINE_S:g} s" in run.stderr


def test_a_hub_url_with_a_user_and_password_sends_neither_in_the_host_header(
    tmp_path: Path,
) -> None:
    # the hook writes its request by hand: a scheme in capitals is still HTTP, and the
    # URL's ``user:password@`` is not part of the host it names (a proxy or a log in
    # between must not read it there)
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    got: list[bytes] = []

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            got.append(conn.recv(65536))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        run = subprocess.run(
            [str(BIN), "hook", "claude-code"],
            input=json.dumps(fixture("claude-code", "Stop", session_id="creds-1")),
            capture_output=True,
            text=True,
            env=_clean_env(
                BACKCHANNEL_URL=f"HTTP://someone:s3cret@127.0.0.1:{port}",
                BACKCHANNEL_TOKEN="x",
                BACKCHANNEL_STATE_DIR=str(tmp_path / "state"),
            ),
            timeout=60,
        )
        thread.join(10)
    finally:
        listener.close()
    assert run.returncode == 0, run.stderr
    [request] = got
    head = request.split(b"\r\n\r\n")[0].decode("latin-1")
    assert f"\r\nHost: 127.0.0.1:{port}\r\n" in head, head
    assert "s3cret" not in head and "someone" not in head, head


@pytest.mark.parametrize("path", ["lean", "full"])
def test_a_hook_under_a_locale_that_is_not_utf8_reads_its_payload_as_utf8(
    srv: Server, path: str
) -> None:
    """The hook JSON is UTF-8 whatever the locale: a runtime whose environment says
    ``ascii`` (``PYTHONIOENCODING``, or the C locale with UTF-8 mode off) still has its
    accented prompt read, and its answer is valid JSON with the waiting message whole."""
    tokens = make_team(srv, f"loc{path}", "w:claude-code", "lead")
    text = "ça marche 😀"
    with srv.client(tokens["lead"]) as c:
        c.post("/v1/messages", json={"to": "w", "text": text}).raise_for_status()
    payload = fixture("claude-code", "Stop", session_id=f"loc-{path}")
    payload["last_assistant_message"] = "c’est fait ✅"
    args = [str(BIN), "hook", "claude-code"]
    if path == "full":
        args.insert(1, "-v")  # not the plain form: the full CLI takes it
    for locale in (
        {"PYTHONIOENCODING": "ascii"},
        {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
    ):
        env = _clean_env(BACKCHANNEL_URL=srv.url, BACKCHANNEL_TOKEN=tokens["w"])
        for name in ("LANG", "LC_ALL", "LC_CTYPE", "PYTHONIOENCODING", "PYTHONUTF8"):
            env.pop(name, None)
        run = subprocess.run(
            args,
            input=json.dumps(payload, ensure_ascii=False).encode("utf-8"),
            capture_output=True,
            env=env | locale,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        assert b"error" not in run.stderr, (locale, run.stderr.decode("utf-8", "replace"))
        answer = json.loads(run.stdout)
        if "PYTHONIOENCODING" in locale:  # the first call handed the message over
            assert answer["decision"] == "block" and text in answer["reason"], answer
        payload["session_id"] += "-again"
