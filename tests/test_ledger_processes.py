"""The ledger is durable: written by one process, read by another, and never left
behind by a killed turn."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from backchannel import connect_sync

TOOL_SEND = """
import os, sys
from backchannel import connect_sync
url, token, session, text, die = sys.argv[1:6]
with connect_sync(url, token) as hub:
    hub.send("lead", text, from_session=session)
    if die == "kill":
        os.kill(os.getpid(), 9)  # the turn's process dies right after its tool call
print("sent")
"""


def _setup(url: str) -> tuple[str, str]:
    with connect_sync(url) as admin:
        admin.create_team("t")
        lead = admin.add_member("t", "lead")["token"]
        worker = admin.add_member("t", "w")["token"]
    return lead, worker


def _stored_ledger(db: Path, session: str) -> int:
    """How many ledger entries the database file holds for ``session``."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM ledger WHERE session_id = ?", (session,)
        ).fetchone()
    return int(row[0])


def _lead_texts(url: str, lead: str) -> list[str]:
    with connect_sync(url, lead) as hub:
        got = hub.receive(limit=100)
        return [m.text for m in got if m.kind == "direct"]


@pytest.mark.slow
def test_ledger_written_by_one_process_read_by_another(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'l.db'}"
    lead, worker = _setup(url)
    with connect_sync(url, worker) as runner:  # the runner process owns the turn
        runner.open_session("w-1")
        runner.report_event("w-1", "turn_start")
        out = subprocess.run(  # the agent's tool process sends during the turn
            [sys.executable, "-c", TOOL_SEND, url, worker, "w-1", "the total is 42", "live"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout.strip() == "sent", out.stderr
        stop = runner.report_event(
            "w-1", "agent_stop", '<message to="lead">the total is 42</message>'
        )
    assert stop["duplicates_dropped"] == ["lead"]
    assert _lead_texts(url, lead) == ["the total is 42"]


@pytest.mark.slow
def test_ledger_left_by_a_sigkilled_turn_does_not_suppress_the_next(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'k.db'}"
    lead, worker = _setup(url)
    with connect_sync(url, worker) as first:
        first.open_session("w-1")
        first.report_event("w-1", "turn_start")
    killed = subprocess.run(
        [sys.executable, "-c", TOOL_SEND, url, worker, "w-1", "the total is 42", "kill"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -9
    assert _stored_ledger(tmp_path / "k.db", "w-1") == 1, "the killed turn left its entry"
    with connect_sync(url, worker) as restarted:  # a new process picks the session up
        resumed = restarted.open_session("w-1")
        assert resumed["state"] == "idle"
        assert _stored_ledger(tmp_path / "k.db", "w-1") == 0, "cleared by the recovery itself"
        restarted.report_event("w-1", "turn_start")
        stop = restarted.report_event(
            "w-1", "agent_stop", '<message to="lead">the total is 42</message>'
        )
    assert stop["duplicates_dropped"] == []
    assert _lead_texts(url, lead) == ["the total is 42", "the total is 42"]
