"""The data directory and store URLs.

``$BACKCHANNEL_HOME`` (default ``./.backchannel``) holds the SQLite file
(``backchannel.db``), the admin token (``admin.token``, written on first start) and
``server.json``, where a running ``backchannel serve`` says where it listens so that the
CLI finds it without ``BACKCHANNEL_URL``.

Everything in it is private to the user the hub runs as: the directory is 0700, the
files 0600 (the SQLite store creates its database, ``-wal`` and ``-shm`` the same way).
A directory or file left more open by an older version is narrowed when ``serve`` starts;
a directory that is not the hub's own (``/tmp`` or a home named by mistake: it holds
files, none of them the hub's) keeps its mode, and the hub's files in it are 0600 all
the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from backchannel.errors import InvalidRequest
from backchannel.files import private_dirs, write_atomic
from backchannel.stores.base import Store

ADMIN_TOKEN_FILE = "admin.token"
SERVER_FILE = "server.json"
DB_FILE = "backchannel.db"


def home(path: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``path``, else ``$BACKCHANNEL_HOME``, else ``./.backchannel``.
    Raises ``InvalidRequest`` when something other than a directory is there."""
    found = Path(path or os.environ.get("BACKCHANNEL_HOME") or ".backchannel").absolute()
    if found.exists() and not found.is_dir():
        raise InvalidRequest(
            f"the data directory {found} is not a directory; point --home or "
            "BACKCHANNEL_HOME at a directory (it is created when missing)"
        )
    return found


def default_store_url(data_dir: Path) -> str:
    return f"sqlite://{data_dir / DB_FILE}"


#: Modes of the data directory and of every file the hub writes in it.
DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) as 0700, or narrow an existing one to 0700
    if it is the hub's own: empty, or holding a file the hub writes there. Any other
    directory (``/tmp``, a home directory) keeps its mode, and so does every existing
    parent; a parent made here is 0700 (``mkdir(parents=True)`` would give it the
    umask's)."""
    try:
        private_dirs(path.parent)
        path.mkdir(mode=DIR_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise _no_data_dir(path, "it is a file, not a directory") from None
        if not _hubs_own(path):
            return
    except OSError as exc:
        raise _no_data_dir(path, exc.strerror or str(exc)) from None
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        path.chmod(DIR_MODE)


def _no_data_dir(path: Path, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"cannot create the data directory {path}: {why}; point --home or "
        "BACKCHANNEL_HOME at a directory you may write"
    )


def _hubs_own(path: Path) -> bool:
    if any((path / name).exists() for name in (ADMIN_TOKEN_FILE, SERVER_FILE, DB_FILE)):
        return True
    with os.scandir(path) as entries:
        return next(entries, None) is None


def private_file(path: Path) -> None:
    """Narrow an existing file to 0600 (nothing if it is not there)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(path.stat().st_mode) != FILE_MODE:
            path.chmod(FILE_MODE)


def admin_token(data_dir: Path, *, create: bool = True) -> str | None:
    """The admin token. With ``create`` (what ``serve`` does at start) the data directory
    is made private first (0700, its files 0600) and the token is created (0600) if it
    is not there yet."""
    path = data_dir / ADMIN_TOKEN_FILE
    if create:
        private_dir(data_dir)
        for name in (ADMIN_TOKEN_FILE, SERVER_FILE):
            private_file(data_dir / name)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if not create:
            return None
    token = "bca_" + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race; use its token
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def write_server_info(data_dir: Path, url: str, store_url: str) -> None:
    private_dir(data_dir)
    info = {"url": url, "pid": os.getpid(), "store": store_url}
    write_atomic(data_dir / SERVER_FILE, json.dumps(info), mode=FILE_MODE)


def read_server_info(data_dir: Path) -> dict[str, Any] | None:
    """What ``serve`` wrote, if that server process is still alive."""
    try:
        info: dict[str, Any] = json.loads((data_dir / SERVER_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    pid = info.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    return info


def clear_server_info(data_dir: Path) -> None:
    info = read_server_info(data_dir)
    if info is None or info.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            (data_dir / SERVER_FILE).unlink()


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def open_store(url: str) -> Store:
    """A store for ``memory://``, ``sqlite:///path`` (or a plain path) or ``postgresql://``."""
    if url in ("memory", "memory://"):
        from backchannel.stores.memory import MemoryStore

        return MemoryStore()
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from backchannel.stores.postgres import PostgresStore
        except ImportError as exc:
            raise InvalidRequest(
                "the PostgreSQL store needs the 'postgres' extra: pip install 'backchannel[postgres]'"
            ) from exc
        return PostgresStore(url)
    if url.startswith("sqlite://") or "://" not in url:
        from backchannel.stores.sqlite import SqliteStore

        return SqliteStore(url)
    raise InvalidRequest(
        f"unknown store URL {redact_url(url)!r}; use sqlite:///path/to/file.db, "
        "postgresql://user:pass@host/db or memory://"
    )
