"""Claude Code team inboxes as the hub keeps them apart: a team Claude Code deleted stays
deleted across a restart of the hub, and two members never share one inbox file."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import start_server


def _status(c: httpx.Client, message_id: str, want: str) -> dict[str, Any]:
    """The message's status once it is ``want`` (within 20 s)."""

    def look() -> dict[str, Any] | None:
        r = c.get(f"/v1/messages/{message_id}")
        body: dict[str, Any] = r.json()
        return body if r.status_code == 200 and body["status"] == want else None

    found: dict[str, Any] = eventually_blocking(
        look,
        what=f"message {message_id} {want}",
        within=20,
        show=lambda: c.get(f"/v1/messages/{message_id}").json(),
    )
    return found


@pytest.mark.slow
def test_a_team_claude_code_deleted_stays_deleted_after_the_hub_restarts(
    tmp_path: Path,
) -> None:
    """The hub remembered only in its process that a team directory held Claude Code's
    ``config.json``: after ``serve`` restarted, the first message to a team TeamDelete
    had removed made its directory again and was counted delivered, read by no agent.
    The mark is now kept in the hub's private state directory: a dead letter after the
    restart too, and no directory made again."""
    root = tmp_path / "teams"
    team_dir = root / "cc-team"
    (team_dir / "inboxes").mkdir(parents=True)
    (team_dir / "config.json").write_text('{"name": "cc-team", "members": []}')
    home = tmp_path / "home"
    srv = start_server(home)
    try:
        tokens = srv.team("t")
        with srv.client() as admin:
            setting = {"type": "inbox-file", "root": str(root), "team": "cc-team"}
            r = admin.post(
                "/v1/teams/t/members",
                json={"name": "researcher", "kind": "claude-code", "delivery": setting},
            )
            r.raise_for_status()
        with srv.client(tokens["user"]) as user:
            user.post(
                "/v1/messages", json={"to": "researcher", "text": "one", "message_id": "m-1"}
            ).raise_for_status()
            _status(user, "m-1", "acked")
    finally:
        srv.stop()
    shutil.rmtree(team_dir)  # what TeamDelete does, while the hub is down
    srv = start_server(home)
    try:
        with srv.client(tokens["user"]) as user:
            user.post(
                "/v1/messages", json={"to": "researcher", "text": "two", "message_id": "m-2"}
            ).raise_for_status()
            status = _status(user, "m-2", "dead")
    finally:
        srv.stop()
    reason = status["deliveries"][0]["dead_reason"] or ""
    assert "'cc-team' was deleted" in reason and "TeamCreate" in reason, status
    assert not team_dir.exists()
    marks = tmp_path / "xdg-state" / "backchannel" / "seen" / "claude-teams"
    assert stat.S_IMODE(marks.stat().st_mode) == 0o700
    assert [stat.S_IMODE(p.stat().st_mode) for p in marks.iterdir()] == [0o600]
