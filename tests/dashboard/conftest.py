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
from typing import Literal

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

    def make(color_scheme: Literal["light", "dark"] = "light") -> Page:
        ctx = browser.new_context(
            viewport={"width": 1440, "height": 900}, color_scheme=color_scheme
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

    def receive(self, member: str, lease: float | None = None) -> list[dict[str, object]]:
        params: dict[str, float] = {"wait": 5}
        if lease is not None:
            params["lease"] = lease
        with self.client(member) as c:
            r = c.get("/v1/inbox", params=params)
            r.raise_for_status()
            return list(r.json()["messages"])

    def ack(self, member: str, *ids: str) -> None:
        with self.client(member) as c:
            c.post("/v1/inbox/ack", json={"message_ids": list(ids)}).raise_for_status()

    def report(
        self, member: str, session_id: str, kind: str, text: str = "", **data: object
    ) -> bool:
        """Report a runtime event to a session; False while the hub has no such endpoint."""
        with self.client(member) as c:
            r = c.post(
                f"/v1/sessions/{session_id}/events", json={"kind": kind, "text": text, "data": data}
            )
            if r.status_code in (404, 405) and r.json()["error"]["code"] == "not_found":
                return False
            r.raise_for_status()
            return True

    def open_session(self, member: str, session_id: str | None = None) -> str:
        with self.client(member) as c:
            r = c.post("/v1/sessions", json={"session_id": session_id})
            r.raise_for_status()
            return str(r.json()["session_id"])


@pytest.fixture
def team(hub_server: Server) -> Team:
    name = f"team{next(_teams)}"
    tokens = hub_server.team(name, "lead", "worker", "reviewer")
    return Team(hub_server, name, tokens)


def sign_in(page: Page, server: Server, token: str) -> None:
    """Open the dashboard, sign in with ``token`` and wait until the stream is live."""
    page.goto(server.url + "/")
    page.locator("#token-input").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")


def screenshot(page: Page, name: str, tmp_path: Path) -> Path:
    """Take ``name``.png; copy it into docs/screenshots when missing or asked to."""
    shot = tmp_path / f"{name}.png"
    page.screenshot(path=str(shot), animations="disabled")
    assert shot.stat().st_size > 1000
    target = SCREENSHOTS / shot.name
    if os.environ.get("BACKCHANNEL_SCREENSHOTS") == "update" or not target.exists():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
    return shot
