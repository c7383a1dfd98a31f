"""Codex hook trust: Codex runs a project's hooks only after the user trusts each one.

Codex keeps the grant in the *user's* config (``$CODEX_HOME/config.toml``, default
``~/.codex/config.toml``), one table per handler::

    [hooks.state."/abs/project/.codex/hooks.json:stop:0:0"]
    trusted_hash = "sha256:…"

The key is the hooks file's absolute path, the event's snake_case label, and the
handler's group and position; the hash is SHA-256 over the handler's normalized
identity (``{"event_name", "matcher"?, "hooks": [handler]}`` with the handler's type,
command, timeout and async flag, as compact JSON with sorted keys). A handler whose
hash differs from the grant is "modified" and does not run either. ``codex exec
--dangerously-bypass-hook-trust`` runs untrusted hooks for one invocation.

``attach`` never writes outside the project, so it only reports the state and prints
the one-time grant (``backchannel attach codex --trust-hooks``, which writes exactly
these tables, for backchannel's own handlers, into the user's Codex config).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backchannel.files import write_atomic

__all__ = ["HookTrust", "codex_home", "grant", "hook_trust", "project_trusted"]

_OURS = re.compile(r"backchannel\S*\s+hook\s+codex\b")
DEFAULT_TIMEOUT_S = 600  # what Codex assumes for a handler without one


def codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


def _label(event: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", event).lower()  # PreToolUse -> pre_tool_use


def _hash(label: str, matcher: str | None, handler: dict[str, Any]) -> str:
    normalized: dict[str, Any] = {
        "type": "command",
        "command": handler["command"],
        "timeout": max(int(handler.get("timeout") or DEFAULT_TIMEOUT_S), 1),
        "async": bool(handler.get("async", False)),
    }
    if handler.get("statusMessage") is not None:
        normalized["statusMessage"] = handler["statusMessage"]
    identity: dict[str, Any] = {"event_name": label, "hooks": [normalized]}
    if matcher is not None:
        identity["matcher"] = matcher
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class HookTrust:
    key: str  # Codex's hooks.state key
    event: str
    expected: str  # the hash a grant must hold
    granted: str | None  # the hash the user config holds, if any

    @property
    def status(self) -> str:
        if self.granted is None:
            return "untrusted"
        return "trusted" if self.granted == self.expected else "modified"


def hook_trust(project: Path, home: Path | None = None) -> list[HookTrust]:
    """backchannel's handlers in ``project``'s ``.codex/hooks.json`` and their trust."""
    hooks_file = (project / ".codex" / "hooks.json").resolve()
    try:
        data = json.loads(hooks_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    states = _states(home or codex_home())
    out: list[HookTrust] = []
    events = data.get("hooks") if isinstance(data, dict) else None
    for event, groups in (events or {}).items():
        for gi, group in enumerate(groups if isinstance(groups, list) else []):
            handlers = group.get("hooks") if isinstance(group, dict) else None
            for hi, handler in enumerate(handlers if isinstance(handlers, list) else []):
                if not isinstance(handler, dict) or handler.get("type", "command") != "command":
                    continue
                if not _OURS.search(str(handler.get("command", ""))):
                    continue
                label = _label(event)
                key = f"{hooks_file}:{label}:{gi}:{hi}"
                matcher = group.get("matcher")
                expected = _hash(label, matcher if isinstance(matcher, str) else None, handler)
                state = states.get(key)
                granted = state.get("trusted_hash") if isinstance(state, dict) else None
                out.append(HookTrust(key, event, expected, granted))
    return out


def _config(home: Path) -> dict[str, Any]:
    try:
        return tomllib.loads((home / "config.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def project_trusted(project: Path, home: Path | None = None) -> bool:
    """Whether the user's Codex config trusts ``project`` or a folder above it (Codex
    reads a project's ``.codex/`` only then)."""
    projects = _config(home or codex_home()).get("projects")
    if not isinstance(projects, dict):
        return False
    here = project.resolve()
    for folder in (here, *here.parents):
        entry = projects.get(str(folder))
        if isinstance(entry, dict) and entry.get("trust_level") == "trusted":
            return True
    return False


def _states(home: Path) -> dict[str, Any]:
    config = _config(home)
    hooks = config.get("hooks")
    states = hooks.get("state") if isinstance(hooks, dict) else None
    return states if isinstance(states, dict) else {}


def grant(project: Path, home: Path | None = None) -> tuple[Path, list[HookTrust]]:
    """Write the trust of backchannel's handlers in ``project`` into the user's Codex
    config (the grant Codex's own hook review makes), replacing older grants of the same
    keys. Returns the config file and the handlers now trusted."""
    home = home or codex_home()
    config = home / "config.toml"
    pending = [t for t in hook_trust(project, home) if t.status != "trusted"]
    if not pending:
        return config, []
    text = config.read_text(encoding="utf-8") if config.exists() else ""
    for t in pending:
        header = f"[hooks.state.{json.dumps(t.key)}]"
        block = f'{header}\ntrusted_hash = "{t.expected}"\n'
        lines = text.splitlines(keepends=True)
        start = next((i for i, line in enumerate(lines) if line.strip() == header), None)
        if start is None:
            text += ("" if not text or text.endswith("\n") else "\n") + "\n" + block
        else:
            end = start + 1
            while end < len(lines) and not lines[end].lstrip().startswith("["):
                end += 1
            text = "".join(lines[:start]) + block + "".join(lines[end:])
    tomllib.loads(text)  # never leave the user's config unreadable
    home.mkdir(parents=True, exist_ok=True)
    write_atomic(config, text)  # as private as it was
    return config, pending
