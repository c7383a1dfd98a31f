"""The data directory and store URLs.

``$BACKCHANNEL_HOME`` (default ``./.backchannel``) holds the SQLite file
(``backchannel.db``), the admin token (``admin.token``, written on first start),
``server.json``, where a running ``backchannel serve`` says where it listens so that the
CLI finds it without ``BACKCHANNEL_URL``, and the operator's ``config.yaml``.

Everything in it is private to the user the hub runs as: the directory is 0700, the
files 0600 (the SQLite store creates its database, ``-wal`` and ``-shm`` the same way;
``config.yaml``, which holds the callback secret, is narrowed to 0600 too).
A directory or file left more open by an older version is narrowed when ``serve`` starts;
a directory that is not the hub's own (``/tmp`` or a home named by mistake: it holds
files, none of them the hub's) keeps its mode, and the hub's files in it are 0600 all
the same.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from backchannel.errors import InvalidRequest
from backchannel.files import no_space, private_dirs, write_atomic
from backchannel.stores.base import Store

ADMIN_TOKEN_FILE = "admin.token"
SERVER_FILE = "server.json"
DB_FILE = "backchannel.db"
#: The operator's configuration (:mod:`backchannel.callbacks`): it holds the callback
#: secret and other hubs' tokens, so it is private like the hub's own files.
CONFIG_FILE = "config.yaml"
#: The port ``backchannel serve`` listens on unless told otherwise; where ``attach``
#: looks for a hub when none is recorded (:func:`default_hub_url`).
DEFAULT_PORT = 8765


def default_hub_url() -> str:
    """The URL of a hub started with ``backchannel serve`` and no ``--host``/``--port``."""
    return f"http://127.0.0.1:{DEFAULT_PORT}"


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
    if it is the hub's own: empty, or holding a file the hub writes there; the
    ``config.yaml`` in one of the hub's own is narrowed to 0600. Any other directory
    (``/tmp``, a home directory) keeps its mode, and so does every existing parent; a
    parent made here is 0700 (``mkdir(parents=True)`` would give it the umask's)."""
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
    private_file(path / CONFIG_FILE)  # the hub's configuration, in a directory of its own


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
    """Narrow an existing file to 0600 (nothing if it is not there). A symbolic link is
    left alone: what it points at is not the hub's (the hub's writes replace the link)."""
    with contextlib.suppress(FileNotFoundError):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != FILE_MODE:
            path.chmod(FILE_MODE)


def admin_token(data_dir: Path, *, create: bool = True) -> str | None:
    """The admin token. With ``create`` (what ``serve`` does at start) the data directory
    is made private first (0700, its files 0600) and the token is created (0600) if it
    is not there yet. The token's file must be a file of its own in the directory, not
    a symbolic link; read without ``create`` (a command of the CLI, which sends it to
    the address ``server.json`` names) it must be the user's and open to no one else."""
    path = data_dir / ADMIN_TOKEN_FILE
    if create:
        private_dir(data_dir)
        private_file(data_dir / SERVER_FILE)
    token = _read_token(path, narrow=create)
    if token is not None or not create:
        return token
    token = "bca_" + secrets.token_urlsafe(32)
    # written whole beside it, then linked in place (which, as an exclusive create,
    # never replaces a token another process made meanwhile): a disk that fills part
    # way leaves no empty or cut token file for the next start to read
    tmp = data_dir / f".{ADMIN_TOKEN_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            try:
                os.link(tmp, path)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                _create_whole(path, token)  # a filesystem without hard links
        finally:
            tmp.unlink(missing_ok=True)
    except FileExistsError:  # another process won the race; use its token
        return _read_token(path, narrow=create)
    except OSError as exc:
        raise no_space(exc, path) from exc
    return token


def _create_whole(path: Path, token: str) -> None:
    """Create ``path`` (exclusively) holding ``token``, removed again if the write fails."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _read_token(path: Path, *, narrow: bool) -> str | None:
    """The token in ``path`` (None: no such file), read without following a symbolic
    link. ``narrow``: a file open to others is narrowed to 0600 (``serve``); else it is
    refused, and so is a file of another user."""
    way_out = (
        "or remove it and `serve` makes a new token"
        if narrow
        else "or set BACKCHANNEL_TOKEN to the admin token instead"
    )
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():
            raise InvalidRequest(
                f"{path} is a symbolic link (to {os.readlink(path)}); the admin token is "
                f"read only from a file of its own there: put the token in it, {way_out}"
            ) from None
        raise InvalidRequest(f"cannot read {path}: {exc.strerror or exc}; {way_out}") from None
    with os.fdopen(fd, "r") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InvalidRequest(f"{path} is not a regular file; {way_out}")
        mode = stat.S_IMODE(st.st_mode)
        if not narrow and st.st_uid != os.geteuid():
            raise InvalidRequest(
                f"{path} belongs to another user (uid {st.st_uid}); the admin token is "
                f"read only from your own file: {way_out}"
            )
        if mode & 0o077:
            if not narrow:
                raise InvalidRequest(
                    f"{path} is open to other users (mode {mode:04o}): others may read the "
                    f"admin token. chmod 600 it (`serve` narrows it when it starts), "
                    f"{way_out}"
                )
            os.fchmod(f.fileno(), FILE_MODE)
        token = f.read().strip()
    if not token:
        raise InvalidRequest(
            f"{path} is empty (a write of it that failed, on a full disk, may have left "
            f"it so): put the admin token in it, {way_out}"
        )
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


def hub_http_url(url: str) -> str | None:
    """A running hub's ``url`` as the clients use it (the scheme in lower case, as RFC
    3986 reads it, and no trailing slash); None when ``url`` is not ``http(s)://``.
    Raises ``InvalidRequest`` for a query, a fragment or a user and password: each would
    be sent mangled (the paths go after the query) or where it does not belong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return None
    parts = urlsplit(f"{scheme.lower()}://{rest}")
    extra = next(
        (
            what
            for what, there in (
                ("a query", parts.query or url.endswith("?")),
                ("a fragment", parts.fragment or "#" in url),
                ("a user name or password", "@" in parts.netloc),
            )
            if there
        ),
        None,
    )
    if extra is not None:
        bare = urlunsplit(
            parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="")
        )
        raise InvalidRequest(
            f"the hub's URL {redact_url(url)!r} holds {extra}, which has no place there: "
            f"give {bare.rstrip('/')!r} (with a path prefix when the hub is served below one), "
            "and the member's token in BACKCHANNEL_TOKEN"
        )
    return urlunsplit(parts).rstrip("/")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def open_store(
    url: str, *, pg_heartbeat: float | None = None, pg_frozen_after: float | None = None
) -> Store:
    """A store for ``memory://``, ``sqlite:///path`` (or a plain path) or ``postgresql://``.
    ``pg_heartbeat`` and ``pg_frozen_after`` (seconds; ``None``: the defaults) set the
    PostgreSQL listener's heartbeat and how long it goes unanswered before the hub asks
    whether the server is frozen; given for another store, they are refused."""
    postgres = url.startswith(("postgresql://", "postgres://"))
    given = [
        name
        for name, value in (
            ("--pg-heartbeat", pg_heartbeat),
            ("--pg-frozen-after", pg_frozen_after),
        )
        if value is not None
    ]
    if given and not postgres:
        raise InvalidRequest(
            f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} only to a PostgreSQL store, and the store is "
            f"{redact_url(url)!r}: drop them, or give --store postgresql://..."
        )
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
        from backchannel.stores.postgres.store import (
            FROZEN_AFTER,
            HEARTBEAT_EVERY,
            check_heartbeat,
        )

        every = HEARTBEAT_EVERY if pg_heartbeat is None else pg_heartbeat
        after = FROZEN_AFTER if pg_frozen_after is None else pg_frozen_after
        try:
            check_heartbeat(every, after, ("--pg-heartbeat", "--pg-frozen-after"))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        return PostgresStore(url, heartbeat_every=every, frozen_after=after)
    if url.startswith("sqlite://") or "://" not in url:
        from backchannel.stores.sqlite import SqliteStore

        return SqliteStore(url)
    raise InvalidRequest(
        f"unknown store URL {redact_url(url)!r}; use sqlite:///path/to/file.db, "
        "postgresql://user:pass@host/db or memory://"
    )
