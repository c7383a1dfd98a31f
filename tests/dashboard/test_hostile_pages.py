"""The dashboard against a page of another origin, in real headless Chromium: it cannot
frame the dashboard, cannot make a signed-in tab's hub send or extend (the page signs in
with a bearer token in the tab's ``sessionStorage``: no cookie rides along with a
request another site makes), and the page's headers say so to older browsers too.

The other origin is ``http://elsewhere.test``, answered by Playwright's routing in the
browser context (nothing listens there); its requests to the hub are real.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from playwright.sync_api import Page, expect

from tests.dashboard.conftest import Team, sign_in

ELSEWHERE = "http://elsewhere.test/"


def _open_elsewhere(page: Page, html: str) -> None:
    page.context.route(
        ELSEWHERE + "**",
        lambda route: route.fulfill(status=200, content_type="text/html", body=html),
    )
    page.goto(ELSEWHERE)


def test_the_page_refuses_to_be_framed_and_says_so_to_every_browser(
    new_page: Callable[..., Page], team: Team
) -> None:
    with httpx.Client(base_url=team.server.url) as c:
        headers = c.get("/").headers
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"  # browsers that ignore frame-ancestors
    assert headers["referrer-policy"] == "no-referrer"
    assert "set-cookie" not in headers

    page = new_page()
    _open_elsewhere(
        page,
        f'<iframe id="f" src="{team.server.url}/" onload="window.__loaded = true"></iframe>',
    )
    page.wait_for_function("window.__loaded === true")
    [framed] = [f for f in page.frames if f is not page.main_frame]
    assert framed.locator("#token-input").count() == 0, "the dashboard rendered in a frame"


def test_another_origin_cannot_send_or_extend_through_a_signed_in_tab(
    new_page: Callable[..., Page], team: Team
) -> None:
    """The team's human is signed in, in this browser; a page elsewhere then posts to
    the composer and the budget extension (a form, and a fetch with credentials). None
    reaches the hub as the human: no message is sent, no budget extended."""
    page = new_page()
    sign_in(page, team.server, team.tokens["user"])
    assert page.context.cookies() == [], "the dashboard sets no cookie to ride along"
    base = f"{team.server.url}/v1/dashboard/teams/{team.name}"
    body = json.dumps({"to": "*", "text": "sent from elsewhere"})
    extend = json.dumps({"key": "pair:lead:worker", "by": 100})
    hostile = page.context.new_page()
    _open_elsewhere(
        hostile,
        f"""<form id="form" method="post" enctype="text/plain" target="sink"
              action="{base}/messages"><input name='{body[:-2]}' value='"}}'></form>
            <iframe name="sink" onload="window.__posted = (window.__posted || 0) + 1"></iframe>
            <script>
              window.__fetched = Promise.all([
                ["{base}/messages", {json.dumps(body)}],
                ["{base}/budgets/extend", {json.dumps(extend)}],
              ].map(([url, data]) =>
                fetch(url, {{method: "POST", credentials: "include", body: data,
                             headers: {{"Content-Type": "text/plain"}}}})
                  .then((r) => r.status, (e) => "blocked")));
              document.getElementById("form").submit();
            </script>""",
    )
    statuses = hostile.evaluate("window.__fetched")
    assert all(s in (401, "blocked") for s in statuses), statuses
    hostile.wait_for_function("window.__posted >= 2")  # the blank frame, then the answer
    with team.client() as c:
        r = c.get(f"/v1/dashboard/teams/{team.name}/budgets")
        assert r.json()["budgets"] == []
    for member in ("lead", "worker", "reviewer"):
        with team.client(member) as c:
            got = c.get("/v1/inbox", params={"wait": 0}).json()["messages"]
        assert got == [], f"a message from elsewhere reached {member}"
    expect(page.locator("#timeline .row")).to_have_count(0)
