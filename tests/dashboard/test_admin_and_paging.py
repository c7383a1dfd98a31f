"""Bounded snapshots with paged panels, and the admin's token and removal actions, over
the API and in real headless Chromium against a real ``backchannel serve``."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from playwright.sync_api import Dialog, Page, expect

from backchannel.interfaces.dashboard import SNAPSHOT_PAGE
from tests.dashboard.conftest import Team, sign_in


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
    expect(more.get_by_role("button")).to_have_count(0)  # no page to read: they are in the timeline
