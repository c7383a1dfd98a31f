"""Helpers shared by the benchmarks: statistics, result tables, event loops, machine facts,
a ``backchannel serve`` subprocess with bounded waits, and team setup.

Nothing here is imported by the package itself; the benchmarks are run by hand
(see bench/README.md), never as timed tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.figures import Figure, write_results

T = TypeVar("T")

# -- statistics ---------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of an already sorted sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(seconds: Iterable[float]) -> dict[str, float]:
    """n, mean, p50, p90, p99, p99.9 and max of latencies given in seconds, as milliseconds."""
    values = sorted(seconds)
    if not values:
        return {"n": 0}
    ms = 1000.0
    return {
        "n": len(values),
        "mean_ms": sum(values) / len(values) * ms,
        "p50_ms": percentile(values, 50) * ms,
        "p90_ms": percentile(values, 90) * ms,
        "p99_ms": percentile(values, 99) * ms,
        "p999_ms": percentile(values, 99.9) * ms,
        "max_ms": values[-1] * ms,
    }


# -- the text a benchmark message carries --------------------------------------------------


def make_text(size: int, intended: float, started: float) -> str:
    """Message text carrying two ``time.perf_counter()`` stamps, padded to ``size`` bytes.

    ``intended`` is when the send was scheduled (the open-loop schedule; equal to
    ``started`` when sending as fast as possible), ``started`` when the send call began.
    The stamps need ~36 bytes; a smaller ``size`` still carries them.
    """
    head = f"{intended:.7f} {started:.7f} "
    return head + "x" * max(0, size - len(head))


def parse_text(text: str) -> tuple[float, float]:
    intended, started, _ = text.split(" ", 2)
    return float(intended), float(started)


# -- results --------------------------------------------------------------------------------


@dataclass
class Target:
    """One figure from DESIGN.md section 7 compared with a measured value."""

    name: str
    goal: str
    value: float
    met: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "goal": self.goal, "value": self.value, "met": self.met}


@dataclass
class Result:
    """What one benchmark phase measured."""

    mode: str
    phase: str
    config: dict[str, Any]
    rows: list[tuple[str, str]] = field(default_factory=list)  # (metric, shown value)
    metrics: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "phase": self.phase,
            "config": self.config,
            "metrics": self.metrics,
            "targets": [t.to_json() for t in self.targets],
            "notes": self.notes,
        }


def fmt_ms(stats: dict[str, float], key: str) -> str:
    v = stats.get(key)
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f} ms"


def latency_row(stats: dict[str, float]) -> str:
    if not stats.get("n"):
        return "no samples"
    return (
        f"p50 {stats['p50_ms']:.2f}  p90 {stats['p90_ms']:.2f}  p99 {stats['p99_ms']:.2f}  "
        f"max {stats['max_ms']:.2f} ms  (n={stats['n']})"
    )


def print_results(results: Sequence[Result], machine: dict[str, Any], *, stderr: bool) -> None:
    """Rich tables: one per phase, then the targets, then the machine caveats."""
    from rich.console import Console
    from rich.table import Table

    console = Console(
        stderr=stderr, highlight=False, width=max(shutil.get_terminal_size().columns, 110)
    )
    for r in results:
        table = Table(title=f"{r.mode} — {r.phase}", title_justify="left", show_lines=False)
        table.add_column("metric", style="bold")
        table.add_column("value")
        for metric, shown in r.rows:
            table.add_row(metric, shown)
        for t in r.targets:
            verdict = "[green]met[/green]" if t.met else "[red]MISSED[/red]"
            table.add_row(f"target: {t.name}", f"{t.goal} → {verdict}")
        console.print(table)
        for note in r.notes:
            console.print(f"  [dim]note:[/dim] {note}")
        console.print()
    console.print(
        "[dim]machine:[/dim] "
        f"{machine['cpus']} CPUs ({machine['cpu_model']}), Python {machine['python']}, "
        f"loop {machine['loop']}, gc thresholds {machine.get('gc_thresholds', '?')}, "
        f"{pinned_note(machine)}data dir {machine['data_dir']} on {machine['fs_type']} "
        f"(fsync p50 {machine['fsync_p50_ms']:.3f} ms, p99 {machine['fsync_p99_ms']:.3f} ms), "
        f"load average at start {machine['loadavg_at_start']}; code {machine['source']}"
    )


def dump_json(results: Sequence[Result], machine: dict[str, Any]) -> str:
    return json.dumps(
        {"machine": machine, "results": [r.to_json() for r in results]}, indent=2, default=str
    )


def finish(
    args: argparse.Namespace,
    benchmark: str,
    results: Sequence[Result],
    figures: Iterable[Figure],
    machine: dict[str, Any],
) -> int:
    """The end of a benchmark's run: its results as JSON on stdout with ``--json``, its
    figures and raw results written to ``--results``; the exit code is 0 only when every
    target was met."""
    if args.json:
        print(dump_json(results, machine))
    write_results(
        args.results,
        benchmark,
        figures,
        {"machine": machine, "results": [r.to_json() for r in results]},
    )
    return 0 if all(t.met for r in results for t in r.targets) else 1


# -- machine --------------------------------------------------------------------------------


def fs_type(path: Path) -> str:
    """Filesystem type of ``path`` (from /proc/mounts, longest mount-point prefix)."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            mnt = parts[1]
            p = str(path.resolve())
            if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, parts[2]
    return kind


def fsync_probe(directory: Path, n: int = 100) -> tuple[float, float]:
    """p50 and p99 of write(4 KiB)+fsync in ``directory``, in ms: what one commit costs."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=".fsync-probe-")
    times = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 4096)
            t = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(name)
    times.sort()
    return percentile(times, 50) * 1e3, percentile(times, 99) * 1e3


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def source_state() -> str:
    """The commit of the code under test, and whether src/ has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted changes in src/' if dirty else ''}"


def machine_info(data_dir: Path, loop: str) -> dict[str, Any]:
    p50, p99 = fsync_probe(data_dir)
    return {
        "source": source_state(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loop": loop,
        "gc_thresholds": gc_thresholds(),
        "cpus_allowed": allowed_cpus(),
        "data_dir": str(data_dir),
        "fs_type": fs_type(data_dir),
        "fsync_p50_ms": p50,
        "fsync_p99_ms": p99,
        "loadavg_at_start": loadavg(),
    }


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs, from /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return math.nan
    ticks = [int(x) for x in fields[:8]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def wait_quiet(max_wait: float, threshold: float = 0.2) -> float:
    """Wait (at most ``max_wait`` s) until other processes use under ``threshold`` of one
    CPU over a one-second window; returns the last measured share (in cores)."""
    deadline = time.monotonic() + max_wait
    while True:
        b0, c0 = machine_busy(), cpu_self()
        time.sleep(1.0)
        others = max(0.0, (machine_busy() - b0) - (cpu_self() - c0))
        if others < threshold or time.monotonic() >= deadline:
            return others
        log(f"  waiting for a quieter machine: other processes use {others:.2f} CPUs ...")


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def cpu_self() -> float:
    """CPU seconds (user + system, every thread) used by this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _stat_cpu(stat: Path) -> float:
    """User + system CPU seconds in a ``/proc/.../stat`` file (a process's or a thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def thread_cpu(pid: int | None = None) -> dict[int, float]:
    """CPU seconds (user + system) each thread of process ``pid`` (this one by default)
    has used so far, by thread id; empty where ``/proc`` cannot tell."""
    out: dict[int, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid or os.getpid()}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out[int(task.name)] = _stat_cpu(task / "stat")
        except (OSError, IndexError, ValueError):
            continue  # the thread ended while it was read
    return out


def cpu_of(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) used by process ``pid`` so far."""
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat"))
    except (OSError, IndexError, ValueError):
        return None


# -- event loops ----------------------------------------------------------------------------


def add_gc_option(group: argparse._ActionsContainer) -> None:
    """``--python-gc``: the host process keeps Python's collector thresholds."""
    group.add_argument(
        "--python-gc",
        action="store_true",
        help="keep Python's garbage-collector thresholds in this process (700/10/10) "
        "instead of calling backchannel.tune_gc(), as the README tells a program that "
        "runs a busy hub in-process to (backchannel serve tunes its own process either way)",
    )


def host_gc(python_gc: bool) -> None:
    """This process hosts a hub (or the load on one): tune its collector as the README
    tells such a program to, unless ``python_gc``. The machine line shows the result."""
    if not python_gc:
        from backchannel.tuning import tune_gc

        tune_gc()


def add_cpu_option(group: argparse._ActionsContainer) -> None:
    """``--cpu N``: this process on one CPU, as ``backchannel.pin_to_cpu`` does."""
    group.add_argument(
        "--cpu",
        type=int,
        default=None,
        metavar="N",
        help="run this process (hub or load generator) on CPU N only, with "
        "backchannel.pin_to_cpu (Linux); for the server, pass --server-arg=--cpu=N",
    )


def host_cpu(cpu: int | None) -> None:
    """Pin this process to ``cpu`` (if given) before it starts a thread; the machine
    line shows it."""
    if cpu is not None:
        from backchannel.tuning import pin_to_cpu

        try:
            pin_to_cpu(cpu)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--cpu: {exc}") from None


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (all of them unless pinned)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def pinned_note(machine: dict[str, Any]) -> str:
    allowed = machine.get("cpus_allowed") or []
    if not allowed or len(allowed) >= (machine.get("cpus") or 0):
        return ""
    return f"this process on CPU {', '.join(map(str, allowed))} only, "


def gc_thresholds() -> str:
    """This process's collector thresholds, as ``700/10/10``."""
    return "/".join(str(n) for n in gc.get_threshold())


def loop_name(want_uvloop: bool) -> str:
    if want_uvloop:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            return "asyncio"
        return "uvloop"
    return "asyncio"


def run(main: Callable[..., Awaitable[T]], *args: Any, use_uvloop: bool) -> T:
    """Run ``main(*args)`` on a fresh loop: uvloop when asked for and installed."""
    factory = None
    if use_uvloop and loop_name(True) == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main(*args))  # type: ignore[arg-type]


# -- backchannel serve as a subprocess --------------------------------------------------------


def backchannel_command() -> list[str]:
    """The ``backchannel`` entry point of the interpreter running the bench."""
    script = Path(sys.executable).parent / "backchannel"
    if script.exists():
        return [str(script)]
    found = shutil.which("backchannel")
    if found:
        return [found]
    return [sys.executable, "-m", "backchannel"]


_PROFILED_SERVER = """
import cProfile, signal, sys, time
from backchannel.interfaces.cli import main
# uvicorn re-raises the SIGTERM it caught once it has shut down; exit normally instead,
# so that the profile gets written
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
out = sys.argv.pop(1)
sys.argv[0] = "backchannel"
prof = cProfile.Profile(time.thread_time)
try:
    prof.runcall(main)
except SystemExit:
    pass
finally:
    prof.dump_stats(out)
"""


class ServerProcess:
    """``backchannel serve --port 0`` in a data directory of its own, with bounded waits.

    ``start`` waits (at most ``timeout`` s) for ``server.json`` and a healthy
    ``/healthz``; ``stop`` sends SIGTERM to this one process, waits, and only then
    SIGKILLs it. The server's output goes to ``home/server.log``.
    """

    def __init__(
        self,
        home: Path,
        store_url: str,
        extra: Sequence[str] = (),
        profile_to: Path | None = None,
    ) -> None:
        self.home = home
        self.profile_to = profile_to
        self.store_url = store_url
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.admin_token = ""
        self.log_path = home / "server.log"

    def start(self, timeout: float = 20.0) -> None:
        import httpx

        self.home.mkdir(parents=True, exist_ok=True)
        prefix = backchannel_command()
        if self.profile_to is not None:
            # the server's event-loop thread under cProfile, timed by that thread's CPU
            self.profile_to.parent.mkdir(parents=True, exist_ok=True)
            prefix = [sys.executable, "-c", _PROFILED_SERVER, str(self.profile_to)]
        cmd = [
            *prefix,
            "serve",
            "--store",
            self.store_url,
            "--port",
            "0",
            "--home",
            str(self.home),
            *self.extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        info_path = self.home / "server.json"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"backchannel serve exited with {self.proc.returncode}; see {self.log_path}:\n"
                    + self.log_path.read_text(errors="replace")[-2000:]
                )
            if info_path.exists():
                with contextlib.suppress(ValueError, OSError):
                    info = json.loads(info_path.read_text())
                    if info.get("pid") == self.proc.pid and info.get("url"):
                        self.url = info["url"]
                        break
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"no {info_path} after {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.05)
        self.admin_token = (self.home / "admin.token").read_text().strip()
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.url}/healthz not healthy after {timeout:.0f} s")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float | None:
        return None if self.proc is None else cpu_of(self.proc.pid)

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- team setup ---------------------------------------------------------------------------------


#: A load generator may run ahead of its receivers: the inbox quota (10,000 queued by
#: default) is raised so that a backlog shows as latency, not as refused sends.
TEAM_SETTINGS = {"max_queued": 10_000_000}


async def setup_team_hub(hub: Any, team: str, members: Sequence[str]) -> None:
    """Create ``team`` and ``members`` on an in-process :class:`Hub`."""
    await hub.create_team(team, settings=TEAM_SETTINGS)
    for name in members:
        await hub.add_member(team, name)


def setup_team_http(
    url: str, admin_token: str, team: str, members: Sequence[str]
) -> dict[str, str]:
    """Create ``team`` and ``members`` over HTTP with the admin token; returns name → token."""
    import httpx

    headers = {"Authorization": f"Bearer {admin_token}"}
    tokens: dict[str, str] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=10.0) as c:
        r = c.post("/v1/teams", json={"name": team, "settings": TEAM_SETTINGS})
        r.raise_for_status()
        for name in members:
            r = c.post(f"/v1/teams/{team}/members", json={"name": name})
            r.raise_for_status()
            tokens[name] = r.json()["token"]
    return tokens


def log(msg: str) -> None:
    """Progress on stderr (stdout stays clean for ``--json``)."""
    print(msg, file=sys.stderr, flush=True)


# -- HTTP clients for the load generator ----------------------------------------------------------


class JsonClient:
    """One keep-alive HTTP/1.1 connection to the hub, speaking JSON, as one member."""

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class HttpxClient(JsonClient):
    """httpx.AsyncClient limited to one connection (what an SDK user would run)."""

    def __init__(self, url: str, token: str, timeout: float) -> None:
        import httpx

        self._c = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {token}"},
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            timeout=httpx.Timeout(timeout),
            http2=False,
        )

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        r = await self._c.request(method, path, json=body, params=params)
        try:
            data = r.json()
        except ValueError:
            data = r.text
        return r.status_code, data

    async def aclose(self) -> None:
        await self._c.aclose()


class RawClient(JsonClient):
    """A bare HTTP/1.1 keep-alive client on asyncio streams (Content-Length bodies only).

    It costs the load generator a fraction of what httpx does per request, so on a
    shared 2-CPU box more of the CPU is left to the server being measured.
    """

    def __init__(self, url: str, token: str, timeout: float) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._head = (f"Host: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n").encode()
        self._timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        from urllib.parse import urlencode

        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        if params:
            path = f"{path}?{urlencode(params)}"
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        extra = (
            b""
            if body is None
            else b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(payload)
        )
        self._writer.write(
            f"{method} {path} HTTP/1.1\r\n".encode() + self._head + extra + b"\r\n" + payload
        )
        try:
            head = await asyncio.wait_for(self._reader.readuntil(b"\r\n\r\n"), self._timeout)
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            data = await self._reader.readexactly(length) if length else b""
        except BaseException:
            await self.aclose()  # a half-read answer leaves the connection unusable
            raise
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            return status, data.decode(errors="replace")

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._reader = self._writer = None


def json_client(kind: str, url: str, token: str, timeout: float) -> JsonClient:
    if kind == "httpx":
        return HttpxClient(url, token, timeout)
    if kind == "raw":
        return RawClient(url, token, timeout)
    raise ValueError(f"unknown HTTP client {kind!r}; use httpx or raw")


def quiet_before(max_wait: float) -> None:
    """Wait (up to ``max_wait`` s) for the machine to go quiet before a phase."""
    if max_wait > 0:
        others = wait_quiet(max_wait)
        if others >= 0.2:
            log(f"  machine still busy (other processes use {others:.2f} CPUs); measuring anyway")


def cpus() -> int:
    return os.cpu_count() or 1
