"""The dashboard in real headless Chromium against a real ``backchannel serve``.

Every wait is one of Playwright's auto-waiting ``expect`` assertions; nothing sleeps.
Rows of the timeline carry ``data-id`` (the message id) and ``data-state``; side-panel
items carry ``data-link-id`` / ``data-timer-id`` / ``data-delegation-id``, and a link's
turns read ``used / budget`` in its ``.turns`` element, for the link tests to come.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.conftest import Server
from tests.dashboard.conftest import Team, screenshot, sign_in


def test_wrong_token_shows_a_clear_error(page: Page, hub_server: Server, tmp_path: Path) -> None:
    page.goto(hub_server.url + "/")
    expect(page.get_by_role("heading", name="Sign in to the hub")).to_be_visible()
    page.locator("#token-input").fill("bc_this-is-not-a-token")
    page.get_by_role("button", name="Sign in").click()
    error = page.get_by_role("alert")
    expect(error).to_be_visible()
    expect(error).to_contain_text("That token is not valid for this hub")
    expect(page.locator("#app-view")).to_be_hidden()
    screenshot(page, "sign-in", tmp_path)


def test_admin_picks_a_team_and_sees_members_live(page: Page, team: Team) -> None:
    sign_in(page, team.server, team.server.admin_token)
    expect(page.locator("#whoami")).to_contain_text("admin")
    picker = page.get_by_label("team", exact=True)
    expect(picker.locator(f'option[value="{team.name}"]')).to_have_count(1)
    picker.select_option(team.name)
    expect(picker).to_have_value(team.name)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    members = page.locator("#members > li")
    expect(members).to_have_count(4)
    worker = page.locator('#members > li[data-member="worker"]')
    expect(worker).to_contain_text("llm")
    expect(worker.locator(".member-state")).to_have_text("no session")
    expect(page.locator('#members > li[data-member="user"]')).to_contain_text("human")
    # a session opens elsewhere: the member's state changes without a reload
    team.open_session("worker", "worker-main")
    expect(worker.locator(".member-state")).to_have_text("idle")
    expect(worker.locator(".session-link")).to_contain_text("worker-main")
    expect(worker.locator(".member-activity")).not_to_have_text("never")


def test_member_sees_its_own_team_without_composer(page: Page, team: Team) -> None:
    sign_in(page, team.server, team.tokens["reviewer"])
    expect(page.locator("#team-name")).to_have_text(team.name)
    expect(page.locator("#team-picker-label")).to_be_hidden()
    expect(page.locator("#composer")).to_be_hidden()
    expect(page.locator("#composer-off")).to_be_visible()
    for panel, text in (
        ("links", "no links yet"),
        ("timers", "no timers yet"),
        ("delegations", "no delegations yet"),
        ("dead", "no dead letters"),
    ):
        expect(page.locator(f"#{panel}-empty")).to_have_text(text)


def test_composed_message_reaches_the_recipients_timeline_live(
    new_page: Callable[..., Page], team: Team, tmp_path: Path
) -> None:
    sender = new_page()
    recipient = new_page()
    sign_in(sender, team.server, team.tokens["user"])
    sign_in(recipient, team.server, team.tokens["worker"])
    expect(recipient.locator("#timeline-empty")).to_have_text("no messages yet")

    sender.get_by_label("recipient").select_option("worker")
    sender.get_by_label("summary").fill("count lines")
    sender.get_by_label("message text").fill("Please count the lines in src/\nand report back.")
    sender.get_by_role("button", name="Send").click()
    expect(sender.locator("#compose-status")).to_have_text("sent to worker")
    expect(sender.get_by_label("message text")).to_have_value("")

    rows = recipient.locator("#timeline .row")
    expect(rows).to_have_count(1)
    first = rows.first
    expect(first).to_contain_text("user")
    expect(first.locator(".to")).to_have_text("worker")
    expect(first.locator(".summary")).to_have_text("count lines")
    expect(first).to_have_attribute("data-state", "queued")

    # the worker takes it, then acknowledges it: both pages follow, no reload
    got = team.receive("worker")
    assert [m["summary"] for m in got] == ["count lines"]
    mid = str(got[0]["message_id"])
    expect(recipient.locator(f'.row[data-id="{mid}"]')).to_have_attribute("data-state", "leased")
    team.ack("worker", mid)
    for p in (recipient, sender):
        expect(p.locator(f'.row[data-id="{mid}"] .state')).to_have_text("acked")

    # more traffic for a fuller picture, then the member filter
    team.send("lead", "reviewer", "Review the parser changes", summary="review parser")
    team.send("reviewer", "lead", "LGTM with two nits: rename `tok`, add a test for empty input")
    sender.get_by_label("recipient").select_option("*")
    sender.get_by_label("message text").fill("Standup in 5 minutes")
    sender.get_by_label("message text").press("Control+Enter")
    expect(sender.locator("#timeline .row")).to_have_count(4)
    newest = sender.locator("#timeline .row").first
    expect(newest.locator(".to")).to_have_text("3 members")
    expect(newest.locator(".state")).to_have_text("queued")
    expect(newest.locator(".progress")).to_have_text("0/3 acked")
    screenshot(sender, "timeline", tmp_path)

    sender.get_by_label("filter by member").select_option("reviewer")
    expect(sender.locator("#timeline .row:visible")).to_have_count(3)
    expect(sender.locator("#timeline-count")).to_have_text("3 of 4")
    sender.get_by_role("button", name="clear").click()
    sender.get_by_label("filter by kind").select_option("system")
    expect(sender.locator("#timeline .row:visible")).to_have_count(0)
    expect(sender.locator("#timeline-empty")).to_have_text("no messages match these filters")


def test_open_a_message_and_its_delivery_history(page: Page, team: Team, tmp_path: Path) -> None:
    mid = team.send(
        "lead", "worker", "Implement the report generator.\n\nUse the template in docs/."
    )
    sign_in(page, team.server, team.tokens["user"])
    page.locator(f'#timeline .row[data-id="{mid}"]').click()
    drawer = page.get_by_role("dialog")
    expect(drawer).to_be_visible()
    expect(drawer.locator("#drawer-title")).to_have_text("lead → worker")
    expect(drawer.locator(".message-text")).to_contain_text("Use the template in docs/.")
    history = drawer.locator(".history li")
    expect(history).to_have_count(1)
    expect(history.first).to_have_attribute("data-event", "queued")
    # the open history follows the message as it moves
    got = team.receive("worker")
    team.ack("worker", str(got[0]["message_id"]))
    expect(history).to_have_count(3)
    expect(drawer.locator(".history .event")).to_have_text(["queued", "leased", "acked"])
    expect(drawer.locator(".deliveries .state")).to_have_text("acked")
    screenshot(page, "message", tmp_path)
    page.keyboard.press("Escape")
    expect(drawer).to_be_hidden()


def test_dead_letter_shows_its_reason(page: Page, team: Team) -> None:
    sign_in(page, team.server, team.tokens["lead"])
    mid = team.send("lead", "worker", "this one will not be acknowledged", summary="doomed")
    team.receive("worker", lease=0.2)  # the server allows one attempt: never acked -> dead
    dead = page.locator(f'#dead li[data-id="{mid}"]')
    expect(dead).to_contain_text("doomed")
    expect(dead.locator(".why")).to_contain_text("attempt")
    expect(page.locator(f'#timeline .row[data-id="{mid}"]')).to_have_attribute("data-state", "dead")
    # the sender is told by the hub
    notice = page.locator('#timeline .row[data-from="hub"]')
    expect(notice.locator(".kind")).to_have_text("system")
    dead.click()
    expect(page.locator(".deliveries .why")).to_contain_text("attempt")


def test_session_view_and_dark_theme(
    new_page: Callable[..., Page], team: Team, tmp_path: Path
) -> None:
    sid = team.open_session("lead", "lead-main")
    team.open_session("worker", "worker-main")
    team.send("lead", "worker", "Split the parser into lexer and grammar", summary="split parser")
    team.send("user", "lead", "How far along is the parser?")
    # a transcript, where the hub records session events (skipped while it does not)
    transcript = team.report("lead", sid, "turn_start", "Plan the parser work")
    if transcript:
        team.report("lead", sid, "thought", "The grammar is small; split lexing out first.")
        team.report("lead", sid, "tool_call", "", name="read_file", input={"path": "src/parse.py"})
        team.report("lead", sid, "tool_result", "412 lines")
        team.report("lead", sid, "agent_stop", "Plan: lexer first, then the grammar.")
    page = new_page("dark")
    sign_in(page, team.server, team.server.admin_token)
    page.get_by_label("team", exact=True).select_option(team.name)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    expect(page.locator("#timeline .row")).to_have_count(2)
    screenshot(page, "overview-dark", tmp_path)
    page.locator('#members > li[data-member="lead"] .session-link').click()
    drawer = page.get_by_role("dialog")
    expect(drawer.locator("#drawer-title")).to_have_text(sid)
    expect(drawer.locator("#drawer-kicker")).to_have_text("session of lead")
    expect(drawer).to_contain_text("idle")
    if transcript:
        expect(drawer.locator(".transcript")).to_contain_text("lexer first, then the grammar")
        expect(drawer.locator(".tr-thought")).to_contain_text("split lexing out first")
    else:
        expect(drawer.locator(".empty")).to_have_text("no transcript yet")
    screenshot(page, "session", tmp_path)


def test_panels_render_links_timers_and_delegations(page: Page, team: Team, tmp_path: Path) -> None:
    """The hub does not record links, timers or delegations yet: serve records of the
    planned shape in place of the snapshot and the stream, and check how they show."""
    now = time.time()
    snap = {
        "members": [
            {"name": "lead", "kind": "claude-code", "state": "active", "last_activity": now},
            {"name": "reviewer", "kind": "codex", "state": "idle", "last_activity": now - 90},
            {"name": "user", "kind": "human", "state": "no session", "last_activity": None},
            {"name": "worker", "kind": "gemini", "state": "idle", "last_activity": now - 20},
        ],
        "links": [
            {
                "link_id": "lnk_1",
                "initiator": "lead",
                "responder": "worker",
                "state": "open",
                "budget": 8,
                "turns_used": 3,
            },
            {
                "link_id": "lnk_2",
                "initiator": "lead",
                "responder": "reviewer",
                "state": "closed",
                "budget": 8,
                "turns_used": 8,
                "closed_reason": "turn budget exhausted",
            },
        ],
        "timers": [
            {
                "timer_id": "tmr_1",
                "member": "worker",
                "intent": "anchor",
                "note": "return to task 3 — implement the report generator",
                "due_at": now + 240,
            },
            {
                "timer_id": "tmr_2",
                "member": "lead",
                "intent": "check",
                "target": "worker",
                "note": "is the worker stuck on the lexer?",
                "due_at": now + 65,
            },
        ],
        "delegations": [
            {
                "delegation_id": f"dlg_{state}",
                "caller": "lead",
                "callee": "reviewer",
                "state": state,
                "task": f"Review the lexer split ({state})",
                "deadline": now + 300,
            }
            for state in ("pending", "answered", "timed_out", "late")
        ],
    }
    body = f"event: snapshot\ndata: {json.dumps(snap)}\n\nevent: live\ndata: {{}}\n\n"
    page.route(
        "**/v1/dashboard/teams/*/snapshot",
        lambda route: route.fulfill(json=snap),
    )
    page.route(
        "**/v1/dashboard/teams/*/stream?*",
        lambda route: route.fulfill(body=body, content_type="text/event-stream"),
    )
    page.goto(team.server.url + "/")
    page.locator("#token-input").fill(team.tokens["user"])
    page.get_by_role("button", name="Sign in").click()

    link = page.locator('#links li[data-link-id="lnk_1"]')
    expect(link.locator(".peers")).to_have_text("lead ↔ worker")
    expect(link.locator(".turns")).to_have_text("3 / 8")
    closed = page.locator('#links li[data-link-id="lnk_2"]')
    expect(closed.locator(".why")).to_have_text("closed: turn budget exhausted")
    expect(page.locator("#links-empty")).to_be_hidden()
    anchor = page.locator('#timers li[data-timer-id="tmr_1"]')
    expect(anchor).to_contain_text("ANCHOR")
    expect(anchor).to_contain_text("return to task 3")
    expect(anchor.locator(".reltime")).to_have_text(re.compile(r"due in [34] min"))
    expect(page.locator("#timers li").first).to_contain_text("CHECK")  # soonest first
    expect(page.locator("#delegation-tally")).to_contain_text("1 timed out")
    expect(page.locator('#delegations li[data-state="late"] .pill')).to_have_text("late")
    expect(page.locator('#members > li[data-member="lead"] .member-state')).to_have_text("active")
    screenshot(page, "panels", tmp_path)
