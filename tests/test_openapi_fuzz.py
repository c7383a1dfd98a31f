"""schemathesis, with every check, against a live `backchannel serve` over a real socket,
once with a member token and once with the admin token: no answer is a 5xx, every
status and content type is the one the OpenAPI document lists, schema-violating input
is refused and the error model holds everywhere.

The two server-sent-event streams are left out: they answer by never ending (their own
tests in test_http_api.py read them). Hooks (tests/schemathesis_hooks.py) keep long-polls
short and point valid team names at the team set up here; tests/schemathesis.toml says
which refusals of schema-valid input are rules JSON Schema cannot state."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, Server, start_server

ST = Path(sys.executable).parent / "st"
EXAMPLES = 10  # per operation and generation phase; about half a minute a token


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("fuzz") / "home")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokens(srv: Server) -> dict[str, str]:
    return srv.team("fuzz", "lead", "worker")


def _fuzz(srv: Server, token: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
        "FUZZ_TEAM": "fuzz",
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [
            str(ST),
            "--config-file",
            str(ROOT / "tests" / "schemathesis.toml"),
            "run",
            f"{srv.url}/openapi.json",
            "--checks",
            "all",
            "--header",
            f"Authorization: Bearer {token}",
            "--max-examples",
            str(EXAMPLES),
            "--exclude-path",
            "/v1/inbox/stream",
            "--exclude-path",
            "/v1/teams/{team}/events",
            "--request-timeout",
            "20",
            "--seed",
            "14",
            "--workers",
            "1",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("who", ["member", "admin"])
def test_schemathesis_all_checks_find_nothing(
    srv: Server, tokens: dict[str, str], who: str, tmp_path: Path
) -> None:
    token = tokens["lead"] if who == "member" else srv.admin_token
    run = _fuzz(srv, token, tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", out)
    assert counts is not None, out[-3000:]
    assert int(counts[1]) == int(counts[2]) >= 300
    assert srv.proc.poll() is None
    log = (srv.home / "serve.log").read_text()
    assert "Traceback" not in log, log[-3000:]
