"""The data directory and store URLs.

``$BACKCHANNEL_HOME`` (default ``./.backchannel``) holds the SQLite file
(``backchannel.db``), the admin token (``admin.token``, mode 0600, written on first
start) and ``server.json``, where a running ``backchannel serve`` says where it listens
so that the CLI finds it without ``BACKCHANNEL_URL``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from backchannel.errors import InvalidRequest
from backchannel.stores.base import Store

ADMIN_TOKEN_FILE = "admin.token"
SERVER_FILE = "server.json"
DB_FILE = "backchannel.db"


def home(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("BACKCHANNEL_HOME") or ".backchannel").absolute()


def default_store_url(data_dir: Path) -> str:
    return f"sqlite://{data_dir / DB_FILE}"


def admin_token(data_dir: Path, *, create: bool = True) -> str | None:
    """The admin token, created (mode 0600) on first use when ``create`` is true."""
    path = data_dir / ADMIN_TOKEN_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if not create:
            return None
    data_dir.mkdir(parents=True, exist_ok=True)
    token = "bca_" + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race; use its token
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def write_server_info(data_dir: Path, url: str, store_url: str) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f".{SERVER_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "store": store_url}))
    tmp.replace(data_dir / SERVER_FILE)


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
