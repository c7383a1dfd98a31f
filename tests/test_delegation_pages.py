"""``GET /v1/delegations`` a page at a time, over a real socket against ``backchannel
serve``: bounded by default, ``limit`` and ``after`` in the HTTP API and the SDK (a page,
every one, the pages themselves), a member's from both sides, a delegation made between
two pages read in its place, and a bad value refused by the parameter's name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backchannel.core.pages import MAX_PAGE, PAGE
from tests.conftest import Server
from tests.helpers_pages import check_sdk_pages

N = PAGE + 5


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import start_server

    s = start_server(tmp_path_factory.mktemp("delegation-pages") / "home")
    yield s
    s.stop()


def _open_turn(c: httpx.Client, session: str) -> None:
    r = c.post("/v1/sessions", json={"session_id": session})
    assert r.status_code == 201, r.text
    r = c.post(f"/v1/sessions/{session}/events", json={"kind": "turn_start", "text": "go"})
    assert r.status_code < 300, r.text


def _delegate(c: httpx.Client, session: str, to: str, n: int) -> dict[str, Any]:
    r = c.post("/v1/delegations", json={"to": to, "task": f"task {n}", "session": session})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def _in_order(made: list[dict[str, Any]]) -> list[str]:
    return [
        d["delegation_id"]
        for d in sorted(made, key=lambda d: (d["created_at"], d["delegation_id"]))
    ]


@pytest.fixture(scope="module")
def team(srv: Server) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Team ``dpages``: ``a`` asked ``b`` and ``c`` N times between them, ``c`` asked ``a``
    twice."""
    tokens = srv.team("dpages", "a", "b", "c")
    made = []
    with srv.client(tokens["a"]) as a, srv.client(tokens["c"]) as c:
        _open_turn(a, "a-s")
        _open_turn(c, "c-s")
        for i in range(N):
            made.append(_delegate(a, "a-s", "b" if i % 2 == 0 else "c", i))
        made += [_delegate(c, "c-s", "a", i) for i in range(2)]
    return tokens, made


def _read_all(c: httpx.Client, limit: int, **params: str) -> list[str]:
    """Every delegation id, page after page of at most ``limit``."""
    seen: list[str] = []
    after = None
    while True:
        page = c.get(
            "/v1/delegations",
            params={"limit": limit, **params, **({"after": after} if after else {})},
        )
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["delegations"]) <= limit
        seen += [d["delegation_id"] for d in body["delegations"]]
        if body["next_after"] is None:
            return seen
        after = body["next_after"]


def test_the_list_is_bounded_and_read_page_by_page(
    srv: Server, team: tuple[dict[str, str], list[dict[str, Any]]]
) -> None:
    tokens, made = team
    ids = _in_order(made)
    with srv.client(tokens["a"]) as c:
        first = c.get("/v1/delegations").json()
        assert [d["delegation_id"] for d in first["delegations"]] == ids[:PAGE]
        assert first["next_after"] == ids[PAGE - 1]
        rest = c.get("/v1/delegations", params={"after": first["next_after"]}).json()
        assert [d["delegation_id"] for d in rest["delegations"]] == ids[PAGE:]
        assert rest["next_after"] is None
        assert _read_all(c, 7) == ids  # every one once, in the order made, both sides
        with_c = _in_order([d for d in made if "c" in (d["caller"], d["callee"])])
        assert _read_all(c, 4, member="c") == with_c
    with srv.client(tokens["c"]) as c:
        assert _read_all(c, 5) == with_c  # a member sees only its own
        assert _read_all(c, 5, member="b") == []
        not_mine = next(d for d in made if d["callee"] == "b")["delegation_id"]
        r = c.get("/v1/delegations", params={"after": not_mine})
        assert r.status_code == 422 and "after" in r.text, r.text
    with srv.client(tokens["user"]) as c:
        assert _read_all(c, 9) == ids  # the team's human sees every one
        assert _read_all(c, 3, member="b") == _in_order([d for d in made if d["callee"] == "b"])


def test_a_delegation_made_between_pages_is_read_once_and_none_is_skipped(
    srv: Server,
) -> None:
    tokens = srv.team("dgrowing", "x", "y")
    with srv.client(tokens["x"]) as c:
        _open_turn(c, "x-s")
        made = [_delegate(c, "x-s", "y", i) for i in range(12)]
        seen: list[str] = []
        after = None
        while True:
            params: dict[str, object] = {"limit": 5, **({"after": after} if after else {})}
            body = c.get("/v1/delegations", params=params).json()
            seen += [d["delegation_id"] for d in body["delegations"]]
            if body["next_after"] is None:
                break
            after = body["next_after"]
            made.append(_delegate(c, "x-s", "y", len(made)))  # made while the list is read
        assert seen == _in_order(made), "every one once, in the order made, the late ones too"


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "0"),
        ("limit", "-1"),
        ("limit", str(MAX_PAGE + 1)),
        ("limit", str(2**70)),
        ("limit", "ten"),
        ("after", ""),
        ("after", "no such delegation"),
        ("after", "dlg_never"),
    ],
)
def test_a_bad_page_is_refused_by_name(
    srv: Server, team: tuple[dict[str, str], list[dict[str, Any]]], param: str, value: str
) -> None:
    tokens, _ = team
    with srv.client(tokens["a"]) as c:
        r = c.get("/v1/delegations", params={param: value})
    assert r.status_code in (400, 422), r.text
    assert param in json.dumps(r.json()), r.text


def test_the_page_size_is_in_the_openapi_schema(srv: Server) -> None:
    with srv.client() as c:
        spec = c.get("/openapi.json").json()
    params = {p["name"]: p for p in spec["paths"]["/v1/delegations"]["get"]["parameters"]}
    assert params["limit"]["schema"]["default"] == PAGE
    assert params["limit"]["schema"]["maximum"] == MAX_PAGE
    assert "after" in params


async def test_the_sdk_reads_a_page_every_one_or_the_pages(
    srv: Server, team: tuple[dict[str, str], list[dict[str, Any]]]
) -> None:
    from backchannel.client import connect

    tokens, made = team
    ids = _in_order(made)
    async with connect(srv.url, tokens["a"]) as client:
        await check_sdk_pages(
            client.delegations,
            client.delegation_pages,
            "delegations",
            lambda d: d.delegation_id,
            ids,
            PAGE,
        )


def test_the_sync_sdk_reads_the_pages(
    srv: Server, team: tuple[dict[str, str], list[dict[str, Any]]]
) -> None:
    from backchannel.client import SyncClient

    tokens, made = team
    ids = _in_order(made)
    with SyncClient(srv.url, tokens["user"]) as client:
        assert [d.delegation_id for d in client.delegations(limit=2)] == ids[:2]
        seen = [d.delegation_id for p in client.delegation_pages() for d in p.delegations]
        assert seen == ids


def test_the_command_line_lists_them_a_page_at_a_time(
    srv: Server, team: tuple[dict[str, Any], list[dict[str, Any]]]
) -> None:
    from tests.test_cli_conventions import run

    tokens, made = team
    ids = _in_order(made)
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    first = run("delegations", "--limit", "4", env=env)
    assert first.returncode == 0, first.stderr
    rows = [line.split("\t") for line in first.stdout.splitlines()]
    assert [r[0] for r in rows] == ids[:4]
    by_id = {d["delegation_id"]: d for d in made}
    assert rows[0][1:3] == [f"a -> {by_id[ids[0]]['callee']}", "pending"]
    assert f"more follow: backchannel delegations --after {ids[3]}" in first.stderr
    assert "--all" in first.stderr
    rest = run("delegations", "--after", ids[3], "--all", "--json", env=env)
    assert rest.returncode == 0, rest.stderr
    assert [d["delegation_id"] for d in json.loads(rest.stdout)] == ids[4:]
    assert "more follow" not in rest.stderr
    with_c = _in_order([d for d in made if "c" in (d["caller"], d["callee"])])
    some = run("delegations", "--member", "c", "--limit", "2", "--json", env=env)
    assert [d["delegation_id"] for d in json.loads(some.stdout)] == with_c[:2]
    assert f"backchannel delegations --after {with_c[1]} --member c" in some.stderr
    env_b = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["b"]}
    none = run("delegations", "--member", "c", "--json", env=env_b)
    assert none.returncode == 0 and json.loads(none.stdout) == [], none.stderr
    bad = run("delegations", "--limit", "0", env=env)
    assert bad.returncode == 2 and "--limit" in bad.stderr
    gone = run("delegations", "--after", "dlg_never", env=env)
    assert gone.returncode == 1 and "after" in gone.stderr
