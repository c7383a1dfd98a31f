"""Bounded snapshots with paged panels, and the admin's token and removal actions, over
the API and in real headless Chromium against a real ``backchannel serve``."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from playwright.sync_api import Dialog, Page, expect

from backchannel.core.pages import MAX_PAGE
from backchannel.interfaces.dashboard import SNAPSHOT_PAGE
from backchannel.testing import eventually_blocking
from tests.dashboard.conftest import Team, sign_in

# Counts, in the page, the traffic events its streams deliver, and how many had come
# when the stream said it was live (a test's view of what opening the page cost).
COUNT_TRAFFIC = """
window.__traffic = 0;
window.__trafficAtLive = null;
const addListener = EventSource.prototype.addEventListener;
EventSource.prototype.addEventListener = function (type, listener, options) {
  let counted = listener;
  if (type === "traffic") {
    counted = (ev) => {
      window.__traffic += 1;
      return listener(ev);
    };
  } else if (type === "live") {
    counted = (ev) => {
      window.__trafficAtLive = window.__traffic;
      return listener(ev);
    };
  }
  return addListener.call(this, type, counted, options);
};
"""


def _many_timers(make_team: Callable[..., Team], n: int) -> tuple[Team, list[int]]:
    t = make_team("busy", settings={"anchor_policy": "off", "max_timers": 1000})
    t.open_session("busy", "busy-s")
    ids = [
        int(
            t.post(
                "busy",
                "/v1/timers",
                intent="anchor",
                minutes=10 + i,
                note=f"n{i}",
                session="busy-s",
            )["timer_id"]
        )
        for i in range(n)
    ]
    return t, ids


def test_snapshot_is_bounded_and_panels_page(make_team: Callable[..., Team]) -> None:
    t, ids = _many_timers(make_team, SNAPSHOT_PAGE * 2 + 30)
    base = f"/v1/dashboard/teams/{t.name}"
    with t.client("busy") as c:
        r = c.get(f"{base}/snapshot")
        snap = r.json()
        assert len(snap["timers"]) == SNAPSHOT_PAGE
        assert snap["hidden"]["timers"] == len(ids) - SNAPSHOT_PAGE
        assert len(r.content) < 60_000
        seen: list[int] = []
        offset = 0
        while True:
            page = c.get(f"{base}/timers", params={"offset": offset, "limit": 40}).json()
            assert page["total"] == len(ids)
            if not page["timers"]:
                break
            seen += [x["timer_id"] for x in page["timers"]]
            offset += len(page["timers"])
        assert seen == ids  # soonest first, each once
        assert c.get(f"{base}/timers", params={"limit": 100_000}).status_code == 422


def test_the_timers_panel_shows_more_on_demand(page: Page, make_team: Callable[..., Team]) -> None:
    t, ids = _many_timers(make_team, SNAPSHOT_PAGE + 20)
    sign_in(page, t.server, t.tokens["busy"])
    items = page.locator("#timers li.item")
    expect(items).to_have_count(SNAPSHOT_PAGE)
    expect(page.locator("#timers-count")).to_have_text(str(len(ids)))
    more = page.locator("#timers .more")
    expect(more).to_contain_text("+ 20 more not shown")
    more.get_by_role("button", name="show more").click()
    expect(items).to_have_count(len(ids))
    expect(page.locator("#timers .more")).to_have_count(0)
    # the bigger page stays when the records change
    t.post("busy", "/v1/timers", intent="anchor", minutes=1, note="soonest", session="busy-s")
    expect(items).to_have_count(len(ids) + 1)
    expect(items.first.locator(".note")).to_have_text("soonest")


def test_a_session_view_says_its_records_are_from_the_loaded_page(
    page: Page, make_team: Callable[..., Team]
) -> None:
    """A session's timers in its view come from the timers the page has loaded; when
    the team has more than those, the view says how many more and where to load them,
    and once they are loaded it lists them all and says nothing more."""
    t, ids = _many_timers(make_team, SNAPSHOT_PAGE + 20)
    sign_in(page, t.server, t.tokens["busy"])
    page.locator('#members > li[data-member="busy"] .session-link', has_text="busy-s").click()
    drawer = page.get_by_role("dialog")
    expect(drawer.locator("#drawer-title")).to_have_text("busy-s")
    expect(drawer.locator(".timer")).to_have_count(SNAPSHOT_PAGE)
    note = drawer.locator(".records-note")
    expect(note).to_have_text(
        f"From the {SNAPSHOT_PAGE} timers this page has loaded: the team has 20 more "
        "(show more in the Timers panel)."
    )
    page.locator("#drawer-close").click()
    page.locator("#timers .more").get_by_role("button", name="show more").click()
    expect(page.locator("#timers li.item")).to_have_count(len(ids))
    page.locator('#members > li[data-member="busy"] .session-link', has_text="busy-s").click()
    expect(drawer.locator(".timer")).to_have_count(len(ids))
    expect(note).to_have_count(0)


def test_admin_rotates_removes_and_deletes_from_the_page(
    page: Page, make_team: Callable[..., Team]
) -> None:
    t = make_team("lead", "worker", settings={"anchor_policy": "off"})
    sign_in(page, t.server, t.server.admin_token)
    page.get_by_label("team", exact=True).select_option(t.name)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    worker = page.locator('#members > li[data-member="worker"]')
    expect(page.locator('#members > li[data-member="user"] .admin-action')).to_have_count(0)

    page.once("dialog", lambda d: d.accept())
    worker.get_by_role("button", name="new token").click()
    note = page.locator("#admin-note")
    expect(note).to_contain_text("New token for worker (shown once): bc_")
    new = note.inner_text().rsplit(" ", 1)[-1]
    me = f"{t.server.url}/v1/me"
    assert (
        httpx.get(me, headers={"Authorization": f"Bearer {t.tokens['worker']}"}).status_code == 401
    )
    assert httpx.get(me, headers={"Authorization": f"Bearer {new}"}).json()["name"] == "worker"

    t.post("lead", "/v1/messages", to="worker", text="are you there?")
    page.once("dialog", lambda d: d.accept())
    worker.get_by_role("button", name="remove").click()
    expect(note).to_contain_text("worker removed: 1 dead letter(s)")
    expect(worker).to_have_count(0)
    with t.client("lead") as c:
        got = c.get("/v1/inbox").json()["messages"]
    assert any("no longer a member" in m["text"] for m in got), json.dumps(got)

    def confirm_name(d: Dialog) -> None:
        d.accept(t.name)

    page.once("dialog", confirm_name)
    page.locator("#remove-team").click()
    expect(note).to_contain_text(f"Team {t.name} removed")
    expect(
        page.get_by_label("team", exact=True).locator(f'option[value="{t.name}"]')
    ).to_have_count(0)
    assert httpx.get(me, headers={"Authorization": f"Bearer {t.tokens['lead']}"}).status_code == 401


def test_the_dead_letters_panel_is_bounded(page: Page, make_team: Callable[..., Team]) -> None:
    """A team with many dead letters in its history: the panel lists the latest
    SNAPSHOT_PAGE of them and counts the rest, rather than one item for each."""
    t = make_team("sink")
    n = SNAPSHOT_PAGE + 20
    for i in range(n):
        t.send("user", "sink", f"doomed {i}", summary=f"doomed {i}")
    got = t.receive("sink", lease=0.2)  # one attempt allowed: never acked -> dead
    assert len(got) == n
    sign_in(page, t.server, t.tokens["user"])
    expect(page.locator("#dead-count")).to_have_text(str(n))
    items = page.locator("#dead li.item")
    expect(items).to_have_count(SNAPSHOT_PAGE)
    expect(items.first.locator(".note")).to_have_text(f"doomed {n - 1}")  # newest first
    more = page.locator("#dead .more")
    expect(more).to_contain_text("+ 20 more not shown")
    expect(more.get_by_role("button")).to_have_count(0)  # it only counts what it leaves out


def _dead(t: Team, message_id: str) -> bool:
    with t.client() as c:
        r = c.get(f"/v1/dashboard/teams/{t.name}/messages/{message_id}")
        r.raise_for_status()
        return all(d["state"] == "dead" for d in r.json()["deliveries"])


def test_opening_a_long_history_costs_what_the_page_shows(
    page: Page, make_team: Callable[..., Team]
) -> None:
    """A team with 20,000 events: the page is sent the latest 1,000 (as many as its
    timeline keeps) and is live after those, showing the newest messages and saying
    that older ones are not shown; a dead letter from before them is still in its
    panel; a message sent once it is open shows live."""
    members = [f"m{i}" for i in range(10)]
    t = make_team(*members)
    doomed = t.send("user", "m0", "doomed early", summary="doomed early")
    assert len(t.receive("m0", lease=0.2)) == 1  # one attempt allowed: never acked -> dead
    eventually_blocking(lambda: _dead(t, doomed), what="the copy to be given up on")
    t.flood("user", 2_000)  # a broadcast to 10 members each: 20,000 events
    page.add_init_script(COUNT_TRAFFIC)
    sign_in(page, t.server, t.tokens["user"])
    assert page.evaluate("window.__trafficAtLive") == 1000
    rows = page.locator("#timeline .row")
    older = "latest 100 messages (older ones not shown)"
    expect(page.locator("#timeline-count")).to_have_text(older)
    expect(rows.first.locator(".summary")).to_have_text("flood 1999")
    expect(rows.last.locator(".summary")).to_have_text("flood 1900")
    expect(rows.first.locator(".progress")).to_have_text("0/10 acked")
    expect(page.locator("#dead-count")).to_have_text("1")
    expect(page.locator("#dead li.item .note")).to_have_text("doomed early")
    expect(page.locator("#dead li.item .why")).not_to_be_empty()
    t.send("m1", "m2", "after opening", summary="after opening")
    expect(rows.first.locator(".summary")).to_have_text("after opening")
    expect(page.locator("#timeline-count")).to_have_text(older.replace("100", "101"))
    page.select_option("#filter-kind", "timer")
    expect(page.locator("#timeline-count")).to_have_text("0 of latest 101")
    sent = page.evaluate("window.__traffic")
    assert 1000 < sent < 1010, sent


@pytest.mark.slow
def test_the_team_picker_holds_every_team_past_a_page(
    page: Page, make_team: Callable[..., Team]
) -> None:
    """The admin's picker reads ``GET /v1/teams`` page after page: a hub with more teams
    than one page holds (1,000) offers the last one too."""
    t = make_team("lead")
    with t.server.client() as admin:
        for i in range(MAX_PAGE):
            admin.post("/v1/teams", json={"name": f"zz{i:04d}"}).raise_for_status()
    sign_in(page, t.server, t.server.admin_token)
    picker = page.get_by_label("team", exact=True)
    expect(picker.locator('option[value="zz0999"]')).to_have_count(1)
    expect(picker.locator(f'option[value="{t.name}"]')).to_have_count(1)


def test_the_budgets_panel_shows_the_newest_and_counts_the_rest(
    page: Page, make_team: Callable[..., Team]
) -> None:
    """A team whose pairs have spent more budgets than a page holds: the panel shows
    the newest page and says how many more there are, and shows them on demand."""
    names = [f"m{i:02}" for i in range(12)]
    t = make_team(*names, settings={"anchor_policy": "off", "pair_budget": 1})
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    for a, b in pairs:  # one exchange each: every pair's budget is spent
        t.post(a, "/v1/messages", to=b, text=f"{a} to {b}", link=False)
    sign_in(page, t.server, t.tokens["user"])
    items = page.locator("#budgets li.item")
    expect(items).to_have_count(SNAPSHOT_PAGE)
    expect(page.locator("#budgets-count")).to_have_text(str(len(pairs)))
    expect(items.first).to_have_attribute("data-key", "pair:m10|m11")  # the newest
    expect(items.first).to_have_attribute("data-spent", "true")
    more = page.locator("#budgets .more")
    expect(more).to_contain_text(f"+ {len(pairs) - SNAPSHOT_PAGE} more not shown")
    more.get_by_role("button", name="show more").click()
    expect(items).to_have_count(len(pairs))
    expect(items.last).to_have_attribute("data-key", "pair:m00|m01")  # the oldest
    expect(page.locator("#budgets .more")).to_have_count(0)
