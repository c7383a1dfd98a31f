"""``GET /v1/teams/{team}/members`` a page at a time, over a real socket against
``backchannel serve``: bounded by default, ``limit`` and ``after`` in the HTTP API (for a
member and for the admin), the SDK (a page, every one, the pages themselves), the command
line and the runner's ``list_members`` tool; a member added between two pages read in its
place, and a bad value refused by the parameter's name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backchannel.core.pages import MAX_PAGE, PAGE
from tests.conftest import Server
from tests.helpers_pages import check_sdk_pages
from tests.test_cli_conventions import run

N = PAGE + 5


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import start_server

    s = start_server(tmp_path_factory.mktemp("member-pages") / "home")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def team(srv: Server) -> tuple[dict[str, str], list[str]]:
    """Team ``mpages``: N members and its human, every name in order."""
    names = [f"m{i:03d}" for i in range(N)]
    tokens = srv.team("mpages", *names)
    return tokens, sorted([*names, "user"])


def _read_all(c: httpx.Client, team: str, limit: int) -> list[str]:
    """Every member name, page after page of at most ``limit``."""
    seen: list[str] = []
    after = None
    while True:
        page = c.get(
            f"/v1/teams/{team}/members",
            params={"limit": limit, **({"after": after} if after else {})},
        )
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["members"]) <= limit
        seen += [m["name"] for m in body["members"]]
        if body["next_after"] is None:
            return seen
        after = body["next_after"]


def test_the_list_is_bounded_and_read_page_by_page(
    srv: Server, team: tuple[dict[str, str], list[str]]
) -> None:
    tokens, names = team
    for token in (tokens["m000"], None):  # a member, and the admin
        with srv.client(token) as c:
            first = c.get("/v1/teams/mpages/members").json()
            assert [m["name"] for m in first["members"]] == names[:PAGE]
            assert first["next_after"] == names[PAGE - 1]
            rest = c.get("/v1/teams/mpages/members", params={"after": first["next_after"]})
            assert [m["name"] for m in rest.json()["members"]] == names[PAGE:]
            assert rest.json()["next_after"] is None
            assert _read_all(c, "mpages", 7) == names


def test_a_member_added_between_pages_is_read_once_and_none_is_skipped(srv: Server) -> None:
    tokens = srv.team("mgrowing", "b", "d", "f", "h", "j", "l")
    with srv.client(tokens["b"]) as c, srv.client() as admin:
        seen: list[str] = []
        after = None
        # one named before the pages read (not on any of them), and ones ahead of them
        added = iter(["a", "i", "k", "z"])
        while True:
            params: dict[str, object] = {"limit": 2, **({"after": after} if after else {})}
            body = c.get("/v1/teams/mgrowing/members", params=params).json()
            seen += [m["name"] for m in body["members"]]
            if body["next_after"] is None:
                break
            after = body["next_after"]
            name = next(added, None)
            if name is not None:
                r = admin.post("/v1/teams/mgrowing/members", json={"name": name, "kind": "llm"})
                assert r.status_code == 201, r.text
        # every one there from the start is read once, in order, and each added ahead of
        # the cursor in its place
        assert seen == ["b", "d", "f", "h", "i", "j", "k", "l", "user", "z"]


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "0"),
        ("limit", "-1"),
        ("limit", str(MAX_PAGE + 1)),
        ("limit", str(2**70)),
        ("limit", "ten"),
        ("after", ""),
        ("after", "no such member"),
    ],
)
def test_a_bad_page_is_refused_by_name(
    srv: Server, team: tuple[dict[str, str], list[str]], param: str, value: str
) -> None:
    tokens, _ = team
    with srv.client(tokens["m001"]) as c:
        r = c.get("/v1/teams/mpages/members", params={param: value})
    assert r.status_code in (400, 422), r.text
    assert param in json.dumps(r.json()), r.text


def test_the_page_size_is_in_the_openapi_schema(srv: Server) -> None:
    with srv.client() as c:
        spec = c.get("/openapi.json").json()
    op = spec["paths"]["/v1/teams/{team}/members"]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert params["limit"]["schema"]["default"] == PAGE
    assert params["limit"]["schema"]["maximum"] == MAX_PAGE
    assert "after" in params


async def test_the_sdk_reads_a_page_every_one_or_the_pages(
    srv: Server, team: tuple[dict[str, str], list[str]]
) -> None:
    from backchannel.client import connect

    tokens, names = team
    async with connect(srv.url, tokens["m002"]) as client:
        await check_sdk_pages(
            client.members, client.member_pages, "members", lambda m: m.name, names, PAGE
        )


def test_the_sync_sdk_reads_the_pages(srv: Server, team: tuple[dict[str, str], list[str]]) -> None:
    from backchannel.client import SyncClient

    _, names = team
    with SyncClient(srv.url, srv.admin_token) as client:
        assert [m.name for m in client.members("mpages", limit=2)] == names[:2]
        seen = [m.name for p in client.member_pages("mpages") for m in p.members]
        assert seen == names


def test_the_command_line_says_when_more_members_follow(
    srv: Server, team: tuple[dict[str, str], list[str]]
) -> None:
    _, names = team
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": srv.admin_token}
    first = run("member", "list", "mpages", env=env)
    assert first.returncode == 0, first.stderr
    assert [line.split("\t")[0] for line in first.stdout.splitlines()] == names[:PAGE]
    assert "more follow" in first.stderr
    assert f"member list mpages --after {names[PAGE - 1]}" in first.stderr
    rest = run("member", "list", "mpages", "--after", names[PAGE - 1], env=env)
    assert rest.returncode == 0, rest.stderr
    assert [line.split("\t")[0] for line in rest.stdout.splitlines()] == names[PAGE:]
    assert "more follow" not in rest.stderr
    every = run("member", "list", "mpages", "--all", "--json", env=env)
    assert every.returncode == 0, every.stderr
    assert [m["name"] for m in json.loads(every.stdout)] == names
    assert "more follow" not in every.stderr
    bad = run("member", "list", "mpages", "--limit", "0", env=env)
    assert bad.returncode == 2 and "--limit" in bad.stderr


async def test_the_runner_tool_answers_a_page_and_says_how_to_read_on(
    srv: Server, team: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    from backchannel.client import connect
    from backchannel.runner.tools import MEMBER_PAGE, ToolContext, list_members

    tokens, names = team
    async with connect(srv.url, tokens["m003"]) as client:
        ctx = ToolContext(client=client, member="m003", session="s", workspace=tmp_path)
        seen: list[str] = []
        args: dict[str, str] = {}
        while True:
            answer = (await list_members(ctx, args)).splitlines()
            shown = [line for line in answer if not line.startswith("(more follow")]
            assert len(shown) <= MEMBER_PAGE
            seen += [line.split(" ")[0] for line in shown]
            if len(shown) == len(answer):
                break
            assert answer[-1].startswith("(more follow: call list_members with after=")
            args = {"after": shown[-1].split(" ")[0]}
            assert f"after={args['after']!r}" in answer[-1]
        assert seen == names
