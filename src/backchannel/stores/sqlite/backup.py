"""A consistent copy of a SQLite store, taken while hubs write to it (``backchannel
backup``).

Copying the file with ``cp`` is not a backup: the hub runs SQLite in WAL mode, and what
it committed last lives in ``FILE-wal`` until a checkpoint moves it into ``FILE``. A copy
of ``FILE`` alone misses those sends and acks (a message acked again, one sent lost), and
a copy of the two taken one after the other can pair a ``FILE`` and a ``FILE-wal`` of
different moments. SQLite's online backup copies the database as one read transaction
sees it, the WAL's commits included, so the copy is one moment of the store: every
message with its deliveries, every ack with its message.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from backchannel.errors import StoreError
from backchannel.files import no_space, private_dirs

__all__ = ["backup"]

_SQLITE_HEADER = b"SQLite format 3\x00"


def backup(source: Path, dest: Path) -> int:
    """Copy the store at ``source`` to the new file ``dest`` (0600, as the store itself),
    in one read transaction of ``source``: hubs go on writing meanwhile and wait for
    nothing. Returns the copy's schema version. ``dest`` must not exist (a backup never
    overwrites); if anything fails, no ``dest`` is left behind."""
    if not source.is_file():
        raise StoreError(
            f"there is no SQLite store at {source}: name the database file of a hub "
            "(--store sqlite:///path, or the data directory with --home)"
        )
    with source.open("rb") as f:
        head = f.read(len(_SQLITE_HEADER))
    if head != _SQLITE_HEADER:
        raise StoreError(f"{source} is not a SQLite database, not a backchannel store")
    if dest.exists() or dest.is_symlink():
        raise StoreError(
            f"{dest} exists; a backup never overwrites a file: name a new one (or remove "
            "that one first)"
        )
    try:
        private_dirs(dest.parent)
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise StoreError(f"cannot create the backup {dest}: {no_space(exc, dest)}") from exc
    try:
        return _copy(source, dest)
    except BaseException:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                os.unlink(f"{dest}{suffix}")
        raise


def _copy(source: Path, dest: Path) -> int:
    src = sqlite3.connect(source, timeout=30.0)
    try:
        src.execute("PRAGMA busy_timeout = 30000")
        try:
            names = {r[0] for r in src.execute("SELECT name FROM sqlite_master")}
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the SQLite store {source}: {exc}") from exc
        if "schema_migrations" not in names:
            raise StoreError(
                f"{source} is a SQLite database of something else (or an empty one), not "
                "a backchannel store; nothing was copied"
            )
        dst = sqlite3.connect(dest)
        try:
            # pages=-1: the whole database in one step, so in one read transaction of
            # the source (a backup in steps starts over when a hub commits between them)
            src.backup(dst, pages=-1)
            check = dst.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StoreError(
                    f"the copy of {source} fails SQLite's check ({check}): the store "
                    "itself is damaged; stop the hub and recover it with `sqlite3 FILE "
                    ".recover`"
                )
            row = dst.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
        finally:
            dst.close()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL:
            # the source is only read: what is full is the disk the copy goes to
            raise StoreError(
                f"cannot back up the SQLite store {source}: the disk holding {dest} is "
                "full; nothing was left there: free space there or name a backup on "
                "another disk, then run the backup again"
            ) from exc
        raise StoreError(f"cannot back up the SQLite store {source}: {exc}") from exc
    finally:
        src.close()
    return int(row[0] or 0)
