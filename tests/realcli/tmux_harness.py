"""Driving the real Claude Code CLI interactively, offline: a private HOME with its first-run prompts
answered, a scripted model API on 127.0.0.1 (:mod:`.fake_anthropic`), a proxy that refuses
and records every attempt to reach anything else, and the CLI in a real tmux pane."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import libtmux
import pytest

from backchannel.testing import eventually_blocking

ROOT = Path(__file__).resolve().parents[2]
CLI_DIR = Path(os.environ.get("BACKCHANNEL_CLI_DIR") or ROOT / ".cache" / "clis")
CLAUDE = CLI_DIR / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"


def claude_binary() -> Path:
    if not CLAUDE.exists():
        pytest.fail(
            f"the real Claude Code CLI is not installed at {CLAUDE}; "
            "run `bash scripts/setup-clis.sh` (make test does)"
        )
    if shutil.which("tmux") is None:
        pytest.fail("the real-CLI tests need tmux on PATH (scripts/setup-system.sh)")
    return CLAUDE


class RefusingProxy:
    """An HTTP(S) proxy on 127.0.0.1 that refuses every request and records its first
    line (``CONNECT host:443 HTTP/1.1``): where the CLI tried to go past loopback."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    first = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    first = "(no request line)"
                self.attempts.append(first)
                body = b"refused: tests reach nothing but 127.0.0.1\n"
                head = f"HTTP/1.1 403 Forbidden\r\nContent-Length: {len(body)}\r\n"
                conn.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)

    def close(self) -> None:
        self._sock.close()


def write_home(home: Path, projects: list[Path]) -> None:
    """A HOME whose ~/.claude.json answers Claude Code's first-run questions: onboarding
    done, the test API key approved, each project's folder trusted."""
    home.mkdir(parents=True, exist_ok=True)
    config = {
        "hasCompletedOnboarding": True,
        "numStartups": 1,
        "theme": "dark",
        "customApiKeyResponses": {"approved": ["sk-test"], "rejected": []},
        "projects": {
            str(p): {"hasTrustDialogAccepted": True, "allowedTools": []} for p in projects
        },
    }
    (home / ".claude.json").write_text(json.dumps(config))


def cli_env(home: Path, api_url: str, proxy: RefusingProxy, **extra: str) -> dict[str, str]:
    """The environment the CLI runs in: the fake API, the private HOME, and every other
    destination sent to the refusing proxy."""
    # PYTHONPATH: the code under test in the hooks and MCP server too (a worktree's)
    names = ("PATH", "LANG", "TERM", "TMPDIR", "PYTHONPATH")
    keep = {k: v for k, v in os.environ.items() if k in names}
    return {
        **keep,
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": api_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "HTTPS_PROXY": proxy.url,
        "HTTP_PROXY": proxy.url,
        "https_proxy": proxy.url,
        "http_proxy": proxy.url,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        **extra,
    }


class Pane:
    """The CLI running in a real tmux pane."""

    def __init__(self, pane: libtmux.Pane) -> None:
        self.pane = pane
        #: When Enter was last pressed in the pane (``time.monotonic()``).
        self.pressed = 0.0

    def screen(self) -> str:
        return "\n".join(self.pane.capture_pane())

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """The screen, once ``text`` is on it."""

        def shown() -> str | None:
            screen = self.screen()
            return screen if text in screen else None

        return str(wait_until(shown, timeout, f"{text!r} on screen", self))

    def type(self, text: str) -> None:
        self.pane.send_keys(text, enter=False, literal=True)
        self.wait_for(text)  # typed in full before Enter, or Enter lands in the burst
        self.enter()

    def enter(self) -> None:
        self.pane.send_keys("", enter=True)
        self.pressed = time.monotonic()

    def exited(self) -> bool:
        """Whether the CLI in the pane has exited (its pane is dead)."""
        return self.pane.cmd("display-message", "-p", "#{pane_dead}").stdout == ["1"]


def wait_until(
    check: Callable[[], Any], timeout: float, what: str, pane: Pane | None = None
) -> Any:
    try:
        return eventually_blocking(check, what=what, within=timeout)
    except AssertionError as exc:
        if pane is None:
            raise
        raise AssertionError(f"{exc}\n--- screen ---\n{pane.screen()}") from None


@contextmanager
def claude_pane(
    cwd: Path, env: dict[str, str], *args: str, width: int = 160, height: int = 50
) -> Iterator[Pane]:
    """``claude ARGS`` in a tmux pane on a private tmux server, killed at the end."""
    with cli_pane(claude_binary(), cwd, env, *args, width=width, height=height) as pane:
        yield pane


@contextmanager
def cli_pane(
    binary: Path, cwd: Path, env: dict[str, str], *args: str, width: int = 160, height: int = 50
) -> Iterator[Pane]:
    """``BINARY ARGS`` in a tmux pane on a private tmux server, with exactly ``env`` as
    its environment; the server (and so the CLI) is killed at the end."""
    import uuid

    if shutil.which("tmux") is None:
        pytest.fail("the real-CLI tests need tmux on PATH (scripts/setup-system.sh)")
    from tests.delivery.conftest_adapters import TmuxServer

    server = TmuxServer(socket_name=f"bc-cli-{uuid.uuid4().hex[:10]}", config_file="/dev/null")
    command = " ".join(_quote(a) for a in [str(binary), *args])
    exports = " ".join(f"{k}={_quote(v)}" for k, v in env.items())
    session = server.new_session(
        session_name=binary.name.split(".")[0],
        window_command=f"env -i {exports} {command}",
        start_directory=str(cwd),
        x=width,
        y=height,
    )
    # a CLI that exits leaves its pane (dead) and its last screen, for Pane.exited
    server.cmd("set-option", "-wg", "remain-on-exit", "on")
    pane = session.active_window.active_pane
    assert pane is not None
    leader = int(pane.cmd("display-message", "-p", "#{pane_pid}").stdout[0])
    try:
        yield Pane(pane)
    finally:
        socket_path = None
        if server.is_alive():
            socket_path = server.cmd("display-message", "-p", "#{socket_path}").stdout[0]
            server.kill()
        if socket_path:
            Path(socket_path).unlink(missing_ok=True)
        # the CLI's process group, for what outlives the pane's hangup (Gemini CLI's
        # relaunched child, its MCP server)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)
