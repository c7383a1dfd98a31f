"""The CLI as a user runs it: subprocesses, stdout for data, stderr for talk, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, Server


def run(
    *args: str, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        input=input,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["serve"],
        ["team"],
        ["team", "create"],
        ["member", "add"],
        ["send"],
        ["inbox"],
        ["tail"],
        ["status"],
    ],
)
def test_help_everywhere(args: list[str]) -> None:
    r = run(*args, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout


def test_full_flow_against_a_server(server: Server) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}  # found through server.json, admin token file
    team = run("team", "create", "crew", env=env)
    assert team.returncode == 0, team.stderr
    assert team.stdout.strip().startswith("bc_")  # the user's token, alone, for $(...)
    assert "shown once" in team.stderr
    lead = run("member", "add", "crew", "lead", env=env)
    worker = run("member", "add", "crew", "worker", "--kind", "codex", env=env)
    assert lead.returncode == worker.returncode == 0
    lead_tok, worker_tok = lead.stdout.strip(), worker.stdout.strip()
    assert lead_tok.startswith("bc_")

    sent = run(
        "send",
        "worker",
        "count the files",
        "--id",
        "job-1",
        env={**env, "BACKCHANNEL_TOKEN": lead_tok},
    )
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "job-1"
    piped = run(
        "send", "worker", "-", env={**env, "BACKCHANNEL_TOKEN": lead_tok}, input="from stdin\n"
    )
    assert piped.returncode == 0

    inbox = run("inbox", "--json", env={**env, "BACKCHANNEL_TOKEN": worker_tok})
    assert inbox.returncode == 0, inbox.stderr
    msgs = json.loads(inbox.stdout)
    assert next((m["message_id"], m["from"], m["text"]) for m in msgs) == (
        "job-1",
        "lead",
        "count the files",
    )
    assert msgs[1]["text"] == "from stdin\n"
    empty = run("inbox", env={**env, "BACKCHANNEL_TOKEN": worker_tok})
    assert empty.stdout == ""
    assert "no messages" in empty.stderr

    status = run("status", "job-1", "--json", env={**env, "BACKCHANNEL_TOKEN": lead_tok})
    assert json.loads(status.stdout)["status"] == "acked"

    members = run("member", "list", "crew", env=env)  # the admin's: with where mail goes
    assert members.stdout.splitlines() == [
        "lead\tllm\tpull",
        "user\thuman\tpull",
        "worker\tcodex\tpull",
    ]


def test_failures_exit_nonzero_with_the_way_out(server: Server) -> None:
    env = {"BACKCHANNEL_HOME": str(server.home)}
    run("team", "create", "crew2", env=env)
    tok = run("member", "add", "crew2", "lead", env=env).stdout.strip()
    bad = run("send", "leed", "hi", env={**env, "BACKCHANNEL_TOKEN": tok})
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert "unknown recipient 'leed'" in bad.stderr
    dup = run("team", "create", "crew2", env=env)
    assert dup.returncode == 1
    assert "already exists" in dup.stderr
    notok = run("inbox", env={**env, "BACKCHANNEL_TOKEN": ""})
    assert notok.returncode == 1
    assert "BACKCHANNEL_TOKEN" in notok.stderr
    wrong = run("inbox", env={**env, "BACKCHANNEL_TOKEN": "bc_wrong"})
    assert wrong.returncode == 1
    assert "invalid token" in wrong.stderr


def test_works_on_the_data_directory_without_a_server(tmp_path: Path) -> None:
    env = {"BACKCHANNEL_HOME": str(tmp_path / "home")}
    assert run("init", env=env).returncode == 0
    assert run("team", "create", "solo", env=env).returncode == 0
    a = run("member", "add", "solo", "a", env=env).stdout.strip()
    b = run("member", "add", "solo", "b", env=env).stdout.strip()
    assert run("send", "b", "offline hello", env={**env, "BACKCHANNEL_TOKEN": a}).returncode == 0
    got = run("inbox", env={**env, "BACKCHANNEL_TOKEN": b})
    assert "a (direct): offline hello" in got.stdout
    assert (tmp_path / "home" / "backchannel.db").exists()


def test_serve_reports_a_busy_port(server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]
    r = run("serve", "--port", port, env={"BACKCHANNEL_HOME": str(server.home / "other")})
    assert r.returncode == 1
    assert "cannot listen" in r.stderr
    assert "--port" in r.stderr


def test_sigterm_stops_serve_cleanly(tmp_path: Path) -> None:
    from tests.conftest import start_server

    srv = start_server(tmp_path / "home")
    srv.proc.terminate()
    assert srv.proc.wait(15) == 0
    assert not (srv.home / "server.json").exists(), "the hub said goodbye"
