"""``backchannel attach``: write a runtime's MCP server entry and hooks into a project.

Files (each runtime's documented project-level configuration):

* Claude Code: ``.mcp.json`` (``mcpServers.backchannel``) and
  ``.claude/settings.local.json`` (``hooks``, ``enabledMcpjsonServers`` so the server
  needs no approval, and ``permissions.allow`` so its tools run without a prompt; this
  file is Claude Code's personal, uncommitted one);
* Codex: ``.codex/config.toml`` (``[mcp_servers.backchannel]``, and ``daemon_auto_start =
  false`` in ``[features]`` so that a session runs in its own ``codex`` process) and
  ``.codex/hooks.json``;
* Gemini CLI: ``.gemini/settings.json`` (``mcpServers.backchannel``, ``hooks``, and
  ``ui.escapePastedAtSymbols``, so that an ``@path`` in a message typed into its pane is
  not read as a file to show the model).

What is there is kept: only backchannel's own entries are added or replaced (a hook is
ours when its command runs ``backchannel ... hook <runtime>`` or its URL is
``/v1/hooks/<runtime>``). A file that changes is first copied to
``<file>.bak-<timestamp>``; a second run changes nothing and backs up nothing. The
member's token is never written: files refer to ``BACKCHANNEL_TOKEN`` the way each
runtime reads environment values (``${BACKCHANNEL_TOKEN}`` in ``.mcp.json``,
``$BACKCHANNEL_TOKEN`` in Gemini's settings and Claude Code's HTTP hook headers,
``env_vars``/``bearer_token_env_var`` in Codex's config).

Nothing is read or written outside the project: each component of a file's path below
the project directory is checked, and a symlink (``.claude`` linked to ``~/.claude``, a
linked ``settings.json``) that leads out of the project is refused with its name. A
symlink that stays inside the project is followed, so the file it names is updated.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import shlex
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backchannel.errors import AttachError
from backchannel.files import write_atomic
from backchannel.runtimes import get_runtime
from backchannel.runtimes.keeper import FLAG as KEEP_ALIVE

__all__ = ["AttachError", "AttachOptions", "FileChange", "apply", "instructions", "plan"]

SERVER = "backchannel"
HOOK_TIMEOUT_S = 30
TOKEN_VAR = "BACKCHANNEL_TOKEN"


@dataclass(frozen=True, slots=True)
class AttachOptions:
    team: str
    member: str
    directory: Path
    url: str  # the hub, http(s)://
    executable: str = "backchannel"
    http: bool = False  # Claude Code: hooks and MCP over HTTP instead of commands

    @property
    def who(self) -> str:
        return f"{self.team}/{self.member}"

    def command(self, *args: str) -> list[str]:
        return [self.executable, *args]

    def mcp_args(self) -> list[str]:
        return ["mcp", "--as", self.who, "--url", self.url]

    def hook_command(self, runtime: str) -> str:
        parts = self.command("hook", runtime, "--as", self.who, "--url", self.url)
        if self.http:  # no `backchannel mcp` beats for the runtime: a keeper does
            parts.append(KEEP_ALIVE)
        return " ".join(shlex.quote(p) for p in parts)


@dataclass(frozen=True, slots=True)
class FileChange:
    path: Path
    before: str | None  # None: the file does not exist yet
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self, root: Path | None = None) -> str:
        name = str(self.path.relative_to(root) if root else self.path)
        lines = difflib.unified_diff(
            (self.before or "").splitlines(keepends=True),
            self.after.splitlines(keepends=True),
            fromfile="/dev/null" if self.before is None else f"a/{name}",
            tofile=f"b/{name}",
        )
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


# -- where files go -------------------------------------------------------------------------


def _target(opts: AttachOptions, *parts: str) -> Path:
    """``opts.directory / parts``, refused when a symlink on the way leads out of the
    project; an in-project symlink is followed (the returned path is the real file,
    still under ``opts.directory``)."""
    root = opts.directory.resolve()
    real = root
    for i, part in enumerate(parts):
        real = real / part
        if real.is_symlink():
            link = opts.directory.joinpath(*parts[: i + 1])
            real = real.resolve()
            if not real.is_relative_to(root):
                raise AttachError(
                    f"refusing to write {Path(*parts)}: {link} is a symlink to {real}, outside "
                    f"the project {root}; replace the symlink with a real "
                    f"{'file' if i == len(parts) - 1 else 'directory'} in the project, or run "
                    "attach in the project the link points into"
                )
    return opts.directory / real.relative_to(root)


# -- merging -------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _json_change(path: Path, edit: Callable[[dict[str, Any]], None]) -> FileChange:
    before = _read(path)
    data: Any = {}
    if before is not None and before.strip():
        try:
            data = json.loads(before)
        except ValueError as exc:
            raise AttachError(
                f"cannot merge into {path}: it is not valid JSON ({exc}); fix it or move it away"
            ) from None
        if not isinstance(data, dict):
            raise AttachError(f"cannot merge into {path}: it holds no JSON object")
    merged = copy.deepcopy(data)
    edit(merged)
    if before is not None and merged == data:
        return FileChange(path, before, before)
    return FileChange(path, before, json.dumps(merged, indent=2, ensure_ascii=False) + "\n")


def _obj(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise AttachError(f"cannot merge: {where} is not an object")
    return value


def _is_ours(handler: Any, runtime: str) -> bool:
    if not isinstance(handler, dict):
        return False
    command = handler.get("command")
    if isinstance(command, str) and re.search(rf"backchannel\S*\s+hook\s+{runtime}\b", command):
        return True
    url = handler.get("url")
    return isinstance(url, str) and f"/v1/hooks/{runtime}" in url


def _put_hooks(
    data: dict[str, Any], runtime: str, events: tuple[str, ...], handler: dict[str, Any]
) -> None:
    hooks = _obj(data, "hooks", "'hooks'")
    for event in events:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise AttachError(f"cannot merge: hooks.{event} is not a list")
        if not _replace_handler(groups, runtime, handler):
            groups.append({"hooks": [dict(handler)]})


def _replace_handler(groups: list[Any], runtime: str, handler: dict[str, Any]) -> bool:
    for group in groups:
        handlers = group.get("hooks") if isinstance(group, dict) else None
        if isinstance(handlers, list):
            for i, existing in enumerate(handlers):
                if _is_ours(existing, runtime):
                    handlers[i] = dict(handler)
                    return True
    return False


_TABLE_RE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def _toml_change(path: Path, table: str, body: dict[str, Any]) -> FileChange:
    """Insert or replace ``[table]`` (and its sub-tables) with ``body``, keeping the
    rest of the file as it is written."""
    before = _read(path)
    text = before or ""
    try:
        current: Any = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AttachError(f"cannot merge into {path}: it is not valid TOML ({exc})") from None
    for part in table.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if current == body and before is not None:
        return FileChange(path, before, before)
    block = f"[{table}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in body.items())
    lines = text.splitlines(keepends=True)
    start = next(
        (i for i, line in enumerate(lines) if (m := _TABLE_RE.match(line)) and m[1] == table),
        None,
    )
    if start is None:
        sep = "" if not text else ("\n" if text.endswith("\n") else "\n\n")
        after = f"{text}{sep}{block}"
    else:
        end = start + 1
        while end < len(lines):
            m = _TABLE_RE.match(lines[end])
            if m and not m[1].startswith(table + "."):
                break
            end += 1
        tail = "\n" if end < len(lines) else ""
        after = "".join(lines[:start]) + block + tail + "".join(lines[end:])
    try:
        tomllib.loads(after)
    except tomllib.TOMLDecodeError as exc:
        raise AttachError(
            f"cannot merge into {path}: [{table}] is defined in a way this command cannot "
            f"rewrite ({exc}); remove it and run attach again"
        ) from None
    return FileChange(path, before, after)


def _toml_key_change(change: FileChange, table: str, key: str, value: Any) -> FileChange:
    """``change`` with ``key = value`` set in ``[table]`` (the table's other keys and the
    rest of the file kept as written; the table is added at the end when missing)."""
    text = change.after
    current: Any = tomllib.loads(text)
    for part in table.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if isinstance(current, dict) and current.get(key) == value:
        return change
    line = f"{key} = {json.dumps(value)}\n"
    lines = text.splitlines(keepends=True)
    start = next(
        (i for i, ln in enumerate(lines) if (m := _TABLE_RE.match(ln)) and m[1] == table), None
    )
    if start is None:
        sep = "" if not text else ("\n" if text.endswith("\n") else "\n\n")
        after = f"{text}{sep}[{table}]\n{line}"
    else:
        end = start + 1
        while end < len(lines) and not _TABLE_RE.match(lines[end]):
            end += 1
        mine = re.compile(rf"^\s*{re.escape(key)}\s*=")
        at = next((i for i in range(start + 1, end) if mine.match(lines[i])), None)
        if at is not None:
            lines[at] = line
        else:
            while end > start + 1 and not lines[end - 1].strip():
                end -= 1  # after the table's last entry, before its blank lines
            if not lines[end - 1].endswith("\n"):
                lines[end - 1] += "\n"
            lines.insert(end, line)
        after = "".join(lines)
    try:
        tomllib.loads(after)
    except tomllib.TOMLDecodeError as exc:
        raise AttachError(
            f"cannot merge into {change.path}: [{table}] is defined in a way this command "
            f"cannot rewrite ({exc}); set {key} = {json.dumps(value)} there yourself"
        ) from None
    return FileChange(change.path, change.before, after)


# -- the runtimes ----------------------------------------------------------------------------


CLAUDE_TOOLS_RULE = f"mcp__{SERVER}"  # a permission rule naming a server allows its tools


def _claude_code(opts: AttachOptions) -> list[FileChange]:
    server: dict[str, Any]
    if opts.http:
        server = {
            "type": "http",
            "url": f"{opts.url}/mcp",
            "headers": {"Authorization": f"Bearer ${{{TOKEN_VAR}}}"},
        }
        handler: dict[str, Any] = {
            "type": "http",
            "url": f"{opts.url}/v1/hooks/claude-code?as={opts.who}",
            "headers": {"Authorization": f"Bearer ${TOKEN_VAR}"},
            "allowedEnvVars": [TOKEN_VAR],
            "timeout": HOOK_TIMEOUT_S,
        }
    else:
        server = {
            "type": "stdio",
            "command": opts.executable,
            "args": opts.mcp_args(),
            "env": {TOKEN_VAR: f"${{{TOKEN_VAR}}}"},
        }
        handler = {
            "type": "command",
            "command": opts.hook_command("claude-code"),
            "timeout": HOOK_TIMEOUT_S,
        }

    def mcp_json(data: dict[str, Any]) -> None:
        _obj(data, "mcpServers", "'mcpServers'")[SERVER] = server

    def settings(data: dict[str, Any]) -> None:
        events = get_runtime("claude-code").events
        if opts.http:
            # Claude Code runs no HTTP hook for SessionStart ("HTTP hooks are not
            # supported for SessionStart"): that one stays a command, or the agent is
            # never told who it is
            command = {
                "type": "command",
                "command": opts.hook_command("claude-code"),
                "timeout": HOOK_TIMEOUT_S,
            }
            _put_hooks(data, "claude-code", ("SessionStart",), command)
            events = tuple(e for e in events if e != "SessionStart")
        _put_hooks(data, "claude-code", events, handler)
        enabled = data.setdefault("enabledMcpjsonServers", [])
        if not isinstance(enabled, list):
            raise AttachError("cannot merge: enabledMcpjsonServers is not a list")
        if SERVER not in enabled:
            enabled.append(SERVER)
        # the backchannel tools run without a prompt, also headless (`claude -p`), where
        # an unapproved tool is refused outright
        permissions = _obj(data, "permissions", "'permissions'")
        allow = permissions.setdefault("allow", [])
        if not isinstance(allow, list):
            raise AttachError("cannot merge: permissions.allow is not a list")
        if CLAUDE_TOOLS_RULE not in allow:
            allow.append(CLAUDE_TOOLS_RULE)

    return [
        _json_change(_target(opts, ".mcp.json"), mcp_json),
        _json_change(_target(opts, ".claude", "settings.local.json"), settings),
    ]


CODEX_END_TIMEOUT_S = 3
CODEX_DAEMON_FEATURE = "daemon_auto_start"
CODEX_SERVER_EXTRA: dict[str, Any] = {
    "required": True,
    "startup_timeout_sec": 30,
    "default_tools_approval_mode": "approve",
}


def _codex(opts: AttachOptions) -> list[FileChange]:
    body: dict[str, Any]
    if opts.http:
        body = {"url": f"{opts.url}/mcp", "bearer_token_env_var": TOKEN_VAR}
    else:
        body = {
            "command": opts.executable,
            "args": opts.mcp_args(),
            "env_vars": [TOKEN_VAR, "BACKCHANNEL_SESSION"],
        }
    # Codex starts its first turn without waiting for a server that is not `required`
    # (backchannel's tools would be missing from it), and refuses an MCP tool call that
    # needs approval when the approval policy is `never` (`codex exec`): the server is
    # required and its tools approved
    body.update(CODEX_SERVER_EXTRA)
    handler = {"type": "command", "command": opts.hook_command("codex"), "timeout": HOOK_TIMEOUT_S}
    events = get_runtime("codex").events

    def hooks(data: dict[str, Any]) -> None:
        _put_hooks(data, "codex", tuple(e for e in events if e != "SessionEnd"), handler)
        # Codex gives a SessionEnd hook at most 3 s (it clamps a longer timeout, and
        # the clamped handler no longer matches the trust granted for it)
        _put_hooks(data, "codex", ("SessionEnd",), {**handler, "timeout": CODEX_END_TIMEOUT_S})

    config = _toml_change(_target(opts, ".codex", "config.toml"), f"mcp_servers.{SERVER}", body)
    # an interactive `codex` otherwise runs its threads in a background server shared by
    # every project of the user: started with the environment (BACKCHANNEL_TOKEN) of the
    # first `codex` of the day, it runs every later session's hooks and MCP server with
    # that member's token, and quitting the TUI leaves the thread running there, so no
    # SessionEnd reaches the hub; this project's sessions run in the `codex` process
    config = _toml_key_change(config, "features", CODEX_DAEMON_FEATURE, False)
    return [config, _json_change(_target(opts, ".codex", "hooks.json"), hooks)]


#: Gemini CLI's setting (under ``ui``) that escapes the ``@`` of pasted text.
GEMINI_ESCAPE_AT = "escapePastedAtSymbols"


def _gemini(opts: AttachOptions) -> list[FileChange]:
    server: dict[str, Any]
    if opts.http:
        server = {
            "httpUrl": f"{opts.url}/mcp",
            "headers": {"Authorization": f"Bearer ${TOKEN_VAR}"},
        }
    else:
        server = {
            "command": opts.executable,
            "args": opts.mcp_args(),
            "env": {TOKEN_VAR: f"${TOKEN_VAR}"},
        }
    handler = {
        "type": "command",
        "command": opts.hook_command("gemini"),
        "name": SERVER,
        "timeout": HOOK_TIMEOUT_S * 1000,  # Gemini CLI counts milliseconds
    }

    # headless Gemini CLI offers an untrusted server's tools to the model only under
    # --yolo; `trust` skips its confirmations for this server alone
    server["trust"] = True

    def settings(data: dict[str, Any]) -> None:
        _obj(data, "mcpServers", "'mcpServers'")[SERVER] = server
        _put_hooks(data, "gemini", get_runtime("gemini").events, handler)
        # Gemini CLI reads any `@path` of a submitted prompt as a file and puts it before
        # the model; a teammate's message the tmux adapter pastes in would otherwise
        # show the agent's files (`@.env`, `@~/.ssh/id_rsa`) to its model. This escapes
        # the `@` of pasted text; the model still sees the message as it was written
        _obj(data, "ui", "'ui'")[GEMINI_ESCAPE_AT] = True

    return [_json_change(_target(opts, ".gemini", "settings.json"), settings)]


_WRITERS: dict[str, Callable[[AttachOptions], list[FileChange]]] = {
    "claude-code": _claude_code,
    "codex": _codex,
    "gemini": _gemini,
}


def plan(runtime: str, opts: AttachOptions) -> list[FileChange]:
    """What ``attach`` would write (unchanged files included, with ``changed`` false)."""
    get_runtime(runtime)
    if not opts.url.startswith(("http://", "https://")):
        raise AttachError(f"--url must be the hub's http(s):// address, not {opts.url!r}")
    return _WRITERS[runtime](opts)


def apply(changes: list[FileChange], *, stamp: str | None = None) -> list[tuple[Path, Path | None]]:
    """Write the changed files, each existing one backed up first.
    Returns ``(written file, its backup or None)`` pairs."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    done: list[tuple[Path, Path | None]] = []
    for change in changes:
        if not change.changed:
            continue
        backup = None
        if change.before is not None:
            backup = change.path.with_name(f"{change.path.name}.bak-{stamp}")
            n = 1
            while backup.exists():
                n += 1
                backup = change.path.with_name(f"{change.path.name}.bak-{stamp}-{n}")
            write_atomic(backup, change.before, mode_of=change.path)
        change.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(change.path, change.after)
        done.append((change.path, backup))
    return done


#: Enables the channel of the ``backchannel`` server of ``.mcp.json`` for one launch.
CHANNEL_FLAG = "--dangerously-load-development-channels server:backchannel"

_START = {
    "claude-code": "claude",
    # Codex reads the project's `daemon_auto_start = false` only once the project is
    # trusted; the first start, at the trust prompt, would use the shared server
    "codex": "codex --no-daemon",
    "gemini": "gemini",
}


def instructions(runtime: str, opts: AttachOptions, token: str | None) -> str:
    """What to do next: export the token (never written to the project), then start."""
    value = shlex.quote(token) if token else f"<the token of {opts.who}>"
    lines = [
        f"Attached {runtime} in {opts.directory} as {opts.who} (hub {opts.url}).",
        "The token is not written to any file. In the shell that starts the agent:",
        "",
        f"  export {TOKEN_VAR}={value}",
        f"  cd {shlex.quote(str(opts.directory))} && {_START[runtime]}",
        "",
        "Each running agent needs its own member's token.",
    ]
    if runtime == "claude-code":  # the server of .mcp.json pushes into an idle session
        lines.append(
            "So that a teammate's message wakes it when idle (Claude Code channels), "
            f"start it as: {_START[runtime]} {CHANNEL_FLAG}"
        )
    if runtime == "codex":
        lines += [
            "`--no-daemon` keeps the session in that `codex` process, with that shell's token,",
            "and ends it when you quit. Codex's shared background server would run it with the",
            "token of whichever `codex` started the server, and keep it running after you quit.",
            "Once Codex trusts the project, its .codex/config.toml turns that server off for",
            "a plain `codex` too.",
        ]
    if runtime == "gemini":
        lines += [
            "Gemini CLI runs only in a trusted folder (headless, an untrusted one exits with",
            "code 55): trust this folder once when Gemini asks (it is remembered), or pass",
            "`gemini --skip-trust` (that run only); automation may set",
            "GEMINI_CLI_TRUST_WORKSPACE=true.",
        ]
    return "\n".join(lines)


def codex_trust_note(opts: AttachOptions, *, grant: bool = False) -> str:
    """Codex's two grants, which only the user makes (in the user's Codex config): the
    project's trust (else .codex/ is not read) and each hook's (else hooks are skipped
    silently). Records the hooks' trust when ``grant``; says what is missing."""
    from backchannel.runtimes import codex_trust

    lines: list[str] = []
    if grant:
        config, granted = codex_trust.grant(opts.directory)
        lines.append(f"Recorded trust of {len(granted)} backchannel hook(s) in {config}.")
    states = codex_trust.hook_trust(opts.directory)
    pending = [t for t in states if t.status != "trusted"]
    if pending:
        grant_cmd = " ".join(
            shlex.quote(p)
            for p in opts.command(
                "attach", "codex", "--team", opts.team, "--member", opts.member,
                "--dir", str(opts.directory), "--url", opts.url,
                *(["--http"] if opts.http else []), "--trust-hooks",
            )
        )  # fmt: skip
        lines += [
            f"Codex skips hooks you have not trusted: {len(pending)} of backchannel's "
            f"hooks are {', '.join(sorted({t.status for t in pending}))}. Trust them once:",
            "",
            f"  {grant_cmd}",
            "",
            "(or review them in Codex with /hooks; `codex exec "
            "--dangerously-bypass-hook-trust` runs them for one invocation only).",
        ]
    elif states:
        lines.append(f"Codex trusts backchannel's {len(states)} hooks.")
    if not codex_trust.project_trusted(opts.directory):
        lines.append(
            "Codex reads .codex/ only in a trusted project: answer its trust prompt, or "
            f"run `codex exec --trust` once in {opts.directory}."
        )
    return "\n".join(lines)
