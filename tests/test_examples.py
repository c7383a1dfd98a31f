"""The examples a newcomer runs, run as the docs show them: the README's Python SDK
sample taken from the markdown against a real ``serve``; docs/a2a.md's two "Two
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

from tests.conftest import Server, free_port

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


def test_the_readme_python_sample_runs_as_written(server: Server, tmp_path: Path) -> None:
    """The README's SDK sample, taken verbatim from the markdown, run with the
    walkthrough's tokens exported: it sends as the user, reads as worker-1, and ends."""
    sample = _block("README.md", "## Python SDK", "python")
    assert "asyncio.run(main())" in sample, "the sample must run as a script"
    tokens = server.team("alpha", "worker-1")
    (tmp_path / "sample.py").write_text(sample)
    env = _env(
        tmp_path,
        BACKCHANNEL_URL=server.url,
        USER_TOKEN=tokens["user"],
        WORKER_TOKEN=tokens["worker-1"],
    )
    got = subprocess.run(
        [sys.executable, "sample.py"], cwd=tmp_path, env=env, capture_output=True, timeout=60
    )
    out, err = got.stdout.decode(), got.stderr.decode()
    assert got.returncode == 0, err
    assert "Traceback" not in err, err
    assert out == "queued ['worker-1'] False\nuser count the words in README.md\n", out
    with server.client(tokens["worker-1"]) as c:
        assert c.get("/v1/inbox/pending").json()["pending"] == 0, "the sample acked it"


# what a shell has before the docs' commands run, and the variables the docs describe
# as settings of the user's own
GIVEN = {"HOME", "PATH", "BACKCHANNEL_URL", "BACKCHANNEL_HOME", "BACKCHANNEL_TOKEN"}


def test_every_variable_a_docs_command_uses_is_set_in_that_doc() -> None:
    """A shell sample that passes ``"$ADMIN_TOKEN"`` nobody set runs as written with an
    empty token: each ``$NAME`` in a README or docs/ shell block is assigned in one of
    that document's shell blocks (``NAME=...``, ``export NAME=...``), or is in GIVEN."""
    unset = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if doc.name == "decisions.md":
            continue
        code = "\n".join(re.findall(r"```(?:sh|bash|shell)\n(.*?)```", doc.read_text(), re.S))
        assigned = set(re.findall(r"(?:^|[\s;(])(?:export\s+)?([A-Z_][A-Z0-9_]*)=", code, re.M))
        used = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", code))
        if used - assigned - GIVEN:
            unset[doc.name] = sorted(used - assigned - GIVEN)
    assert unset == {}, unset


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
