"""A throwaway PostgreSQL server for the test suite.

``start_postgres()`` returns a :class:`PgServer` whose ``url`` points at a fresh, empty
database. When ``BACKCHANNEL_TEST_POSTGRES_URL`` is set, that server is used instead
(nothing is started and ``stop()`` does nothing); the role in it needs ``CREATEDB`` for
:meth:`PgServer.new_database`.

Otherwise the harness starts its own server:

* binaries: ``$BACKCHANNEL_PG_BINDIR`` if set, else the ones shipped in the ``pgserver``
  wheel (a dev dependency, so ``pip install -e .[dev]`` is enough), else Debian's
  ``/usr/lib/postgresql/*/bin`` (``scripts/setup-postgres.sh`` installs them);
* a new data directory in a temporary directory, ``initdb`` with a random password
  (``scram-sha-256`` over TCP, ``trust`` on the private unix socket);
* ``postgres`` listening on a free port of 127.0.0.1 (retried on a port race) and on a
  unix socket in the temporary directory, with ``fsync=off`` (test data is disposable);
* as root, everything runs as the ``postgres`` user (or ``nobody``): PostgreSQL refuses
  to run as root;
* on Linux the server gets a parent-death signal, so it stops even if the test process
  is killed;
* a bounded wait until it accepts connections, then ``CREATE DATABASE``.

Anything that goes wrong raises :class:`PgHarnessError` with the server log attached:
tests that need PostgreSQL fail loudly, they are never skipped.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from backchannel.stores.postgres import mask_url

__all__ = ["PgHarnessError", "PgServer", "find_bindir", "start_postgres"]

ENV_URL = "BACKCHANNEL_TEST_POSTGRES_URL"
ENV_BINDIR = "BACKCHANNEL_PG_BINDIR"
START_TIMEOUT = 30.0
USER = "backchannel"


class PgHarnessError(RuntimeError):
    """PostgreSQL could not be started or reached for the tests."""


def _with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


@dataclass
class PgServer:
    """A running server (or an external one) and the URL of the tests' database."""

    url: str
    admin_url: str
    data_dir: Path | None = None
    log_path: Path | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _tmp: Path | None = field(default=None, repr=False)
    #: how the server was started (``restart`` starts it again the same way)
    _start: Callable[[], subprocess.Popen[bytes]] | None = field(default=None, repr=False)

    def new_database(self, prefix: str = "bc") -> str:
        """Create an empty database and return its URL (for tests that need a clean slate)."""
        name = f"{prefix}_{secrets.token_hex(6)}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # name is generated: no injection
        return _with_dbname(self.url, name)

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no server log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def restart(self, *, crash: bool = False, down_for: float = 0.0) -> None:
        """Stop the server and start it again on the same port and data: a fast shutdown
        (SIGINT: sessions are ended, the data is checkpointed), or with ``crash`` every
        process of it killed with SIGKILL at once (the host lost power; it starts with
        crash recovery); ``down_for`` seconds pass before it starts again. Waits until it
        accepts connections again."""
        proc = self._process
        if proc is None or self._start is None:
            raise PgHarnessError("only a server the harness started can be restarted")
        if crash:
            os.killpg(proc.pid, signal.SIGKILL)  # the postmaster and its backends
        else:
            proc.send_signal(signal.SIGINT)
        proc.wait(30)
        time.sleep(down_for)  # an outage of a known length, not a wait for a condition
        self._process = self._start()
        deadline = time.monotonic() + START_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                with psycopg.connect(self.admin_url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last = str(exc)
                time.sleep(0.05)
        raise PgHarnessError(
            f"PostgreSQL did not come back after a restart (last error: {last}). "
            f"Server log:\n{self.log_tail()}"
        )

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every process of the server stopped (SIGSTOP) while inside, as a paused VM or
        a host stalled in swap: its sockets stay open and its kernel acknowledges what
        clients send, but nothing answers. The postmaster first (it forks no backend
        meanwhile), then its children (each backend is a process group of its own).
        Always continued (SIGCONT) on leaving."""
        proc = self._process
        if proc is None:
            raise PgHarnessError("only a server the harness started can be frozen")
        stopped = [proc.pid]
        try:
            os.kill(proc.pid, signal.SIGSTOP)
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            for pid in map(int, children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            yield
        finally:
            for pid in reversed(stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then SIGKILL after 10 s; remove the data. Idempotent."""
        proc, self._process = self._process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def find_bindir() -> Path:
    """Where ``initdb`` and ``postgres`` are; raises :class:`PgHarnessError` if nowhere."""
    candidates: list[Path] = []
    if os.environ.get(ENV_BINDIR):
        candidates.append(Path(os.environ[ENV_BINDIR]))
    # Locate the pgserver wheel without importing it (its import warns, and warnings are
    # errors in the test suite).
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(Path(p) for p in debian)
    for c in candidates:
        if (c / "postgres").is_file() and (c / "initdb").is_file():
            return c
    raise PgHarnessError(
        "no PostgreSQL binaries found (looked in: "
        + ", ".join(str(c) for c in candidates or [Path("/usr/lib/postgresql/*/bin")])
        + "). Install the dev extra (`pip install -e '.[dev]'`, which brings the pgserver "
        "wheel), run `scripts/setup-postgres.sh`, set BACKCHANNEL_PG_BINDIR, or point "
        f"{ENV_URL} at a running server."
    )


@dataclass(frozen=True)
class _RunAs:
    """Who PostgreSQL runs as (all ``None``: as ourselves)."""

    user: int | None
    group: int | None
    extra_groups: list[int] | None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged account to run PostgreSQL as when we are root, else ``None``."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PgHarnessError(
        "running as root and neither a 'postgres' nor a 'nobody' account exists; "
        "PostgreSQL refuses to run as root"
    )


def _die_with_parent() -> None:
    """In the child, before exec: a fast shutdown if the test process dies (even by
    SIGKILL), so no server outlives its session. Linux only; elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _external(url: str) -> PgServer:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise PgHarnessError(f"{ENV_URL} is set but {mask_url(url)} is unreachable: {exc}") from exc
    srv = PgServer(url=url, admin_url=url)
    srv.url = srv.new_database("bctest")
    return srv


def start_postgres() -> PgServer:
    """Start a server (or adopt ``$BACKCHANNEL_TEST_POSTGRES_URL``); see the module doc."""
    if os.environ.get(ENV_URL):
        return _external(os.environ[ENV_URL])
    bindir = find_bindir()
    account = _run_as()
    tmp = Path(tempfile.mkdtemp(prefix="bc-pg-"))
    os.chmod(tmp, 0o755)
    data, sock, log = tmp / "data", tmp / "sock", tmp / "server.log"
    password = secrets.token_hex(12)
    pwfile = tmp / "pwfile"
    pwfile.write_text(password + "\n")
    sock.mkdir()
    data.mkdir(mode=0o700)
    log.touch()
    who = _RunAs(None, None, None)
    if account is not None:
        for p in (data, sock, log, pwfile):
            os.chown(p, account.pw_uid, account.pw_gid)
        who = _RunAs(account.pw_uid, account.pw_gid, [])
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC"}
    try:
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}",
             "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync"],
            capture_output=True, env=env, cwd=tmp, timeout=120, check=False,
            user=who.user, group=who.group, extra_groups=who.extra_groups,
        )  # fmt: skip
        if init.returncode != 0:
            raise PgHarnessError(
                f"initdb ({bindir}) failed with exit {init.returncode}:\n"
                + init.stdout.decode(errors="replace")
                + init.stderr.decode(errors="replace")
            )
        srv = _launch(bindir, data, sock, log, password, env, who, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atexit.register(srv.stop)  # belt and braces if the session dies before teardown
    try:
        srv.url = srv.new_database("bctest")
    except BaseException:
        srv.stop()
        raise
    return srv


def _launch(
    bindir: Path,
    data: Path,
    sock: Path,
    log: Path,
    password: str,
    env: dict[str, str],
    who: _RunAs,
    tmp: Path,
) -> PgServer:
    last = ""
    for _ in range(3):  # a port grabbed between _free_port() and bind() means: try another
        port = _free_port()

        def start(port: int = port) -> subprocess.Popen[bytes]:
            with open(log, "ab") as out:
                return subprocess.Popen(
                    [str(bindir / "postgres"), "-D", str(data), "-p", str(port),
                     "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sock}",
                     "-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off", "-c", "max_connections=300",
                     "-c", "shared_buffers=64MB", "-c", "deadlock_timeout=200ms"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                    cwd=tmp, start_new_session=True, user=who.user, group=who.group,
                    extra_groups=who.extra_groups, preexec_fn=_die_with_parent,
                )  # fmt: skip

        proc = start()
        admin = f"postgresql://{USER}:{password}@127.0.0.1:{port}/postgres"
        srv = PgServer(url=admin, admin_url=admin, data_dir=data, log_path=log,
                       _process=proc, _tmp=tmp, _start=start)  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                with psycopg.connect(admin, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return srv
            except psycopg.OperationalError as exc:
                last = str(exc)
                time.sleep(0.05)
        else:
            srv._tmp = None  # keep the directory for the caller's cleanup
            srv.stop()
            raise PgHarnessError(
                f"PostgreSQL did not accept connections within {START_TIMEOUT:.0f} s "
                f"(last error: {last}). Server log:\n{srv.log_tail()}"
            )
        tail = srv.log_tail()
        if "could not bind" not in tail and "Address already in use" not in tail:
            raise PgHarnessError(
                f"PostgreSQL ({bindir / 'postgres'}) exited with code {proc.returncode} "
                f"at start. Server log:\n{tail}"
            )
    raise PgHarnessError(f"PostgreSQL could not bind a loopback port in 3 tries:\n{last}")
