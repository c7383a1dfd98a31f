"""The data directory and everything the hub writes in it are private to its user."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from backchannel.config import admin_token
from backchannel.delivery.claude_inbox import InboxWatcher, InboxWriter
from backchannel.delivery.stdin import StdinAgent
from backchannel.errors import InvalidRequest, StoreError
from backchannel.files import state_mark, write_atomic, write_mark
from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import eventually
from tests.conftest import BIN, Server, start_server
from tests.peers import Peer, QuietHandler


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _hub_files(home: Path) -> dict[str, int]:
    names = ["backchannel.db", "backchannel.db-wal", "backchannel.db-shm"]
    return {n: _mode(home / n) for n in [*names, "admin.token", "server.json"]}


def _hub_database(path: Path) -> None:
    """A hub's database at ``path``, made by the store (its schema in it)."""

    async def make() -> None:
        async with Hub(SqliteStore(path), background=False) as hub:
            await hub.create_team("t")

    asyncio.run(make())


def _send_one(srv: Server) -> None:
    tokens = srv.team("alpha", "lead", "worker")
    with srv.client(tokens["lead"]) as c:
        r = c.post("/v1/messages", json={"to": "worker", "text": "private words"})
        assert r.status_code == 201, r.text


def test_a_new_data_directory_is_0700_and_its_files_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, which would give 0755 and 0644
    try:
        home = tmp_path / "new" / "home"
        srv = start_server(home)
    finally:
        os.umask(old)
    try:
        _send_one(srv)
        assert _mode(home) == 0o700
        assert _hub_files(home) == dict.fromkeys(_hub_files(home), 0o600)
    finally:
        srv.stop()


def test_a_world_readable_data_directory_is_narrowed_on_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    db = home / "backchannel.db"
    _hub_database(db)
    conn = sqlite3.connect(db)  # a database left by an older version, 0644 with its WAL
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE leftover (x)")
    conn.execute("INSERT INTO leftover VALUES (1)")
    for path in (home / "admin.token", *home.glob("backchannel.db*")):
        if not path.exists():
            path.write_text("bca_old-token\n")
        path.chmod(0o644)
    assert {_mode(p) for p in home.glob("backchannel.db*")} == {0o644}
    conn.close()
    srv = start_server(home)
    try:
        _send_one(srv)
        assert _mode(home) == 0o700
        assert _hub_files(home) == dict.fromkeys(_hub_files(home), 0o600)
        assert srv.admin_token == "bca_old-token"
    finally:
        srv.stop()


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_a_data_directory_made_for_its_config_file_is_narrowed_at_the_first_start(
    tmp_path: Path, umask: int
) -> None:
    """The operator makes the data directory and writes config.yaml in it (the callback
    secret, other hubs' tokens) before the hub's first start, under a usual umask: the
    hub takes the directory for its own, makes it 0700 and the config file 0600."""
    home = tmp_path / "home"
    old = os.umask(umask)
    try:
        home.mkdir()
        (home / "config.yaml").write_text('callback_secret: "long random words"\n')
    finally:
        os.umask(old)
    assert (_mode(home), _mode(home / "config.yaml")) == (0o777 & ~umask, 0o666 & ~umask)
    srv = start_server(home)
    try:
        _send_one(srv)
        assert (_mode(home), _mode(home / "config.yaml")) == (0o700, 0o600)
        assert _hub_files(home) == dict.fromkeys(_hub_files(home), 0o600)
    finally:
        srv.stop()


async def test_the_sqlite_store_creates_its_files_private_in_a_new_directory(
    tmp_path: Path,
) -> None:
    old = os.umask(0o022)
    try:
        store = SqliteStore(tmp_path / "made" / "hub.db")
        async with Hub(store, background=False) as hub:
            await hub.create_team("t")
            await hub.add_member("t", "a")
            assert _mode(tmp_path / "made") == 0o700
            files = sorted(p.name for p in (tmp_path / "made").iterdir())
            assert files == ["hub.db", "hub.db-shm", "hub.db-wal"]
            assert {_mode(tmp_path / "made" / f) for f in files} == {0o600}
    finally:
        os.umask(old)


def test_a_directory_that_is_not_the_hubs_keeps_its_mode(tmp_path: Path) -> None:
    """A data directory named by mistake (``/tmp``, a home: files, none of the hub's) is
    not narrowed; the admin token the hub writes in it is 0600 all the same."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "someone-elses.txt").write_text("hello\n")
    (shared / "config.yaml").write_text("another program's: true\n")
    (shared / "config.yaml").chmod(0o644)
    token = admin_token(shared)
    assert token is not None and token.startswith("bca_")
    assert (_mode(shared), _mode(shared / "config.yaml")) == (0o1777, 0o644)
    assert _mode(shared / "admin.token") == 0o600
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    empty.chmod(0o755)
    admin_token(empty)  # an empty directory is the hub's to make private
    assert _mode(empty) == 0o700


@pytest.mark.parametrize("kind", ["text", "foreign database"])
def test_a_file_that_is_not_a_hub_database_is_refused_and_left_alone(
    tmp_path: Path, kind: str
) -> None:
    """``--store`` naming a file that is not the hub's (``/etc/passwd``, another
    program's SQLite database): refused with an error naming it; neither its mode nor
    its content changes."""
    path = tmp_path / "theirs"
    if kind == "text":
        path.write_text("root:x:0:0:root:/root:/bin/bash\n")
    else:
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE messages (their_column)")
        conn.commit()
        conn.close()
    path.chmod(0o644)
    before = path.read_bytes()

    async def open_it() -> None:
        async with Hub(SqliteStore(path), background=False):
            pass

    with pytest.raises(StoreError) as err:
        asyncio.run(open_it())
    assert str(path) in err.value.message and "not a backchannel store" in err.value.message
    assert _mode(path) == 0o644
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs"]


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_link_in_place_of_a_store_companion_is_refused_and_its_target_left_alone(
    tmp_path: Path, suffix: str
) -> None:
    """A symlink put where the store keeps its ``-wal``, ``-shm`` or ``-journal``,
    pointing at a file of the user's: the store refuses to open, naming the link and how
    to go on; the file it points at keeps its mode and content."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    db = home / "hub.db"
    _hub_database(db)
    for leftover in home.glob("hub.db-*"):
        leftover.unlink()
    victim = tmp_path / "page.html"
    victim.write_text("<p>for everyone</p>\n")
    victim.chmod(0o644)
    link = home / f"hub.db{suffix}"
    link.symlink_to(victim)

    async def open_it() -> None:
        async with Hub(SqliteStore(db), background=False) as hub:
            await hub.create_team("u")

    with pytest.raises(StoreError) as err:
        asyncio.run(open_it())
    assert (_mode(victim), victim.read_text()) == (0o644, "<p>for everyone</p>\n")
    message = err.value.message
    assert str(link) in message and "symbolic link" in message and "remove" in message
    assert link.is_symlink(), "the link is the user's to look at, not removed"


# -- files written over at once (backchannel.files.write_atomic) -------------------------


def test_a_file_written_over_keeps_its_mode_and_a_new_one_takes_the_umasks(
    tmp_path: Path,
) -> None:
    private = tmp_path / "config.toml"
    private.write_text("old")
    private.chmod(0o600)
    write_atomic(private, "new")
    assert (private.read_text(), _mode(private)) == ("new", 0o600)

    backup = tmp_path / "config.toml.bak"
    write_atomic(backup, "old", mode_of=private)
    assert _mode(backup) == 0o600

    fresh = tmp_path / "fresh.json"
    old = os.umask(0o027)
    try:
        write_atomic(fresh, "{}")
    finally:
        os.umask(old)
    assert _mode(fresh) == 0o640

    chosen = tmp_path / "server.json"
    chosen.write_text("{}")
    chosen.chmod(0o644)
    write_atomic(chosen, "{}", mode=0o600)
    assert _mode(chosen) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.toml",
        "config.toml.bak",
        "fresh.json",
        "server.json",
    ]


def test_two_writers_of_one_file_at_once_each_write_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second write that starts while the first is between its write and its rename
    (another thread of the same process) uses a temporary file of its own: with one name
    per process, it truncated the first's file and the first's rename found nothing."""
    target = tmp_path / "server.json"
    rename = os.replace
    calls: list[str] = []

    def second_write_first(src: str, dst: str) -> None:
        if not calls:
            calls.append("second")
            write_atomic(target, '{"writer": 2}', mode=0o600)
        rename(src, dst)

    monkeypatch.setattr(os, "replace", second_write_first)
    write_atomic(target, '{"writer": 1}', mode=0o600)
    assert target.read_text() == '{"writer": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["server.json"]


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "taken", "text")
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


def _made_below(root: Path) -> dict[str, int]:
    """Every file and directory below ``root`` (``root`` itself excluded), by path."""
    return {str(p.relative_to(root)): _mode(p) for p in sorted(root.rglob("*"))}


def _private(modes: dict[str, int], root: Path) -> dict[str, int]:
    return {k: 0o700 if (root / k).is_dir() else 0o600 for k in modes}


@pytest.fixture
def umask_000() -> Iterator[None]:
    """The loosest umask a process can run with: nothing the hub makes may rely on it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


async def test_with_umask_000_the_data_directory_and_store_make_private_parents(
    tmp_path: Path, umask_000: None
) -> None:
    """``mkdir(parents=True)`` gives the parents it makes the umask's mode (0777 here):
    a data directory or a SQLite file named below directories that do not exist yet
    must not leave world-writable directories above the hub's private ones."""
    admin_token(tmp_path / "a" / "b" / "home")
    async with Hub(SqliteStore(tmp_path / "s" / "t" / "hub.db"), background=False) as hub:
        await hub.create_team("t")
        made = _made_below(tmp_path)
    assert made == _private(made, tmp_path)


async def test_with_umask_000_inbox_files_and_their_directories_are_private(
    tmp_path: Path, umask_000: None
) -> None:
    """The ``inbox-file`` writer makes a team's inbox directory and a member's inbox when
    missing, and the bridge the directory it watches: under any umask, 0700 and 0600
    (Claude Code, running as the same user, reads and writes them all the same)."""
    root = tmp_path / "claude" / "teams"
    written = InboxWriter(root).append("crew", "worker", msg_id="m1", from_="lead", text="hi")
    assert written.written
    watcher = InboxWatcher("other", root=root)
    watching = asyncio.ensure_future(anext(watcher.watch()))
    try:
        await eventually(lambda: (root / "other" / "inboxes").is_dir(), what="the watch")
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await watching
    made = _made_below(tmp_path)
    assert "claude/teams/crew/inboxes/worker.json" in made
    assert made == _private(made, tmp_path)


async def test_with_umask_000_a_stdin_agents_output_file_and_its_parents_are_private(
    tmp_path: Path, umask_000: None
) -> None:
    agent = StdinAgent(["cat"], stdout=tmp_path / "logs" / "agents" / "lead.log")
    await agent.start()
    await agent.close()
    made = _made_below(tmp_path)
    assert "logs/agents/lead.log" in made
    assert made == _private(made, tmp_path)


async def test_a_stdin_agents_output_file_left_open_to_others_is_narrowed(
    tmp_path: Path,
) -> None:
    """The agent's output holds the messages it was given. An output file that was
    already there, readable by everyone (made by hand, or by a tool with umask 022), was
    appended to as it was: every message the agent got went into a file any user could
    read. Now it is narrowed to 0600 as it is opened; what it held is kept. A path that
    is not a regular file (``/dev/null``, a FIFO) keeps its mode."""
    out = tmp_path / "lead.log"
    out.write_text("the run before\n")
    out.chmod(0o644)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo, 0o644)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens for writing once read
    try:
        for path in (out, fifo):
            agent = StdinAgent(["sh", "-c", "echo said"], stdout=path)
            await agent.start()
            await agent.close()
    finally:
        os.close(reader)
    assert _mode(out) == 0o600
    assert out.read_text().startswith("the run before\n")
    assert _mode(fifo) == 0o644


# -- the admin token's file ---------------------------------------------------------


class _Recorder(Peer):
    """A stand-in hub that records the Authorization header of each request."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                outer.seen.append(self.headers.get("authorization", ""))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                body = b'{"teams": []}'
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.serve(Handler)


def _data_dir(tmp_path: Path, url: str) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    write_atomic(
        home / "server.json",
        json.dumps({"url": url, "pid": os.getpid(), "store": "memory://"}),
        mode=0o600,
    )
    return home


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
    return subprocess.run(
        [str(BIN), *args],
        env={**env, "BACKCHANNEL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_sends_no_token_a_symlink_in_the_data_directory_points_at(
    tmp_path: Path,
) -> None:
    # whoever could write the data directory (one under /tmp, made by someone else)
    # could link admin.token to any file the user can read and server.json to their own
    # address: the CLI would send that file's first line as its bearer token
    secret = tmp_path / "secret"
    secret.write_text("the user's secret\n")
    secret.chmod(0o600)
    peer = _Recorder()
    try:
        home = _data_dir(tmp_path, peer.url)
        (home / "admin.token").symlink_to(secret)
        r = _cli(home, "team", "list")
    finally:
        peer.close()
    assert peer.seen == []
    assert r.returncode == 1
    assert "admin.token" in r.stderr and "symbolic link" in r.stderr, r.stderr
    assert "BACKCHANNEL_TOKEN" in r.stderr


def test_the_cli_refuses_an_admin_token_others_may_read(tmp_path: Path) -> None:
    peer = _Recorder()
    try:
        home = _data_dir(tmp_path, peer.url)
        (home / "admin.token").write_text("bca_exposed\n")
        (home / "admin.token").chmod(0o644)
        r = _cli(home, "team", "list")
        assert peer.seen == []
        assert r.returncode == 1
        assert "others may read" in r.stderr and "chmod 600" in r.stderr, r.stderr
        (home / "admin.token").chmod(0o600)
        r = _cli(home, "team", "list")
        assert r.returncode == 0, r.stderr
        assert peer.seen == ["Bearer bca_exposed"]
    finally:
        peer.close()


def test_serve_neither_follows_nor_narrows_an_admin_token_symlink(tmp_path: Path) -> None:
    # as root, serve on such a directory narrowed the target (say /etc/passwd) to 0600
    # and took its first line as the admin token
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("root:x:0:0:root:/root:/bin/bash\n")
    elsewhere.chmod(0o644)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "admin.token").symlink_to(elsewhere)
    with pytest.raises(InvalidRequest, match="symbolic link"):
        admin_token(home)
    assert _mode(elsewhere) == 0o644
    assert elsewhere.read_text() == "root:x:0:0:root:/root:/bin/bash\n"


def test_a_state_mark_is_made_once_whole_and_private(tmp_path: Path) -> None:
    """The hub's marks (Claude Code teams seen, inbox claims): a file 0600 named after
    its key's hash in a directory made 0700. Made with ``create`` by many writers at
    once, exactly one makes it and it holds that writer's whole text; nothing else is
    left in the directory."""
    folder = tmp_path / "state" / "marks"
    mark = state_mark(folder, "/some/inbox.json")
    assert mark.parent == folder and mark == state_mark(folder, "/some/inbox.json")
    start = threading.Barrier(8)

    def make(i: int) -> bool:
        start.wait(timeout=20)
        return write_mark(mark, f"writer {i}\n" * 1000, create=True)

    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(make, range(8)))
    assert made.count(True) == 1
    assert mark.read_text() == f"writer {made.index(True)}\n" * 1000
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(mark.stat().st_mode) == 0o600
    assert list(folder.iterdir()) == [mark]
    assert write_mark(mark, "replaced\n") and mark.read_text() == "replaced\n"
    assert stat.S_IMODE(mark.stat().st_mode) == 0o600
