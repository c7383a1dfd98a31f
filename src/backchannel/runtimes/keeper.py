"""A runtime's beat when no ``backchannel mcp`` of it beats: a small process, started by
the command hook, that tells the hub the runtime runs for as long as it does.

A runtime whose MCP client talks to the hub's HTTP MCP server (``attach --http``) starts
no process of backchannel's that lives as long as it does, so nothing beats for it
(:mod:`backchannel.runtimes.liveness`), and a session of it idle at its prompt, or in one
long tool call, for over the exit grace while a message waits for it was taken for dead.
Its command hooks do run under it (all of Codex's and Gemini CLI's, Claude Code's
``SessionStart``). A hook run with ``--keep-alive`` (``attach --http`` writes it) makes
sure one keeper runs for its runtime process (:func:`ensure`): a process of its own
session (so a runtime's timeout of the hook, or a signal to its process group, leaves it
alone) that beats for the hook's runtime key while that process runs
(:func:`~backchannel.runtimes.liveness.running`: the same pid and start time, looked at
every :data:`POLL_S` and just before each beat) and then exits. A killed runtime's
beats stop as its MCP server's would, and its sessions end by the hub's rule.

One keeper per runtime process: it holds a ``flock`` on a file named for the key in the
hook's state directory (:func:`~backchannel.runtimes.seen.state_dir`) for as long as it
runs, and removes the file when it exits; a hook finds the lock held and starts nothing,
and a second keeper started in a race finds it held and exits. The token reaches it in its environment, never on its
command line.

Standard library only, and imported by the lean command hook only when it runs with
``--keep-alive``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from backchannel.runtimes import liveness

__all__ = ["ALIVE_PATH", "FLAG", "POLL_S", "ensure", "lock_path", "main"]

#: The hook's option that asks for a keeper.
FLAG = "--keep-alive"
ALIVE_PATH = "/v1/sessions/alive"
#: How often the keeper looks whether its runtime still runs (on Linux a read of
#: ``/proc``; elsewhere a ``ps``, so less often): how soon after its runtime it exits.
POLL_S = 2.0 if os.path.isdir("/proc/self") else 10.0
#: How long to wait before beating again when the hub could not be reached, or did not
#: say (the MCP server's rule: a minute).
RETRY_S = 60.0
#: The shortest time between two beats, whatever the hub says.
MIN_BEAT_S = 1.0
_TIMEOUT_S = 10.0


def lock_path(key: str) -> Path:
    """The file a keeper for runtime process ``key`` holds its lock on."""
    from backchannel.runtimes.seen import state_dir

    return state_dir() / f"keeper_{urllib.parse.quote(key, safe='-_.')}.lock"


def _lock(key: str) -> int | None:
    """An open descriptor holding the keeper lock of ``key``; ``None`` when another
    process holds it (or it cannot be had)."""
    from backchannel.files import private_dirs

    path = lock_path(key)
    try:
        private_dirs(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def ensure(key: str, url: str, token: str) -> bool:
    """Make sure a keeper beats for runtime process ``key`` to the hub at ``url`` with
    ``token``: start one unless one runs. Returns whether it started one; never raises
    (a hook must answer whatever happens here)."""
    fd = _lock(key)
    if fd is None:
        return False  # one runs (or the state directory is not writable: none can)
    os.close(fd)  # the keeper takes it; one started meanwhile by another hook wins
    env = {k: v for k, v in os.environ.items() if k != "BACKCHANNEL_TOKEN"}
    env["BACKCHANNEL_TOKEN"] = token
    args = [sys.executable, "-m", "backchannel.runtimes.keeper", url, key]
    # no stdin or stdout of the hook's (the runtime reads the hook's output to its end),
    # in a session of its own; the hook's other descriptors are not inherited (PEP 446)
    null = [(os.POSIX_SPAWN_OPEN, n, os.devnull, os.O_RDWR, 0) for n in (0, 1, 2)]
    try:
        os.posix_spawn(sys.executable, args, env, file_actions=null, setsid=True)
    except (NotImplementedError, AttributeError):  # no setsid for posix_spawn here
        return _popen(args, env)
    except OSError:
        return False
    return True


def _popen(args: list[str], env: dict[str, str]) -> bool:
    import subprocess

    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError:
        return False
    proc.returncode = 0  # not waited for: it outlives the hook by design
    return True


def _opener(url: str) -> urllib.request.OpenerDirector:
    """urllib's opener for the hub at ``url``: one that never goes through a proxy when
    the hub is on this machine (:mod:`backchannel.reach`), the environment's otherwise."""
    from backchannel.reach import loopback

    if loopback(url):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def beat(url: str, token: str, key: str) -> float | None:
    """One beat; how soon the hub asks to be beaten again (its ``next_in``), or ``None``
    when the beat did not go through."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}{ALIVE_PATH}",
        data=json.dumps({"runtime": key}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _opener(url).open(request, timeout=_TIMEOUT_S) as resp:
            answer = json.loads(resp.read(65536))
        every = float(answer["next_in"])
    except (OSError, ValueError, KeyError, TypeError, urllib.error.URLError):
        return None
    return every if every > 0 else None


def keep(url: str, token: str, key: str) -> None:
    """Beat for ``key`` while its process runs (the caller holds the lock). A beat that
    does not go through is tried again at the pace the hub last asked for, as the MCP
    server's beat is: a hub away for a while counts silence from its return, and a
    minute could outlast a short exit grace. Before the hub answered once, a failed
    beat is tried again after :data:`MIN_BEAT_S`, doubling up to :data:`RETRY_S`: the
    hook that started the keeper has just reached the hub."""
    due = 0.0
    every: float | None = None  # the hub's pace, once it answered
    retry = MIN_BEAT_S  # before it answered: the hook just reached it, so soon, doubling
    while liveness.running(key):
        now = time.monotonic()
        if now >= due:
            every = beat(url, token, key) or every
            if every is None:
                due, retry = now + retry, min(retry * 2, RETRY_S)
            else:
                due = now + max(MIN_BEAT_S, every)
        time.sleep(max(0.05, min(POLL_S, due - time.monotonic())))


def main(argv: Sequence[str]) -> int:
    """``python -m backchannel.runtimes.keeper URL KEY``, the token in
    ``BACKCHANNEL_TOKEN``."""
    if len(argv) != 2:
        print("usage: python -m backchannel.runtimes.keeper URL RUNTIME_KEY", file=sys.stderr)
        return 2
    url, key = argv
    token = os.environ.pop("BACKCHANNEL_TOKEN", "")
    if not token or not url.lower().startswith(("http://", "https://")):
        return 2
    fd = _lock(key)
    if fd is None:
        return 0  # another keeper beats for it
    try:
        keep(url, token, key)
    finally:  # its runtime is gone: no hook of it comes for the file any more
        with contextlib.suppress(OSError):
            lock_path(key).unlink()
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
