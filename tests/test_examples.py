"""The examples a newcomer runs, run as the docs show them: docs/a2a.md's two "Two
minutes" blocks as one bash script (every script under examples/a2a as the blocks
invoke it), then the hub stopped under the member agent; and ``examples/demo.py``.
Each must end cleanly, print what the docs show and no traceback."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # python and backchannel of this environment


def _block(doc: str, heading: str, lang: str) -> str:
    """The first ``lang`` block after ``heading`` in ``doc``."""
    text = (ROOT / doc).read_text()
    rest = text[text.index(heading) :]
    m = re.search(rf"```{lang}\n(.*?)```", rest, re.S)
    assert m is not None, f"no {lang} block after {heading!r} in {doc}"
    return m.group(1)


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env['PATH']}", **more)
    return env


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_a2a_examples_run_as_docs_a2a_shows(tmp_path: Path) -> None:
    """docs/a2a.md's inbound block (serve, member.py, call.py) and outbound block
    (agent_server.py, the registry entry, a restarted serve, delegate.py), run in one
    bash script in a fresh directory on free ports, print what the docs show. Then the
    hub stops under member.py: it says so in one line and exits 1, no traceback."""
    inbound = _block("docs/a2a.md", "## Two minutes, inbound", "sh")
    outbound = _block("docs/a2a.md", "## Two minutes, outbound", "sh")
    shown_in = _block("docs/a2a.md", "## Two minutes, inbound", "text")
    shown_out = _block("docs/a2a.md", "## Two minutes, outbound", "text")
    # the documented ports may be taken on a shared machine: the same blocks on free ones
    hub, agent = free_port(), free_port()
    script = (inbound + outbound).replace("8765", str(hub)).replace("9999", str(agent))
    # then stop the hub under the member agent (job 2) and end the A2A agent (job 3)
    script += (
        "kill %4; wait %4\n"
        'code=0; wait %2 || code=$?; echo "member.py exited $code"\n'
        "kill %3; wait %3 || true\n"
    )
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    proc = subprocess.Popen(
        ["bash", "-eu", "-c", script],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        raw_out, raw_err = proc.communicate(timeout=100)
    finally:
        # whatever the script left running (it failed half-way) goes with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    out, err = raw_out.decode(), raw_err.decode()
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err, err
    expected = re.escape(shown_in + shown_out + "member.py exited 1\n")
    expected = expected.replace(r"\[tu_e127638df1284082\]", r"\[tu_[0-9a-f]{16}\]")
    assert re.fullmatch(expected, out), (out, err)
    [said] = [line for line in err.splitlines() if line.startswith("member.py:")]
    assert said.startswith("member.py: stopped, the hub went away: cannot reach the hub"), err


@pytest.mark.slow
def test_the_demo_runs_and_ends_cleanly(tmp_path: Path) -> None:
    """examples/demo.py (what ``make demo`` runs) in a copy of its directory, so that its
    data directory and the repository it surveys are both under ``tmp_path``."""
    (tmp_path / "examples").mkdir()
    for name in ("demo.py", "survey-team.yaml"):
        (tmp_path / "examples" / name).write_text((ROOT / "examples" / name).read_text())
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("import os\n\n# TODO: handle errors\n")
    got = subprocess.run(
        [sys.executable, "examples/demo.py"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        timeout=240,
    )
    out, err = got.stdout.decode(), got.stderr.decode()
    assert got.returncode == 0, (out, err)
    assert "Traceback" not in out + err, (out, err)
    assert "Done in" in out and "1 duplicate suppressed" in out, out
    assert (tmp_path / ".backchannel" / "demo" / "backchannel.db").exists()
