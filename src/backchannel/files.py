"""Files the hub and its commands write over: whole, at once, with a mode on purpose.

A reader sees the old text or the new, never half of either: the new text goes to a
temporary file beside the target, which is renamed over it. The temporary file's name is
this call's own (process id and random bytes), created exclusively and never through a
symlink, so two writers (two threads, two processes) never write into one temporary
file, and a file left behind by a crash is never reused with its old mode.

The mode is chosen, never inherited by accident: ``mode`` sets it; without it the file
keeps the mode of ``mode_of`` (default: the file it replaces), so a private config stays
private; a file that is new gets the umask's, as ``open`` would give it. The text is
never readable by others before its mode is set: the temporary file is made 0600 and
widened, if at all, only once it is written.

A disk that is full (or a quota used up) fails the write before the rename: the old
file is left whole, the temporary file removed, and the ``OSError`` (errno kept) names
the disk and the way out rather than a bare "No space left on device".

Only the standard library here: the hook command imports this on every hook.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["narrow", "no_space", "private_dirs", "state_mark", "write_atomic", "write_mark"]


def write_atomic(
    path: Path, text: str, *, mode: int | None = None, mode_of: Path | None = None
) -> None:
    """Replace ``path`` with ``text`` (UTF-8) at once; see the module's docstring.

    Raises ``OSError`` as ``open`` and ``rename`` do (:func:`no_space`'s for a full
    disk); nothing is left behind then, and ``path`` is as it was."""
    if mode is None:
        try:
            mode = stat.S_IMODE((mode_of or path).stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise no_space(exc, path) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if mode != 0o600:
                os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise no_space(exc, path) from exc
        raise


def no_space(exc: OSError, path: Path) -> OSError:
    """``exc`` itself, unless it says the disk (or the user's quota) is full: then an
    ``OSError`` of the same errno that names the disk holding ``path`` and the way out,
    for a message that reaches the person who can free the space."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    what = "no space left" if exc.errno == errno.ENOSPC else "the disk quota is used up"
    return OSError(
        exc.errno,
        f"{what} on the disk holding {path.parent}, so {path} was not written (the file "
        "there, if any, is as it was): free space there, then try again",
    )


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it
    (``/proc/self/status``); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def narrow(fd: int, path: Path) -> None:
    """Make the regular file open as ``fd`` private (0600) if it is open to others: a
    file the hub appends to that was there before it (an agent's output named in a
    delivery setting). What is not a regular file (``/dev/null``, a FIFO, a terminal)
    keeps its mode. A file the hub may not change (another user's) is left as it is,
    with a warning naming it."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not stat.S_IMODE(st.st_mode) & 0o077:
        return
    try:
        os.fchmod(fd, 0o600)
    except OSError as exc:
        log.warning(
            "%s is open to other users (mode %o) and could not be made private (%s); "
            "what the hub writes there can be read by them: chmod 600 it",
            path, stat.S_IMODE(st.st_mode), exc.strerror or exc,
        )  # fmt: skip


def private_dirs(folder: Path) -> None:
    """``folder`` and every missing directory above it, created 0700 (as the XDG base
    directory spec asks; ``mkdir(parents=True)`` would give the parents the umask's)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


def state_mark(folder: Path, key: str) -> Path:
    """The mark for ``key`` in ``folder`` (a directory of the hub's private state): a
    file named after the key's hash, so any key (a path, say) makes a safe name."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return folder / digest[:32]


def write_mark(mark: Path, text: str, *, create: bool = False) -> bool:
    """Write the mark ``mark`` (:func:`state_mark`) whole, at once: 0600, in a
    directory made 0700 if missing. ``create``: only if there is none yet, atomically
    (a reader never sees it empty or half written; of two writers at once, one makes
    it): ``False`` when one was there. Raises ``OSError`` as :func:`write_atomic`."""
    private_dirs(mark.parent)
    if not create:
        write_atomic(mark, text, mode=0o600)
        return True
    tmp = mark.with_name(f".{mark.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.link(tmp, mark)  # fails, never replaces, when the mark is there
        except FileExistsError:
            return False
        return True
    except OSError as exc:
        raise no_space(exc, mark) from exc
    finally:
        tmp.unlink(missing_ok=True)
