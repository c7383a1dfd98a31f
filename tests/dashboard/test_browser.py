"""The dashboard in real headless Chromium against a real ``backchannel serve``.

Every wait is one of Playwright's auto-waiting ``expect`` assertions; nothing sleeps.
Rows of the timeline carry ``data-id`` (the message id), ``data-kind`` and
``data-state``; side-panel items carry ``data-link-id`` / ``data-timer-id`` /
``data-delegation-id`` and ``data-state``, and a link's turns read ``used/budget`` in
its ``.turns`` element. The links, timers and delegations are the hub's own, made
through the HTTP API as agents would make them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Locator, Page, Route, expect

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


def _no_reload_mark(page: Page) -> None:
    """Mark the page: a reload or navigation would lose the mark (see _not_reloaded)."""
    page.evaluate("window.__sameDocument = true")


def _not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"


def _off(make_team: Callable[..., Team], *members: str) -> Team:
    """A team without the anchor rule (it has tests of its own), so any turn may send."""
    return make_team(*members, settings={"anchor_policy": "off"})


def test_see_a_links_budget_change_after_a_crossing(
    page: Page, make_team: Callable[..., Team]
) -> None:
    t = _off(make_team, "a", "b")
    t.open_session("a", "a-s")
    t.open_session("b", "b-s")
    # a's turn sends to b: that opens a link between a-s and b-s
    t.report("a", "a-s", "turn_start")
    t.post("a", "/v1/messages", to="b", text="Can you check the lexer?", from_session="a-s")
    t.report("a", "a-s", "agent_stop", "")  # no output: nothing crosses yet
    with t.client("a") as c:
        [link] = c.get("/v1/links").json()["links"]
    assert (link["turns_used"], link["budget"]) == (0, 8)

    sign_in(page, t.server, t.tokens["user"])
    _no_reload_mark(page)
    item = page.locator(f'#links li[data-link-id="{link["link_id"]}"]')
    expect(page.locator("#links li.link")).to_have_count(1)
    expect(item.locator(".peers")).to_have_text("a ↔ b")
    expect(item.locator(".link-sessions")).to_have_text("a-s↔b-s")
    expect(item.locator(".pill")).to_have_text("open")
    expect(item.locator(".turns")).to_have_text("0/8")
    expect(page.locator("#links-count")).to_have_text("1")

    # b's turn ends with output: it crosses to a and uses one turn of the budget
    t.report("b", "b-s", "turn_start")
    stop = t.report("b", "b-s", "agent_stop", "The lexer is fine; the grammar needs work.")
    assert stop["crossed"] == [
        {"link_id": link["link_id"], "to": "a", "turns_used": 1, "budget": 8}
    ]
    expect(item.locator(".turns")).to_have_text("1/8")
    expect(item.locator(".meter")).to_have_attribute("title", "1 of 8 turns used")
    crossing = page.locator(f'#timeline .row[data-id="{link["link_id"]}-1"]')
    expect(crossing.locator(".kind")).to_have_text("link")
    expect(crossing.locator(".route")).to_have_text("b → a")

    # the initiator closes it: the panel says so, and why
    t.post("a", "/v1/messages", to="b", text="Thanks, that is all.", close_link=True)
    expect(item.locator(".pill")).to_have_text("closed")
    expect(item.locator(".why")).to_have_text("closed: a, who opened it, closed it")
    expect(item.locator(".why")).to_have_attribute("data-reason", "closed_by_initiator")
    expect(item.locator(".turns")).to_have_text("1/8")
    _not_reloaded(page)


def test_a_spent_conversation_budget_shows_and_the_human_extends_it(
    page: Page, make_team: Callable[..., Team]
) -> None:
    t = make_team("a", "b", settings={"anchor_policy": "off", "pair_budget": 2})
    sign_in(page, t.server, t.tokens["user"])
    _no_reload_mark(page)
    expect(page.locator("#budgets-empty")).to_be_visible()
    t.post("a", "/v1/messages", to="b", text="ping", link=False)
    t.post("b", "/v1/messages", to="a", text="pong", link=False)  # spends the pair's budget
    item = page.locator('#budgets li[data-key="pair:a|b"]')
    expect(item.locator(".peers")).to_have_text("a ↔ b")
    expect(item.locator(".turns")).to_have_text("2/2")
    expect(item.locator(".pill")).to_have_text("spent")
    expect(item).to_have_attribute("data-spent", "true")
    with t.client("a") as c:
        r = c.post("/v1/messages", json={"to": "b", "text": "again", "link": False})
    assert (r.status_code, r.json()["error"]["code"]) == (429, "budget_exhausted")
    item.locator(".extend-by").fill("3")
    item.locator("button.extend").click()
    expect(page.locator("#budgets-status")).to_have_text("pair:a|b: 2 of 5 used")
    expect(item.locator(".turns")).to_have_text("2/5")
    expect(item).to_have_attribute("data-spent", "false")
    t.post("a", "/v1/messages", to="b", text="again, allowed", link=False)
    expect(item.locator(".turns")).to_have_text("3/5")
    _not_reloaded(page)


def test_an_extension_whose_answer_was_lost_is_not_made_twice_by_a_second_click(
    page: Page, make_team: Callable[..., Team]
) -> None:
    # the hub extends, its answer never reaches the page (a reset): the person clicks
    # again, and that click must be the same extension made again, not a second one
    t = make_team("a", "b", settings={"anchor_policy": "off", "pair_budget": 2})
    sign_in(page, t.server, t.tokens["user"])
    t.post("a", "/v1/messages", to="b", text="ping", link=False)
    t.post("b", "/v1/messages", to="a", text="pong", link=False)  # spends the pair's budget
    item = page.locator('#budgets li[data-key="pair:a|b"]')
    status = page.locator("#budgets-status")
    expect(item).to_have_attribute("data-spent", "true")
    bodies: list[dict[str, Any]] = []
    lose = {1, 4}  # the requests whose answers are lost

    def answer(route: Route) -> None:
        bodies.append(dict(route.request.post_data_json))
        if len(bodies) in lose:
            route.fetch()  # the hub gets it and extends
            route.abort("connectionreset")  # and the page never hears
        else:
            route.continue_()

    def click(by: str) -> None:
        expect(item.locator("button.extend")).to_be_enabled()
        item.locator(".extend-by").fill(by)
        item.locator("button.extend").click()

    page.route("**/budgets/extend", answer)
    click("3")
    expect(status).to_have_class(re.compile(r"\berror\b"))
    click("3")
    expect(status).to_have_text("pair:a|b: 2 of 5 used")
    assert len(bodies) == 2 and bodies[0] == bodies[1], bodies
    assert bodies[0]["request_id"], bodies
    # with its answer in hand, the next click is the next extension
    click("3")
    expect(status).to_have_text("pair:a|b: 2 of 8 used")
    assert bodies[2]["request_id"] != bodies[0]["request_id"], bodies
    # a lost answer, then another amount: the hub refuses it as the same request made
    # with other terms, and the page says the first one went through
    click("3")
    expect(status).to_have_class(re.compile(r"\berror\b"))
    click("1")
    expect(status).to_contain_text("your earlier extension by 3 went through")
    assert bodies[4]["request_id"] == bodies[3]["request_id"], bodies
    expect(item.locator(".turns")).to_have_text("2/11")
    click("1")
    expect(status).to_have_text("pair:a|b: 2 of 12 used")
    assert len({b["request_id"] for b in bodies}) == 4, bodies


#: Loaded before the page's own scripts: every ``snapshot`` and ``traffic`` event of the
#: live stream, as the page receives it (its own listeners run in the same dispatch), in
#: ``window.__live`` as "type data"; what a test waits on to know an update has landed.
LIVE_SEEN = """(() => {
  const Real = window.EventSource;
  window.__live = [];
  window.EventSource = class extends Real {
    constructor(...args) {
      super(...args);
      for (const type of ["snapshot", "traffic"]) {
        this.addEventListener(type, (e) => window.__live.push(`${type} ${e.data}`));
      }
    }
  };
})();"""


def _landed(page: Page, *marks: str) -> None:
    """Wait until, for each mark, a live update holding every word of it has landed."""
    for mark in marks:
        words = mark.split()
        page.wait_for_function(
            "(words) => window.__live.some((e) => words.every((w) => e.includes(w)))", arg=words
        )


def _press(page: Page, target: Locator) -> None:
    """Press the mouse button on ``target``, and keep it down."""
    box = target.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()


def _spent_budget(page: Page, make_team: Callable[..., Team]) -> tuple[Team, Locator]:
    """A team whose pair a|b has spent its budget, on the page (which records the live
    updates it gets): the team and the budget's item."""
    t = make_team("a", "b", settings={"anchor_policy": "off", "pair_budget": 2})
    page.add_init_script(LIVE_SEEN)
    sign_in(page, t.server, t.tokens["user"])
    t.post("a", "/v1/messages", to="b", text="ping", link=False)
    t.post("b", "/v1/messages", to="a", text="pong", link=False)  # spends the pair's budget
    item = page.locator('#budgets li[data-key="pair:a|b"]')
    expect(item).to_have_attribute("data-spent", "true")
    return t, item


def _update_lands(page: Page, t: Team) -> None:
    """A live update that redraws every panel reaches the page: b opens a session."""
    t.open_session("b", "b-s")
    _landed(page, "snapshot b-s")


def test_a_click_pressed_while_a_live_update_lands_is_not_lost(
    page: Page, make_team: Callable[..., Team]
) -> None:
    """A person's click takes a moment from press to release. A live update redrawing
    the panel in between replaced the button pressed, and the browser sent the click to
    neither copy: the extension was never asked for. The redraw waits for the release."""
    t, item = _spent_budget(page, make_team)
    _press(page, item.locator("button.extend"))
    _update_lands(page, t)
    page.mouse.up()
    expect(page.locator("#budgets-status")).to_have_text("pair:a|b: 2 of 6 used")
    # what the update changed is drawn once the press is over
    expect(page.locator('#members > li[data-member="b"] .member-state')).to_have_text("idle")
    expect(item.locator(".turns")).to_have_text("2/6")


def test_a_timeline_row_pressed_while_its_message_moves_opens(page: Page, team: Team) -> None:
    """Traffic redraws a row as its message moves, and puts a new message's row above
    it: either between the press and the release lost the click (the row pressed was
    redrawn, or moved down from under the pointer). Both wait for the release."""
    mid = team.send("lead", "worker", "Count the lines in src/.", summary="count lines")
    page.add_init_script(LIVE_SEEN)
    sign_in(page, team.server, team.tokens["user"])
    row = page.locator(f'#timeline .row[data-id="{mid}"]')
    expect(row).to_have_attribute("data-state", "queued")
    _press(page, row)
    assert [m["message_id"] for m in team.receive("worker")] == [mid]  # it is leased
    other = team.send("lead", "reviewer", "Review the lexer.", summary="review")
    _landed(page, f"traffic {mid} leased", f"traffic {other}")
    page.mouse.up()
    expect(page.get_by_role("dialog").locator("#drawer-title")).to_have_text("lead → worker")
    expect(row).to_have_attribute("data-state", "leased")
    expect(page.locator("#timeline .row").first).to_have_attribute("data-id", other)


def test_typing_in_a_panel_survives_a_live_update(
    page: Page, make_team: Callable[..., Team]
) -> None:
    """A live update landing while the person types an amount redrew the box under the
    cursor: the keys typed after it went nowhere. The panel waits until the box is
    left; the other panels do not."""
    t, item = _spent_budget(page, make_team)
    by = item.locator(".extend-by")
    by.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("1")
    _update_lands(page, t)
    expect(page.locator('#members > li[data-member="b"] .member-state')).to_have_text("idle")
    page.keyboard.type("2")
    expect(by).to_have_value("12")
    item.locator("button.extend").click()
    expect(page.locator("#budgets-status")).to_have_text("pair:a|b: 2 of 14 used")
    expect(item.locator(".turns")).to_have_text("2/14")


def test_timers_show_intent_note_and_due_time_live(
    page: Page, make_team: Callable[..., Team]
) -> None:
    t = _off(make_team, "lead", "worker")
    t.open_session("lead", "lead-s")
    t.open_session("worker", "worker-s")
    sign_in(page, t.server, t.tokens["lead"])
    _no_reload_mark(page)
    expect(page.locator("#timers-empty")).to_have_text("no timers yet")

    check = t.post(
        "lead",
        "/v1/timers",
        intent="check",
        minutes=5,
        note="is the worker stuck on the lexer?",
        target="worker",
        session="lead-s",
    )
    assert check["state"] == "pending"
    item = page.locator(f'#timers li[data-timer-id="{check["timer_id"]}"]')
    expect(item).to_have_attribute("data-state", "pending")
    expect(item.locator(".intent")).to_have_text("CHECK")
    expect(item.locator(".owner")).to_have_text("lead")
    expect(item.locator(".target")).to_have_text("→ worker")
    expect(item.locator(".note")).to_have_text("is the worker stuck on the lexer?")
    expect(item.locator(".reltime")).to_have_text(re.compile(r"due in [45] min"))
    expect(item.locator(".session-ref")).to_have_text("lead-s")
    expect(page.locator("#timers-empty")).to_be_hidden()

    # soonest first
    anchor = t.post(
        "worker",
        "/v1/timers",
        intent="anchor",
        minutes=2,
        note="return to task 3 — implement the report generator",
        session="worker-s",
    )
    ids = page.locator("#timers li")
    expect(ids).to_have_count(2)
    expect(ids.first).to_have_attribute("data-timer-id", str(anchor["timer_id"]))
    expect(ids.first.locator(".intent")).to_have_text("ANCHOR")
    expect(ids.first.locator(".target")).to_have_count(0)

    # a timer that fires becomes its session's breadcrumb message and leaves the panel
    t.post("worker", "/v1/timers", intent="anchor", seconds=1, note="look up", session="worker-s")
    fired = page.locator('#timeline .row[data-kind="timer"]')
    expect(fired.locator(".route")).to_have_text("hub → worker")
    expect(fired.locator(".summary")).to_contain_text("look up")
    expect(ids).to_have_count(2)

    # a cancelled timer leaves it too
    with t.client("lead") as c:
        c.delete(f"/v1/timers/{check['timer_id']}").raise_for_status()
    expect(ids).to_have_count(1)
    expect(page.locator("#timers-count")).to_have_text("1")
    _not_reloaded(page)


def _answer(t: Team, callee: str, session_id: str, text: str) -> None:
    """Play the callee: its delegated session runs one turn that ends with the answer."""
    t.turn(callee, session_id, text)


def test_delegations_pending_answered_timed_out_and_late(
    page: Page, make_team: Callable[..., Team]
) -> None:
    t = _off(make_team, "lead", "counter")
    t.open_session("lead", "lead-s")
    sign_in(page, t.server, t.tokens["user"])
    _no_reload_mark(page)
    expect(page.locator("#delegations-empty")).to_have_text("no delegations yet")

    t.report("lead", "lead-s", "turn_start")
    count = t.post(
        "lead",
        "/v1/delegations",
        to="counter",
        task="Count the Python files",
        tool_use_id="tu_count",
    )
    slow = t.post(
        "lead",
        "/v1/delegations",
        to="counter",
        task="Benchmark the parser\n(all three grammars)",
        tool_use_id="tu_slow",
        timeout_s=1,
    )
    t.report("lead", "lead-s", "agent_stop", "")
    assert (count["state"], count["callee_session"]) == ("pending", "lead-s--tu_count")

    item = page.locator(f'#delegations li[data-delegation-id="{count["delegation_id"]}"]')
    expect(item).to_have_attribute("data-state", "pending")
    expect(item.locator(".item-line").first).to_have_text("lead ⇢ counterpending")
    expect(item.locator(".task")).to_have_text("Count the Python files")
    expect(item.locator(".detail")).to_have_text(re.compile(r"answer due in [45] min"))
    expect(item.locator(".session-ref")).to_have_text("lead-s--tu_count")

    # the slow one passes its deadline: timed out, with the error the caller got
    late = page.locator(f'#delegations li[data-delegation-id="{slow["delegation_id"]}"]')
    expect(late).to_have_attribute("data-state", "timed_out")
    expect(late.locator(".pill")).to_have_text("timed out")
    expect(late.locator(".task")).to_have_text("Benchmark the parser")
    expect(late.locator(".why")).to_contain_text("counter did not answer within 1 s")
    tally = page.locator("#delegation-tally .tally-item")
    expect(tally).to_have_text(["1 pending", "0 answered", "1 timed out", "0 late"])

    # the callee answers both: one answered, one late
    _answer(t, "counter", "lead-s--tu_count", "There are 42 Python files.")
    expect(item).to_have_attribute("data-state", "answered")
    expect(item.locator(".pill")).to_have_text("answered")
    expect(item.locator(".result")).to_have_text("There are 42 Python files.")
    _answer(t, "counter", "lead-s--tu_slow", "Parsing takes 3 ms per file.")
    expect(late).to_have_attribute("data-state", "late")
    expect(late.locator(".detail")).to_contain_text("answered after its deadline")
    expect(late.locator(".result")).to_have_text("Parsing takes 3 ms per file.")
    expect(tally).to_have_text(["0 pending", "1 answered", "0 timed out", "1 late"])
    expect(page.locator("#delegations-count")).to_have_text("2")
    # the results reach the caller as tool_result messages
    expect(page.locator('#timeline .row[data-kind="tool_result"]')).to_have_count(2)
    _not_reloaded(page)


def _busy_team(make_team: Callable[..., Team]) -> Team:
    """A team in the middle of work: links (one spent), timers, delegations in every
    state, a dead letter and a session with a transcript."""
    t = _off(make_team, "lead", "worker", "reviewer")
    for m in ("lead", "worker", "reviewer"):
        t.open_session(m, f"{m}-s")
    t.report("lead", "lead-s", "turn_start", "Plan the parser work")
    t.report("lead", "lead-s", "thought", "The grammar is small; split lexing out first.")
    t.report("lead", "lead-s", "tool_call", "", name="read_file", input={"path": "src/parse.py"})
    t.report("lead", "lead-s", "tool_result", "412 lines")
    t.post(
        "lead",
        "/v1/messages",
        to="worker",
        text="Split the parser into a lexer and a grammar.",
        summary="split the parser",
        from_session="lead-s",
    )
    t.post(
        "lead",
        "/v1/messages",
        to="reviewer",
        text="Review the lexer as soon as it lands.",
        summary="review the lexer",
        from_session="lead-s",
        link_budget=2,
    )
    t.post(
        "lead",
        "/v1/timers",
        intent="anchor",
        minutes=10,
        note="return to task 3 — implement the report generator",
        session="lead-s",
    )
    t.post(
        "lead",
        "/v1/timers",
        intent="check",
        minutes=2,
        note="is the worker stuck on the lexer?",
        target="worker",
        session="lead-s",
    )
    for to, task, tu, timeout in (
        ("reviewer", "Review the lexer split", "tu_review", None),
        ("worker", "Count the Python files", "tu_count", None),
        ("reviewer", "Benchmark the old parser", "tu_bench", 1),
        ("worker", "List the TODOs in src/", "tu_todo", 1),
    ):
        t.post("lead", "/v1/delegations", to=to, task=task, tool_use_id=tu, timeout_s=timeout)
    t.report("lead", "lead-s", "agent_stop", "Plan: lexer first, then the grammar.")
    t.turn("worker", "worker-s", "Lexer split done; the grammar is next.")
    t.turn(
        "reviewer", "reviewer-s", "The lexer reads well. Two nits: rename `tok`, test empty input."
    )
    _answer(t, "worker", "lead-s--tu_count", "There are 42 Python files.")
    for m in ("lead", "worker", "reviewer"):
        t.drain(m, f"{m}-s")
    return t


def test_busy_team_panels_and_session_view(
    new_page: Callable[..., Page], make_team: Callable[..., Team], tmp_path: Path
) -> None:
    t = _busy_team(make_team)
    page = new_page(height=1300)
    sign_in(page, t.server, t.tokens["user"])
    links = page.locator("#links li.link")
    expect(links).to_have_count(2)
    # open links first: lead's turn crossed both, then each peer's turn crossed back
    expect(links.nth(0).locator(".peers")).to_have_text("lead ↔ worker")
    expect(links.nth(0).locator(".turns")).to_have_text("2/8")
    expect(links.nth(0)).to_have_attribute("data-state", "open")
    expect(links.nth(1).locator(".peers")).to_have_text("lead ↔ reviewer")
    expect(links.nth(1).locator(".turns")).to_have_text("2/2")
    expect(links.nth(1)).to_have_attribute("data-state", "closed")
    expect(links.nth(1).locator(".why")).to_have_text("closed: its 2 turns are used up")
    expect(page.locator("#timers li .intent")).to_have_text(["CHECK", "ANCHOR"])
    tally = page.locator("#delegation-tally .tally-item")
    expect(tally).to_have_text(["1 pending", "1 answered", "2 timed out", "0 late"])
    _answer(t, "worker", "lead-s--tu_todo", "3 TODOs: lexer.py:12, grammar.py:40, cli.py:7")
    expect(tally).to_have_text(["1 pending", "1 answered", "1 timed out", "1 late"])
    # a dead letter, with its reason
    mid = t.send("worker", "reviewer", "Can you look at this diff?", summary="look at the diff")
    # the server allows one attempt: a copy taken and never acked is dead
    t.receive("reviewer", lease=0.2, session="reviewer-s")
    expect(page.locator(f'#dead li[data-id="{mid}"] .why')).to_contain_text("attempt")
    screenshot(page, "panels", tmp_path)

    # the session view: its links, timers and delegations, and its transcript
    page.locator('#members > li[data-member="lead"] .session-link', has_text="lead-s").click()
    drawer = page.get_by_role("dialog")
    expect(drawer.locator("#drawer-title")).to_have_text("lead-s")
    expect(drawer.locator(".link .mini-what")).to_have_text(["↔ worker", "↔ reviewer"])
    expect(drawer.locator(".link .turns")).to_have_text(["2/8", "2/2"])
    expect(drawer.locator(".timer .intent")).to_have_text(["CHECK", "ANCHOR"])
    expect(drawer.locator(".delegation .mini-what")).to_have_count(4)
    expect(drawer.locator('.delegation[data-state="late"] .mini-what')).to_have_text("⇢ worker")
    transcript = drawer.locator(".transcript > li")
    expect(transcript.first).to_have_attribute("data-kind", "session")
    expect(drawer.locator(".tr-thought")).to_contain_text("split lexing out first")
    expect(drawer.locator(".tr-tool_call .tr-about")).to_have_text("read_file")
    expect(drawer.locator(".tr-tool_call .tr-text")).to_contain_text('"path": "src/parse.py"')
    expect(drawer.locator(".tr-sent .tr-about")).to_have_text(["→ worker", "→ reviewer"])
    expect(drawer.locator(".tr-agent_stop").first).to_contain_text("lexer first, then the grammar")
    # the open session view follows the session: a link crossing into it shows up
    t.turn("worker", "worker-s", "The grammar is done too.")
    expect(drawer.locator(".link .turns")).to_have_text(["3/8", "2/2"])
    screenshot(page, "session", tmp_path)
    # ... and a running turn, event by event
    t.report("lead", "lead-s", "turn_start", "Next: the grammar")
    expect(drawer.locator(".facts .pill")).to_have_text("active")
    t.report("lead", "lead-s", "thought", "Check the worker's lexer before the grammar.")
    expect(drawer.locator(".tr-thought").last).to_have_text(re.compile("worker's lexer before"))


def test_overview_in_the_dark_theme(
    new_page: Callable[..., Page], make_team: Callable[..., Team], tmp_path: Path
) -> None:
    t = _busy_team(make_team)
    t.send("user", "lead", "How far along is the parser?", summary="status?")
    page = new_page("dark")
    sign_in(page, t.server, t.server.admin_token)
    page.get_by_label("team", exact=True).select_option(t.name)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    expect(page.locator('#timeline .row[data-from="user"]')).to_have_count(1)
    expect(page.locator("#links li.link")).to_have_count(2)
    expect(page.locator("#delegations li")).to_have_count(4)
    expect(page.locator('#delegation-tally [data-state="timed_out"]')).to_have_text("2 timed out")
    screenshot(page, "overview-dark", tmp_path)


MARKUP = (
    '<img src=x onerror="window.__xss=1"></script><script>window.__xss=2</script><b>bold</b>'
    '<svg onload="window.__xss=3"></svg><a href="javascript:window.__xss=4">[link](x)</a>'
)


def test_text_agents_write_is_shown_as_text_everywhere(
    page: Page, make_team: Callable[..., Team]
) -> None:
    """Markup in every field an agent or a member writes (a message's text and
    summary, a timer's note, a delegation's task and answer, a turn's thought and
    closing text, a block to an unknown member and the hub's notice quoting it) is
    shown as text: no element of it is ever made, whatever the CSP would block."""
    t = _off(make_team, "lead", "counter")
    t.open_session("lead", "lead-s")
    t.report("lead", "lead-s", "turn_start")
    mid = t.send("lead", "counter", MARKUP, summary=MARKUP, from_session="lead-s")
    t.post("lead", "/v1/timers", intent="anchor", minutes=5, note=MARKUP, session="lead-s")
    t.post("lead", "/v1/delegations", to="counter", task=MARKUP, tool_use_id="tu_x")
    t.report("lead", "lead-s", "thought", MARKUP)
    t.report("lead", "lead-s", "agent_stop", f'{MARKUP}\n<message to="nobody">{MARKUP}</message>')
    _answer(t, "counter", "lead-s--tu_x", MARKUP)

    sign_in(page, t.server, t.tokens["user"])
    expect(page.locator(f'#timeline .row[data-id="{mid}"] .summary')).to_have_text(MARKUP)
    expect(page.locator("#timers .note")).to_have_text(MARKUP)
    expect(page.locator("#delegations .task")).to_contain_text("<img src=x")
    expect(page.locator("#delegations .result")).to_contain_text("<img src=x")
    page.locator(f'#timeline .row[data-id="{mid}"]').click()
    expect(page.locator("#drawer .message-text").first).to_have_text(MARKUP)
    page.locator("#drawer-close").click()
    page.locator('#timeline .row[data-from="hub"]').first.click()  # the unknown-member notice
    expect(page.locator("#drawer .message-text").first).to_contain_text("<img src=x")
    page.locator("#drawer-close").click()
    page.locator("#members .session-link", has_text="lead-s").first.click()
    expect(page.locator("#drawer .transcript")).to_contain_text(MARKUP)
    made = page.evaluate(
        """[
            document.querySelectorAll('img, svg, a, script:not([src])').length,
            [...document.querySelectorAll('b')].filter((b) => b.textContent === 'bold').length,
            window.__xss,
        ]"""
    )
    assert made == [0, 0, None], made


def test_a_member_sees_only_its_own_delegations_and_messages(
    new_page: Callable[..., Page], make_team: Callable[..., Team]
) -> None:
    """Signed in as a member, the page shows the delegations it made or was asked and
    opens only the messages it sent or got, as the API lets it; signed in as the
    team's human it shows all of them."""
    t = _off(make_team, "lead", "counter", "bystander")
    t.open_session("lead", "lead-s")
    t.report("lead", "lead-s", "turn_start")
    d = t.post("lead", "/v1/delegations", to="counter", task="Count the secret files")
    t.report("lead", "lead-s", "agent_stop", "")
    human, caller, bystander = new_page(), new_page(), new_page()
    sign_in(human, t.server, t.tokens["user"])
    sign_in(caller, t.server, t.tokens["lead"])
    sign_in(bystander, t.server, t.tokens["bystander"])
    for page in (human, caller):
        item = page.locator(f'#delegations li[data-delegation-id="{d["delegation_id"]}"]')
        expect(item.locator(".task")).to_have_text("Count the secret files")
        expect(page.locator("#delegation-tally .tally-item").first).to_have_text("1 pending")
    task = bystander.locator('#timeline .row[data-kind="delegation"]')
    expect(task).to_have_count(1)  # the team's traffic, as GET /v1/teams/{team}/events
    expect(bystander.locator("#delegations-empty")).to_have_text("no delegations yet")
    expect(bystander.locator("#delegation-tally .tally-item")).to_have_count(0)
    task.click()
    expect(bystander.locator("#drawer .form-error")).to_contain_text("that you sent or received")
    expect(bystander.locator("#drawer")).not_to_contain_text("Count the secret files")
    human.locator('#timeline .row[data-kind="delegation"]').click()
    expect(human.locator("#drawer .message-text").first).to_have_text("Count the secret files")
