"""The page's JavaScript modules: each one served as JavaScript from the hub's own list,
every import resolving to one of them, none writing HTML, and the page loading them in
Chromium under its Content-Security-Policy without a console error."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import httpx
import pytest
from playwright.sync_api import ConsoleMessage, Page, Response

from backchannel.interfaces.dashboard import STATIC_DIR, static_assets
from tests.conftest import Server
from tests.dashboard.conftest import Team, sign_in

MODULES = sorted(name for name in static_assets() if name.endswith(".js"))
IMPORT = re.compile(r"""^import \{ ([^}]*) \} from "([^"]+)";$""", re.MULTILINE)
EXPORT = re.compile(r"^export (?:async function|function|const|let|class) ([\w$]+)", re.MULTILINE)


def test_every_module_is_served_as_javascript(hub_server: Server) -> None:
    assert "app.js" in MODULES
    assert len(MODULES) > 10, MODULES
    with httpx.Client(base_url=hub_server.url) as c:
        for name in MODULES:
            r = c.get(f"/static/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-type"] == "text/javascript; charset=utf-8", name
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["cache-control"] == "no-cache"
            assert r.text == (STATIC_DIR / name).read_text(encoding="utf-8")
            assert not re.search(r"https?://", r.text), f"{name} reaches beyond the hub"
            # the browser asks again on every load; an unchanged module costs a 304
            again = c.get(f"/static/{name}", headers={"If-None-Match": r.headers["etag"]})
            assert again.status_code == 304, name
            assert again.content == b""
        head = c.head("/static/app.js")
        assert head.status_code == 200
        assert head.headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize(
    "path",
    [
        "/static/",
        "/static/js",
        "/static/js/",
        "/static/index.html",  # the page is served at / with its CSP, nowhere else
        "/static/js/nothing.js",
        "/static/%2e%2e/dashboard.py",
        "/static/..%2fdashboard.py",
        "/static/js/%2e%2e/%2e%2e/http.py",
        "/static//etc/passwd",
        "/static/app.js.map",
    ],
)
def test_nothing_but_the_listed_assets_is_served(hub_server: Server, path: str) -> None:
    with httpx.Client(base_url=hub_server.url) as c:
        r = c.get(path)
    assert r.status_code == 404, (path, r.status_code)
    assert r.json()["error"]["code"] == "not_found"


def test_every_import_names_a_served_module_and_its_export() -> None:
    texts = {name: (STATIC_DIR / name).read_text(encoding="utf-8") for name in MODULES}
    for name, text in texts.items():
        assert text.count("\nimport ") == len(IMPORT.findall(text)), f"{name}: odd import"
        for names, spec in IMPORT.findall(text):
            assert spec.startswith("./"), f"{name} imports {spec!r}: only relative modules"
            target = (PurePosixPath(name).parent / spec).as_posix()
            while "/../" in f"/{target}":
                target = re.sub(r"(^|/)[^/]+/\.\./", r"\1", target, count=1)
            target = target.removeprefix("./")
            assert target in texts, f"{name} imports a missing {spec!r}"
            missing = {n.strip() for n in names.split(",")} - set(EXPORT.findall(texts[target]))
            assert not missing, f"{name} imports {missing} that {target} does not export"


def test_no_module_writes_html() -> None:
    """Hub data is untrusted text: it goes into the page as text nodes, never as markup."""
    sinks = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(")
    for name in MODULES:
        text = (STATIC_DIR / name).read_text(encoding="utf-8")
        assert not sinks.search(text), f"{name} writes HTML"


def test_the_page_loads_every_module_without_a_console_error(page: Page, team: Team) -> None:
    problems: list[str] = []
    loaded: dict[str, str] = {}

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type in ("error", "warning"):
            problems.append(f"{msg.type}: {msg.text}")

    def on_response(resp: Response) -> None:
        path = resp.url.removeprefix(team.server.url)
        if path.startswith("/static/"):
            loaded[path.removeprefix("/static/")] = resp.headers.get("content-type", "")
            if resp.status >= 400:
                problems.append(f"{path}: HTTP {resp.status}")

    page.on("console", on_console)
    page.on("response", on_response)
    sign_in(page, team.server, team.tokens["user"])
    assert sorted(k for k in loaded if k.endswith(".js")) == MODULES
    assert all(t.startswith("text/javascript") for k, t in loaded.items() if k.endswith(".js"))
    assert not problems, problems
