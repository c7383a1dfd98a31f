"""Files the hub and its commands write, on a disk that is full (ENOSPC): the old file
stays whole, nothing half written is left behind, and the error names the disk and the
way out. The disk is a small tmpfs of the test's own (:mod:`tests.full_disk`)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backchannel import config
from backchannel.errors import InvalidRequest, StoreError
from backchannel.files import write_atomic
from backchannel.interfaces.cli import app
from backchannel.runtimes import seen
from backchannel.stores.sqlite.backup import backup
from tests.full_disk import fill, small_disk


@pytest.fixture
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    with small_disk(request, tmp_path, "1m") as mount:
        yield mount


def test_a_file_written_over_on_a_full_disk_stays_whole_and_the_error_says_why(
    disk: Path,
) -> None:
    target = disk / "settings.json"
    write_atomic(target, '{"old": true}')
    filler = fill(disk)
    with pytest.raises(OSError) as caught:
        write_atomic(target, '{"new": "' + "x" * 200_000 + '"}')
    message = str(caught.value)
    assert caught.value.errno == 28
    assert f"no space left on the disk holding {disk}" in message
    assert str(target) in message and "free space there" in message
    assert target.read_text() == '{"old": true}'
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "settings.json"]
    filler.unlink()
    write_atomic(target, '{"new": true}')
    assert target.read_text() == '{"new": true}'


def test_an_admin_token_that_cannot_be_written_leaves_no_empty_token_file(disk: Path) -> None:
    """``serve`` on a full disk: the token is not created, and no empty token file is
    left for the next start to read as the admin token."""
    home = disk / "home"
    home.mkdir()
    filler = fill(disk)
    with pytest.raises(OSError) as caught:
        config.admin_token(home)
    assert "no space left on the disk holding" in str(caught.value)
    assert "free space there" in str(caught.value)
    assert not (home / config.ADMIN_TOKEN_FILE).exists()
    assert [p.name for p in home.iterdir() if p.name.startswith(".")] == []
    filler.unlink()
    token = config.admin_token(home)
    assert token and token.startswith("bca_")
    assert config.admin_token(home) == token
    assert (home / config.ADMIN_TOKEN_FILE).stat().st_mode & 0o777 == 0o600


def test_an_empty_admin_token_file_is_refused_naming_the_way_out(tmp_path: Path) -> None:
    """One left behind by an older version that failed mid-write: never an empty token."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / config.ADMIN_TOKEN_FILE).touch(mode=0o600)
    with pytest.raises(InvalidRequest, match=r"is empty.*remove it and `serve` makes a new"):
        config.admin_token(home)


def test_a_backup_onto_a_full_disk_says_so_and_leaves_nothing(disk: Path, tmp_path: Path) -> None:
    source = tmp_path / "hub.db"
    conn = sqlite3.connect(source)
    conn.execute("CREATE TABLE schema_migrations (version INTEGER)")
    conn.execute("INSERT INTO schema_migrations VALUES (1)")
    conn.execute("CREATE TABLE big (x BLOB)")
    conn.execute("INSERT INTO big VALUES (?)", (os.urandom(2 << 20),))
    conn.commit()
    conn.close()
    dest = disk / "backups" / "hub.db"
    with pytest.raises(StoreError) as caught:
        backup(source, dest)
    message = caught.value.message
    assert f"the disk holding {dest} is full" in message
    assert "free space there or name a backup on another disk" in message
    assert list((disk / "backups").iterdir()) == []


def test_attach_on_a_full_disk_keeps_each_config_whole_and_says_what_to_do(disk: Path) -> None:
    project = disk / "project"
    (project / ".claude").mkdir(parents=True)
    settings = project / ".claude" / "settings.local.json"
    settings.write_text('{"permissions": {"allow": ["Bash(ls:*)"]}}')
    fill(disk)
    args = ["attach", "claude-code", "--team", "t", "--member", "w", "--dir", str(project)]
    run = CliRunner().invoke(app, [*args, "--url", "http://127.0.0.1:8765"])
    assert run.exit_code == 1, run.output
    assert run.exception is None or isinstance(run.exception, SystemExit)
    assert "no space left on the disk holding" in run.output
    assert "run `backchannel attach` again" in run.output
    assert settings.read_text() == '{"permissions": {"allow": ["Bash(ls:*)"]}}'
    assert [p.name for p in project.rglob(".*.tmp")] == []


def test_the_hooks_record_of_shown_ids_on_a_full_disk_stays_whole(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook cannot add to its record: it answers all the same (the hub then shows
    those messages again rather than lose them), and the record keeps what it held."""
    monkeypatch.setenv("BACKCHANNEL_STATE_DIR", str(disk / "seen"))
    seen.remember("claude-code", "s-1", ["m-1"])
    fill(disk)
    seen.remember("claude-code", "s-1", [f"m-{n}-" + "x" * 300 for n in range(2, 200)])
    assert seen.recorded("claude-code", "s-1") == ["m-1"]
    assert [p.name for p in (disk / "seen").iterdir() if p.name.endswith(".tmp")] == []
    (disk / "filler").unlink()
    seen.remember("claude-code", "s-1", ["m-2"])
    assert seen.recorded("claude-code", "s-1") == ["m-1", "m-2"]
