"""Claude Code team inboxes as the hub keeps them apart: a team Claude Code deleted stays
deleted across a restart of the hub, and two members never share one inbox file."""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.delivery.claude_inbox import InboxWriter, read_inbox
from backchannel.delivery.inbox_file import claim_inbox, take_inbox
from backchannel.delivery.inbox_watch import InboxBridge
from backchannel.testing import eventually, eventually_blocking
from tests.conftest import Server, start_server
from tests.delivery.conftest_adapters import dispatching, running_hub, wait_state


def _status(c: httpx.Client, message_id: str, want: str) -> dict[str, Any]:
    """The message's status once it is ``want`` (within 20 s)."""

    def look() -> dict[str, Any] | None:
        r = c.get(f"/v1/messages/{message_id}")
        body: dict[str, Any] = r.json()
        return body if r.status_code == 200 and body["status"] == want else None

    found: dict[str, Any] = eventually_blocking(
        look,
        what=f"message {message_id} {want}",
        within=20,
        show=lambda: c.get(f"/v1/messages/{message_id}").json(),
    )
    return found


@pytest.mark.slow
def test_a_team_claude_code_deleted_stays_deleted_after_the_hub_restarts(
    tmp_path: Path,
) -> None:
    """The hub remembered only in its process that a team directory held Claude Code's
    ``config.json``: after ``serve`` restarted, the first message to a team TeamDelete
    had removed made its directory again and was counted delivered, read by no agent.
    The mark is now kept in the hub's private state directory: a dead letter after the
    restart too, and no directory made again."""
    root = tmp_path / "teams"
    team_dir = root / "cc-team"
    (team_dir / "inboxes").mkdir(parents=True)
    (team_dir / "config.json").write_text('{"name": "cc-team", "members": []}')
    home = tmp_path / "home"
    srv = start_server(home)
    try:
        tokens = srv.team("t")
        with srv.client() as admin:
            setting = {"type": "inbox-file", "root": str(root), "team": "cc-team"}
            r = admin.post(
                "/v1/teams/t/members",
                json={"name": "researcher", "kind": "claude-code", "delivery": setting},
            )
            r.raise_for_status()
        with srv.client(tokens["user"]) as user:
            user.post(
                "/v1/messages", json={"to": "researcher", "text": "one", "message_id": "m-1"}
            ).raise_for_status()
            _status(user, "m-1", "acked")
    finally:
        srv.stop()
    shutil.rmtree(team_dir)  # what TeamDelete does, while the hub is down
    srv = start_server(home)
    try:
        with srv.client(tokens["user"]) as user:
            user.post(
                "/v1/messages", json={"to": "researcher", "text": "two", "message_id": "m-2"}
            ).raise_for_status()
            status = _status(user, "m-2", "dead")
    finally:
        srv.stop()
    reason = status["deliveries"][0]["dead_reason"] or ""
    assert "'cc-team' was deleted" in reason and "TeamCreate" in reason, status
    assert not team_dir.exists()
    marks = tmp_path / "xdg-state" / "backchannel" / "seen" / "claude-teams"
    assert stat.S_IMODE(marks.stat().st_mode) == 0o700
    assert [stat.S_IMODE(p.stat().st_mode) for p in marks.iterdir()] == [0o600]


def test_a_second_member_on_one_inbox_file_is_refused_when_set(server: Server) -> None:
    """Claude Code names an inbox file by the name with every character but letters,
    digits, '_' and '-' made '-': a member given the inbox ``a.b`` and another given
    ``a-b`` (or the inbox ``x y`` beside a member ``x-y``) were both accepted and shared
    one file, each agent reading the other's messages. The second is now refused when
    it is added or changed, naming the member that has the file and the way out."""
    server.team("t")
    root = str(server.home / "teams")

    def inbox(**options: str) -> dict[str, str]:
        return {"type": "inbox-file", "root": root, **options}

    with server.client() as admin:

        def add(name: str, delivery: dict[str, str]) -> httpx.Response:
            return admin.post("/v1/teams/t/members", json={"name": name, "delivery": delivery})

        assert add("alice", inbox(inbox="a.b")).status_code == 201
        assert add("x-y", inbox()).status_code == 201
        for name, delivery, holder in (
            ("bob", inbox(inbox="a-b"), "alice"),
            ("carol", inbox(inbox="x y"), "x-y"),
            ("dave", inbox(inbox="X-Y"), "x-y"),  # one file where case is ignored (macOS)
            ("erin", inbox(inbox="x-y", team="t"), "x-y"),  # the hub team by name
        ):
            r = add(name, delivery)
            assert r.status_code == 422, (name, r.text)
            message = r.json()["error"]["message"]
            assert f"which member {holder!r} of team 't' is delivered to" in message
            assert "'inbox' (or a 'team') of its own" in message
        # a member's own file, and one of its own, are fine
        assert add("bob", inbox(inbox="a_b")).status_code == 201
        r = admin.patch("/v1/teams/t/members/bob", json={"delivery": inbox(inbox="a.b")})
        assert r.status_code == 422 and "'alice'" in r.json()["error"]["message"]
        r = admin.patch("/v1/teams/t/members/alice", json={"delivery": inbox(inbox="a-b")})
        assert r.status_code == 200, r.text  # the same file under another name: its own
        members = admin.get("/v1/teams/t/members").json()["members"]
        assert sorted(m["name"] for m in members) == ["alice", "bob", "user", "x-y"]


async def test_an_inbox_file_of_another_member_is_never_written(tmp_path: Path) -> None:
    """Two hub teams whose Claude Code team names sanitize alike (``cc.x``, ``cc-x``)
    shared one inbox file: team t2's message to its member was written into the inbox
    team t1's agent reads, and counted delivered (a leak across teams). So did two
    members of one team set before the refusal above. The file is now claimed by the
    first member written to; another member's message is a dead letter saying why,
    nothing written, until the holder's delivery no longer names the file."""
    root = tmp_path / "teams"

    def setting(team: str) -> dict[str, str]:
        return {"type": "inbox-file", "root": str(root), "team": team, "inbox": "r"}

    path = root / "cc-x" / "inboxes" / "r.json"
    async with running_hub() as hub:
        await hub.create_team("t2", settings={"anchor_policy": "off"})
        await hub.add_member("t", "r", "claude-code", delivery=setting("cc.x"))
        await hub.add_member("t", "s", "claude-code", delivery=setting("cc x"))  # set before
        await hub.add_member("t2", "r", "claude-code", delivery=setting("cc-x"))
        async with dispatching(hub):
            first = await hub.send("t", "user", "r", "for t's r", link=False)
            await wait_state(hub, "t", first.message_id, "acked")
            other = await hub.send("t2", "user", "r", "t2 secret", link=False)
            same = await hub.send("t", "user", "s", "for s", link=False)
            st_other = await wait_state(hub, "t2", other.message_id, "dead")
            st_same = await wait_state(hub, "t", same.message_id, "dead")
            assert [e["text"] for e in read_inbox(path)] == ["[From user] for t's r"]
            cross = st_other.deliveries[0].dead_reason or ""
            assert "the inbox of a member of another hub team" in cross
            assert "'t'" not in cross  # the other team is not named to this one
            assert "member 'r' of this team" in (st_same.deliveries[0].dead_reason or "")
            # t's r moves to an inbox of its own: the file is t2's r's from now on
            await hub.update_member("t", "r", delivery=setting("cc-y"))
            again = await hub.send("t2", "user", "r", "t2 now", link=False)
            await wait_state(hub, "t2", again.message_id, "acked")
    assert [e["text"] for e in read_inbox(path)][-1] == "[From user] t2 now"
    claims = tmp_path / "xdg-state" / "backchannel" / "seen" / "claude-inboxes"
    assert stat.S_IMODE(claims.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in claims.iterdir()} == {0o600}


async def test_two_writers_taking_over_one_outdated_claim_at_once_one_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim of an inbox file whose member moved away is taken over at the next
    write. Two writers that found it outdated at the same instant (here: released
    together by a barrier just after both looked at the outdated holder) both took it
    over and both wrote, so the agent reading the file got the other hub team's message
    too. The take-over is now a compare-and-swap under a lock: one wins, the other
    finds the winner holding the file and its message is a dead letter saying why."""
    root = tmp_path / "teams"

    def setting(team: str) -> dict[str, str]:
        return {"type": "inbox-file", "root": str(root), "team": team, "inbox": "r"}

    path = root / "cc-x" / "inboxes" / "r.json"
    async with running_hub() as hub:
        for team in ("t2", "t3"):
            await hub.create_team(team, settings={"anchor_policy": "off"})
        await hub.add_member("t", "r", "claude-code", delivery=setting("cc.x"))
        async with dispatching(hub):
            first = await hub.send("t", "user", "r", "for t's r", link=False)
            await wait_state(hub, "t", first.message_id, "acked")
        await hub.update_member("t", "r", delivery=setting("cc-y"))  # the claim is outdated
        await hub.add_member("t2", "r", "claude-code", delivery=setting("cc-x"))
        await hub.add_member("t3", "r", "claude-code", delivery=setting("cc x"))

        both = asyncio.Barrier(2)
        get_member = hub.get_member

        async def looked_at_together(team: str, member: str) -> Any:
            found = await get_member(team, member)
            if (team, member) == ("t", "r"):  # the outdated holder: wait for the other
                async with asyncio.timeout(20):
                    await both.wait()
            return found

        monkeypatch.setattr(hub, "get_member", looked_at_together)
        async with dispatching(hub):
            sent = {
                team: await hub.send(team, "user", "r", f"{team} secret", link=False)
                for team in ("t2", "t3")
            }

            async def settled() -> dict[str, Any] | None:
                states = {t: await hub.message_status(t, m.message_id) for t, m in sent.items()}
                done = all(s.state.value in ("acked", "dead") for s in states.values())
                return states if done else None

            states = await eventually(settled, within=30, what="both messages settled")
        assert sorted(s.state.value for s in states.values()) == ["acked", "dead"]
        [won] = [t for t, s in states.items() if s.state.value == "acked"]
        [lost] = [t for t, s in states.items() if s.state.value == "dead"]
        texts = [e["text"] for e in read_inbox(path)]
        assert f"[From user] {won} secret" in texts
        assert f"[From user] {lost} secret" not in texts, "never in the winner's inbox"
        reason = states[lost].deliveries[0].dead_reason or ""
        assert "the inbox of a member of another hub team" in reason


async def test_the_claim_is_checked_off_the_event_loop_with_the_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim mark was read with a plain file read on the event loop before each
    write (a slow state directory stalled every agent's traffic), and apart from the
    append. It is now read in the worker thread that appends, one step with it."""
    from backchannel.delivery import inbox_file

    root = tmp_path / "teams"
    loop_thread = threading.get_ident()
    reads: list[int] = []
    appends: list[int] = []
    read_claim, append = inbox_file._read_claim, InboxWriter.append

    def recorded_read(claim: Path) -> Any:
        reads.append(threading.get_ident())
        return read_claim(claim)

    def recorded_append(self: InboxWriter, *args: Any, **kwargs: Any) -> Any:
        appends.append(threading.get_ident())
        return append(self, *args, **kwargs)

    monkeypatch.setattr(inbox_file, "_read_claim", recorded_read)
    monkeypatch.setattr(InboxWriter, "append", recorded_append)
    async with running_hub() as hub:
        await hub.add_member(
            "t", "r", "claude-code", delivery={"type": "inbox-file", "root": str(root)}
        )
        async with dispatching(hub):
            for text in ("one", "two"):
                sent = await hub.send("t", "user", "r", text, link=False)
                await wait_state(hub, "t", sent.message_id, "acked")
    assert len(reads) >= 2 and len(appends) == 2
    assert loop_thread not in reads, "no claim read on the event loop"
    assert set(reads) <= set(appends), "read in the thread that appends"


def test_writers_taking_over_one_outdated_claim_at_once_leave_the_file_to_one(
    tmp_path: Path,
) -> None:
    """The member holding an inbox file's claim was removed; writers for two other
    members (hubs on one host, two teams whose names sanitize alike) found it so at the
    same moment and each took the claim over: each replaced it and read back its own,
    and both wrote into the one file. The claim is now taken over only from the
    outdated holder, under a lock: one wins, the others find the file held."""
    path = tmp_path / "teams" / "cc-x" / "inboxes" / "r.json"
    assert claim_inbox(path, "t", "gone") is None  # its holder, removed since
    stale = [claim_inbox(path, f"t{i}", "r") for i in range(16)]
    assert set(stale) == {("t", "gone")}
    start = threading.Barrier(16)

    def take(i: int) -> tuple[str, str] | None:
        start.wait(10)
        return take_inbox(path, f"t{i}", "r", stale[i])

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(take, range(16)))
    winners = [i for i, held in enumerate(got) if held is None]
    assert len(winners) == 1, got
    assert {held for held in got if held is not None} == {(f"t{winners[0]}", "r")}
    # the winner's claim stands; a later look by a loser says who holds it
    assert claim_inbox(path, f"t{winners[0]}", "r") is None
    assert claim_inbox(path, "t99", "r") == (f"t{winners[0]}", "r")


#: Team names and the directories Claude Code 2.1.332 gives them: the inboxes'
#: (``/[^a-zA-Z0-9_-]/g`` -> "-") and the config's (``/[^a-zA-Z0-9]/g`` -> "-", lowered),
#: each JavaScript regex over UTF-16 code units (a character past U+FFFF is two "-").
CLAUDE_DIRS = [
    ("My_Team", "My_Team", "my-team"),
    ("ÄB c", "-B-c", "-b-c"),
    ("a/b", "a-b", "a-b"),
    ("..", "--", "--"),
    ("a\N{GRINNING FACE}b", "a--b", "a--b"),
]


@pytest.mark.parametrize(("name", "inbox_dir", "config_dir"), CLAUDE_DIRS)
async def test_a_deleted_team_is_seen_where_claude_code_keeps_its_config(
    tmp_path: Path, name: str, inbox_dir: str, config_dir: str
) -> None:
    """Claude Code names a team's inbox directory and its config directory with two
    different sanitizers, and TeamDelete removes the config's alone. The hub looked for
    ``config.json`` in the inbox directory: for a name with capitals, ``_`` or other
    characters it never saw the team made, so after TeamDelete it went on writing into
    inboxes no agent reads, each message counted delivered. Now it looks where Claude
    Code keeps the config: the inbox is written where Claude Code reads it, and after
    TeamDelete a message is a dead letter."""
    root = tmp_path / "teams"
    (root / config_dir).mkdir(parents=True)
    (root / config_dir / "config.json").write_text('{"members": []}')
    inbox = root / inbox_dir / "inboxes" / "researcher.json"
    setting = {"type": "inbox-file", "root": str(root), "team": name}
    async with running_hub() as hub:
        await hub.add_member("t", "researcher", "claude-code", delivery=setting)
        async with dispatching(hub):
            first = await hub.send("t", "user", "researcher", "one", link=False)
            await wait_state(hub, "t", first.message_id, "acked")
            assert [e["text"] for e in read_inbox(inbox)] == ["[From user] one"]
            shutil.rmtree(root / config_dir)  # what TeamDelete does
            sent = await hub.send("t", "user", "researcher", "two", link=False)
            st = await wait_state(hub, "t", sent.message_id, "dead")
    assert "was deleted" in (st.deliveries[0].dead_reason or "")
    # nothing written, nor a removed directory made again
    assert inbox.exists() is (inbox_dir != config_dir)
    assert "[From user] two" not in [e["text"] for e in read_inbox(inbox)]


async def test_two_team_names_of_one_claude_code_config_are_deleted_together(
    tmp_path: Path,
) -> None:
    """``My_Team`` and ``my-team`` keep their inboxes apart and their config in one
    directory, as Claude Code names them: one Claude Code team config, so when
    TeamDelete removes it, the messages of both are dead letters."""
    root = tmp_path / "teams"
    (root / "my-team").mkdir(parents=True)
    (root / "my-team" / "config.json").write_text('{"members": []}')
    async with running_hub() as hub:
        for member, cc_team in (("a", "My_Team"), ("b", "my-team")):
            setting = {"type": "inbox-file", "root": str(root), "team": cc_team}
            await hub.add_member("t", member, "claude-code", delivery=setting)
        async with dispatching(hub):
            for member in ("a", "b"):
                sent = await hub.send("t", "user", member, "one", link=False)
                await wait_state(hub, "t", sent.message_id, "acked")
            shutil.rmtree(root / "my-team")
            for member in ("a", "b"):
                sent = await hub.send("t", "user", member, "two", link=False)
                await wait_state(hub, "t", sent.message_id, "dead")
    assert [e["text"] for e in read_inbox(root / "My_Team" / "inboxes" / "a.json")] == [
        "[From user] one"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("other", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_hub_of_another_store_never_writes_an_inbox_file_a_live_hub_holds(
    tmp_path: Path, other: str, request: pytest.FixtureRequest
) -> None:
    """Two hubs on two stores (two teams' SQLite files) share the user's state
    directory, where inbox-file claims are kept. A claim named the team and the member,
    not the store: hub B, whose team and member have the same names as hub A's, took
    A's claim for its own and wrote into the inbox A's agent reads (both counted
    delivered; A's bridge then read B's entry in as well). The claim now carries the
    store: while A is serving, B's message is a dead letter naming hub A; once A has
    stopped, B takes the claim over and writes. B on another SQLite file, or on
    PostgreSQL."""
    root = tmp_path / "teams"
    setting = {"type": "inbox-file", "root": str(root)}
    path = root / "t" / "inboxes" / "r.json"
    a = start_server(tmp_path / "a")
    b_store = request.getfixturevalue("new_postgres_url")() if other == "postgres" else None
    b = start_server(tmp_path / "b", b_store)
    try:
        users = {}
        sent: dict[str, str] = {}
        # A's member first, and its message written (A holds the claim from then on);
        # then B's, whose bridge would otherwise race A's to the claim
        for name, srv in (("a", a), ("b", b)):
            users[srv.url] = srv.team("t")["user"]
            with srv.client() as c:
                r = c.post("/v1/teams/t/members", json={"name": "r", "delivery": setting})
                assert r.status_code == 201, r.text
            with srv.client(users[srv.url]) as c:
                body = {"to": "r", "text": f"from hub {name}", "link": False}
                r = c.post("/v1/messages", json=body)
                assert r.status_code == 201, r.text
                sent[name] = r.json()["message_id"]
                if name == "a":
                    _status(c, sent["a"], "acked")
        with b.client(users[b.url]) as c:
            dead = _status(c, sent["b"], "dead")
        reason = dead["deliveries"][0]["dead_reason"]
        assert "another hub" in reason and f"sqlite://{tmp_path / 'a'}" in reason, reason
        assert [e["text"] for e in read_inbox(path)] == ["[From user] from hub a"]
        a.stop()
        with b.client(users[b.url]) as c:
            r = c.post("/v1/messages", json={"to": "r", "text": "b again", "link": False})
            assert r.status_code == 201, r.text
            _status(c, r.json()["message_id"], "acked")
        assert [e["text"] for e in read_inbox(path)][-1] == "[From user] b again"
    finally:
        a.stop()
        b.stop()


async def test_a_bridge_never_reads_an_inbox_file_a_serving_hub_of_another_store_holds(
    tmp_path: Path,
) -> None:
    """Two hubs on two stores, one state directory, a team and members of the same
    names, one inbox file. Hub B's bridge read the entries hub A's teammate wrote into
    A's agent's inbox and took them in as messages of B's own member of that name (a
    message B's member never sent, in B's record and budgets). A file a serving hub of
    another store has claimed is now left to that hub; once its dispatcher stops, the
    claim is B's to take over."""
    root = tmp_path / "teams"
    setting = {"type": "inbox-file", "root": str(root)}
    path = root / "t" / "inboxes" / "r.json"
    async with running_hub() as a, running_hub() as b:
        for hub in (a, b):
            await hub.add_member("t", "r", "claude-code", delivery=setting)
            await hub.add_member("t", "alice", "llm")
        async with dispatching(a):
            sent = await a.send("t", "alice", "r", "for a's r", link=False)
            await wait_state(a, "t", sent.message_id, "acked")
            assert [e["text"] for e in read_inbox(path)] == ["[From alice] for a's r"]
            InboxWriter(root).append("t", "r", msg_id="cc-1", from_="alice", text="by hand")
            bridge = InboxBridge(b, root=root, watch=False)
            await bridge.start()
            try:
                taken = await bridge.scan()
                assert not [r for r in taken if r.messages or r.own], taken
                assert bridge.taken == 0
            finally:
                await bridge.stop()
        # a's dispatcher stopped, giving its claims up: b's member has the file now
        async with dispatching(b):
            later = await b.send("t", "alice", "r", "for b's r", link=False)
            await wait_state(b, "t", later.message_id, "acked")
        assert [e["text"] for e in read_inbox(path)][-1] == "[From alice] for b's r"


def test_a_claim_written_before_claims_named_their_store_is_still_understood(
    tmp_path: Path,
) -> None:
    """A claim made by the previous version names the team and the member only: it is
    still the member's (and made its store's at the next write), another member's
    still holds the file, and a claim of a store whose hub is gone is taken over."""
    from backchannel.delivery.inbox_file import StoreMark, _claim_of

    path = tmp_path / "teams" / "t" / "inboxes" / "r.json"
    mine = StoreMark("a" * 32, "hub A")
    assert claim_inbox(path, "t", "r") is None  # the old body: no store
    assert claim_inbox(path, "t", "x", mine) == ("t", "r")
    assert claim_inbox(path, "t", "r", mine) is None
    assert json.loads(_claim_of(path).read_text())["store"] == mine.key
    # a store whose hub is not serving (no presence held): its claim is taken over
    theirs = StoreMark("b" * 32, "hub B")
    assert claim_inbox(path, "t", "r", theirs) is None
    assert json.loads(_claim_of(path).read_text())["hub"] == "hub B"


def test_hubs_of_one_store_share_its_mark_and_other_stores_do_not(tmp_path: Path) -> None:
    """Every hub of one store writes its member's inbox as one: two SQLite paths to one
    file, or two URLs of one PostgreSQL database (another user, another password), are
    one store; another file or another database is another store."""
    from types import SimpleNamespace

    from backchannel.delivery.inbox_file import store_mark

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    def mark(url: str) -> str:
        return store_mark(SimpleNamespace(url=url)).key

    db = tmp_path / "real" / "hub.db"
    assert mark(f"sqlite://{db}") == mark(f"sqlite://{tmp_path / 'link' / 'hub.db'}")
    assert mark(f"sqlite://{db}") != mark(f"sqlite://{tmp_path / 'real' / 'other.db'}")
    pg = "postgresql://a:***@127.0.0.1:5433/team1"
    assert mark(pg) == mark("postgresql://b@127.0.0.1:5433/team1?sslmode=disable")
    assert mark(pg) != mark("postgresql://a:***@127.0.0.1:5433/team2")
    assert mark("memory://") != mark("memory://"), "each memory store is its own"


def _hub_of(store: Any) -> Any:
    from backchannel.hub import Hub

    return Hub(store, check_delivery=False)


@pytest.mark.postgres
async def test_one_database_reached_under_two_host_names_is_one_store(
    tmp_path: Path, new_postgres_url: Any
) -> None:
    """Two hubs on one PostgreSQL database, one reaching it as ``127.0.0.1``, the other
    as ``localhost``. The claims named the store by a hash of its host, port and
    database, so the two took each other for hubs of two stores: while hub A served,
    hub B's messages to the member were dead letters naming A, and B's bridge left the
    member's file unread. The store's identity is now kept in the store itself: both
    hubs see one store, B writes the file A claimed, and an entry a teammate wrote is
    taken in once, whichever hub reads it."""
    from backchannel.delivery.inbox_file import held_elsewhere, store_mark, write_claimed
    from backchannel.stores.postgres import PostgresStore

    url = new_postgres_url()
    assert "@127.0.0.1:" in url
    other = url.replace("@127.0.0.1:", "@localhost:")
    root = tmp_path / "teams"
    setting = {"type": "inbox-file", "root": str(root)}
    path = root / "t" / "inboxes" / "r.json"
    async with _hub_of(PostgresStore(url)) as a, _hub_of(PostgresStore(other)) as b:
        await a.create_team("t", settings={"anchor_policy": "off"})
        await a.add_member("t", "r", "claude-code", delivery=setting)
        await a.add_member("t", "alice", "llm")
        assert store_mark(a.store).key == store_mark(b.store).key
        # hub A writes the member's inbox: its claim, and A serving from then on
        writer = InboxWriter(root)
        append = functools.partial(
            writer.append, "t", "r", msg_id="by-a", from_="alice", text="[From alice] one"
        )
        await write_claimed(a, path, "t", "r", append)
        assert held_elsewhere(path, store_mark(b.store)) is None
        async with dispatching(b):  # hub B pushes the member now: the same store's
            sent = await b.send("t", "alice", "r", "two", link=False)
            await wait_state(b, "t", sent.message_id, "acked")
        assert [e["text"] for e in read_inbox(path)] == ["[From alice] one", "[From alice] two"]
        writer.append("t", "r", msg_id="cc-1", from_="alice", text="by hand")
        taken = []
        for hub in (b, a):
            bridge = InboxBridge(hub, root=root, watch=False)
            await bridge.start()
            try:
                await bridge.scan()
                taken.append(bridge.taken)
            finally:
                await bridge.stop()
        # B takes in the two entries not its own (the one written by hand with write_claimed
        # and the teammate's), A nothing more: one store, each entry once
        assert taken == [2, 0]


async def _bridge_takes(hub: Any, root: Path) -> int:
    """How many hub messages a new bridge of ``hub`` makes reading every file once."""
    bridge = InboxBridge(hub, root=root, watch=False)
    await bridge.start()
    try:
        await bridge.scan()
        return bridge.taken
    finally:
        await bridge.stop()


async def test_files_no_member_reads_are_read_by_one_serving_hub_and_taken_over_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two hubs on two stores, one state directory, a team and members of the same
    names, one Claude Code team directory. The files no member reads itself (the
    human's ``user.json``, a lead's inbox) were read by both hubs' bridges: what the
    teammate wrote to the user became a message in both stores (two leads would each be
    handed it). They are now one serving hub's, claimed for the team directory as an
    inbox file is for its member; the other leaves them and says so. When that hub
    stops, the other takes the files over, and with them only what was written after:
    the entries the first hub took in (the member's file's too) are not taken in again,
    nor after a restart."""
    root = tmp_path / "teams"
    setting = {"type": "inbox-file", "root": str(root)}
    writer = InboxWriter(root)
    async with running_hub() as a, running_hub() as b:
        for hub in (a, b):
            await hub.add_member("t", "r", "claude-code", delivery=setting)
            await hub.add_member("t", "alice", "llm")
        async with dispatching(a):
            sent = await a.send("t", "alice", "r", "for a's r", link=False)
            await wait_state(a, "t", sent.message_id, "acked")  # a holds r.json
            writer.append("t", "user", msg_id="cc-1", from_="r", text="done")
            writer.append("t", "r", msg_id="cc-2", from_="alice", text="by hand")
            assert await _bridge_takes(a, root) == 2
            with caplog.at_level("WARNING", "backchannel.delivery.inbox_watch"):
                assert await _bridge_takes(b, root) == 0, "user.json is hub a's to read"
            assert "another hub" in caplog.text and "user.json" in caplog.text
        # hub a stopped serving: b takes the files over, and only what came after
        writer.append("t", "user", msg_id="cc-3", from_="r", text="after")
        assert await _bridge_takes(b, root) == 1
        assert await _bridge_takes(b, root) == 0, "nor again after a restart"
        got = await b.receive("t", "user", limit=10)
        assert [d.message.text for d in got] == ["after"]


async def test_a_member_file_taken_over_from_another_store_brings_in_only_what_is_new(
    tmp_path: Path,
) -> None:
    """Hub A (one store) pushes to its member's inbox file and its bridge takes in what
    a teammate wrote there. A stops; hub B (another store, a member of the same names)
    takes the claim over and writes. B's bridge read the file whole: A's message and
    the teammate's entry A had taken in became messages of B's store too (its record,
    its pair budgets). Now only what was written after A's last read comes in."""
    root = tmp_path / "teams"
    setting = {"type": "inbox-file", "root": str(root)}
    path = root / "t" / "inboxes" / "r.json"
    writer = InboxWriter(root)
    async with running_hub() as a, running_hub() as b:
        for hub in (a, b):
            await hub.add_member("t", "r", "claude-code", delivery=setting)
            await hub.add_member("t", "alice", "llm")
        async with dispatching(a):
            sent = await a.send("t", "alice", "r", "for a's r", link=False)
            await wait_state(a, "t", sent.message_id, "acked")
            writer.append("t", "r", msg_id="cc-1", from_="alice", text="by hand, for a")
            assert await _bridge_takes(a, root) == 1
        async with dispatching(b):  # a stopped: b takes the claim over
            later = await b.send("t", "alice", "r", "for b's r", link=False)
            await wait_state(b, "t", later.message_id, "acked")
        writer.append("t", "r", msg_id="cc-2", from_="alice", text="by hand, for b")
        assert len(read_inbox(path)) == 4
        assert await _bridge_takes(b, root) == 1, "only the entry written after a's read"
        assert await _bridge_takes(b, root) == 0


async def test_an_entry_in_a_file_no_member_reads_goes_to_the_store_of_its_writer(
    tmp_path: Path,
) -> None:
    """One Claude Code team whose teammates are members of two stores' teams (``r`` of
    hub A's, ``r2`` of hub B's; each hub pushes to its own member's inbox file). Hub A
    reads the files no member reads itself; what ``r2`` writes to ``user.json`` is B's
    all the same: its inbox file is claimed by B, so its agent is B's member. B takes it
    in, A leaves it; what ``r`` writes is A's alone."""
    root = tmp_path / "teams"
    writer = InboxWriter(root)
    async with running_hub() as a, running_hub() as b:
        for hub, member in ((a, "r"), (b, "r2")):
            setting = {"type": "inbox-file", "root": str(root)}
            await hub.add_member("t", member, "claude-code", delivery=setting)
            await hub.add_member("t", "alice", "llm")
        async with dispatching(a), dispatching(b):
            for hub, member in ((a, "r"), (b, "r2")):
                sent = await hub.send("t", "alice", member, f"for {member}", link=False)
                await wait_state(hub, "t", sent.message_id, "acked")
            assert await _bridge_takes(a, root) == 0  # a reads user.json from now on
            writer.append("t", "user", msg_id="cc-1", from_="r2", text="from b's agent")
            writer.append("t", "user", msg_id="cc-2", from_="r", text="from a's agent")
            assert await _bridge_takes(b, root) == 1
            assert await _bridge_takes(a, root) == 1
            got = {h: await h.receive("t", "user", limit=10) for h in (a, b)}
        assert [d.message.text for d in got[a]] == ["from a's agent"]
        assert [d.message.text for d in got[b]] == ["from b's agent"]
