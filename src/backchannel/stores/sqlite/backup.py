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

import errno
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from backchannel.errors import StoreError
from backchannel.files import no_space, private_dirs

__all__ = ["backup"]

_SQLITE_HEADER = b"SQLite format 3\x00"


def backup(source: Path, dest: Path) -> int:
    """Copy the store at ``source`` to the new file ``dest`` (0600, as the store itself),
    in one read transaction of ``source``: hubs go on writing meanwhile and wait for
    nothing. Returns the copy's schema version. ``dest`` must not exist (a backup never
    overwrites); if anything fails, no ``dest`` is left behind.

    The copy is written in a directory of its own (0700, beside ``dest``, named
    ``.NAME.*.partial``), where nobody else can put a link, and is given its name only
    once whole (:func:`_publish`): a link put at ``dest`` meanwhile is never written
    through, and a backup killed midway leaves nothing named like a backup."""
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
        raise _exists(dest)
    try:
        private_dirs(dest.parent)
        work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    except OSError as exc:
        raise StoreError(f"cannot create the backup {dest}: {no_space(exc, dest)}") from exc
    try:
        copy = work / "copy.db"
        os.close(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        version = _copy(source, copy, dest)
        _publish(copy, dest)
        return version
    except OSError as exc:
        raise StoreError(f"cannot create the backup {dest}: {no_space(exc, dest)}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _exists(dest: Path) -> StoreError:
    return StoreError(
        f"{dest} exists; a backup never overwrites a file: name a new one (or remove "
        "that one first)"
    )


def _publish(copy: Path, dest: Path) -> None:
    """Give the whole ``copy`` the name ``dest``, never replacing what is there (a file,
    or a link someone put there while the copy was taken): a hard link, which fails
    when the name is taken. Where the file system has none, ``dest`` is created
    exclusively and the copy renamed over it (a rename replaces a link put there since,
    and never writes through it)."""
    try:
        os.link(copy, dest, follow_symlinks=False)
        return
    except FileExistsError:
        raise _exists(dest) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
    try:
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        raise _exists(dest) from None
    os.replace(copy, dest)


def _copy(source: Path, copy: Path, dest: Path) -> int:
    """Copy ``source`` into the empty database ``copy`` (what becomes ``dest``, the name
    errors give)."""
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
        dst = sqlite3.connect(copy)
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
