"""``GET /v1/links`` a page at a time: bounded by default, ``limit`` and ``after`` (a
link opened between two pages read in its place, none twice or skipped) on the memory,
SQLite and PostgreSQL stores through the SDK in-process, and over a real socket against
``backchannel serve`` for the HTTP API's refusals and the command line."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator

import pytest

from backchannel.client import attach
from backchannel.core.pages import MAX_PAGE, PAGE
from backchannel.hub import Hub
from backchannel.stores.base import Store
from tests.conftest import Server
from tests.test_cli_conventions import run

#: 16 members: 120 pairs, each a link once one of them sends to the other
MEMBERS = [f"m{i:02d}" for i in range(16)]


async def _open_links(hub: Hub, team: str, pairs: list[tuple[str, str]]) -> list[str]:
    """A linked send for each pair (its first member to its second); the link ids in the
    order they opened."""
    ids = []
    for a, b in pairs:
        await hub.send(team, a, b, f"{a} to {b}", sender_session=f"{a}-s")
        found = await hub.list_links(team, member=a)
        (link,) = [x for x in found if {x.initiator, x.responder} == {a, b}]
        ids.append(link.link_id)
    return ids


async def test_links_are_read_page_by_page_on_every_store(
    make_store: Callable[[], Store],
) -> None:
    async with Hub(make_store(), background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        tokens = {}
        for m in MEMBERS:
            _, tokens[m] = await hub.add_member("t", m)
            await hub.open_session("t", m, f"{m}-s")
            await hub.report_event("t", m, f"{m}-s", "turn_start")  # a send opens a link
        pairs = list(itertools.combinations(MEMBERS, 2))
        assert len(pairs) > PAGE
        ids = await _open_links(hub, "t", pairs[:-3])
        async with attach(hub, tokens["m00"]) as c:
            first = [p async for p in c.link_pages(limit=PAGE)]
            assert [x.link_id for x in first[0].links] == ids[:PAGE]
            assert first[0].next_after == ids[PAGE - 1]
            # three links open while the list is read: each is read in its place
            seen, after = [], None
            late = iter(pairs[-3:])
            while True:
                (page,) = [p async for p in c.link_pages(after=after, limit=7)]
                assert len(page.links) <= 7
                seen += [x.link_id for x in page.links]
                if page.next_after is None:
                    break
                after = page.next_after
                pair = next(late, None)
                if pair is not None:
                    ids += await _open_links(hub, "t", [pair])
            assert seen == ids, "every link once, in the order they opened"
            assert [x.link_id for x in await c.links()] == ids  # every page
            mine = [i for i, (a, b) in zip(ids, pairs, strict=True) if "m03" in (a, b)]
            assert len(mine) == len(MEMBERS) - 1
            got = [
                x.link_id
                for p in [p async for p in c.link_pages(member="m03", limit=4)]
                for x in p.links
            ]
            assert got == mine[:4]
            assert [x.link_id for x in await c.links(member="m03", after=mine[1])] == mine[2:]
            assert [x.link_id for x in await c.links(open_only=True, limit=3)] == ids[:3]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import start_server

    s = start_server(tmp_path_factory.mktemp("link-pages") / "home")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def team(srv: Server) -> tuple[dict[str, str], list[str]]:
    """Team ``links``: a, b, c and d each linked to the others (six links)."""
    names = ["a", "b", "c", "d"]
    tokens = srv.team("links", *names)
    with srv.client() as admin:
        admin.patch("/v1/teams/links", json={"settings": {"anchor_policy": "off"}})
    ids = []
    for x, y in itertools.combinations(names, 2):
        with srv.client(tokens[x]) as c:
            c.post("/v1/sessions", json={"session_id": f"{x}-s"}).raise_for_status()
            c.post(f"/v1/sessions/{x}-s/events", json={"kind": "turn_start"}).raise_for_status()
            r = c.post("/v1/messages", json={"to": y, "text": "hi", "from_session": f"{x}-s"})
            assert r.status_code in (200, 201, 202), r.text
            found = c.get("/v1/links", params={"member": x}).json()["links"]
            ids += [k["link_id"] for k in found if y in (k["initiator"], k["responder"])]
    assert len(ids) == 6, ids
    return tokens, ids


def test_the_http_list_is_paged(srv: Server, team: tuple[dict[str, str], list[str]]) -> None:
    tokens, ids = team
    with srv.client(tokens["a"]) as c:
        first = c.get("/v1/links", params={"limit": 4}).json()
        assert [k["link_id"] for k in first["links"]] == ids[:4]
        assert first["next_after"] == ids[3]
        rest = c.get("/v1/links", params={"limit": 4, "after": ids[3]}).json()
        assert [k["link_id"] for k in rest["links"]] == ids[4:]
        assert rest["next_after"] is None
        whole = c.get("/v1/links").json()
        assert [k["link_id"] for k in whole["links"]] == ids and whole["next_after"] is None


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "0"),
        ("limit", str(MAX_PAGE + 1)),
        ("limit", "ten"),
        ("after", ""),
        ("after", "no such link"),
        ("after", "lnk_never"),
    ],
)
def test_a_bad_page_is_refused_by_name(
    srv: Server, team: tuple[dict[str, str], list[str]], param: str, value: str
) -> None:
    tokens, _ = team
    with srv.client(tokens["a"]) as c:
        r = c.get("/v1/links", params={param: value})
    assert r.status_code in (400, 422), r.text
    assert param in json.dumps(r.json()), r.text


def test_the_command_line_says_when_more_links_follow(
    srv: Server, team: tuple[dict[str, str], list[str]]
) -> None:
    tokens, ids = team
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    first = run("links", "--limit", "4", env=env)
    assert first.returncode == 0, first.stderr
    assert [line.split()[0] for line in first.stdout.splitlines()] == ids[:4]
    assert f"more follow: backchannel links --after {ids[3]}" in first.stderr
    assert "--all" in first.stderr
    rest = run("links", "--limit", "4", "--after", ids[3], "--json", env=env)
    assert rest.returncode == 0, rest.stderr
    assert [k["link_id"] for k in json.loads(rest.stdout)] == ids[4:]
    assert "more follow" not in rest.stderr
    every = run("links", "--all", "--open", env=env)
    assert [line.split()[0] for line in every.stdout.splitlines()] == ids
    assert "more follow" not in every.stderr
    bad = run("links", "--limit", "0", env=env)
    assert bad.returncode == 2 and "--limit" in bad.stderr
