"""``backchannel doctor [RUNTIME]``: check a project's attachment end to end and say
what to fix. Exit code 0 only when every check holds.

Checks, per attached runtime: the attachment (who and which hub its files name), the
hub answering, the token's member being that one, the hooks registered for every event
(and, for Codex, trusted, in a trusted project; for Gemini CLI, in a trusted folder
and escaping the ``@`` of pasted text), no member of the team with its push target
down (:mod:`backchannel.delivery.circuit`), and the MCP server starting and
listing its tools (the command the runtime would run, spoken to over stdio; or the
hub's ``/mcp`` for an HTTP attachment).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shlex
import subprocess
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from backchannel.client._transport import hub_request
from backchannel.reach import not_the_hub, unanswered
from backchannel.runtimes import get_runtime

RUNTIMES = ("claude-code", "codex", "gemini")
MCP_TIMEOUT_S = 20.0
_AS = re.compile(r"--as\s+(\S+)")
_URL = re.compile(r"--url\s+(\S+)")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    fix: str = ""


@dataclass
class Attachment:
    runtime: str
    who: str  # TEAM/MEMBER
    url: str
    hooks: dict[str, list[dict[str, Any]]]  # event -> our handlers
    server: dict[str, Any] | None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ours(hooks: Any, runtime: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for event, groups in (hooks or {}).items() if isinstance(hooks, dict) else ():
        for group in groups if isinstance(groups, list) else ():
            for h in group.get("hooks", []) if isinstance(group, dict) else ():
                command, url = str(h.get("command", "")), str(h.get("url", ""))
                if re.search(rf"backchannel\S*\s+hook\s+{runtime}\b", command) or (
                    f"/v1/hooks/{runtime}" in url
                ):
                    found.setdefault(event, []).append(h)
    return found


def load(runtime: str, project: Path) -> Attachment | None:
    """What the project's files say about ``runtime``'s attachment (None: not attached)."""
    server: dict[str, Any] | None
    if runtime == "claude-code":
        server = _json(project / ".mcp.json").get("mcpServers", {}).get("backchannel")
        hooks = _ours(_json(project / ".claude" / "settings.local.json").get("hooks"), runtime)
    elif runtime == "codex":
        try:
            config = tomllib.loads((project / ".codex" / "config.toml").read_text("utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            config = {}
        server = config.get("mcp_servers", {}).get("backchannel")
        hooks = _ours(_json(project / ".codex" / "hooks.json").get("hooks"), runtime)
    else:
        settings = _json(project / ".gemini" / "settings.json")
        server = settings.get("mcpServers", {}).get("backchannel")
        hooks = _ours(settings.get("hooks"), runtime)
    if not server and not hooks:
        return None
    text = " ".join(
        [json.dumps(server or {})]
        + [str(h.get("command", "")) + " " + str(h.get("url", "")) for hs in hooks.values() for h in hs]
    )  # fmt: skip
    who = _AS.search(text)
    url = _URL.search(text)
    if url is None and server and isinstance(server.get("url") or server.get("httpUrl"), str):
        found = str(server.get("url") or server.get("httpUrl"))
        url_value = found.removesuffix("/mcp")
    else:
        url_value = url[1].strip('",') if url else ""
    as_value = who[1].strip('",') if who else ""
    if not as_value:
        m = re.search(r"[?&]as=([^&\"\s]+)", text)
        as_value = m[1] if m else ""
    return Attachment(
        runtime, as_value, url_value, hooks, server if isinstance(server, dict) else None
    )


# -- the checks ------------------------------------------------------------------------------


def check_hub(a: Attachment, token: str | None) -> list[Check]:
    out: list[Check] = []
    try:
        r = hub_request("GET", f"{a.url}/healthz", timeout=5)
    except httpx.HTTPError as exc:
        what, way_out = unanswered(a.url, exc)
        return [Check("hub reachable", False, what, f"{way_out}, or attach again with the right --url")]  # fmt: skip
    if r.status_code != 200:  # the hub answers 200 whatever its health
        what, _, way_out = not_the_hub(r.status_code, r.content).partition("; ")
        return [Check("hub reachable", False, f"at {a.url}: {what}", way_out)]
    out.append(Check("hub reachable", True, f"{a.url} answered {r.status_code}"))
    if not token:
        out.append(Check("token", False, "BACKCHANNEL_TOKEN is not set",
                         f"export BACKCHANNEL_TOKEN=<the token of {a.who}>"))  # fmt: skip
        return out
    try:
        r = hub_request(
            "GET", f"{a.url}/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=5
        )
    except httpx.HTTPError as exc:
        what, way_out = unanswered(a.url, exc)
        out.append(Check("token", False, what, way_out))
        return out
    if r.status_code != 200:
        out.append(Check("token", False, f"the hub refused it ({r.status_code})",
                         f"export the token of {a.who} as BACKCHANNEL_TOKEN"))  # fmt: skip
        return out
    me = r.json()
    member = f"{me.get('team')}/{me.get('name')}"
    out.append(Check("token's member", member == a.who, f"token of {member}, attached as {a.who}",
                     "" if member == a.who else f"export the token of {a.who} as BACKCHANNEL_TOKEN"))  # fmt: skip
    if member == a.who:
        out.append(check_push(a, str(me.get("team")), token))
    return out


def check_push(a: Attachment, team: str, token: str) -> Check:
    """The team's members whose push target a hub found down (their messages are
    dead-lettered until a probe gets through; backchannel.delivery.circuit)."""
    try:
        r = hub_request(
            "GET",
            f"{a.url}/v1/teams/{team}/members",
            headers={"Authorization": f"Bearer {token}"},
            timeout=5,
        )
        members = r.json().get("members", []) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        members = None
    if not isinstance(members, list):
        return Check("push delivery", True, f"not checked (the members of {team} were not listed)")
    down = [m for m in members if isinstance(m, dict) and isinstance(m.get("push_circuit"), dict)]
    if not down:
        return Check("push delivery", True, f"no member of {team} has its push target down")
    said = "; ".join(
        f"{m.get('name')}: {c.get('target')} down since "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(c.get('down_since', 0))))} "
        f"({c.get('reason')})"
        for m in down
        if isinstance(c := m["push_circuit"], dict)
    )
    return Check(
        "push delivery",
        False,
        f"down for {len(down)} member(s) of {team}, whose messages are dead-lettered until "
        f"a probe gets through: {said}",
        "bring the target back (the hub probes it and delivers again by itself, in order), "
        f"or change the member's delivery setting (backchannel member set {team} NAME "
        "--delivery JSON); senders are told of each dead letter and may send it again",
    )


def attach_command(a: Attachment, project: Path) -> str:
    """The ``attach`` that writes this attachment again, run from any directory: the
    project named by ``--dir`` and an HTTP attachment kept one (``--http``)."""
    http = bool(a.server and (a.server.get("url") or a.server.get("httpUrl")))
    words = ["backchannel", "attach", a.runtime, "--team", a.who.split("/")[0],
             "--member", a.who.split("/")[-1], "--dir", str(project), "--url", a.url,
             *(["--http"] if http else [])]  # fmt: skip
    return " ".join(shlex.quote(w) for w in words)


def check_hooks(a: Attachment, project: Path) -> list[Check]:
    events = get_runtime(a.runtime).events
    missing = [e for e in events if e not in a.hooks]
    attach_cmd = attach_command(a, project)
    out = [Check("hooks registered", not missing,
                 f"missing: {', '.join(missing)}" if missing else f"{len(events)} events",
                 attach_cmd if missing else "")]  # fmt: skip
    if a.runtime == "codex":
        from backchannel.runtimes import codex_trust

        states = codex_trust.hook_trust(project)
        bad = [t for t in states if t.status != "trusted"]
        out.append(Check("hooks trusted (Codex)", bool(states) and not bad,
                         ", ".join(f"{t.event}: {t.status}" for t in bad) or f"{len(states)} trusted",
                         attach_cmd + " --trust-hooks" if bad or not states else ""))  # fmt: skip
        try:
            config = tomllib.loads((project / ".codex" / "config.toml").read_text("utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            config = {}
        features = config.get("features")
        own = isinstance(features, dict) and features.get("daemon_auto_start") is False
        out.append(Check("sessions in their own process (Codex)", own,
                         "" if own else "the shared background server would run them",
                         "" if own else attach_cmd))  # fmt: skip
        trusted = codex_trust.project_trusted(project)
        out.append(Check("project trusted (Codex)", trusted, str(project),
                         "" if trusted else f"run `codex exec --trust` once in {project}"))  # fmt: skip
    if a.runtime == "gemini":
        out += _gemini_trust(a, project)
        out.append(_gemini_escape_at(project, attach_cmd))
    return out


def _gemini_escape_at(project: Path, attach_cmd: str) -> Check:
    """Whether Gemini CLI escapes the ``@`` of pasted text (``ui.escapePastedAtSymbols``,
    the project's setting, else the user's): without it, an ``@path`` in a message typed
    into its pane makes it read that file and show it to the model."""
    home = Path(os.environ.get("GEMINI_CLI_HOME") or Path.home())
    value = None
    for settings in (project / ".gemini" / "settings.json", home / ".gemini" / "settings.json"):
        ui = _json(settings).get("ui")
        if isinstance(ui, dict) and "escapePastedAtSymbols" in ui:
            value = ui["escapePastedAtSymbols"]
            break
    ok = value is True
    return Check("pasted @ escaped (Gemini)", ok,
                 "" if ok else "ui.escapePastedAtSymbols is not set: an @path in a message "
                 "typed into Gemini's pane makes it read that file for the model",
                 "" if ok else attach_cmd)  # fmt: skip


def _gemini_trust(a: Attachment, project: Path) -> list[Check]:
    out = []
    trusted = bool(a.server and a.server.get("trust") is True)
    out.append(Check("MCP server trusted (Gemini)", trusted, "",
                     "" if trusted else "attach again: it writes \"trust\": true"))  # fmt: skip
    home = Path(os.environ.get("GEMINI_CLI_HOME") or Path.home())
    folders = _json(home / ".gemini" / "trustedFolders.json")
    here = project.resolve()
    folder_trust = _json(home / ".gemini" / "settings.json").get("security", {})
    disabled = folder_trust.get("folderTrust", {}).get("enabled") is False
    ok = (
        disabled
        or os.environ.get("GEMINI_CLI_TRUST_WORKSPACE") == "true"
        or folders.get(str(here)) == "TRUST_FOLDER"
        or any(folders.get(str(p)) == "TRUST_PARENT" for p in here.parents)
        or any(folders.get(str(p)) == "TRUST_FOLDER" for p in here.parents)
    )
    out.append(Check("folder trusted (Gemini)", ok, str(here),
                     "" if ok else f"trust {here} when Gemini asks, or add it to "
                     f"{home / '.gemini' / 'trustedFolders.json'} as TRUST_FOLDER"))  # fmt: skip
    return out


def check_mcp(a: Attachment, token: str | None, project: Path) -> Check:
    name = "MCP server lists its tools"
    server = a.server or {}
    if not server:
        return Check(name, False, "no backchannel MCP server in the project", "attach again")
    command = server.get("command")
    if not isinstance(command, str):
        return _check_http_mcp(a, token, server)
    args = [str(x) for x in server.get("args", [])]
    env = {**os.environ, **({"BACKCHANNEL_TOKEN": token} if token else {})}
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [command, *args], cwd=project, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    except OSError as exc:
        return Check(name, False, f"cannot run {shlex.join([command, *args])}: {exc}",
                     "put backchannel on PATH, or attach again from where it is installed")  # fmt: skip
    try:
        tools = _stdio_tools(proc)
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=5)
    took = time.monotonic() - started
    if tools is None:
        detail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no answer"]
        return Check(name, False, detail[0], "see the error above; run `backchannel mcp` by hand")
    ok = "send_message" in tools
    return Check(name, ok, f"{len(tools)} tools in {took:.1f} s")


def _stdio_tools(proc: subprocess.Popen[bytes]) -> list[str] | None:
    assert proc.stdin is not None
    assert proc.stdout is not None
    init = {"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "backchannel-doctor", "version": "1"}}  # fmt: skip
    for msg in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
    ):
        proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + MCP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(deadline - time.monotonic(), 0)):
            break
        line = proc.stdout.readline()
        if not line:
            return None
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if reply.get("id") == 2:
            return [t.get("name", "") for t in reply.get("result", {}).get("tools", [])]
    return None


def _check_http_mcp(a: Attachment, token: str | None, server: dict[str, Any]) -> Check:
    name = "MCP server lists its tools"
    url = str(server.get("url") or server.get("httpUrl") or f"{a.url}/mcp")
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    try:
        r = hub_request("POST", url, json=body, headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        what, way_out = unanswered(url, exc)
        return Check(name, False, what, way_out)
    ok = r.status_code == 200 and "send_message" in r.text
    return Check(name, ok, f"{url} answered {r.status_code}")


# -- the command ---------------------------------------------------------------------------------


def doctor(
    runtime: Annotated[
        str | None, typer.Argument(help="claude-code, codex or gemini [every attached one]")
    ] = None,
    directory: Annotated[
        Path, typer.Option("--dir", help="The project directory.", file_okay=False)
    ] = Path("."),
    token: Annotated[
        str | None, typer.Option("--token", envvar="BACKCHANNEL_TOKEN", help="The member token.")
    ] = None,
) -> None:
    """Check a project's attachment end to end (hub, token, hooks, MCP server) and say
    what to fix; exit code 0 only when all holds."""
    if runtime is not None and runtime not in RUNTIMES:
        typer.echo(
            f"error: unknown runtime {runtime!r}; use one of: {', '.join(RUNTIMES)}", err=True
        )
        raise typer.Exit(2)
    project = directory.resolve()
    found = [a for r in ([runtime] if runtime else RUNTIMES) if (a := load(r, project))]
    if not found:
        what = runtime or "any runtime"
        typer.echo(f"{project} is not attached to {what}; run `backchannel attach {runtime or 'RUNTIME'} "
                   "--team TEAM --member MEMBER --url HUB` there", err=True)  # fmt: skip
        raise typer.Exit(1)
    failed = 0
    for a in found:
        typer.echo(f"{a.runtime} in {project}, attached as {a.who or '?'} to {a.url or '?'}")
        checks = check_hub(a, token) + check_hooks(a, project) + [check_mcp(a, token, project)]
        for c in checks:
            typer.echo(
                f"  {'ok  ' if c.ok else 'FAIL'} {c.name}" + (f": {c.detail}" if c.detail else "")
            )
            if not c.ok and c.fix:
                typer.echo(f"       fix: {c.fix}")
        failed += sum(not c.ok for c in checks)
    if failed:
        typer.echo(f"{failed} check(s) failed", err=True)
        raise typer.Exit(1)
