"""Which runtime process a backchannel process runs under: a key the hub matches so that
the runtime's MCP server can say its sessions are alive while the runtime is.

The hub cannot see a runtime's process. It ends a session that shows no sign of life for
the team's exit grace while a message waits for it (``session_silent``,
:mod:`backchannel.hub.sessions`); without more than hook events to go by, a runtime left
idle at its prompt, or in one long tool call, looked dead. Two of backchannel's own
processes run under each runtime process, on its machine: the command hook (``backchannel
hook``, for every event of each of its sessions) and the stdio MCP server (``backchannel
mcp``, for as long as the runtime runs). Both name the runtime process the same way:

* the nearest ancestor that is not a shell or a launcher (:data:`PASS_THROUGH`): the
  runtimes run hooks through a shell and MCP servers directly;
* as ``<machine>/<pid>/<start time>``: the machine's boot id (Linux) or host name, so
  that a key from one machine never matches another's, and the process's start time, so
  that a pid used again by a later process is another key.

The hook command sends the key with each event (:data:`RUNTIME_FIELD`); the hub keeps it
on the session. The MCP server beats while its parent lives; the hub counts a beat as a
sign of life of the member's live sessions that carry the key. A runtime that is killed
takes its MCP server with it (killed too, or its stdin closes), the beats stop, and its
sessions end by the rule as before.

A beat for a key says that process runs, whoever sends it, so it is sent only for a key
whose process is seen running just before (:func:`running`: the same pid with the same
start time, not a zombie). That is what lets the MCP server beat for more than its
nearest ancestor (:func:`runtime_keys`): started through a launcher that stays as its
parent and is not in :data:`PASS_THROUGH` (``timeout``, a wrapper script that runs it
without ``exec``, ``flock``), its nearest ancestor is the launcher, not the runtime that
the hooks name, so it beats for the few nearest ancestors that run. And it is what lets
a process that is no child of the runtime beat for it: the keeper a command hook started
with ``--keep-alive`` (:mod:`backchannel.runtimes.keeper`), for a runtime with no
``backchannel mcp`` of its own (the HTTP MCP server, ``attach --http``).

Standard library only: the lean command hook imports this on every call.
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = [
    "PASS_THROUGH",
    "RUNTIME_FIELD",
    "add_runtime",
    "running",
    "runtime_key",
    "runtime_keys",
]

#: Where a hook payload names the runtime process its hook ran under.
RUNTIME_FIELD = "backchannel_runtime"
#: Processes between a runtime and backchannel that are not the runtime: the shells
#: that run hook commands and the launchers that run ``backchannel`` itself.
PASS_THROUGH = frozenset(
    {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "busybox", "uv", "uvx", "pipx"}
)
#: How many ancestors are looked at, at most.
MAX_HOPS = 6
#: For how many of its nearest ancestors that are not :data:`PASS_THROUGH` the MCP server
#: beats: the runtime, behind a launcher or two the list does not know.
MAX_KEYS = 3


def _proc(pid: int) -> tuple[str, int, str] | None:
    """``(name, parent pid, start time)`` of ``pid`` from ``/proc`` (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    name = raw[raw.find("(") + 1 : raw.rfind(")")]
    fields = raw[raw.rfind(")") + 2 :].split()
    try:  # after the name: state, ppid (4th field), ..., starttime (22nd field)
        return name, int(fields[1]), fields[19]
    except (IndexError, ValueError):
        return None


def _ps(pid: int) -> tuple[str, int, str] | None:
    """The same from ``ps`` (macOS and other systems without ``/proc``)."""
    import subprocess  # not on Linux: the command hook imports this on every call

    try:
        out = subprocess.run(
            ["ps", "-o", "ppid=,lstart=,comm=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) < 7 or not out[0].isdigit():
        return None  # ppid, then lstart's five words ("Fri Nov 27 23:32:24 2026"), then comm
    return " ".join(out[6:]), int(out[0]), "-".join(out[1:6])


def _machine() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def _reader() -> Any:
    return _proc if os.path.isdir("/proc/self") else _ps


def runtime_key(parent: int | None = None) -> str | None:
    """The key of the runtime process this process runs under (see the module
    docstring), starting at ``parent`` (this process's parent by default); ``None`` when
    it cannot be told."""
    keys = runtime_keys(parent, 1)
    return keys[0] if keys else None


def runtime_keys(parent: int | None = None, most: int = MAX_KEYS) -> list[str]:
    """The keys of up to ``most`` of the nearest ancestors, from ``parent`` (this
    process's parent by default) up, that are not :data:`PASS_THROUGH`, nearest first:
    the first is the runtime's when nothing but shells and known launchers stand
    between."""
    read = _reader()
    pid = os.getppid() if parent is None else parent
    keys: list[str] = []
    for _ in range(MAX_HOPS):
        if pid <= 1 or len(keys) >= most:
            break
        found = read(pid)
        if found is None:
            break
        name, ppid, started = found
        name = os.path.basename(name).lstrip("-")  # a login shell's name starts with "-"
        if name not in PASS_THROUGH:
            keys.append(f"{_machine()}/{pid}/{started}")
        pid = ppid
    return keys


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits for its parent to reap it (Linux; elsewhere
    ``ps`` would show it as ``<defunct>``, with a start time all the same)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return True
    return raw[raw.rfind(b")") + 2 :][:1] in (b"Z", b"X")


def running(key: str) -> bool:
    """Whether the process ``key`` names (:func:`runtime_key`) runs now, on this machine:
    the same pid with the same start time, not a zombie (a runtime killed under a parent
    that has not reaped it yet is dead)."""
    machine, _, rest = key.partition("/")
    pid_text, _, started = rest.partition("/")
    if machine != _machine() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    found = _reader()(pid)
    if found is None or found[2] != started:
        return False
    return not (os.path.isdir("/proc/self") and _zombie(pid))


def add_runtime(payload: Any) -> Any:
    """``payload`` with :data:`RUNTIME_FIELD` added, when it is an object and the key can
    be told."""
    if not isinstance(payload, dict) or RUNTIME_FIELD in payload:
        return payload
    key = runtime_key()
    return payload if key is None else {**payload, RUNTIME_FIELD: key}
