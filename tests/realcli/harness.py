"""Driving the real agent CLIs (pinned versions from npm, ``scripts/setup-clis.sh``)
headless against a scripted model server on 127.0.0.1 and a real ``backchannel serve``.

No other network: every run has ``HTTP(S)_PROXY`` pointing at a local proxy that refuses
and records whatever reaches it (``NO_PROXY`` covers loopback), and each test asserts it
recorded nothing. ``BACKCHANNEL_CLI_DIR`` points at another install (the latest
versions, ``make test-latest-clis``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from backchannel.testing import eventually_blocking
from tests.conftest import BIN, ROOT, Server

from . import fake_anthropic, fake_gemini, fake_openai
from .fake_anthropic import FakeAnthropic, Request, Rule
from .fake_gemini import FakeGemini
from .fake_openai import FakeOpenAI

CLI_DIR = Path(os.environ.get("BACKCHANNEL_CLI_DIR") or ROOT / ".cache" / "clis")
RUN_TIMEOUT_S = 120


def install_clis() -> Path:
    """The pinned CLIs, installed once into .cache/clis (a no-op when they are there)."""
    if "BACKCHANNEL_CLI_DIR" not in os.environ:
        subprocess.run(["bash", str(ROOT / "scripts" / "setup-clis.sh")], check=True)
    return CLI_DIR / "node_modules" / ".bin"


def never_stuck_in_accept(server: ThreadingHTTPServer) -> None:
    """Give ``server``'s listening socket a timeout. A CLI that opens a connection and
    resets it at once (Claude Code does, to the proxy) can leave ``serve_forever`` in a
    blocking ``accept`` after its ``select`` saw the connection: the kernel dropped it,
    ``accept`` waits for the next one, and ``shutdown()`` waits for ``serve_forever``
    without end (a test's teardown hung 600 s). With a timeout the ``accept`` gives up,
    ``serve_forever`` sees the shutdown; accepted connections stay blocking."""
    server.socket.settimeout(1.0)


class RefusingProxy:
    """An HTTP(S) proxy on 127.0.0.1 that answers 403 to everything and records what
    was asked of it (``CONNECT host:443`` or ``GET http://...``)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _refuse(self) -> None:
                proxy.seen.append(f"{self.command} {self.path}")
                self.send_response(403)
                self.send_header("content-length", "0")
                self.end_headers()

            do_CONNECT = do_GET = do_POST = do_PUT = do_HEAD = _refuse

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        never_stuck_in_accept(self._server)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Api(Protocol):
    url: str
    requests: list[Request]

    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> None: ...


@dataclass
class Model:
    """A CLI's view of the scripted model: its request shape's readers."""

    make: Callable[[list[Rule]], Api]
    texts: Callable[[Request], list[str]]
    last: Callable[[Request], str]
    tools: Callable[[Request], list[str]]


MODELS = {
    "claude-code": Model(
        FakeAnthropic, fake_anthropic.texts, fake_anthropic.last_user_text,
        fake_anthropic.tool_names,
    ),
    "codex": Model(FakeOpenAI, fake_openai.texts, fake_openai.last_user_text,
                   fake_openai.tool_names),
    "gemini": Model(FakeGemini, fake_gemini.texts, fake_gemini.last_user_text,
                    fake_gemini.tool_names),
}  # fmt: skip


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    session_id: str


@dataclass
class Rig:
    """One attached project of one CLI, its member's token and a peer's."""

    runtime: str
    team: str
    server: Server
    tokens: dict[str, str]
    project: Path
    home: Path
    bin_dir: Path
    proxy: RefusingProxy
    api: Api | None = None
    runs: list[Run] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None  # the run under way

    @property
    def model(self) -> Model:
        return MODELS[self.runtime]

    def env(self) -> dict[str, str]:
        assert self.api is not None
        env = {
            "PATH": f"{BIN.parent}:{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "BACKCHANNEL_TOKEN": self.tokens["alice"],
            "HTTP_PROXY": self.proxy.url,
            "HTTPS_PROXY": self.proxy.url,
            "http_proxy": self.proxy.url,
            "https_proxy": self.proxy.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        if os.environ.get("PYTHONPATH"):  # the hooks run the backchannel under test
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if self.runtime == "claude-code":
            env |= {
                "ANTHROPIC_BASE_URL": self.api.url,
                "ANTHROPIC_API_KEY": "sk-test",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            }
        elif self.runtime == "codex":
            env |= {"CODEX_HOME": str(self.home / ".codex"), "FAKE_OPENAI_KEY": "sk-test"}
        else:
            env |= {"GOOGLE_GEMINI_BASE_URL": self.api.url, "GEMINI_API_KEY": "test"}
        return env

    def write_gemini_config(self, *, trusted: bool = True) -> None:
        """The user's side: API-key auth, one model (no routing requests), no usage
        statistics, no update check, and (``trusted``) the project folder trusted (the
        step `attach` prints; else Gemini asks)."""
        gemini = self.home / ".gemini"
        gemini.mkdir(parents=True, exist_ok=True)
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "model": {"name": "gemini-2.5-flash"},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            # the interactive CLI asks registry.npmjs.org for a newer version
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        }
        (gemini / "settings.json").write_text(json.dumps(settings))
        if trusted:
            folders = {str(self.project): "TRUST_FOLDER"}
            (gemini / "trustedFolders.json").write_text(json.dumps(folders))

    def write_codex_config(self, *, trusted: bool = True) -> None:
        """The user's side: the scripted provider, what would reach past the machine
        turned off, and (``trusted``) the project trusted (else Codex asks)."""
        assert self.api is not None
        config = self.home / ".codex" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        trust = f'[projects."{self.project}"]\ntrust_level = "trusted"\n' if trusted else ""
        config.write_text(
            'model = "gpt-test"\nmodel_provider = "fake"\n'
            # the interactive CLI asks api.github.com for a newer version
            "check_for_update_on_startup = false\n"
            "[model_providers.fake]\n"
            f'name = "fake"\nbase_url = "{self.api.url}/v1"\nwire_api = "responses"\n'
            'env_key = "FAKE_OPENAI_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
            f"{trust}"
            # what would reach past the machine: usage analytics, the apps and plugin
            # catalogues (chatgpt.com, github.com)
            "[analytics]\nenabled = false\n"
            "[features]\napps = false\nplugins = false\nremote_plugin = false\n"
        )

    def run(self, prompt: str, resume: str | None = None, *, check: bool = True) -> Run:
        """One headless run of the CLI in the project (resuming ``resume``); ``check``:
        it must exit 0."""
        if self.runtime == "claude-code":
            args = [str(self.bin_dir / "claude"), "-p", prompt, "--output-format", "json"]
            args += ["--resume", resume] if resume else []
        elif self.runtime == "gemini":
            self.write_gemini_config()
            args = [str(self.bin_dir / "gemini"), "-p", prompt, "--output-format", "json"]
            args += ["--resume", resume] if resume else []
        else:
            if not (self.home / ".codex" / "config.toml").exists():
                self.write_codex_config()
                # the user's one-time grant that `attach` prints: Codex skips untrusted hooks
                attach(self.runtime, self.project, self.server.url, self.team, "--trust-hooks",
                       env={"CODEX_HOME": str(self.home / ".codex")})  # fmt: skip
            args = [str(self.bin_dir / "codex"), "exec", "--skip-git-repo-check", "--json"]
            args += ["resume", resume, prompt] if resume else [prompt]
        with subprocess.Popen(
            args,
            cwd=self.project,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: see kill()
        ) as p:
            self.proc = p
            try:
                out, err = p.communicate(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
                p.communicate()
                raise
            finally:
                self.proc = None
        run = Run(p.returncode, out, err, _session_id(self.runtime, out))
        self.runs.append(run)
        if check:
            assert p.returncode == 0, f"{self.runtime} exited {p.returncode}: {err[-2000:]}"
        return run

    def kill(self) -> None:
        """Kill the run under way as a crash would: the CLI, its hooks and its MCP
        server, at once, with no chance to report anything."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    # -- the hub's side ---------------------------------------------------------------
    def get(self, who: str, path: str, **params: Any) -> Any:
        with self.server.client(self.tokens[who]) as c:
            r = c.get(path, params=params)
            r.raise_for_status()
            return r.json()

    def take(self, member: str, session: str | None = None) -> list[dict[str, Any]]:
        """``member``'s waiting messages (for ``session`` too), acknowledged."""
        params: dict[str, Any] = {"limit": 100} | ({"session": session} if session else {})
        with self.server.client(self.tokens[member]) as c:
            got = c.get("/v1/inbox", params=params).json()["messages"]
            if got:
                ids = [m["message_id"] for m in got]
                c.post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()
        return list(got)

    def session(self, sid: str) -> dict[str, Any]:
        return dict(self.get("alice", f"/v1/sessions/{sid}"))

    def events(self, sid: str) -> list[dict[str, Any]]:
        return list(self.get("alice", f"/v1/sessions/{sid}/transcript")["events"])

    def peer_turn(self, closing: str, sid: str = "bob-s") -> None:
        """bob, a hub-side agent, takes a turn that ends with ``closing``."""
        with self.server.client(self.tokens["bob"]) as c:
            c.post("/v1/sessions", json={"session_id": sid}).raise_for_status()
            for kind, text in (("turn_start", ""), ("agent_stop", closing)):
                body = {"kind": kind, "text": text}
                c.post(f"/v1/sessions/{sid}/events", json=body).raise_for_status()

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
        return eventually_blocking(check, what=what, within=timeout)


def _session_id(runtime: str, stdout: str) -> str:
    if runtime in ("claude-code", "gemini"):
        try:
            return str(json.loads(stdout).get("session_id", ""))
        except ValueError:
            return ""
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "thread.started":
            return str(event.get("thread_id", ""))
    return ""


def attach(
    runtime: str, project: Path, url: str, team: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``backchannel attach`` in ``project`` as ``team``/alice (Codex's user config in
    ``env["CODEX_HOME"]``, never the real one)."""
    env = {**os.environ, "CODEX_HOME": str(project / ".no-codex-home"), **(env or {})}
    run = subprocess.run(
        [str(BIN), "attach", runtime, "--team", team, "--member", "alice", "--url", url, *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    config = project / ".codex" / "config.toml"
    named = 'env_vars = ["BACKCHANNEL_TOKEN", "BACKCHANNEL_SESSION"]'
    if runtime == "codex" and os.environ.get("PYTHONPATH") and config.exists():
        # Codex hands its MCP server only the variables it names: the code under test
        # (a worktree's) in the server too, as Claude Code and Gemini hand it over
        text = config.read_text()
        config.write_text(text.replace(named, f'{named[:-1]}, "PYTHONPATH"]'))
    return run


def have(bin_dir: Path, runtime: str) -> bool:
    name = {"claude-code": "claude", "codex": "codex", "gemini": "gemini"}[runtime]
    return (bin_dir / name).exists() or shutil.which(name, path=str(bin_dir)) is not None


_teams = iter(range(1, 1000))


@contextmanager
def attached(
    runtime: str, server: Server, bin_dir: Path, tmp_path: Path, **settings: Any
) -> Iterator[Rig]:
    """A fresh team (alice on ``runtime``, bob; ``settings`` its team settings), a git
    project attached as alice, a home and the refusing proxy; after the test, the proxy
    must have recorded nothing."""
    from tests.runtimes.agents import make_team

    if not have(bin_dir, runtime):
        raise AssertionError(f"{runtime} is not installed in {bin_dir}; run scripts/setup-clis.sh")
    team = f"t{next(_teams)}-{os.getpid()}"
    tokens = make_team(server, team, f"alice:{runtime}", "bob", **settings)
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    attach(runtime, project, server.url, team)
    home = tmp_path / "home"
    home.mkdir()
    proxy = RefusingProxy()
    r = Rig(runtime, team, server, tokens, project, home, bin_dir, proxy)
    try:
        yield r
    finally:
        proxy.close()
        if r.api is not None:
            r.api.__exit__(None, None, None)
    assert proxy.seen == [], f"{runtime} tried to reach the network: {proxy.seen}"
    crashed = _hook_crashes(r)
    assert crashed == [], f"a backchannel hook failed open inside {runtime}: {crashed}"


def _hook_crashes(r: Rig) -> list[str]:
    """What says a backchannel hook hit an internal error (it then answers ``{}`` and the
    CLI goes on, so nothing else shows it): the runs' stderr, and the hook results Claude
    Code keeps in its session transcripts."""
    said = [line for run in r.runs for line in run.stderr.splitlines()]
    for transcript in (r.home / ".claude" / "projects").rglob("*.jsonl"):
        said += transcript.read_text(errors="replace").splitlines()
    return [line[:500] for line in said if "backchannel hook" in line and "internal error" in line]


def mcp_runtime(team: str, member: str) -> str:
    """The runtime process the CLI's ``backchannel mcp`` of ``team/member`` runs under,
    named as it names it in its beats (:mod:`backchannel.runtimes.liveness`)."""
    from backchannel.runtimes.liveness import runtime_key

    who = f"{team}/{member}".encode()
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if b"mcp" in args and who in args:
            key = runtime_key(int(stat[stat.rfind(")") + 2 :].split()[1]))
            assert key is not None, f"no runtime above {entry}"
            return key
    raise AssertionError(f"no backchannel mcp process for {team}/{member}")
