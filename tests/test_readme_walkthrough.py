"""The README's "Run a hub yourself" walkthrough, run verbatim: the first terminal's
block as a real ``serve``, the second terminal's block as a bash script in the same
directory. Once with the development install, once from a wheel built and installed by
``make install`` into a clean virtual environment."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import start_server

ROOT = Path(__file__).resolve().parent.parent


def walkthrough() -> tuple[str, str]:
    """The shell blocks after "In a first terminal" and "In a second terminal"."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Run a hub yourself") :]
    blocks = []
    for lead in ("In a first terminal", "In a second terminal"):
        rest = section[section.index(lead) :]
        m = re.search(r"```sh\n(.*?)```", rest, re.S)
        assert m is not None, f"no sh block after {lead!r}"
        blocks.append(m.group(1))
    return blocks[0], blocks[1]


def run_walkthrough(bin_dir: Path, cwd: Path) -> str:
    first, second = walkthrough()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    assert first.strip() == "backchannel serve"
    # the default port may be taken on a shared machine: the same command on a free port
    log = open(cwd / "serve.log", "wb")  # noqa: SIM115 (closed below)
    serve = subprocess.Popen(
        ["bash", "-c", first.strip() + " --port 0"],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        info = cwd / ".backchannel" / "server.json"

        def started() -> bool:
            assert serve.poll() is None, (cwd / "serve.log").read_text()
            return info.exists()

        eventually_blocking(started, what="serve to start", within=60)
        script = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", second],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert script.stdout is not None
        fd = script.stdout.fileno()
        seen = b""
        deadline = time.monotonic() + 90
        try:
            # the last command, `tail`, runs until stopped: read until it shows the ack
            # (raw reads: a buffered reader could hold lines that select() cannot see)
            while not re.search(rb"acked\s+user -> worker-1", seen):
                assert script.poll() is None, seen.decode()
                assert time.monotonic() < deadline, seen.decode()
                ready, _, _ = select.select([fd], [], [], 1.0)
                if ready:
                    seen += os.read(fd, 65536)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(script.pid, signal.SIGINT)
            script.wait(15)
            script.stdout.close()
        return seen.decode()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(20)
        log.close()


def test_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    out = run_walkthrough(Path(sys.executable).parent, tmp_path)
    assert "hub: http://127.0.0.1:" in out  # status
    assert "worker-1 (direct): count the lines in src/" not in out  # inbox shows sender
    assert "user (direct): count the lines in src/" in out
    assert "error" not in out.lower()


@pytest.mark.slow
def test_wheel_builds_installs_and_serves(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    quiet = {"capture_output": True, "text": True, "timeout": 600}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        **quiet,  # type: ignore[call-overload]
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("backchannel-*.whl")
    # `make install` (the README's step) from that wheel, into its default places under
    # a HOME of the test's own
    home = tmp_path / "home"
    home.mkdir()
    venv, bin_dir = home / ".local" / "share" / "backchannel", home / ".local" / "bin"
    installed = subprocess.run(
        ["make", "install", f"PACKAGE={wheel}"],
        cwd=ROOT,
        env={**os.environ, "HOME": str(home)},
        **quiet,  # type: ignore[call-overload]
    )
    assert installed.returncode == 0, installed.stderr
    assert f"{bin_dir} is not on your PATH" in installed.stderr
    assert (bin_dir / "backchannel").resolve() == (venv / "bin" / "backchannel").resolve()
    version = subprocess.run(
        [str(bin_dir / "backchannel"), "--version"], capture_output=True, text=True
    )
    assert version.stdout.startswith("backchannel ")
    work = tmp_path / "work"
    work.mkdir()
    out = run_walkthrough(bin_dir, work)
    assert "user (direct): count the lines in src/" in out
    # the Python SDK sample, run as the README says, with what `make install` installed
    # (not this test's own Python, which is left off PATH)
    readme = (ROOT / "README.md").read_text()
    sdk = readme[readme.index("## Python SDK") :]
    how = re.search(r"then `([^`]*sample\.py)` there", sdk)
    assert how is not None, "the README says how to run sample.py"
    sample = re.search(r"```python\n(.*?)```", sdk, re.S)
    assert sample is not None
    (work / "sample.py").write_text(sample.group(1))
    server = start_server(tmp_path / "hub")
    try:
        tokens = server.team("alpha", "worker-1")
        plain_path = os.pathsep.join(
            [str(bin_dir), *(p for p in os.environ["PATH"].split(os.pathsep)
                             if Path(p).resolve() != Path(sys.executable).parent.resolve())]
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKCHANNEL_", "PYTHON"))}
        env |= {"HOME": str(home), "PATH": plain_path, "BACKCHANNEL_URL": server.url,
                "USER_TOKEN": tokens["user"], "WORKER_TOKEN": tokens["worker-1"]}  # fmt: skip
        ran = subprocess.run(
            ["bash", "-c", how.group(1)], cwd=work, env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "queued ['worker-1'] False\nuser count the words in README.md\n"
    finally:
        server.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a2a_inbound_quickstart_runs_as_written_pasted_whole(tmp_path: Path) -> None:
    """docs/a2a.md's first block, pasted as one piece into a shell in a fresh directory:
    each command must wait for what the one before it started (the hub runs in the
    background), and the output must be the one the page shows. Only the port is
    changed, to a free one; ``python`` is this environment's."""
    pytest.importorskip("a2a")
    text = (ROOT / "docs" / "a2a.md").read_text()
    section = text[text.index("## Two minutes, inbound") :]
    m = re.search(r"```sh\n(.*?)```\s*```text\n(.*?)```", section, re.S)
    assert m is not None, "no sh block and its output in docs/a2a.md"
    block, shown = m.group(1), m.group(2)
    port = _free_port()
    script = block.replace("8765", str(port))
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # its python too
    env["HOME"] = str(tmp_path / "home")
    out_file, err_file = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_file, "wb") as out, open(err_file, "wb") as err:
        proc = subprocess.Popen(
            ["bash", "-eo", "pipefail", "-c", script],
            cwd=work,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=120)
    finally:
        # the hub and the member's agent were started in the background: stop them all
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = out_file.read_text(), err_file.read_text()
    assert proc.returncode == 0, said
    # what the page shows, in its order (the hub in the background prints its own lines)
    lines = iter(said[0].splitlines())
    for want in shown.strip().splitlines():
        assert any(line == want for line in lines), (want, said)
