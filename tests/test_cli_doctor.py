"""``backchannel doctor``: a project's attachment checked end to end against a real
``backchannel serve`` (the MCP server started for real), with what to fix."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Server, start_server
from tests.runtimes.agents import make_team

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("doctor") / "home")
    try:
        yield s
    finally:
        s.stop()


def _run(
    project: Path, *args: str, token: str | None, home: Path
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BACKCHANNEL_TOKEN", "BACKCHANNEL_URL")}
    env |= {
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "PATH": f"{BIN.parent}:{env['PATH']}",
    }
    if token:
        env["BACKCHANNEL_TOKEN"] = token
    return subprocess.run(
        [str(BIN), *args], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )


def _attach(srv: Server, project: Path, runtime: str, home: Path, *extra: str) -> None:
    project.mkdir(exist_ok=True)
    run = _run(project, "attach", runtime, "--team", "doc", "--member", "alice", "--url", srv.url,
               *extra, token=None, home=home)  # fmt: skip
    assert run.returncode == 0, run.stderr


@pytest.fixture(scope="module")
def tokens(srv: Server) -> dict[str, str]:
    return make_team(srv, "doc", "alice:claude-code", "bob")


def test_a_sound_attachment_passes_every_check(
    srv: Server, tokens: dict[str, str], tmp_path: Path
) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    _attach(srv, project, "claude-code", home)
    run = _run(project, "doctor", "claude-code", token=tokens["alice"], home=home)
    assert run.returncode == 0, run.stdout + run.stderr
    for line in ("ok   hub reachable", "ok   token's member", "ok   hooks registered",
                 "ok   MCP server lists its tools"):  # fmt: skip
        assert line in run.stdout


def test_another_members_token_and_no_token_fail_with_the_fix(
    srv: Server, tokens: dict[str, str], tmp_path: Path
) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    _attach(srv, project, "claude-code", home)
    wrong = _run(project, "doctor", token=tokens["bob"], home=home)
    assert wrong.returncode == 1
    assert "FAIL token's member: token of doc/bob, attached as doc/alice" in wrong.stdout
    assert "fix: export the token of doc/alice as BACKCHANNEL_TOKEN" in wrong.stdout
    none = _run(project, "doctor", token=None, home=home)
    assert none.returncode == 1 and "BACKCHANNEL_TOKEN is not set" in none.stdout


def test_codex_untrusted_hooks_fail_until_granted(
    srv: Server, tokens: dict[str, str], tmp_path: Path
) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    _attach(srv, project, "codex", home)
    before = _run(project, "doctor", "codex", token=tokens["alice"], home=home)
    assert before.returncode == 1
    assert "FAIL hooks trusted (Codex)" in before.stdout and "--trust-hooks" in before.stdout
    assert "FAIL project trusted (Codex)" in before.stdout
    _attach(srv, project, "codex", home, "--trust-hooks")
    config = home / ".codex" / "config.toml"
    config.write_text(
        config.read_text() + f'\n[projects."{project.resolve()}"]\ntrust_level = "trusted"\n'
    )
    after = _run(project, "doctor", "codex", token=tokens["alice"], home=home)
    assert after.returncode == 0, after.stdout
    assert "ok   sessions in their own process (Codex)" in after.stdout


def test_a_member_whose_push_target_is_down_is_listed_with_the_way_out(
    srv: Server, tmp_path: Path
) -> None:
    # the circuit as the hub that owns bob's push stored it (schema 17); the hub doctor
    # asks reads it from the store, whichever hub found the target down
    tokens = make_team(srv, "pushdown", "alice:claude-code", "bob")
    project, home = tmp_path / "p", tmp_path / "home"
    project.mkdir()
    run = _run(project, "attach", "claude-code", "--team", "pushdown", "--member", "alice",
               "--url", srv.url, token=None, home=home)  # fmt: skip
    assert run.returncode == 0, run.stderr
    sound = _run(project, "doctor", "claude-code", token=tokens["alice"], home=home)
    assert "ok   push delivery: no member of pushdown has its push target down" in sound.stdout
    state = {
        "state": "down", "target": "webhook to service 'bot'/backchannel/deliver",
        "reason": "gave up after 3 attempt(s): connection refused", "down_since": 1.7e9,
        "next_probe_at": 1.7e9 + 5, "probes": 0, "dead_lettered": 2, "probe_interval": 5.0,
    }  # fmt: skip
    db = sqlite3.connect(srv.home / "backchannel.db", isolation_level=None)
    try:
        db.execute(
            "INSERT INTO push_circuits (team, member, state) VALUES ('pushdown', 'bob', ?)",
            (json.dumps(state),),
        )
    finally:
        db.close()
    down = _run(project, "doctor", "claude-code", token=tokens["alice"], home=home)
    assert down.returncode == 1
    line = next(x for x in down.stdout.splitlines() if "push delivery" in x)
    assert line.startswith("  FAIL push delivery: down for 1 member(s) of pushdown")
    assert "bob: webhook to service 'bot'/backchannel/deliver down since" in line
    assert "connection refused" in line
    assert "fix: bring the target back" in down.stdout
    assert "change the member's delivery setting" in down.stdout


def test_a_project_not_attached_says_how(tmp_path: Path) -> None:
    run = _run(tmp_path, "doctor", token=None, home=tmp_path)
    assert run.returncode == 1 and "backchannel attach" in run.stderr


def test_a_hub_that_is_gone_fails_reachability(tokens: dict[str, str], tmp_path: Path) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    project.mkdir()
    run = _run(project, "attach", "claude-code", "--team", "doc", "--member", "alice",
               "--url", "http://127.0.0.1:9", token=None, home=home)  # fmt: skip
    assert run.returncode == 0
    gone = _run(project, "doctor", token=tokens["alice"], home=home)
    assert gone.returncode == 1 and "FAIL hub reachable" in gone.stdout


def test_gemini_folder_trust_is_checked(
    srv: Server, tokens: dict[str, str], tmp_path: Path
) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    _attach(srv, project, "gemini", home)
    before = _run(project, "doctor", "gemini", token=tokens["alice"], home=home)
    assert before.returncode == 1 and "FAIL folder trusted (Gemini)" in before.stdout
    assert "ok   MCP server trusted (Gemini)" in before.stdout
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "trustedFolders.json").write_text(
        f'{{"{project.resolve()}": "TRUST_FOLDER"}}'
    )
    after = _run(project, "doctor", "gemini", token=tokens["alice"], home=home)
    assert after.returncode == 0, after.stdout


def test_gemini_without_escaped_pasted_at_fails_with_the_fix(
    srv: Server, tokens: dict[str, str], tmp_path: Path
) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    _attach(srv, project, "gemini", home)
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "trustedFolders.json").write_text(
        f'{{"{project.resolve()}": "TRUST_FOLDER"}}'
    )
    assert _run(project, "doctor", "gemini", token=tokens["alice"], home=home).returncode == 0
    # an attachment from before attach wrote the setting, or the user turned it off
    path = project / ".gemini" / "settings.json"
    settings = json.loads(path.read_text())
    settings["ui"]["escapePastedAtSymbols"] = False
    path.write_text(json.dumps(settings))
    off = _run(project, "doctor", "gemini", token=tokens["alice"], home=home)
    assert off.returncode == 1 and "FAIL pasted @ escaped (Gemini)" in off.stdout
    assert "backchannel attach gemini" in off.stdout


@pytest.mark.parametrize("printed_by", ["attach", "doctor"])
def test_the_printed_codex_trust_grant_runs_as_printed_from_another_directory(
    srv: Server, tokens: dict[str, str], tmp_path: Path, printed_by: str
) -> None:
    """The one-time hook grant `attach` and `doctor` print, pasted in the terminal the
    user is in (not the project), trusts the project's hooks and keeps an HTTP
    attachment one: it neither attaches the current directory nor rewrites the project
    to command hooks and a stdio MCP server."""
    project, home, elsewhere = tmp_path / "p", tmp_path / "home", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    attached = _run(elsewhere, "attach", "codex", "--team", "doc", "--member", "alice",
                    "--url", srv.url, "--dir", str(project), "--http", token=None, home=home)  # fmt: skip
    assert attached.returncode == 0, attached.stderr
    if printed_by == "attach":
        said = attached.stderr
    else:
        checked = _run(elsewhere, "doctor", "codex", "--dir", str(project),
                       token=tokens["alice"], home=home)  # fmt: skip
        assert checked.returncode == 1, checked.stdout
        said = checked.stdout
    grants = [line.strip().removeprefix("fix: ") for line in said.splitlines()
              if line.strip().endswith("--trust-hooks")]  # fmt: skip
    assert len(grants) == 1, said
    env = {k: v for k, v in os.environ.items() if k not in ("BACKCHANNEL_TOKEN", "BACKCHANNEL_URL")}
    env |= {"HOME": str(home), "CODEX_HOME": str(home / ".codex"),
            "PATH": f"{BIN.parent}:{env['PATH']}"}  # fmt: skip
    granted = subprocess.run(["bash", "-c", grants[0]], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    assert not (elsewhere / ".codex").exists(), "the grant attached the current directory"
    config = (project / ".codex" / "config.toml").read_text()
    assert f'url = "{srv.url}/mcp"' in config and "command =" not in config, config
    after = _run(elsewhere, "doctor", "codex", "--dir", str(project),
                 token=tokens["alice"], home=home)  # fmt: skip
    assert "ok   hooks trusted (Codex)" in after.stdout, after.stdout
