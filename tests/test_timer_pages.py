"""``GET /v1/timers`` a page at a time, over a real socket against ``backchannel serve``:
bounded by default, ``limit`` and ``after`` in the HTTP API, the SDK and the command
line, and a bad value refused by the parameter's name."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from backchannel.core.timers import MAX_TIMER_PAGE, TIMER_PAGE
from tests.conftest import Server
from tests.test_cli_conventions import run


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import start_server

    s = start_server(tmp_path_factory.mktemp("timer-pages") / "home")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def team(srv: Server) -> tuple[dict[str, str], list[int]]:
    """Team ``pages``: ``a`` and ``b`` hold TIMER_PAGE + 5 anchor timers between them."""
    tokens = srv.team("pages", "a", "b")
    ids = []
    for name in ("a", "b"):
        with srv.client(tokens[name]) as c:
            c.post("/v1/sessions", json={"session_id": f"{name}-1"}).raise_for_status()
            for i in range((TIMER_PAGE + 5) // 2 + (name == "a")):
                body = {"intent": "anchor", "minutes": 60, "note": f"{name} {i}"}
                r = c.post("/v1/timers", json=body)
                assert r.status_code == 201, r.text
                ids.append(r.json()["timer_id"])
    assert len(ids) == TIMER_PAGE + 5
    return tokens, ids


def test_the_list_is_bounded_and_read_page_by_page(
    srv: Server, team: tuple[dict[str, str], list[int]]
) -> None:
    tokens, ids = team
    with srv.client(tokens["a"]) as c:
        first = c.get("/v1/timers").json()
        assert [t["timer_id"] for t in first["timers"]] == ids[:TIMER_PAGE]
        assert first["next_after"] == ids[TIMER_PAGE - 1]
        rest = c.get("/v1/timers", params={"after": first["next_after"]}).json()
        assert [t["timer_id"] for t in rest["timers"]] == ids[TIMER_PAGE:]
        assert rest["next_after"] is None
        seen, after = [], 0
        while True:
            page = c.get("/v1/timers", params={"limit": 7, "after": after}).json()
            assert len(page["timers"]) <= 7
            seen += [t["timer_id"] for t in page["timers"]]
            if page["next_after"] is None:
                break
            after = page["next_after"]
        assert seen == ids  # every one once, in the order they were set


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "0"),
        ("limit", "-1"),
        ("limit", str(MAX_TIMER_PAGE + 1)),
        ("limit", str(2**70)),
        ("limit", "ten"),
        ("after", "-1"),
        ("after", str(2**70)),
        ("after", "zz"),
        ("after", "1.5"),
    ],
)
def test_a_bad_page_is_refused_by_name(
    srv: Server, team: tuple[dict[str, str], list[int]], param: str, value: str
) -> None:
    tokens, _ = team
    with srv.client(tokens["a"]) as c:
        r = c.get("/v1/timers", params={param: value})
    assert r.status_code in (400, 422), r.text
    assert param in json.dumps(r.json()), r.text


async def test_the_sdk_reads_a_page_or_every_one(
    srv: Server, team: tuple[dict[str, str], list[int]]
) -> None:
    from backchannel import errors
    from backchannel.client import connect

    tokens, ids = team
    async with connect(srv.url, tokens["a"]) as client:
        assert [t.timer_id for t in await client.timers(limit=3)] == ids[:3]
        assert [t.timer_id for t in await client.timers(after=ids[1], limit=2)] == ids[2:4]
        assert [t.timer_id for t in await client.timers()] == ids  # all, page by page
        for bad in ({"limit": 0}, {"limit": -5}, {"after": -1}):
            with pytest.raises(errors.InvalidRequest) as caught:
                await client.timers(**bad)  # type: ignore[arg-type]
            assert caught.value.details["field"] == next(iter(bad))


def test_the_command_line_shows_a_page(srv: Server, team: tuple[dict[str, str], list[int]]) -> None:
    tokens, ids = team
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    got = run("timer", "list", "--limit", "2", "--after", str(ids[0]), "--json", env=env)
    assert got.returncode == 0, got.stderr
    assert [t["timer_id"] for t in json.loads(got.stdout)] == ids[1:3]
    bad = run("timer", "list", "--limit", "0", env=env)
    assert bad.returncode == 2 and "--limit" in bad.stderr


def test_the_command_line_says_when_more_timers_follow(
    srv: Server, team: tuple[dict[str, str], list[int]]
) -> None:
    """A page that is not the whole list says so on stderr, with the command that reads
    the next one; the last page says nothing more, and --all reads every one."""
    tokens, ids = team
    env = {"BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["a"]}
    first = run("timer", "list", env=env)
    assert first.returncode == 0, first.stderr
    assert [int(line.split("\t")[0]) for line in first.stdout.splitlines()] == ids[:TIMER_PAGE]
    assert "more follow" in first.stderr
    assert f"--after {ids[TIMER_PAGE - 1]}" in first.stderr and "--all" in first.stderr
    rest = run("timer", "list", "--after", str(ids[TIMER_PAGE - 1]), env=env)
    assert rest.returncode == 0, rest.stderr
    assert [int(line.split("\t")[0]) for line in rest.stdout.splitlines()] == ids[TIMER_PAGE:]
    assert "more follow" not in rest.stderr
    every = run("timer", "list", "--all", env=env)
    assert every.returncode == 0, every.stderr
    assert [int(line.split("\t")[0]) for line in every.stdout.splitlines()] == ids
    assert "more follow" not in every.stderr
    page = run("timer", "list", "--limit", "2", "--json", env=env)
    assert page.returncode == 0, page.stderr
    assert [t["timer_id"] for t in json.loads(page.stdout)] == ids[:2]
    assert f"--after {ids[1]}" in page.stderr
    exact = run("timer", "list", "--limit", "5", "--after", str(ids[-6]), env=env)
    assert exact.returncode == 0, exact.stderr
    assert len(exact.stdout.splitlines()) == 5 and "more follow" not in exact.stderr
