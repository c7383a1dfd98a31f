"""``GET /v1/teams`` and ``GET /v1/teams/{team}/budgets`` a page at a time: bounded by
default, ``limit`` and ``after`` (a team or budget made between two pages read in its
place, none twice or skipped) on the memory, SQLite and PostgreSQL stores through the
SDK in-process, and over a real socket against ``backchannel serve`` for the HTTP API's
refusals, the SDK and the command line."""

from __future__ import annotations

import functools
import itertools
import json
import shlex
from collections.abc import Callable, Iterator

import pytest

from backchannel.client import attach
from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.hub import Hub
from backchannel.stores.base import Store
from tests.conftest import Server
from tests.helpers_pages import check_sdk_pages
from tests.test_cli_conventions import run

#: 16 members: 120 pairs, each a used budget once one of them sends to the other
MEMBERS = [f"m{i:02d}" for i in range(16)]


async def _exchange(hub: Hub, team: str, pairs: list[tuple[str, str]]) -> None:
    for a, b in pairs:
        await hub.send(team, a, b, f"{a} to {b}", link=False)


def _pairs(pairs: list[tuple[str, str]]) -> list[str]:
    return sorted(f"pair:{a}|{b}" for a, b in pairs)


async def test_teams_are_read_page_by_page_on_every_store(
    make_store: Callable[[], Store],
) -> None:
    async with Hub(make_store(), background=False) as hub:
        names = [f"t{i:03d}" for i in range(0, 2 * (PAGE + 5), 2)]
        for name in names:
            await hub.create_team(name)
        async with attach(hub) as admin:
            first = [p async for p in admin.team_pages(limit=PAGE)]
            assert [t.name for t in first[0].teams] == names[:PAGE]
            assert first[0].next_after == names[PAGE - 1]
            # three teams made while the list is read: each is read in its place
            seen: list[str] = []
            after = None
            late = iter(["t001", "t051", "t999"])
            while True:
                (page,) = [p async for p in admin.team_pages(after=after, limit=7)]
                assert len(page.teams) <= 7
                seen += [t.name for t in page.teams]
                if page.next_after is None:
                    break
                after = page.next_after
                name = next(late, None)
                if name is not None:
                    await hub.create_team(name)
                    names.append(name)
            assert seen == sorted(set(names) - {"t001"}), "each once, the late ones in place"
            assert [t.name for t in await admin.teams()] == sorted(names)
            await check_sdk_pages(
                admin.teams, admin.team_pages, "teams", lambda t: t.name, sorted(names), PAGE
            )


async def test_budgets_are_read_page_by_page_on_every_store(
    make_store: Callable[[], Store],
) -> None:
    async with Hub(make_store(), background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        for m in MEMBERS:
            await hub.add_member("t", m)
        _, other = await hub.create_team("other")
        pairs = list(itertools.combinations(MEMBERS, 2))
        assert len(pairs) > PAGE
        await _exchange(hub, "t", pairs[:-3])
        async with attach(hub) as admin:
            pair_keys = _pairs(pairs[:-3])
            every = [b.key for b in await admin.budgets("t")]
            assert [k for k in every if k.startswith("pair:")] == pair_keys
            assert not [k for k in every if not k.startswith(("pair:", "chain:"))]
            first = [p async for p in admin.budget_pages("t", limit=PAGE)]
            assert [b.key for b in first[0].budgets] == every[:PAGE]
            assert first[0].next_after == every[PAGE - 1]
            # three pairs talk while the list is read: each is read in its place
            seen: list[str] = []
            after = None
            late = iter(pairs[-3:])
            while True:
                (page,) = [p async for p in admin.budget_pages("t", after=after, limit=9)]
                assert len(page.budgets) <= 9
                seen += [b.key for b in page.budgets]
                if page.next_after is None:
                    break
                after = page.next_after
                pair = next(late, None)
                if pair is not None:
                    await _exchange(hub, "t", [pair])
            assert sorted(set(seen)) == seen, "each once, in key order"
            assert [k for k in seen if k.startswith("pair:")] == _pairs(pairs)
            every = [b.key for b in await admin.budgets("t")]
            await check_sdk_pages(
                functools.partial(admin.budgets, "t"),
                functools.partial(admin.budget_pages, "t"),
                "budgets",
                lambda b: b.key,
                every,
                PAGE,
            )
        async with attach(hub, other) as c:  # another team's human sees none of them
            assert await c.budgets() == []


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import start_server

    s = start_server(tmp_path_factory.mktemp("team-pages") / "home")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def teams(srv: Server) -> dict[str, str]:
    """Teams ``pa`` to ``pf``; in ``pa``, a, b, c and d have each sent to the others."""
    tokens = srv.team("pa", "a", "b", "c", "d")
    for name in ("pb", "pc", "pd", "pe", "pf"):
        srv.team(name)
    for x, y in itertools.combinations("abcd", 2):
        with srv.client(tokens[x]) as c:
            r = c.post("/v1/messages", json={"to": y, "text": "hi", "link": False})
            assert r.status_code in (200, 201, 202), r.text
    return tokens


def _read_all(srv: Server, path: str, items: str, key: str, limit: int) -> list[str]:
    seen: list[str] = []
    after = None
    with srv.client() as c:
        while True:
            params: dict[str, object] = {"limit": limit, **({"after": after} if after else {})}
            r = c.get(path, params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body[items]) <= limit
            seen += [x[key] for x in body[items]]
            if body["next_after"] is None:
                return seen
            after = body["next_after"]


def test_the_http_lists_are_paged(srv: Server, teams: dict[str, str]) -> None:
    names = ["pa", "pb", "pc", "pd", "pe", "pf"]
    with srv.client() as c:
        every = [t["name"] for t in c.get("/v1/teams").json()["teams"]]
    assert [n for n in every if n in names] == names
    assert _read_all(srv, "/v1/teams", "teams", "name", 4) == every
    keys = _read_all(srv, "/v1/teams/pa/budgets", "budgets", "key", 2)
    assert [k for k in keys if k.startswith("pair:")] == _pairs(
        list(itertools.combinations("abcd", 2))
    )
    with srv.client(teams["a"]) as c:  # a member sees its own team, and its budgets
        assert c.get("/v1/teams").json() == {"teams": [{"name": "pa"}], "next_after": None}
        assert c.get("/v1/teams", params={"after": "pa"}).json()["teams"] == []
        page = c.get("/v1/teams/pa/budgets", params={"limit": 2}).json()
        assert [b["key"] for b in page["budgets"]] == keys[:2]
        assert page["next_after"] == keys[1]


@pytest.mark.parametrize("path", ["/v1/teams", "/v1/teams/pa/budgets"])
@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "0"),
        ("limit", "-1"),
        ("limit", str(MAX_PAGE + 1)),
        ("limit", str(2**70)),
        ("limit", "ten"),
        ("after", ""),
    ],
)
def test_a_bad_page_is_refused_by_name(
    srv: Server, teams: dict[str, str], path: str, param: str, value: str
) -> None:
    with srv.client() as c:
        r = c.get(path, params={param: value})
    assert r.status_code in (400, 422), r.text
    assert param in json.dumps(r.json()), r.text


def test_the_page_size_is_in_the_openapi_schema(srv: Server) -> None:
    with srv.client() as c:
        spec = c.get("/openapi.json").json()
    for path in ("/v1/teams", "/v1/teams/{team}/budgets"):
        params = {p["name"]: p for p in spec["paths"][path]["get"]["parameters"]}
        assert params["limit"]["schema"]["default"] == PAGE
        assert params["limit"]["schema"]["maximum"] == MAX_PAGE
        assert "after" in params


def test_the_sync_sdk_reads_the_pages(srv: Server, teams: dict[str, str]) -> None:
    from backchannel.client import SyncClient

    with SyncClient(srv.url, srv.admin_token) as c:
        every = [t.name for t in c.teams()]
        assert [t.name for p in c.team_pages(limit=3) for t in p.teams] == every[:3]
        keys = [b.key for b in c.budgets("pa")]
        assert [b.key for p in c.budget_pages("pa") for b in p.budgets] == keys
        assert [b.key for b in c.budgets("pa", after=keys[0], limit=2)] == keys[1:3]


def test_the_command_line_says_when_more_follow(srv: Server, teams: dict[str, str]) -> None:
    with srv.client() as c:
        every = [t["name"] for t in c.get("/v1/teams").json()["teams"]]
        keys = [b["key"] for b in c.get("/v1/teams/pa/budgets").json()["budgets"]]
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": srv.admin_token}
    first = run("team", "list", "--limit", "2", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == every[:2]
    assert f"more follow: backchannel team list --after {every[1]}" in first.stderr
    rest = run("team", "list", "--after", every[1], "--json", env=env)
    assert [t["name"] for t in json.loads(rest.stdout)] == every[2:]
    assert "more follow" not in rest.stderr

    env_user = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": teams["user"]}
    first = run("budget", "list", "pa", "--limit", "3", env=env_user)
    assert first.returncode == 0, first.stderr
    assert [line.split("\t")[0] for line in first.stdout.splitlines()] == keys[:3]
    again = f"backchannel budget list pa --after {shlex.quote(keys[2])}"
    assert f"more follow: {again}" in first.stderr
    (argv,) = [line for line in first.stderr.splitlines() if "more follow" in line]
    cmd = shlex.split(argv.split("more follow: ")[1].split(" (or --all")[0])
    rest = run(*cmd[1:], "--json", env=env_user)
    assert rest.returncode == 0, rest.stderr
    assert [b["key"] for b in json.loads(rest.stdout)] == keys[3:]
    every_one = run("budget", "list", "pa", "--all", env=env_user)
    assert [line.split("\t")[0] for line in every_one.stdout.splitlines()] == keys
    bad = run("budget", "list", "pa", "--limit", "0", env=env_user)
    assert bad.returncode == 2 and "--limit" in bad.stderr
