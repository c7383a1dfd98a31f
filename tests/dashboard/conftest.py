"""Fixtures for the dashboard tests: a real ``backchannel serve`` and Debian's headless
Chromium driven by Playwright's sync API (never a browser that Playwright downloads).

Screenshots of the main views are taken on every run (into the test's temporary
directory); they are copied to ``docs/screenshots/`` when a file there is missing or when
``BACKCHANNEL_SCREENSHOTS=update``, so ordinary runs leave the work tree clean.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.conftest import Server, start_server

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

_teams = itertools.count(1)


@pytest.fixture(scope="package")
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the dashboard tests. One attempt per message, so a copy leased and
    never acked is a dead letter as soon as its (short) lease runs out."""
    srv = start_server(tmp_path_factory.mktemp("dashboard") / "home", None, "--max-attempts", "1")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.is_file():
        pytest.fail(
            f"the dashboard tests drive Debian's Chromium at {CHROMIUM}; install it with "
            "`apt-get install -y chromium` (scripts/setup-system.sh does)",
            pytrace=False,
        )
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def new_page(browser: Browser) -> Iterator[Callable[..., Page]]:
    """A factory of pages, each in its own browser context (own sessionStorage). A test
    fails if a script on its pages throws."""
    contexts = []
    errors: list[str] = []

    def make(color_scheme: Literal["light", "dark"] = "light", height: int = 900) -> Page:
        ctx = browser.new_context(
            viewport={"width": 1440, "height": height}, color_scheme=color_scheme
        )
        ctx.set_default_timeout(10_000)
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("pageerror", lambda exc: errors.append(f"{exc.name}: {exc.message}"))
        return page

    try:
        yield make
    finally:
        for ctx in contexts:
            ctx.close()
    assert not errors, f"the page's script failed: {errors}"


@pytest.fixture
def page(new_page: Callable[..., Page]) -> Page:
    return new_page()


@dataclass
class Team:
    """A fresh team on the shared server, with tokens for each member."""

    server: Server
    name: str
    tokens: dict[str, str]

    def client(self, member: str | None = None) -> httpx.Client:
        return self.server.client(self.tokens[member] if member else None)

    def send(self, sender: str, to: str, text: str, **extra: object) -> str:
        with self.client(sender) as c:
            r = c.post("/v1/messages", json={"to": to, "text": text, **extra})
            r.raise_for_status()
            return str(r.json()["message_id"])

    def flood(self, sender: str, messages: int, prefix: str = "flood") -> list[str]:
        """Broadcast ``messages`` messages from ``sender`` in batches (each a ``queued``
        event for every other member but ``user``): a long history, quickly. Their ids."""
        ids: list[str] = []
        with self.client(sender) as c:
            for start in range(0, messages, 1000):
                items = [
                    {"to": "*", "text": f"{prefix} {i}", "summary": f"{prefix} {i}"}
                    for i in range(start, min(start + 1000, messages))
                ]
                r = c.post("/v1/messages/batch", json={"messages": items}, timeout=120)
                r.raise_for_status()
                results = r.json()["results"]
                assert all(x["sent"] for x in results), [x for x in results if not x["sent"]][:3]
                ids += [str(x["sent"]["message_id"]) for x in results]
        return ids

    def receive(
        self, member: str, lease: float | None = None, session: str | None = None
    ) -> list[dict[str, object]]:
        params: dict[str, float | str] = {"wait": 5, "limit": 100}
        if lease is not None:
            params["lease"] = lease
        if session is not None:
            params["session"] = session
        with self.client(member) as c:
            r = c.get("/v1/inbox", params=params)
            r.raise_for_status()
            return list(r.json()["messages"])

    def ack(self, member: str, *ids: str) -> None:
        with self.client(member) as c:
            c.post("/v1/inbox/ack", json={"message_ids": list(ids)}).raise_for_status()

    def drain(self, member: str, session: str) -> None:
        """Take and acknowledge whatever waits for ``session``, as its runtime would."""
        with self.client(member) as c:
            got = c.get("/v1/inbox", params={"session": session, "limit": 100}).json()
            ids = [m["message_id"] for m in got["messages"]]
            if ids:
                c.post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()

    def post(self, member: str, path: str, **body: object) -> dict[str, Any]:
        """POST ``body`` as ``member``; the answer's JSON."""
        with self.client(member) as c:
            r = c.post(path, json=body)
            assert r.is_success, f"POST {path}: {r.status_code} {r.text}"
            return dict(r.json())

    def report(
        self, member: str, session_id: str, kind: str, text: str = "", **data: object
    ) -> dict[str, Any]:
        """Report a runtime event (``turn_start``, ``thought``, ``agent_stop``, ...)."""
        return self.post(
            member, f"/v1/sessions/{session_id}/events", kind=kind, text=text, data=data
        )

    def turn(self, member: str, session_id: str, closing: str) -> dict[str, Any]:
        """A whole turn that only ends with ``closing`` (its output crosses any link)."""
        self.report(member, session_id, "turn_start")
        return self.report(member, session_id, "agent_stop", closing)

    def open_session(self, member: str, session_id: str | None = None) -> str:
        return str(self.post(member, "/v1/sessions", session_id=session_id)["session_id"])


@pytest.fixture
def make_team(hub_server: Server) -> Callable[..., Team]:
    """A factory of fresh teams on the shared server: ``make_team("a", "b",
    settings={"anchor_policy": "off"})``; tokens for the members and ``user``."""

    def make(*members: str, settings: dict[str, object] | None = None) -> Team:
        name = f"team{next(_teams)}"
        with hub_server.client() as c:
            r = c.post("/v1/teams", json={"name": name, "settings": settings or {}})
            r.raise_for_status()
            tokens = {"user": str(r.json()["user_token"])}
            for m in members:
                r = c.post(f"/v1/teams/{name}/members", json={"name": m})
                r.raise_for_status()
                tokens[m] = str(r.json()["token"])
        return Team(hub_server, name, tokens)

    return make


@pytest.fixture
def team(make_team: Callable[..., Team]) -> Team:
    return make_team("lead", "worker", "reviewer")


def sign_in(page: Page, server: Server, token: str) -> None:
    """Open the dashboard, sign in with ``token`` and wait until the stream is live."""
    page.goto(server.url + "/")
    page.locator("#token-input").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")


def screenshot(page: Page, name: str, tmp_path: Path) -> Path:
    """Take ``name``.png; copy it into docs/screenshots when missing or asked to."""
    shot = tmp_path / f"{name}.png"
    page.mouse.move(0, 0)  # no hover highlight where the last click was
    page.screenshot(path=str(shot), animations="disabled")
    assert shot.stat().st_size > 1000
    target = SCREENSHOTS / shot.name
    if os.environ.get("BACKCHANNEL_SCREENSHOTS") == "update" or not target.exists():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
    return shot
