"""Shared fixtures: stores for the conformance suite, a hub on a fake clock, a real server."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.hub import Hub
from backchannel.stores.base import Store
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, MemoryStore, eventually_blocking

pytest_plugins = ["tests.conftest_pg"]

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent / "backchannel"


# -- Ctrl-C ----------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a shell without job control (``make test
    &`` in a script, ``nohup``) has SIGINT ignored, and so has every process it starts:
    the tests of what Ctrl-C does (the SDK's receives, the CLI's commands, the README's
    walk-through) would see nothing happen. The suite takes Ctrl-C as a terminal's
    would; its children then start with SIGINT's default, as they do from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# -- workers ------------------------------------------------------------------------


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How ``make test`` shares the suite among its workers (pytest-xdist, ``--dist
    loadfile``): each file's tests on one worker, so its module fixtures (a browser, a
    hub, a CLI's first turn) are set up once; and every test that drives a real agent CLI
    (``tests/realcli``) on the same worker, one at a time. Two Node.js CLIs starting
    together beside their hubs starve each other of the two cores this suite is planned
    for, and a CLI that reads its keys late is not what those tests are about. (xdist's
    ``loadgroup`` would say this with marks, but it renames tests in a way pytest 9 no
    longer sees.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _RealCliTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/realcli/" if path.startswith("tests/realcli/") else path

    return _RealCliTogether(config, log)


# -- no real network ---------------------------------------------------------------

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _allowed(address: Any) -> bool:
    if isinstance(address, (str, bytes)):  # unix socket
        return True
    host = str(address[0])
    return host in ("localhost", "::1") or host.startswith("127.") or host == "0.0.0.0"


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if not _allowed(address):
        raise AssertionError(f"a test tried to reach {address!r}; tests may only use loopback")
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if not _allowed(address):
        raise AssertionError(f"a test tried to reach {address!r}; tests may only use loopback")
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True)
def _no_real_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that reaches past loopback (a real model service, say)."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
    for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(autouse=True)
def _private_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep what command hooks record per session (runtimes.seen) out of the real home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.delenv("BACKCHANNEL_STATE_DIR", raising=False)


# -- stores --------------------------------------------------------------------------

_counter = itertools.count()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """A factory of fresh stores, once per store implementation (the PostgreSQL one on
    a server the harness starts; see tests/conftest_pg.py)."""
    if request.param == "memory":
        return MemoryStore
    if request.param == "postgres":
        from backchannel.stores.postgres import PostgresStore

        new_url = request.getfixturevalue("new_postgres_url")
        return lambda: PostgresStore(new_url())
    return lambda: SqliteStore(tmp_path / f"store-{next(_counter)}.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def hub(clock: FakeClock) -> Any:
    h = Hub(MemoryStore(), clock=clock, background=False, lease_seconds=30, max_attempts=3)
    async with h:
        yield h


# -- a real server -------------------------------------------------------------------


@dataclass
class Server:
    url: str
    home: Path
    admin_token: str
    proc: subprocess.Popen[bytes]
    store_url: str

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            timeout=30,
        )

    def team(self, name: str, *members: str) -> dict[str, str]:
        """Create a team and members; returns name -> token (``user`` included)."""
        with self.client() as c:
            r = c.post("/v1/teams", json={"name": name})
            r.raise_for_status()
            tokens = {"user": r.json()["user_token"]}
            for m in members:
                r = c.post(f"/v1/teams/{name}/members", json={"name": m})
                r.raise_for_status()
                tokens[m] = r.json()["token"]
        return tokens

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    home: Path,
    store_url: str | None = None,
    *args: str,
    env: dict[str, str] | None = None,
    port: int = 0,
) -> Server:
    """Start ``backchannel serve`` on a free port and wait until it answers /healthz."""
    home.mkdir(parents=True, exist_ok=True)
    info = home / "server.json"
    if info.exists():
        info.unlink()
    store_url = store_url or f"sqlite://{home / 'backchannel.db'}"
    env = {**os.environ, **(env or {}), "BACKCHANNEL_HOME": str(home)}
    with open(home / "serve.log", "ab") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [str(BIN), "serve", "--port", str(port), "--store", store_url, *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def up() -> Server | None:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited early: {(home / 'serve.log').read_text()}")
        if info.exists():
            try:
                url = json.loads(info.read_text())["url"]
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    token = (home / "admin.token").read_text().strip()
                    return Server(url, home, token, proc, store_url)
            except (ValueError, KeyError, httpx.HTTPError):
                pass
        return None

    try:
        return eventually_blocking(up, what="serve to come up", within=30)
    except AssertionError:
        proc.kill()
        raise RuntimeError(f"serve did not come up: {(home / 'serve.log').read_text()}") from None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "home")
    try:
        yield srv
    finally:
        srv.stop()
