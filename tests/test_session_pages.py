"""``GET /v1/sessions`` a page at a time, over a real socket against ``backchannel serve``:
bounded by default, ``limit`` and ``after`` in the HTTP API, the SDK (a page, every one,
the pages themselves) and the command line, a session opened between two pages read in
its place, and a bad value refused by the parameter's name."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from backchannel.core.pages import MAX_PAGE, PAGE
from tests.conftest import Server
from tests.helpers_pages import check_sdk_pages
from tests.test_cli_conventions import run


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import start_server

    s = start_server(tmp_path_factory.mktemp("session-pages") / "home")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def team(srv: Server) -> tuple[dict[str, str], list[str]]:
    """Team ``pages``: ``a`` and ``b`` opened PAGE + 5 sessions between them, in turn."""
    tokens = srv.team("pages", "a", "b")
    ids = []
    with srv.client(tokens["a"]) as a, srv.client(tokens["b"]) as b:
        for i in range(PAGE + 5):
            c, name = (a, "a") if i % 2 == 0 else (b, "b")
            r = c.post("/v1/sessions", json={"session_id": f"{name}-{i:03d}"})
            assert r.status_code == 201, r.text
            ids.append(r.json()["session_id"])
    return tokens, ids


def _read_all(c: httpx.Client, limit: int, **params: str) -> list[str]:
    """Every session id, page after page of at most ``limit``."""
    seen: list[str] = []
    after = None
    while True:
        page = c.get(
            "/v1/sessions", params={"limit": limit, **params, **({"after": after} if after else {})}
        )
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["sessions"]) <= limit
        seen += [s["session_id"] for s in body["sessions"]]
        if body["next_after"] is None:
            return seen
        after = body["next_after"]


def test_the_list_is_bounded_and_read_page_by_page(
    srv: Server, team: tuple[dict[str, str], list[str]]
) -> None:
    tokens, ids = team
    with srv.client(tokens["a"]) as c:
        first = c.get("/v1/sessions").json()
        assert [s["session_id"] for s in first["sessions"]] == ids[:PAGE]
        assert first["next_after"] == ids[PAGE - 1]
        rest = c.get("/v1/sessions", params={"after": first["next_after"]}).json()
        assert [s["session_id"] for s in rest["sessions"]] == ids[PAGE:]
        assert rest["next_after"] is None
        assert _read_all(c, 7) == ids  # every one once, in the order opened
        mine = [i for i in ids if i.startswith("b-")]
        assert _read_all(c, 4, member="b") == mine


def test_a_session_opened_between_pages_is_read_once_and_none_is_skipped(srv: Server) -> None:
    tokens = srv.team("growing", "x")
    with srv.client(tokens["x"]) as c:
        opened = []
        for i in range(12):
            r = c.post("/v1/sessions", json={"session_id": f"x-{i:02d}"})
            assert r.status_code == 201, r.text
            opened.append(r.json()["session_id"])
        seen: list[str] = []
        after = None
        while True:
            params: dict[str, object] = {"limit": 5, **({"after": after} if after else {})}
            body = c.get("/v1/sessions", params=params).json()
            seen += [s["session_id"] for s in body["sessions"]]
            if body["next_after"] is None:
                break
            after = body["next_after"]
            # one opened while the list is being read (a resumed one changes nothing)
            r = c.post("/v1/sessions", json={"session_id": f"x-late-{len(seen)}"})
            assert r.status_code == 201, r.text
            opened.append(r.json()["session_id"])
            assert c.post("/v1/sessions", json={"session_id": "x-00"}).status_code == 201
        assert seen == opened, "every one once, in the order opened, the late ones too"


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "0"),
        ("limit", "-1"),
        ("limit", str(MAX_PAGE + 1)),
        ("limit", str(2**70)),
        ("limit", "ten"),
        ("after", ""),
        ("after", "no such session"),
        ("after", "never-opened"),
    ],
)
def test_a_bad_page_is_refused_by_name(
    srv: Server, team: tuple[dict[str, str], list[str]], param: str, value: str
) -> None:
    tokens, _ = team
    with srv.client(tokens["a"]) as c:
        r = c.get("/v1/sessions", params={param: value})
    assert r.status_code in (400, 422), r.text
    assert param in json.dumps(r.json()), r.text


async def test_the_sdk_reads_a_page_every_one_or_the_pages(
    srv: Server, team: tuple[dict[str, str], list[str]]
) -> None:
    from backchannel.client import connect

    tokens, ids = team
    async with connect(srv.url, tokens["a"]) as client:
        await check_sdk_pages(
            client.list_sessions,
            client.session_pages,
            "sessions",
            lambda s: s.session_id,
            ids,
            PAGE,
        )


def test_the_sync_sdk_reads_the_pages(srv: Server, team: tuple[dict[str, str], list[str]]) -> None:
    from backchannel.client import SyncClient

    tokens, ids = team
    with SyncClient(srv.url, tokens["b"]) as client:
        assert [s.session_id for s in client.list_sessions("a", limit=2)] == ids[0:4:2]
        seen = [s.session_id for p in client.session_pages() for s in p.sessions]
        assert seen == ids


def test_the_command_line_says_when_more_sessions_follow(
    srv: Server, team: tuple[dict[str, str], list[str]]
) -> None:
    """A page that is not the whole list says so on stderr, with the command that reads
    the next one; the last page says nothing more, and --all reads every one."""
    tokens, ids = team
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    first = run("session", "list", env=env)
    assert first.returncode == 0, first.stderr
    assert [line.split("\t")[0] for line in first.stdout.splitlines()] == ids[:PAGE]
    assert "more follow" in first.stderr
    assert f"--after {ids[PAGE - 1]}" in first.stderr and "--all" in first.stderr
    rest = run("session", "list", "--after", ids[PAGE - 1], env=env)
    assert rest.returncode == 0, rest.stderr
    assert [line.split("\t")[0] for line in rest.stdout.splitlines()] == ids[PAGE:]
    assert "more follow" not in rest.stderr
    every = run("session", "list", "--all", env=env)
    assert every.returncode == 0, every.stderr
    assert [line.split("\t")[0] for line in every.stdout.splitlines()] == ids
    assert "more follow" not in every.stderr
    page = run("session", "list", "--limit", "2", "--member", "b", "--json", env=env)
    assert page.returncode == 0, page.stderr
    assert [s["session_id"] for s in json.loads(page.stdout)] == ids[1:4:2]
    assert f"--after {ids[3]} --member b" in page.stderr
    exact = run("session", "list", "--limit", "5", "--after", ids[-6], env=env)
    assert exact.returncode == 0, exact.stderr
    assert len(exact.stdout.splitlines()) == 5 and "more follow" not in exact.stderr
    bad = run("session", "list", "--limit", "0", env=env)
    assert bad.returncode == 2 and "--limit" in bad.stderr


async def test_only_the_sessions_whose_turn_runs_when_asked(srv: Server) -> None:
    """``active_only``: the sessions whose turn runs now, paged as the rest, over HTTP,
    the SDK (the MCP server's ``check_inbox`` asks it of its member) and the command
    line (``--active``)."""
    from backchannel.client import connect

    tokens = srv.team("active-only", "a", "b")
    with srv.client(tokens["a"]) as a, srv.client(tokens["b"]) as b:
        for c, sid in ((a, "a-1"), (a, "a-2"), (a, "a-3"), (b, "b-1")):
            c.post("/v1/sessions", json={"session_id": sid}).raise_for_status()
        for c, sid in ((a, "a-1"), (a, "a-3"), (b, "b-1")):
            r = c.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"})
            r.raise_for_status()
        assert _read_all(a, 1, active_only="true") == ["a-1", "a-3", "b-1"]
        assert _read_all(a, 1, active_only="true", member="a") == ["a-1", "a-3"]
        assert _read_all(a, 10, active_only="false", member="a") == ["a-1", "a-2", "a-3"]
        r = a.get("/v1/sessions", params={"active_only": "maybe"})
        assert r.status_code == 422 and "active_only" in r.text, r.text
        a.post("/v1/sessions/a-1/events", json={"kind": "agent_stop"}).raise_for_status()
    async with connect(srv.url, tokens["b"]) as client:
        got = await client.list_sessions("a", active_only=True)
        assert [s.session_id for s in got] == ["a-3"]
        pages = [p async for p in client.session_pages(active_only=True, limit=5)]
        assert [s.session_id for p in pages for s in p.sessions] == ["a-3", "b-1"]
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    page = run("session", "list", "--active", "--limit", "1", env=env)
    assert page.returncode == 0, page.stderr
    assert [line.split("\t")[0] for line in page.stdout.splitlines()] == ["a-3"]
    assert "--after a-3 --active" in page.stderr


async def test_only_the_sessions_not_ended_when_asked(srv: Server) -> None:
    """``live_only``: the sessions not terminated, paged as the rest, over HTTP, the SDK
    (the runner looks for its members' sessions with it, five times a second) and the
    command line (``--live``)."""
    from backchannel.client import connect

    tokens = srv.team("live-only", "a", "b")
    with srv.client(tokens["a"]) as a, srv.client(tokens["b"]) as b:
        for c, sid in ((a, "a-1"), (a, "a-2"), (a, "a-3"), (b, "b-1"), (b, "b-2")):
            c.post("/v1/sessions", json={"session_id": sid}).raise_for_status()
        for c, sid in ((a, "a-2"), (b, "b-1")):
            c.post(f"/v1/sessions/{sid}/terminate", json={}).raise_for_status()
        assert _read_all(a, 1, live_only="true") == ["a-1", "a-3", "b-2"]
        assert _read_all(a, 1, live_only="true", member="a") == ["a-1", "a-3"]
        assert _read_all(a, 10, live_only="false", member="a") == ["a-1", "a-2", "a-3"]
        r = a.get("/v1/sessions", params={"live_only": "maybe"})
        assert r.status_code == 422 and "live_only" in r.text, r.text
    async with connect(srv.url, tokens["b"]) as client:
        got = await client.list_sessions("a", live_only=True)
        assert [s.session_id for s in got] == ["a-1", "a-3"]
        pages = [p async for p in client.session_pages(live_only=True, limit=5)]
        assert [s.session_id for p in pages for s in p.sessions] == ["a-1", "a-3", "b-2"]
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    page = run("session", "list", "--live", "--member", "a", "--limit", "1", env=env)
    assert page.returncode == 0, page.stderr
    assert [line.split("\t")[0] for line in page.stdout.splitlines()] == ["a-1"]
    assert "--after a-1 --member a --live" in page.stderr
