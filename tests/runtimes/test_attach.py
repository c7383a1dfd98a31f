"""``backchannel attach``: writes each runtime's MCP entry and hooks, merged, backed up,
idempotent, with a dry run; the token never lands in a file."""

from __future__ import annotations

import json
import stat
import subprocess
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backchannel.interfaces.cli import app
from tests.conftest import Server, free_port

from .helpers import SEQUENCES

TOKEN = "bc_SECRET-token-value"
URL = "http://127.0.0.1:8765"
FILES = {
    "claude-code": [".mcp.json", ".claude/settings.local.json"],
    "codex": [".codex/config.toml", ".codex/hooks.json"],
    "gemini": [".gemini/settings.json"],
}


def attach(d: Path, runtime: str, *extra: str, member: str = "w") -> Any:
    args = ["attach", runtime, "--team", "t", "--member", member, "--dir", str(d), "--url", URL]
    return CliRunner().invoke(app, [*args, *extra], env={"BACKCHANNEL_TOKEN": TOKEN})


def _hooks(data: dict[str, Any], event: str) -> list[dict[str, Any]]:
    return [h for group in data["hooks"][event] for h in group["hooks"]]


def _ours(handlers: list[dict[str, Any]], runtime: str) -> list[dict[str, Any]]:
    return [h for h in handlers if f"hook {runtime}" in h.get("command", "")]


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text()
    data: dict[str, Any] = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    return data


def _backups(d: Path) -> list[Path]:
    return sorted(d.rglob("*.bak-*"))


@pytest.mark.parametrize("runtime", list(FILES))
def test_attach_to_an_empty_project(tmp_path: Path, runtime: str) -> None:
    result = attach(tmp_path, runtime)
    assert result.exit_code == 0, result.output
    assert f"export BACKCHANNEL_TOKEN={TOKEN}" in result.stderr
    for name in FILES[runtime]:
        path = tmp_path / name
        assert path.exists(), name
        assert TOKEN not in path.read_text()
    hooks_file = {"claude-code": 1, "codex": 1, "gemini": 0}[runtime]
    hooks = _load(tmp_path / FILES[runtime][hooks_file])
    for event in SEQUENCES[runtime]:
        [handler] = _ours(_hooks(hooks, event), runtime)
        assert handler["command"] == f"backchannel hook {runtime} --as t/w --url {URL}"
        assert handler["type"] == "command"
    mcp = _load(tmp_path / FILES[runtime][0])
    server = (mcp.get("mcpServers") or mcp["mcp_servers"])["backchannel"]
    assert server["command"] == "backchannel"
    assert server["args"] == ["mcp", "--as", "t/w", "--url", URL]
    if runtime == "claude-code":
        assert server["env"] == {"BACKCHANNEL_TOKEN": "${BACKCHANNEL_TOKEN}"}
        assert hooks["enabledMcpjsonServers"] == ["backchannel"]
    elif runtime == "codex":
        assert "BACKCHANNEL_TOKEN" in server["env_vars"]
    else:
        assert server["env"] == {"BACKCHANNEL_TOKEN": "$BACKCHANNEL_TOKEN"}
        assert _ours(_hooks(hooks, "AfterAgent"), runtime)[0]["timeout"] == 30_000
    assert _backups(tmp_path) == []


EXISTING = {
    ".mcp.json": {"mcpServers": {"github": {"command": "gh-mcp", "args": []}}},
    ".claude/settings.local.json": {
        "permissions": {"allow": ["Bash(npm test:*)"]},
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "make lint"}]}]},
    },
    ".codex/hooks.json": {
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "uvx codhc ruff check"}]}]}
    },
    ".gemini/settings.json": {
        "theme": "GitHub",
        "mcpServers": {"docs": {"httpUrl": "http://127.0.0.1:9000/mcp"}},
        "hooks": {
            "BeforeTool": [
                {"matcher": "write_file", "hooks": [{"type": "command", "command": "./guard.sh"}]}
            ]
        },
    },
}
CODEX_TOML = """# my codex settings
model = "o3"

[mcp_servers.other]
command = "other-mcp"

[features]
hooks = true
"""


def _seed(d: Path, runtime: str) -> dict[str, str]:
    before = {}
    for name in FILES[runtime]:
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = CODEX_TOML if name.endswith(".toml") else json.dumps(EXISTING[name], indent=4)
        path.write_text(text)
        before[name] = text
    return before


@pytest.mark.parametrize("runtime", list(FILES))
def test_attach_merges_with_existing_config_and_keeps_a_backup(
    tmp_path: Path, runtime: str
) -> None:
    before = _seed(tmp_path, runtime)
    result = attach(tmp_path, runtime)
    assert result.exit_code == 0, result.output
    backups = _backups(tmp_path)
    assert len(backups) == len(FILES[runtime])
    for b in backups:
        original = b.name.split(".bak-")[0]
        name = next(n for n in FILES[runtime] if n.endswith(original))
        assert b.read_text() == before[name]
        assert b.name in result.stderr
    if runtime == "claude-code":
        mcp = _load(tmp_path / ".mcp.json")
        assert set(mcp["mcpServers"]) == {"github", "backchannel"}
        settings = _load(tmp_path / ".claude/settings.local.json")
        assert settings["permissions"] == {"allow": ["Bash(npm test:*)", "mcp__backchannel"]}
        commands = [h["command"] for h in _hooks(settings, "Stop")]
        assert commands[0] == "make lint" and len(commands) == 2
    elif runtime == "codex":
        text = (tmp_path / ".codex/config.toml").read_text()
        assert text.startswith(CODEX_TOML)  # comments and layout kept
        config = tomllib.loads(text)
        assert set(config["mcp_servers"]) == {"other", "backchannel"}
        # the user's features kept; Codex's shared background server turned off
        features = {"hooks": True, "daemon_auto_start": False}
        assert (config["model"], config["features"]) == ("o3", features)
        hooks = _load(tmp_path / ".codex/hooks.json")
        assert _hooks(hooks, "Stop")[0]["command"] == "uvx codhc ruff check"
    else:
        settings = _load(tmp_path / ".gemini/settings.json")
        assert settings["theme"] == "GitHub"
        assert set(settings["mcpServers"]) == {"docs", "backchannel"}
        assert settings["hooks"]["BeforeTool"][0]["matcher"] == "write_file"
        assert len(_hooks(settings, "BeforeTool")) == 2


@pytest.mark.parametrize("runtime", list(FILES))
def test_attach_twice_changes_nothing(tmp_path: Path, runtime: str) -> None:
    _seed(tmp_path, runtime)
    assert attach(tmp_path, runtime).exit_code == 0
    written = {n: (tmp_path / n).read_text() for n in FILES[runtime]}
    backups = _backups(tmp_path)
    again = attach(tmp_path, runtime)
    assert again.exit_code == 0
    assert "already attached; nothing changed" in again.stderr
    assert {n: (tmp_path / n).read_text() for n in FILES[runtime]} == written
    assert _backups(tmp_path) == backups
    dry = attach(tmp_path, runtime, "--dry-run")
    assert (dry.exit_code, dry.stdout) == (0, "")


@pytest.mark.parametrize("runtime", list(FILES))
def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path: Path, runtime: str) -> None:
    before = _seed(tmp_path, runtime)
    result = attach(tmp_path, runtime, "--dry-run")
    assert result.exit_code == 0
    for name in FILES[runtime]:
        assert f"--- a/{name}\n+++ b/{name}\n" in result.stdout
        assert (tmp_path / name).read_text() == before[name]
    assert "+" in result.stdout and "backchannel hook" in result.stdout
    assert _backups(tmp_path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh = attach(empty, runtime, "--dry-run")
    assert f"--- /dev/null\n+++ b/{FILES[runtime][0]}\n" in fresh.stdout
    assert list(empty.iterdir()) == []


def test_attaching_another_member_replaces_the_hooks_and_the_server(tmp_path: Path) -> None:
    attach(tmp_path, "claude-code")
    result = attach(tmp_path, "claude-code", member="lead")
    assert result.exit_code == 0
    settings = _load(tmp_path / ".claude/settings.local.json")
    for event in SEQUENCES["claude-code"]:
        [handler] = _hooks(settings, event)
        assert "--as t/lead" in handler["command"]
    assert _load(tmp_path / ".mcp.json")["mcpServers"]["backchannel"]["args"][2] == "t/lead"


def test_claude_code_over_http(tmp_path: Path) -> None:
    assert attach(tmp_path, "claude-code", "--http").exit_code == 0
    server = _load(tmp_path / ".mcp.json")["mcpServers"]["backchannel"]
    assert server == {
        "type": "http",
        "url": f"{URL}/mcp",
        "headers": {"Authorization": "Bearer ${BACKCHANNEL_TOKEN}"},
    }
    settings = _load(tmp_path / ".claude/settings.local.json")
    [handler] = _hooks(settings, "Stop")
    assert handler["url"] == f"{URL}/v1/hooks/claude-code?as=t/w"
    assert handler["headers"] == {"Authorization": "Bearer $BACKCHANNEL_TOKEN"}
    assert handler["allowedEnvVars"] == ["BACKCHANNEL_TOKEN"]
    assert TOKEN not in (tmp_path / ".claude/settings.local.json").read_text()


def test_a_broken_config_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / ".gemini" / "settings.json"
    path.parent.mkdir()
    path.write_text('{"theme": "GitHub",')
    result = attach(tmp_path, "gemini")
    assert result.exit_code == 1
    assert "not valid JSON" in result.stderr
    assert path.read_text() == '{"theme": "GitHub",'
    assert _backups(tmp_path) == []


LINKED_DIR = {"claude-code": ".claude", "codex": ".codex", "gemini": ".gemini"}


@pytest.mark.parametrize("runtime", list(FILES))
def test_a_symlinked_runtime_directory_outside_the_project_is_refused(
    tmp_path: Path, runtime: str
) -> None:
    project, outside = tmp_path / "project", tmp_path / "home-config"
    project.mkdir()
    outside.mkdir()
    (outside / "keep.json").write_text("{}")
    link = project / LINKED_DIR[runtime]
    link.symlink_to(outside, target_is_directory=True)
    result = attach(project, runtime)
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())  # the console wraps long lines
    assert f"{link} is a symlink to {outside}" in said
    assert "outside the project" in said and "replace the symlink" in said
    assert sorted(p.name for p in outside.iterdir()) == ["keep.json"]
    assert sorted(p.name for p in project.iterdir()) == [LINKED_DIR[runtime]]  # nothing written


def test_a_symlinked_file_outside_the_project_is_refused(tmp_path: Path) -> None:
    project, outside = tmp_path / "project", tmp_path / "elsewhere.json"
    project.mkdir()
    outside.write_text('{"mcpServers": {}}')
    (project / ".mcp.json").symlink_to(outside)
    result = attach(project, "claude-code")
    assert result.exit_code == 1
    assert f"{project / '.mcp.json'} is a symlink to {outside}" in " ".join(result.stderr.split())
    assert outside.read_text() == '{"mcpServers": {}}'
    assert not (project / ".claude").exists()


def test_a_symlink_that_stays_in_the_project_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "config" / "gemini"
    real.mkdir(parents=True)
    (tmp_path / ".gemini").symlink_to(Path("config") / "gemini", target_is_directory=True)
    result = attach(tmp_path, "gemini")
    assert result.exit_code == 0, result.output
    assert (tmp_path / ".gemini").is_symlink()
    assert "mcpServers" in _load(real / "settings.json")


def test_claude_code_over_http_keeps_session_start_a_command(tmp_path: Path) -> None:
    assert attach(tmp_path, "claude-code", "--http").exit_code == 0
    settings = _load(tmp_path / ".claude/settings.local.json")
    [start] = _hooks(settings, "SessionStart")
    assert start["type"] == "command" and "hook claude-code --as t/w" in start["command"]
    assert all(h["type"] == "http" for h in _hooks(settings, "UserPromptSubmit"))
    assert attach(tmp_path, "claude-code", "--http").exit_code == 0  # idempotent
    assert _load(tmp_path / ".claude/settings.local.json") == settings


HOOK_FILES = {
    "claude-code": ".claude/settings.local.json",
    "codex": ".codex/hooks.json",
    "gemini": ".gemini/settings.json",
}


@pytest.mark.parametrize("runtime", list(FILES))
def test_over_http_the_command_hooks_keep_a_keeper_beating(tmp_path: Path, runtime: str) -> None:
    """With the HTTP MCP server no ``backchannel mcp`` beats for the runtime: its command
    hooks run with ``--keep-alive`` (:mod:`backchannel.runtimes.keeper`). Over stdio
    they do not: the MCP server beats."""
    for http, where in ((True, tmp_path / "http"), (False, tmp_path / "stdio")):
        where.mkdir()
        extra = ("--http",) if http else ()
        env = {"BACKCHANNEL_TOKEN": TOKEN, "CODEX_HOME": str(tmp_path / "codex-home")}
        args = ["attach", runtime, "--team", "t", "--member", "w", "--dir", str(where)]
        result = CliRunner().invoke(app, [*args, "--url", URL, *extra], env=env)
        assert result.exit_code == 0, result.output
        data = _load(where / HOOK_FILES[runtime])
        commands = [
            h["command"]
            for event in data["hooks"]
            for h in _hooks(data, event)
            if h.get("type") == "command"
        ]
        assert commands and all(
            c.endswith(" --keep-alive") == http for c in _ours_commands(commands, runtime)
        ), commands


def _ours_commands(commands: list[str], runtime: str) -> list[str]:
    return [c for c in commands if f"hook {runtime}" in c]


def _codex_attach(d: Path, home: Path, *extra: str) -> Any:
    args = ["attach", "codex", "--team", "t", "--member", "w", "--dir", str(d), "--url", URL]
    env = {"BACKCHANNEL_TOKEN": TOKEN, "CODEX_HOME": str(home)}
    return CliRunner().invoke(app, [*args, *extra], env=env)


def test_codex_server_is_required_and_approved_and_session_end_fits_codex(
    tmp_path: Path,
) -> None:
    home = tmp_path / "codex-home"
    assert _codex_attach(tmp_path, home).exit_code == 0
    with open(tmp_path / ".codex/config.toml", "rb") as f:
        config = tomllib.load(f)
    server = config["mcp_servers"]["backchannel"]
    assert config["features"] == {"daemon_auto_start": False}  # one process per session
    assert server["required"] is True
    assert server["default_tools_approval_mode"] == "approve"
    hooks = _load(tmp_path / ".codex/hooks.json")
    [end] = _hooks(hooks, "SessionEnd")
    assert end["timeout"] <= 3  # Codex clamps a longer one, which voids its trust


def test_codex_hook_trust_is_reported_and_granted_once(tmp_path: Path) -> None:
    from backchannel.runtimes.codex_trust import hook_trust

    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text('model = "o3"\n')
    first = _codex_attach(tmp_path, home)
    assert first.exit_code == 0
    assert "--trust-hooks" in first.output and "untrusted" in first.output
    assert not (home / "config.toml").read_text().count("hooks.state")

    granted = _codex_attach(tmp_path, home, "--trust-hooks")
    assert granted.exit_code == 0
    states = hook_trust(tmp_path, home)
    assert {t.event for t in states} == set(SEQUENCES["codex"])
    assert all(t.status == "trusted" for t in states)
    config = (home / "config.toml").read_text()
    assert config.startswith('model = "o3"\n')  # the user's config is kept
    assert _codex_attach(tmp_path, home, "--trust-hooks").exit_code == 0
    assert (home / "config.toml").read_text() == config  # granted once

    # a changed handler is no longer trusted: Codex would skip it
    hooks = _load(tmp_path / ".codex/hooks.json")
    _hooks(hooks, "Stop")[0]["timeout"] = 31
    (tmp_path / ".codex/hooks.json").write_text(json.dumps(hooks))
    assert {t.event: t.status for t in hook_trust(tmp_path, home)}["Stop"] == "modified"


def test_gemini_server_is_trusted_and_the_folder_trust_step_is_printed(tmp_path: Path) -> None:
    result = attach(tmp_path, "gemini")
    assert result.exit_code == 0
    server = _load(tmp_path / ".gemini/settings.json")["mcpServers"]["backchannel"]
    assert server["trust"] is True
    assert "gemini --skip-trust" in result.output and "GEMINI_CLI_TRUST_WORKSPACE" in result.output


def test_gemini_escapes_the_at_of_pasted_messages_keeping_the_users_ui(tmp_path: Path) -> None:
    # Gemini CLI reads any @path of a prompt as a file for the model: a teammate's message
    # typed in by the tmux adapter would show the agent's files; pasted @ is escaped
    path = tmp_path / ".gemini" / "settings.json"
    path.parent.mkdir()
    path.write_text('{"ui": {"hideBanner": true, "escapePastedAtSymbols": false}}')
    assert attach(tmp_path, "gemini").exit_code == 0
    ui = _load(path)["ui"]
    assert ui == {"hideBanner": True, "escapePastedAtSymbols": True}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert attach(fresh, "gemini").exit_code == 0
    assert _load(fresh / ".gemini/settings.json")["ui"] == {"escapePastedAtSymbols": True}
    path.write_text('{"ui": "compact"}')
    refused = attach(tmp_path, "gemini")
    assert refused.exit_code != 0 and "'ui' is not an object" in refused.output


def test_a_private_file_stays_private_and_so_does_its_backup(tmp_path: Path) -> None:
    mcp = tmp_path / ".mcp.json"
    mcp.write_text('{"mcpServers": {"mine": {"command": "x", "env": {"KEY": "secret"}}}}')
    mcp.chmod(0o600)
    assert attach(tmp_path, "claude-code").exit_code == 0
    (backup,) = _backups(tmp_path)
    assert stat.S_IMODE(mcp.stat().st_mode) == 0o600
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    # and the user's own Codex config, where --trust-hooks records the grant
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text('model = "o3"\n')
    (home / "config.toml").chmod(0o600)
    assert _codex_attach(tmp_path, home, "--trust-hooks").exit_code == 0
    assert "hooks.state" in (home / "config.toml").read_text()
    assert stat.S_IMODE((home / "config.toml").stat().st_mode) == 0o600


def _attach_on(srv: Server, d: Path, team: str, member: str, token: str | None = None) -> Any:
    env = {"BACKCHANNEL_HOME": str(srv.home), "BACKCHANNEL_URL": srv.url}
    if token is not None:  # a member's token, and a data directory without the admin's
        env = {"BACKCHANNEL_HOME": str(d / "elsewhere"), "BACKCHANNEL_TOKEN": token}
    args = ["attach", "claude-code", "--team", team, "--member", member, "--dir", str(d)]
    return CliRunner().invoke(app, [*args, "--url", srv.url], env=env)


def test_a_typo_in_the_member_or_the_team_is_refused_while_the_hub_can_say(
    server: Server, tmp_path: Path
) -> None:
    """``attach --member wroker`` wrote the project's config for a member that does not
    exist and said it was attached; the agent then ran with no backchannel tools (every
    token refused by ``--as demo/wroker``). The hub is asked when it can be (the admin
    token of the data directory, or the member token in the environment), and a name it
    does not know is refused with the closest ones, nothing written."""
    with server.client() as admin:
        admin.post("/v1/teams", json={"name": "demo"}).raise_for_status()
        worker = admin.post(
            "/v1/teams/demo/members", json={"name": "worker", "kind": "claude-code"}
        ).json()["token"]
    project = tmp_path / "project"
    got = _attach_on(server, project, "demo", "wroker")
    assert got.exit_code == 1, got.output
    assert "unknown member 'wroker' in team 'demo'; did you mean 'worker'?" in got.stderr
    assert "backchannel member add demo wroker" in got.stderr
    assert not (project / ".mcp.json").exists()
    got = _attach_on(server, project, "dmo", "worker")
    assert got.exit_code == 1, got.output
    assert f"unknown team 'dmo' on the hub at {server.url}; did you mean 'demo'?" in got.stderr
    assert not (project / ".mcp.json").exists()
    got = _attach_on(server, project, "demo", "wroker", token=worker)
    assert got.exit_code == 1, got.output
    assert "did you mean 'worker'?" in got.stderr
    got = _attach_on(server, project, "demo", "worker", token=worker)
    assert got.exit_code == 0, got.output
    assert (project / ".mcp.json").exists()


def test_attach_goes_on_when_the_hub_cannot_say(tmp_path: Path) -> None:
    """No hub answering (it is started later), or a token it does not take: the names
    cannot be checked, and attach writes the files as before."""
    result = attach(tmp_path, "claude-code", member="anyone")  # URL: nothing checks it
    assert result.exit_code == 0, result.output
    assert (tmp_path / ".mcp.json").exists()


def _attach_from(project: Path, member: str, token: str, *extra: str) -> Any:
    """``attach`` with no --url, BACKCHANNEL_URL nor running server recorded (unless
    ``extra`` names one): the data directory is the project's own, empty or with a
    server.json its server left behind."""
    env = {"BACKCHANNEL_HOME": str(project / ".backchannel"), "BACKCHANNEL_TOKEN": token}
    args = ["attach", "claude-code", "--team", "demo", "--member", member, "--dir", str(project)]
    return CliRunner().invoke(app, [*args, *extra], env=env)


def test_with_no_hub_recorded_attach_asks_the_default_url_and_says_what_it_found(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no server recorded, ``attach`` said "no running hub found; using
    http://127.0.0.1:8765" and wrote the files unchecked, even with a hub answering
    there. It asks the default URL now: a hub that answers is named (its names are
    checked once it is named with --url: an address nobody named gets no token); none
    answering is said, with what to do."""
    from backchannel import config

    with server.client() as admin:
        admin.post("/v1/teams", json={"name": "demo"}).raise_for_status()
        worker = admin.post(
            "/v1/teams/demo/members", json={"name": "worker", "kind": "claude-code"}
        ).json()["token"]
    monkeypatch.setattr(config, "DEFAULT_PORT", int(server.url.rsplit(":", 1)[1]))
    project = tmp_path / "project"
    stale = project / ".backchannel"
    stale.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (stale / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": gone.pid}))
    got = _attach_from(project, "wroker", worker, "--dry-run")
    assert got.exit_code == 0, got.output
    assert f"found a hub at {server.url}" in got.stderr
    assert "names were not checked" in " ".join(got.stderr.split())
    got = _attach_from(project, "wroker", worker, "--url", server.url)
    assert got.exit_code == 1, got.output
    assert "unknown member 'wroker' in team 'demo'; did you mean 'worker'?" in got.stderr
    assert not (project / ".mcp.json").exists()
    got = _attach_from(project, "worker", worker)
    assert got.exit_code == 0, got.output
    assert f"found a hub at {server.url}" in got.stderr
    assert server.url in (project / ".mcp.json").read_text()

    silent = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setattr(config, "DEFAULT_PORT", int(silent.rsplit(":", 1)[1]))
    elsewhere = tmp_path / "elsewhere"
    got = _attach_from(elsewhere, "wroker", worker)
    assert got.exit_code == 0, got.output  # attach may come before the hub
    assert f"no hub answers at {silent}" in got.stderr
    assert "backchannel serve" in got.stderr and "--url" in got.stderr
    assert "found a hub" not in got.stderr
    assert silent in (elsewhere / ".mcp.json").read_text()


def test_a_url_no_client_can_use_is_refused_not_replaced(tmp_path: Path) -> None:
    """``attach --url ftp://host`` (or a store's URL) fell back to http://127.0.0.1:8765
    and wrote that."""
    result = attach(tmp_path, "claude-code", "--url", "ftp://hub.example:8765")
    assert result.exit_code == 1, result.output
    assert "cannot tell where 'ftp://hub.example:8765'" in result.stderr
    assert "nothing written" in result.stderr
    store = f"sqlite:///{tmp_path / 'hub.db'}"
    result = attach(tmp_path, "claude-code", "--url", store)
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert f"{store!r} is a store, and the agent reaches its hub over HTTP" in said, said
    assert "nothing written" in said
    assert list(tmp_path.iterdir()) == []


class _Squatter(BaseHTTPRequestHandler):
    """Any local process on the default port: answers ``/healthz`` as a hub does and
    ``/v1/me`` as if the token were the administrator's, and keeps every request's
    headers."""

    seen: list[tuple[str, dict[str, str]]]

    def _answer(self) -> None:
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        body: Any = {"status": "ok"}
        if self.path.startswith("/v1/me"):
            body = {"admin": True, "team": None, "name": None}
        elif self.path.startswith("/v1/"):
            body = []
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


def test_a_process_squatting_the_default_port_gets_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no hub recorded, ``attach`` asked ``/healthz`` on the default port and, on a
    200 with a ``status``, sent the data directory's admin token and the member token
    to whatever answered there to check the names: any local process listening on
    8765 collected both. An address nobody named or recorded now gets no credential:
    the hub found is named, the names are left unchecked, with the way to check them."""
    from backchannel import config

    seen: list[tuple[str, dict[str, str]]] = []
    handler = type("Squatter", (_Squatter,), {"seen": seen})
    squatter = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        port = squatter.server_address[1]
        monkeypatch.setattr(config, "DEFAULT_PORT", port)
        project = tmp_path / "project"
        home = project / ".backchannel"
        admin_token = config.admin_token(home)  # a data directory with no server.json
        assert admin_token
        got = _attach_from(project, "worker", TOKEN)
    finally:
        squatter.shutdown()
        squatter.server_close()
    paths = [path for path, _ in seen]
    assert "/healthz" in paths, paths  # it was asked, and answered as a hub
    for path, headers in seen:
        sent = json.dumps(headers)
        assert "authorization" not in headers and "cookie" not in headers, (path, headers)
        assert TOKEN not in sent and admin_token not in sent, (path, headers)
    assert got.exit_code == 0, got.output
    said = " ".join(got.stderr.split())
    url = f"http://127.0.0.1:{port}"
    assert f"found a hub at {url}" in said, said
    assert "names were not checked" in said, said
    assert f"--url {url}" in said and "backchannel doctor" in said, said
    assert url in (project / ".mcp.json").read_text()


def test_the_data_directorys_admin_token_goes_only_to_the_hub_it_records(
    tmp_path: Path,
) -> None:
    """``attach --url`` checked the names with the admin token of whatever data directory
    it ran in, at any address named: a hub elsewhere (or whatever listens at a mistyped
    port) got this machine's admin token. That token is its own hub's, the one
    ``server.json`` records; another address gets the member token the user gave with
    it, and no other."""
    from backchannel import config

    seen: list[tuple[str, dict[str, str]]] = []
    handler = type("Squatter", (_Squatter,), {"seen": seen})
    other = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{other.server_address[1]}"
        home = tmp_path / ".backchannel"
        admin_token = config.admin_token(home)  # a data directory, its hub not running
        assert admin_token
        args = ["attach", "claude-code", "--team", "demo", "--member", "worker"]
        env = {"BACKCHANNEL_HOME": str(home), "BACKCHANNEL_TOKEN": TOKEN}
        got = CliRunner().invoke(
            app, [*args, "--dir", str(tmp_path / "p"), "--url", url, "--dry-run"], env=env
        )
    finally:
        other.shutdown()
        other.server_close()
    sent = [h.get("authorization", "") for _, h in seen]
    assert f"Bearer {admin_token}" not in sent, seen
    assert all(admin_token not in json.dumps(h) for _, h in seen), seen
    assert f"Bearer {TOKEN}" in sent, seen  # the member token, with the address, is the user's
    assert got.exit_code == 0, got.output
