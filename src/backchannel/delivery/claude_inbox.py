"""Claude Code agent-team inbox files: a writer that never loses a message, and a watcher.

Claude Code gives each teammate an inbox file ``{root}/{team}/inboxes/{member}.json``
(``root`` is ``$CLAUDE_CONFIG_DIR/teams``, by default ``~/.claude/teams``): a JSON array,
pretty-printed with 2-space indents, of entries
``{from, text, summary?, timestamp, color?, msgV, msg_id, type: "message", read}``.
Writers hold a ``proper-lockfile`` lock: the *directory* ``<inbox>.json.lock``, made with
``mkdir``, stale once its mtime is over 10 s old, its mtime refreshed while held.

:class:`InboxWriter` takes the same lock, so it interleaves safely with Claude Code's own
writers, and it promises more than they do:

* it takes a stale lock over so that two of the hub's writers (threads or processes)
  that find it stale at once never both hold it: one removes and remakes it, under a
  ``flock`` on the stale directory and after checking it is still that directory and
  still stale, and the other sees the new lock (:class:`InboxLock`). proper-lockfile's
  take-over (``stat``, ``rmdir``, ``mkdir``) has no such step, so against Claude Code's
  writers a take-over races as it does between two of them; the lock left behind is the
  same empty directory either way;
* it never gives up silently: it retries until a deadline, then raises
  :class:`InboxWriteError`, and the hub does not acknowledge the message;
* the new array goes to ``<inbox>.json.tmp.<hex>``, is fsynced, renamed over the inbox,
  the directory fsynced, and the file read back to check the entry is there; a new
  inbox (``[]``) is written whole beside its place and linked in, so a disk that fills
  part way leaves the inbox as it was (or absent), never empty or cut, and no
  temporary file: the error names the full disk, and the hub tries the message again;
* an append whose ``msg_id`` is already in the inbox writes nothing (idempotent), if
  that entry has the append's ``from`` and ``text``; another entry under the id (one
  planted there) is never taken for it (:class:`InboxIdTaken`);
* an inbox that is not a JSON array is moved aside to ``<inbox>.json.corrupt-<UTC>``
  with a warning, never overwritten with a partial view;
* a team Claude Code deleted (its config directory, named by another sanitizer than its
  inbox directory (:func:`config_dir`), seen holding ``config.json``, which
  ``TeamCreate`` writes, and gone since) is not made again: :class:`InboxTeamDeleted`;
  what was seen is marked in the hub's state directory, so it holds after a restart;
* other writers' entries are kept byte for byte (the text is appended to, not
  re-serialized), except when pruning drops old *read* entries past ``max_entries``.

Crash contract: if the process dies after the rename but before the hub records the
delivery, the hub delivers again and the retry finds the ``msg_id`` and writes nothing.
If the reader had already consumed and pruned the entry, it is written a second time:
delivery is at least once, and the ``msg_id`` lets a reader drop the copy.

:class:`InboxWatcher` covers the other direction (entries agents write into other
inboxes, e.g. ``user.json``); :func:`member_state_from_entry` maps them to member states.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import random
import re
import secrets
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from backchannel.errors import InboxWriteError
from backchannel.files import no_space, private_dirs, state_mark, write_mark

if TYPE_CHECKING:
    import anyio

__all__ = [
    "ACTIVE_WINDOW_S",
    "LOCK_STALE_S",
    "MAX_INBOX_BYTES",
    "MAX_NAME",
    "AppendResult",
    "InboxIdTaken",
    "InboxLock",
    "InboxNotAFile",
    "InboxTeamDeleted",
    "InboxTooBig",
    "InboxWatcher",
    "InboxWriteError",
    "InboxWriter",
    "MemberState",
    "Stamp",
    "config_dir",
    "config_dir_name",
    "default_root",
    "entry_id",
    "entry_ids",
    "file_stamp",
    "inbox_dir_name",
    "inbox_path",
    "is_active",
    "js_timestamp",
    "member_state_from_entry",
    "name_problem",
    "protocol_message",
    "read_inbox",
    "read_inbox_or_none",
    "stable_id",
    "stamp_settled",
    "team_deleted",
    "team_marked",
    "team_marks",
    "unsafe_dirs",
]

logger = logging.getLogger("backchannel.delivery.claude_inbox")

#: proper-lockfile's default ``stale``: a lock whose mtime is older than this is dead.
LOCK_STALE_S = 10.0
#: An inbox file larger than this is neither read nor rewritten (see :func:`read_inbox`).
MAX_INBOX_BYTES = 32 * 1024 * 1024
#: A member counts as active this long after its last message.
ACTIVE_WINDOW_S = 300.0
#: The values of :class:`backchannel.types.SessionState`.
MemberState = Literal["active", "idle", "terminated"]

#: The longest team or inbox name the writer takes: the inbox's file name grows by up
#: to 41 characters (``.json.corrupt-<UTC>-<n>``) and a name holds at most 255 bytes.
MAX_NAME = 200

# Claude Code (2.1.332) names a team's two directories with two different sanitizers:
#   inboxes:     teams/<t>/inboxes/<a>.json, t and a each  .replace(/[^a-zA-Z0-9_-]/g, "-")
#   config.json: teams/<t>/config.json, t  .replace(/[^a-zA-Z0-9]/g, "-").toLowerCase()
# (TeamCreate writes the config; TeamDelete removes that directory only). Both JavaScript
# regexes are without the ``u`` flag: they match UTF-16 code units, so a character past
# U+FFFF (two units) becomes two "-". So "My_Team" keeps its inboxes in My_Team/ and its
# config in my-team/.
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_CONFIG_UNSAFE = re.compile(r"[^a-zA-Z0-9]")


def _js_sub(pattern: re.Pattern[str], name: str) -> str:
    """``name.replace(pattern, "-")`` as JavaScript does it without the ``u`` flag: each
    UTF-16 code unit of a character that does not match becomes one ``-``."""
    return pattern.sub(lambda m: "-" * (2 if ord(m.group()) > 0xFFFF else 1), name)


def inbox_dir_name(name: str) -> str:
    """The name Claude Code gives a team's inbox directory, or an inbox file (its stem)."""
    return _js_sub(_UNSAFE, name)


def config_dir_name(team: str) -> str:
    """The name of the directory Claude Code keeps team ``team``'s ``config.json`` in
    (and removes at ``TeamDelete``). The same for the inbox directory's name in place of
    ``team``: what the inbox sanitizer keeps, this one makes ``-`` or lowers too."""
    return _js_sub(_CONFIG_UNSAFE, team).lower()


def config_dir(team_dir: Path | str) -> Path:
    """The directory of the ``config.json`` of the team whose inboxes are in
    ``team_dir`` (``<teams>/<inbox_dir_name(team)>``): ``<teams>/<config_dir_name>``."""
    d = Path(team_dir)
    return d.parent / config_dir_name(d.name)


@dataclass(frozen=True, slots=True)
class AppendResult:
    written: bool  # this call added the entry
    already_present: bool  # an entry with this msg_id was there; nothing written
    path: Path
    lock_wait_s: float  # time spent waiting for the lock, all attempts together


# --------------------------------------------------------------------------- format


def default_root() -> Path:
    """Where Claude Code keeps teams: ``$CLAUDE_CONFIG_DIR/teams`` or ``~/.claude/teams``."""
    config = os.environ.get("CLAUDE_CONFIG_DIR")
    return (Path(config).expanduser() if config else Path.home() / ".claude") / "teams"


def inbox_path(team: str, member: str, root: Path | str | None = None) -> Path:
    """``member``'s inbox; names sanitized as Claude Code does (:func:`inbox_dir_name`)."""
    base = Path(root).expanduser() if root is not None else default_root()
    return base / inbox_dir_name(team) / "inboxes" / f"{inbox_dir_name(member)}.json"


def team_marks() -> Path:
    """The directory where the hub marks the Claude Code team directories its inbox
    writers have seen holding ``config.json`` (made by ``TeamCreate``): ``claude-teams``
    in the hub's private state directory (``$BACKCHANNEL_STATE_DIR``, else under
    ``$XDG_STATE_HOME``), 0700, each mark a file 0600. Never in Claude Code's own files:
    the marks outlive the hub's process, so a team deleted while the hub was down (or
    before it restarted) is known deleted all the same."""
    from backchannel.runtimes.seen import state_dir

    return state_dir() / "claude-teams"


def _mark_of(team_dir: Path | str, marks: Path) -> Path:
    return state_mark(marks, os.path.abspath(team_dir))


def team_marked(team_dir: Path | str, marks: Path | None = None) -> bool:
    """Whether an inbox writer on this host saw the config directory of the team whose
    inboxes are in ``team_dir`` (:func:`config_dir`) holding ``config.json``."""
    try:
        return _mark_of(config_dir(team_dir), marks or team_marks()).exists()
    except OSError:
        return False


def team_deleted(team_dir: Path | str, marks: Path | None = None) -> bool:
    """Whether the team whose inboxes are in ``team_dir`` is a Claude Code team deleted
    since (``TeamDelete``): its config directory (:func:`config_dir`, named by another
    sanitizer than ``team_dir``) seen holding ``config.json`` (:func:`team_marked`), and
    holding none now."""
    return not (config_dir(team_dir) / "config.json").exists() and team_marked(team_dir, marks)


def name_problem(what: str, name: str) -> str | None:
    """Why ``name`` cannot name a Claude Code team or inbox (``what``) on disk, else
    ``None``: longer than :data:`MAX_NAME`, the directory, the inbox's lock or its
    temporary file could not be made, and every write would fail."""
    if len(name) <= MAX_NAME:
        return None
    return (
        f"the Claude Code {what} name {name[:20]!r}... is too long ({len(name)} characters, "
        f"at most {MAX_NAME}): the inbox's files could not be named on disk; use a shorter "
        f"{what!r} in the member's delivery setting"
    )


def unsafe_dirs(path: Path | str) -> str | None:
    """Why the directories of the inbox ``path`` are not safe to write in, else ``None``.

    The inbox's team directory and its ``inboxes`` directory must not be symlinks (the
    inbox's path would lead to a directory elsewhere, whose ``<name>.json`` the writer
    would rewrite or move aside), and neither they nor the teams root may be owned by
    another user or writable by other users (such a user could put a symlink there
    between the writer's look and its write). Group-writable is allowed: a umask of
    002 (a user's private group) makes them so, Claude Code's directories included.
    The root itself may be a symlink (``~/.claude`` kept elsewhere); what it leads to is
    checked. A directory not there yet is fine: the writer makes it, 0700."""
    inboxes = Path(path).parent
    uid = os.geteuid()
    for d, follow in ((inboxes.parent.parent, True), (inboxes.parent, False), (inboxes, False)):
        try:
            st = os.stat(d) if follow else os.lstat(d)
        except FileNotFoundError:
            return None  # nor anything below it: made by the writer
        except OSError as exc:
            return f"{d} cannot be looked at ({exc.strerror})"
        if stat.S_ISLNK(st.st_mode):
            name = str(d)
            with contextlib.suppress(OSError):
                name = f"{d} (to {os.readlink(d)})"
            return (
                f"{name} is a symlink, not a directory: the hub does not write inboxes through "
                "it. Put the directory itself in its place"
            )
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a directory; move it away and the hub makes the directory"
        if st.st_uid != uid:
            return (
                f"{d} is owned by user id {st.st_uid}, not this user ({uid}), who could "
                "replace what lies in it; the hub writes inboxes only in its own directories"
            )
        if st.st_mode & stat.S_IWOTH:
            return (
                f"{d} is mode {stat.S_IMODE(st.st_mode):04o}: other users may write it "
                f"and replace what lies in it; run chmod o-w {d}"
            )
    return None


def js_timestamp(when: float | None = None) -> str:
    """``new Date().toISOString()``: UTC, millisecond precision, ``Z`` suffix."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def stable_id(entry: Mapping[str, Any]) -> str:
    """The id of an entry written without one: ``sha256(from + timestamp + text)``.

    Exactly as the research's reader computes it (``buildLegacyInboxMessageId``):
    ``"inbox-" + sha256(from + "\\n" + timestamp + "\\n" + text)``, first 16 hex digits,
    so both name the same entry alike. The newlines keep ``("ab", t, "c")`` and
    ``("a", t, "bc")``-style splits apart. Claude Code itself matches entries on these
    three fields, and none of them changes when the entry is marked read, so the id is
    the same on every read.
    """
    parts = (entry.get(k) for k in ("from", "timestamp", "text"))
    key = "\n".join(p if isinstance(p, str) else "" if p is None else json.dumps(p) for p in parts)
    return "inbox-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def entry_id(entry: Mapping[str, Any]) -> str:
    """The entry's id: its ``msg_id`` (Claude Code's key), else its ``messageId`` (the key
    other tools write), else :func:`stable_id`. Empty or non-string ids do not count."""
    for key in ("msg_id", "messageId"):
        value = entry.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return stable_id(entry)


def entry_ids(entry: Mapping[str, Any]) -> set[str]:
    """Every id the entry answers to: ``msg_id`` and ``messageId`` when both are set, so an
    append of either id finds it."""
    ids = {entry_id(entry)}
    for key in ("msg_id", "messageId"):
        value = entry.get(key)
        if isinstance(value, str) and value.strip():
            ids.add(value)
    return ids


def _decode(data: bytes | str) -> list[Any]:
    """Parse an inbox; ``ValueError`` unless it is a JSON array. Blank counts as ``[]``:
    that is what a reader sees between Claude Code's exclusive create and its ``[]``."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    value = json.loads(text) if text.strip() else []
    if not isinstance(value, list):
        raise ValueError(f"top level is {type(value).__name__}, not an array")
    return value


class InboxTooBig(OSError):
    """An inbox file over the size the hub reads (:data:`MAX_INBOX_BYTES`)."""

    def __init__(self, path: Path | str, size: int, limit: int) -> None:
        super().__init__(
            f"inbox {path} holds {size / 2**20:.1f} MiB, more than the {limit / 2**20:.0f} "
            "MiB the hub reads or rewrites; clear its read entries (or move it aside) "
            "and the hub writes to it again"
        )


class InboxNotAFile(OSError):
    """Something other than a regular file (a FIFO, a device, a socket, a directory) in
    an inbox's place: it is neither read (a FIFO would block the read) nor replaced."""

    def __init__(self, path: Path | str, mode: int) -> None:
        kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
                 stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket",
                 stat.S_IFDIR: "a directory"}  # fmt: skip
        kind = kinds.get(stat.S_IFMT(mode), "not a file")
        super().__init__(
            f"inbox {path} is not a regular file ({kind}); the hub neither reads nor "
            "replaces it: move it away and the hub writes the inbox there"
        )


class InboxIdTaken(InboxWriteError):
    """The inbox holds an entry under the message's id that is not the one the hub
    writes (another ``from`` or ``text``): anything running as the user can write any
    entry, and one planted under the id of a message the hub is about to deliver would
    otherwise be taken for it, the message reported delivered while the agent read the
    other text. Writing the message beside it would leave two entries under one id,
    either of which a reader may keep; the message is not delivered to this inbox."""


class InboxTeamDeleted(InboxWriteError):
    """The Claude Code team of the inbox was deleted (``TeamDelete``): its directory
    held the team's ``config.json`` when this writer (or one before it on this host, see
    :attr:`InboxWriter.marks`) last looked, and the file is gone
    now. Nobody reads an inbox made again there; the message is not written (a dead
    letter, the sender told), never counted delivered into a file no agent polls."""


def _read_own(path: Path | str, limit: int = MAX_INBOX_BYTES) -> bytes:
    """The bytes of the inbox file ``path`` itself, never through a symlink (``OSError``
    ``ELOOP``: a link put in an inbox's place is not the inbox, and what it points to,
    another team's inbox or any file of the user's, is not read into it) and never over
    ``limit`` bytes (:class:`InboxTooBig`: an inbox costs the hub several times its size
    in memory at every read, and unread entries are never pruned)."""
    # O_NONBLOCK: opening a FIFO to read would wait for a writer that may never come
    # (holding the inbox's lock, or the bridge's read of the team); a regular file reads
    # as without it
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InboxNotAFile(path, st.st_mode)
        size = st.st_size
        if size > limit:
            raise InboxTooBig(path, size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InboxTooBig(path, len(data), limit)
    return data


#: What :func:`file_stamp` tells of a file: device, inode, size, mtime and ctime (ns).
Stamp = tuple[int, int, int, int, int]


def file_stamp(path: Path | str) -> Stamp | None:
    """The file at ``path`` (never followed) as ``lstat`` sees it, ``None`` if it cannot
    be looked at. A reader that takes it *before* reading and finds it unchanged at its
    next look may skip the read: every writer that changes the file changes one of them
    (a rename gives a new inode; a write in place, the size or the times)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: How long after its last modification a file's stamp is not yet taken as settled: a
#: file system keeps times by a clock that moves in ticks (a jiffy on Linux, a second or
#: two on some), and a writer that rewrites the file in place to the same size within
#: the tick of its last change leaves every part of the stamp as it was.
RACY_NS = 2_000_000_000


def stamp_settled(stamp: Stamp) -> bool:
    """The file of ``stamp`` (taken before it was read) was last modified long enough
    ago that a change after the read would show in its stamp. A reader keeps a stamp to
    skip the next read only when it is; else it reads the file again at its next look,
    as git does with an index entry that is "racily clean"."""
    return time.time_ns() - stamp[3] >= RACY_NS


_warned: set[tuple[str, str]] = set()


def _warn_once(path: Path | str, exc: OSError) -> None:
    """Log why an inbox is not read, once per file and reason (it is read at every change)."""
    key = (str(path), type(exc).__name__ if exc.errno is None else str(exc.errno))
    if key not in _warned and len(_warned) < 10_000:
        _warned.add(key)
        if exc.errno == errno.ELOOP:
            logger.warning("inbox %s is a symlink; it is not read through it", path)
        else:
            logger.warning("%s", exc)


def read_inbox(path: Path | str) -> list[dict[str, Any]]:
    """Read an inbox without locking; every entry returned (a copy) has a ``msg_id``.

    A missing, unparseable or non-array file reads as ``[]``, as in Claude Code; so does
    a symlink and a file over :data:`MAX_INBOX_BYTES` (logged once, see
    :func:`_read_own`). Elements that are not objects are skipped; entries without an id
    get :func:`stable_id`. Writers replace the file by rename, so a read sees one whole
    version.
    """
    return read_inbox_or_none(path) or []


def read_inbox_or_none(path: Path | str) -> list[dict[str, Any]] | None:
    """:func:`read_inbox`, but ``None`` for a file that is there and cannot be read now
    (unparseable, a symlink, too big, not readable, not a file): its entries are not
    known, which is not the same as its holding none. A missing file reads as ``[]``."""
    try:
        items = _decode(_read_own(path))
    except FileNotFoundError:
        return []
    except (InboxTooBig, InboxNotAFile) as exc:
        _warn_once(path, exc)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _warn_once(path, exc)
        return None
    except ValueError:
        return None
    return [{**e, "msg_id": entry_id(e)} for e in items if isinstance(e, dict)]


def _dumps(value: Any) -> str:
    """``JSON.stringify(value, null, 2)`` for the values inboxes hold."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: escape them, as JSON.stringify does
        text = json.dumps(value, indent=2)
    return text


# ------------------------------------------------------------------------------ lock


class _Refresher:
    """One daemon thread per process that keeps the mtime of every held lock fresh."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.held: dict[int, InboxLock] = {}
        self.thread: threading.Thread | None = None

    def add(self, lock: InboxLock) -> None:
        with self.cond:
            self.held[id(lock)] = lock
            if self.thread is None:
                self.thread = threading.Thread(target=self.run, name="inbox-lock", daemon=True)
                self.thread.start()
            self.cond.notify()

    def remove(self, lock: InboxLock) -> None:
        with self.cond:
            self.held.pop(id(lock), None)

    def run(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                due = [lk for lk in self.held.values() if lk._next_refresh <= now]
                if not due:
                    nxt = min((lk._next_refresh for lk in self.held.values()), default=None)
                    self.cond.wait(None if nxt is None else nxt - now)
            for lk in due:
                lk._refresh()


_refresher = _Refresher()


def _after_fork() -> None:  # a forked child has the registry but not the thread
    global _refresher
    _refresher = _Refresher()


os.register_at_fork(after_in_child=_after_fork)


class InboxLock:
    """The lock Claude Code takes on an inbox, made the way ``proper-lockfile`` makes it.

    The lock is the directory ``<inbox>.lock``: whoever creates it holds it. One whose
    mtime is over ``stale_s`` old is taken over: remove it, then ``mkdir`` once more, as
    proper-lockfile does, but under a ``flock`` on the stale directory and only if it is
    still that directory and still stale, so two of the hub's writers that find it stale
    at once never both hold it (:meth:`_take_over`). While held, a background thread refreshes the mtime every
    ``refresh_s``; if the directory goes or its mtime is not the one we set, someone took
    the lock over and :meth:`still_held` turns false. Not reentrant.
    """

    def __init__(
        self, inbox: Path | str, *, stale_s: float = LOCK_STALE_S, refresh_s: float | None = None
    ) -> None:
        self.path = Path(f"{inbox}.lock")
        self.stale_s = stale_s
        self.refresh_s = refresh_s if refresh_s is not None else stale_s / 2
        self._mutex = threading.Lock()
        self._held = self._lost = False
        self._mtime_ns = 0
        self._next_refresh = 0.0

    def try_acquire(self) -> bool:
        """One attempt, no waiting: True if we now hold the lock. May raise ``OSError``."""
        if self._held:
            raise RuntimeError(f"{self.path} is already held by this InboxLock")
        try:
            os.mkdir(self.path)
        except FileExistsError:
            try:
                age = time.time() - os.stat(self.path).st_mtime
            except FileNotFoundError:  # released meanwhile: like proper-lockfile, try once
                return self._mkdir_once()
            if age <= self.stale_s:
                return False
            return self._take_over()
        self._acquired()
        return True

    def _take_over(self) -> bool:
        """Take over the lock directory found stale, so that of the hub's writers who
        found it stale at once (threads or processes) one wins and the others see the
        new lock, never remove it.

        proper-lockfile's own take-over (``stat``, ``rmdir``, ``mkdir``) lets a second
        writer that judged the old lock stale remove the first one's new lock and make
        its own: both then hold it. Here the stale directory is opened and ``flock``-ed
        (exclusive, not waiting: a lock per open file, so two threads of one process
        exclude each other as two processes do), and under that only if the path is
        still that very directory (same device and inode: the open descriptor keeps the
        inode from being reused) and still stale is it removed and made anew. A writer
        that finds the flock taken, or another directory at the path, has lost the race
        and tries again later. Writers that take no flock (Claude Code's) take it over
        as proper-lockfile does, racing as they always have.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # released meanwhile: like proper-lockfile, try once
            return self._mkdir_once()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another of our writers is taking it over right now
            opened = os.fstat(fd)
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                return self._mkdir_once()
            if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
                return False  # taken over (or released and taken) since we looked
            age = time.time() - now.st_mtime
            if age <= self.stale_s:
                return False  # its holder refreshed it meanwhile
            logger.warning("taking over stale inbox lock %s (untouched for %.1f s)", self.path, age)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(self.path)
            return self._mkdir_once()
        finally:
            os.close(fd)  # drops the flock

    def _mkdir_once(self) -> bool:
        try:
            os.mkdir(self.path)
        except FileExistsError:
            return False
        self._acquired()
        return True

    def _acquired(self) -> None:
        with self._mutex:
            self._mtime_ns = os.stat(self.path).st_mtime_ns
            self._held, self._lost = True, False
            self._next_refresh = time.monotonic() + self.refresh_s
        _refresher.add(self)

    def _refresh(self) -> None:
        with self._mutex:
            self._next_refresh = float("inf")
            if not self._held or self._lost:
                return
            try:
                if os.stat(self.path).st_mtime_ns != self._mtime_ns:
                    raise FileNotFoundError(self.path)
                os.utime(self.path)
                self._mtime_ns = os.stat(self.path).st_mtime_ns
            except OSError:
                self._lost = True
                logger.warning("inbox lock %s was taken over or removed while held", self.path)
                return
            self._next_refresh = time.monotonic() + self.refresh_s

    def still_held(self) -> bool:
        """True if the lock directory is still ours (present, with the mtime we set)."""
        with self._mutex:
            try:
                ours = os.stat(self.path).st_mtime_ns == self._mtime_ns
            except OSError:
                ours = False
            return self._held and not self._lost and ours

    def release(self) -> None:
        """Remove the lock directory, unless it was taken over meanwhile. Idempotent."""
        _refresher.remove(self)
        with self._mutex:
            if not self._held:
                return
            self._held = False
            try:
                if not self._lost and os.stat(self.path).st_mtime_ns == self._mtime_ns:
                    os.rmdir(self.path)
            except OSError as exc:
                logger.warning("could not release inbox lock %s: %s", self.path, exc)


# ---------------------------------------------------------------------------- writer


class _LockLost(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _View:
    """One parsed version of an inbox file; never mutated."""

    raw: str
    entries: list[Any]
    ids: frozenset[str]
    n_read: int

    @property
    def head(self) -> str:  # the text up to the end of the last element
        return self.raw.rstrip()[:-1].rstrip()

    @classmethod
    def of(cls, raw: str, entries: list[Any], base: _View | None = None) -> _View:
        objs = [e for e in entries if isinstance(e, dict)]
        ids = frozenset(i for e in objs for i in entry_ids(e))
        n_read = sum(1 for e in objs if e.get("read") is True)
        if base is None:
            return cls(raw, entries, ids, n_read)
        return cls(raw, base.entries + entries, base.ids | ids, base.n_read + n_read)


def _parse(raw: str, cached: _View | None) -> _View:
    """Parse ``raw`` (``ValueError`` if bad), reusing ``cached`` if ``raw`` extends it.

    Writers append by rewriting the whole array, so the new text usually starts with the
    old one up to its last element; then only the tail is parsed. That equals a full
    parse: valid array text, then ``,``, one or more elements and ``]`` is a valid array.
    """
    if cached is not None and cached.entries:
        if raw == cached.raw:
            return cached
        head = cached.head
        rest = raw[len(head) :].lstrip() if raw.startswith(head) else ""
        if rest.startswith(","):
            try:
                tail = json.loads("[" + rest[1:])
            except ValueError:
                tail = None
            if isinstance(tail, list) and tail:
                return _View.of(raw, tail, cached)
    return _View.of(raw, _decode(raw))


#: Pauses between reads of an inbox that does not parse, before it counts as corrupt.
_TORN_PAUSES = (0.02, 0.05)


def _salvage(data: bytes, cached: _View | None) -> _View:
    """What is left of an inbox that does not parse: the version this writer last saw,
    when the file is that version cut short (it wrote it, and a crash or a full disk
    cut it); else every whole element from the start of a cut or damaged array; else
    nothing."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _View.of("[]", [])
    if cached is not None and text.strip() and cached.raw.startswith(text):
        return cached
    body = text.lstrip()
    if not body.startswith("["):
        return _View.of("[]", [])
    decoder, items, at = json.JSONDecoder(), [], 1
    while True:
        while at < len(body) and body[at] in " \t\r\n":
            at += 1
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            break
        items.append(value)
        while at < len(body) and body[at] in " \t\r\n":
            at += 1
        if body[at : at + 1] != ",":
            break
        at += 1
    return _View.of(_dumps(items), items) if items else _View.of("[]", [])


class InboxWriter:
    """Appends entries to Claude Code inbox files; synchronous and thread-safe.

    :meth:`append` either returns (the entry is in the file, fsynced and read back, or
    was there already) or raises :class:`InboxWriteError`. ``deadline_s`` bounds the
    call; lock attempts back off with full jitter from ``backoff_initial_s`` doubling
    up to ``backoff_max_s``. ``stale_s`` is the lock's stale time (keep Claude Code's
    10 s outside tests). Once an inbox holds more than ``max_entries``, the oldest
    *read* entries are dropped down to ``prune_to`` (default 90 % of ``max_entries``);
    unread entries never are. ``fsync=False`` is for benchmarks only.
    """

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        deadline_s: float = 30.0,
        stale_s: float = LOCK_STALE_S,
        refresh_s: float | None = None,
        max_entries: int = 1000,
        prune_to: int | None = None,
        backoff_initial_s: float = 0.002,
        backoff_max_s: float = 0.05,
        fsync: bool = True,
        max_bytes: int = MAX_INBOX_BYTES,
        marks: Path | str | None = None,
    ) -> None:
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.deadline_s, self.stale_s, self.refresh_s = deadline_s, stale_s, refresh_s
        self.max_entries = max_entries
        self.prune_to = prune_to if prune_to is not None else max(1, max_entries * 9 // 10)
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.fsync = fsync
        self.max_bytes = max_bytes
        self._cache: OrderedDict[Path, _View] = OrderedDict()  # last version seen, per inbox
        self._cache_lock = threading.Lock()
        # team directories seen holding Claude Code's config.json (made by TeamCreate);
        # each also marked in ``marks`` (the hub's private state), so a restart knows them
        self._created_teams: set[Path] = set()
        self._marks = Path(marks).expanduser() if marks is not None else None

    @property
    def marks(self) -> Path:
        """Where the teams seen holding ``config.json`` are marked (:func:`team_marks`)."""
        if self._marks is None:
            self._marks = team_marks()
        return self._marks

    def _saw_team(self, team_dir: Path) -> None:
        """Remember that the config directory of the team whose inboxes are in
        ``team_dir`` holds ``config.json``, in memory and in a mark that outlives the
        process (:func:`team_marks`)."""
        with self._cache_lock:
            if team_dir in self._created_teams:
                return
        config = config_dir(team_dir)
        mark = _mark_of(config, self.marks)
        try:
            if not mark.exists():
                write_mark(mark, os.path.abspath(config) + "\n", create=True)
        except OSError as exc:  # the memory still holds it, for this process
            logger.warning(
                "cannot mark the Claude Code team %s as made by TeamCreate in %s (%s): after "
                "a restart a message for it, once deleted, would make it again",
                team_dir, mark, exc,
            )  # fmt: skip
        with self._cache_lock:
            self._created_teams.add(team_dir)

    def _team_was_seen(self, team_dir: Path) -> bool:
        with self._cache_lock:
            if team_dir in self._created_teams:
                return True
        return team_marked(team_dir, self.marks)

    def path_for(self, team: str, member: str) -> Path:
        return inbox_path(team, member, self.root)

    def read(self, team: str, member: str) -> list[dict[str, Any]]:
        return read_inbox(self.path_for(team, member))

    def append(
        self,
        team: str,
        member: str,
        *,
        msg_id: str,
        from_: str,
        text: str,
        summary: str | None = None,
        color: str | None = None,
        timestamp: str | float | None = None,
    ) -> AppendResult:
        """Add one entry to ``member``'s inbox unless an entry with ``msg_id`` is there.

        Creates the inbox directory (``mkdir -p``, each directory it makes 0700) and the
        inbox (``[]``, exclusive create, as Claude Code does; 0600, whatever the umask)
        when missing; an inbox rewritten keeps its mode. ``timestamp`` is ISO-8601 or UNIX
        seconds (default now). ``summary`` and ``color`` are left out when ``None``:
        Claude Code drops entries holding ``null`` there.
        """
        if not msg_id:
            raise ValueError("msg_id must be a non-empty string")
        entry: dict[str, Any] = {"from": from_, "text": text}
        if summary is not None:
            entry["summary"] = summary
        entry["timestamp"] = timestamp if isinstance(timestamp, str) else js_timestamp(timestamp)
        if color is not None:
            entry["color"] = color
        entry.update(msgV=1, msg_id=msg_id, type="message", read=False)
        path = self.path_for(team, member)
        deadline, waited = time.monotonic() + self.deadline_s, 0.0
        self._prepare(path)
        while True:
            lock = InboxLock(path, stale_s=self.stale_s, refresh_s=self.refresh_s)
            started = time.monotonic()
            self._acquire(path, lock, deadline)
            waited += time.monotonic() - started
            try:
                written = self._append_locked(path, lock, entry)
            except _LockLost:
                if time.monotonic() < deadline:
                    continue
                raise InboxWriteError(
                    f"lost the lock {lock.path} before writing {msg_id!r}, "
                    f"and the {self.deadline_s:g} s deadline has passed"
                ) from None
            except OSError as exc:
                if (
                    isinstance(exc, FileNotFoundError)
                    and not path.parent.is_dir()
                    and time.monotonic() < deadline
                ):
                    continue  # the team's directory removed meanwhile: made again, from the start
                raise InboxWriteError(
                    f"cannot write {msg_id!r} to {path}: {no_space(exc, path)}"
                ) from exc
            finally:
                lock.release()
            return AppendResult(written, not written, path, waited)

    async def append_async(
        self,
        team: str,
        member: str,
        *,
        msg_id: str,
        from_: str,
        text: str,
        summary: str | None = None,
        color: str | None = None,
        timestamp: str | float | None = None,
    ) -> AppendResult:
        """:meth:`append` in a worker thread (``anyio.to_thread.run_sync``)."""
        import anyio.to_thread

        call = functools.partial(
            self.append, team, member, msg_id=msg_id, from_=from_, text=text,
            summary=summary, color=color, timestamp=timestamp,
        )  # fmt: skip
        return await anyio.to_thread.run_sync(call)

    def _prepare(self, path: Path) -> None:
        """Check the inbox's directories (:func:`unsafe_dirs`), then make the inbox if it
        is missing; ``InboxWriteError`` names what is wrong."""
        if (problem := unsafe_dirs(path)) is not None:
            raise InboxWriteError(f"cannot write inbox {path}: {problem}")
        team_dir = path.parent.parent
        config = config_dir(team_dir) / "config.json"
        if config.exists():
            self._saw_team(team_dir)
        elif self._team_was_seen(team_dir):
            raise InboxTeamDeleted(
                f"nothing written to {path}: the Claude Code team {team_dir.name!r} was "
                f"deleted (its {config} is gone, as TeamDelete leaves it), "
                "so no agent reads this inbox. Create the team again (TeamCreate), or "
                "point the member's delivery setting at a live team, and send again"
            )
        try:
            self._ensure_inbox(path)
        except OSError as exc:
            raise InboxWriteError(f"cannot create inbox {path}: {no_space(exc, path)}") from exc

    def _ensure_inbox(self, path: Path) -> None:
        """Create the inbox holding ``[]`` unless it is there, whole: written beside it,
        then linked in place (an exclusive create that never replaces an inbox another
        writer made meanwhile). Created and then written, a disk that filled in between
        left an empty file, which is not JSON: Claude Code could not read it."""
        if path.exists():
            return
        private_dirs(path.parent)
        tmp = Path(f"{path}.tmp.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.write(fd, b"[]")
            finally:
                os.close(fd)
            os.link(tmp, path)
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            # a filesystem without hard links: renamed in place unless an inbox came
            # meanwhile (a writer between the look and the rename is a narrow race)
            if not path.exists():
                os.rename(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _acquire(self, path: Path, lock: InboxLock, deadline: float) -> None:
        attempt, error = 0, ""
        while True:
            try:
                if lock.try_acquire():
                    return
                error = ""
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # not over by waiting
                    raise InboxWriteError(
                        f"cannot make the inbox lock {lock.path}: {no_space(exc, lock.path)}; "
                        "the message was not written"
                    ) from exc
                error = f": {exc}"
                if exc.errno == errno.ENOENT:  # the team's directory removed (TeamDelete)
                    self._prepare(path)  # made again (unless a TeamCreate team: InboxTeamDeleted)
            now = time.monotonic()
            if now >= deadline:
                raise InboxWriteError(
                    f"could not take the inbox lock {lock.path} within {self.deadline_s:g} s"
                    f"{error or ': held by another writer'} (stale after {lock.stale_s:g} s); "
                    "the message was not written"
                )
            # the exponent capped: past 1,024 tries 2.0 ** attempt overflows a float
            base = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(attempt, 64))
            attempt += 1
            time.sleep(min(deadline - now, random.uniform(0, base)))

    def _remember(self, path: Path, view: _View | None = None) -> _View | None:
        """Get (no ``view``) or set the last version seen of ``path``; keeps 16 inboxes."""
        with self._cache_lock:
            if view is None:
                return self._cache.get(path)
            self._cache[path] = view
            self._cache.move_to_end(path)
            if len(self._cache) > 16:
                self._cache.popitem(last=False)
            return view

    def _load(self, path: Path) -> _View:
        """Read the inbox under the lock. One that does not parse is read again after a
        pause or two (a writer that takes no lock may be part way through), then moved
        aside; what reads on is what :func:`_salvage` finds of it. A symlink in the inbox's place reads as empty, never through it, and the new
        inbox replaces the link (the file it points to is neither read nor written); one
        over ``max_bytes`` raises :class:`InboxTooBig` (an ``OSError``)."""
        cached, error = self._remember(path), ValueError()
        for pause in (*_TORN_PAUSES, None):
            try:
                data = _read_own(path, self.max_bytes)
            except FileNotFoundError:
                return _View.of("[]", [])
            except InboxTooBig:
                raise
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                logger.warning(
                    "inbox %s is a symlink (to %s); not reading through it: the inbox "
                    "written now replaces the link",
                    path, os.readlink(path),
                )  # fmt: skip
                return _View.of("[]", [])
            try:
                return _parse(data.decode("utf-8"), cached)
            except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, not an array
                error = exc
            if pause is not None:  # a writer that takes no lock may be part way through
                time.sleep(pause)
        kept = _salvage(data, cached)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        aside, n = Path(f"{path}.corrupt-{stamp}"), 0
        while aside.exists():
            n += 1
            aside = Path(f"{path}.corrupt-{stamp}-{n}")
        os.rename(path, aside)
        logger.warning(
            "inbox %s is not a JSON array (%s); moved it aside to %s and started a new "
            "one with the %d whole entries it held",
            path, error, aside.name, len(kept.entries),
        )  # fmt: skip
        return kept

    def _append_locked(self, path: Path, lock: InboxLock, entry: dict[str, Any]) -> bool:
        view = self._load(path)
        msg_id = entry["msg_id"]
        if msg_id in view.ids:
            self._remember(path, view)
            said = (entry["from"], entry["text"])
            for e in view.entries:
                if not isinstance(e, dict) or msg_id not in entry_ids(e):
                    continue
                if (e.get("from"), e.get("text")) != said:
                    raise InboxIdTaken(
                        f"{path} holds an entry under {msg_id!r} from {e.get('from')!r} "
                        "that is not the one the hub writes (another sender or text); "
                        "the message is not written beside it. Remove that entry (a "
                        "process that can write the inbox put it there) and send again"
                    )
            return False
        text = "  " + _dumps(entry).replace("\n", "\n  ")
        raw = f"{view.head},\n{text}\n]" if view.entries else f"[\n{text}\n]"
        new = _View(raw, [*view.entries, entry], view.ids | {msg_id}, view.n_read)
        if len(new.entries) > self.max_entries and new.n_read:
            new = self._pruned(path, new)
        data = new.raw.encode("utf-8")
        self._replace(path, data, lock)
        self._remember(path, new)
        try:  # read back: normally the very bytes written, compared without parsing
            back = _read_own(path, len(data) + self.max_bytes)
            found = back == data or msg_id in _parse(back.decode("utf-8"), new).ids
        except (OSError, ValueError) as exc:
            raise InboxWriteError(f"wrote {msg_id!r} to {path}; reading back: {exc}") from exc
        if not found:
            raise InboxWriteError(f"wrote {msg_id!r} to {path} but it is not there on reading back")
        return True

    def _pruned(self, path: Path, view: _View) -> _View:
        excess, keep = len(view.entries) - self.prune_to, []
        for e in view.entries:
            if excess > 0 and isinstance(e, dict) and e.get("read") is True:
                excess -= 1
            else:
                keep.append(e)
        logger.info("pruned %d read entries from %s", len(view.entries) - len(keep), path)
        return _View.of(_dumps(keep), keep)

    def _replace(self, path: Path, data: bytes, lock: InboxLock) -> None:
        """Write ``<inbox>.tmp.<hex>``, fsync, rename over the inbox, fsync the directory."""
        tmp = Path(f"{path}.tmp.{secrets.token_hex(4)}")
        try:
            st = os.lstat(path)  # a symlink's target is not the inbox: its mode is not used
            mode: int | None = st.st_mode & 0o777 if stat.S_ISREG(st.st_mode) else None
        except FileNotFoundError:
            mode = None
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                if mode is not None:
                    os.fchmod(fd, mode)
                while data:
                    data = data[os.write(fd, data) :]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if not lock.still_held():
                raise _LockLost
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if self.fsync:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


# --------------------------------------------------------------------------- watcher


class InboxWatcher:
    """Yields ``(member, entry)`` for entries that appear in a team's inbox files.

    Watches ``{root}/{team}/inboxes`` (created if missing) with ``watchfiles``, and
    rescans every ``rescan_s`` in case an event was missed. ``members`` limits which
    inboxes count (e.g. ``{"user"}``). Each entry is yielded once per file, keyed by
    :func:`entry_id`, whether or not it is marked read later.

    Inboxes in a directory :func:`unsafe_dirs` refuses (a symlinked team or
    ``inboxes`` directory, or one other users can change) are not read: their entries
    could come from anyone. A warning says why, once; they are read once it is fixed.

    Caveat: the seen ids live in memory. A new watcher (after a restart) yields again
    every entry still in the files, unless ``skip_existing``, which skips what is there
    at start (and so misses what arrived while nothing watched). Consumers must be
    idempotent on ``msg_id``. Ids of entries gone from a file are forgotten.
    """

    def __init__(
        self,
        team: str,
        *,
        root: Path | str | None = None,
        members: Collection[str] | None = None,
        skip_existing: bool = False,
        rescan_s: float = 1.0,
        debounce_ms: int = 20,
        force_polling: bool | None = None,
    ) -> None:
        self.inboxes = inbox_path(team, "x", root).parent
        self.members = None if members is None else frozenset(members)
        self.skip_existing, self.rescan_s = skip_existing, rescan_s
        self.debounce_ms, self.force_polling = debounce_ms, force_polling
        self._seen: dict[str, set[str]] = {}
        self._stamps: dict[str, Stamp] = {}  # each file as last read whole
        self._stop: anyio.Event | None = None
        self._refused: str | None = None  # why the inboxes are not read now, said once

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        """Scan the inboxes once; return the entries not returned before, in file order.

        A file that does not parse now is skipped and its seen ids kept, so a torn read
        (of a non-atomic writer) never looks like new or vanished entries. A file whose
        :func:`file_stamp` is the one it had when last read whole is not read again.
        """
        found: list[tuple[str, dict[str, Any]]] = []
        if (problem := unsafe_dirs(self.inboxes / "x.json")) is not None:
            # files others could have put there: not the team's entries (as the hub's
            # own inbox bridge, :mod:`backchannel.delivery.inbox_watch`)
            if problem != self._refused:
                logger.warning("not reading the inboxes in %s: %s", self.inboxes, problem)
            self._refused = problem
            return found
        self._refused = None
        try:
            files = sorted(p for p in self.inboxes.iterdir() if p.suffix == ".json")
        except FileNotFoundError:
            return found
        for path in files:
            member = path.stem
            if self.members is not None and member not in self.members:
                continue
            stamp = file_stamp(path)  # taken before the read: a change after it is seen
            if stamp is not None and self._stamps.get(member) == stamp:
                continue  # unchanged since it was last read: nothing new in it
            try:
                items = [e for e in _decode(_read_own(path)) if isinstance(e, dict)]
            except (OSError, ValueError):
                continue
            if stamp is not None and stamp_settled(stamp):
                self._stamps[member] = stamp
            else:  # changed within the file system's tick: read again at the next look
                self._stamps.pop(member, None)
            seen = self._seen.get(member, set())
            present = {entry_id(e) for e in items}
            for e in items:
                if (ident := entry_id(e)) not in seen:
                    seen.add(ident)
                    found.append((member, {**e, "msg_id": ident}))
            self._seen[member] = seen & present
        return found

    def stop(self) -> None:
        """End a running :meth:`watch` after its current wait."""
        if self._stop is not None:
            self._stop.set()

    def __aiter__(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self.watch()

    async def watch(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        import anyio
        import anyio.to_thread
        import watchfiles

        if unsafe_dirs(self.inboxes / "x.json") is None:  # never made through a symlink
            private_dirs(self.inboxes)
        self._stop = anyio.Event()
        first = await anyio.to_thread.run_sync(self.poll)
        for item in () if self.skip_existing else first:
            yield item
        async for _ in watchfiles.awatch(
            self.inboxes,
            watch_filter=lambda _change, name: name.endswith(".json"),
            debounce=self.debounce_ms,
            step=min(50, self.debounce_ms),
            stop_event=self._stop,
            rust_timeout=max(1, int(self.rescan_s * 1000)),
            yield_on_timeout=True,
            recursive=False,
            force_polling=self.force_polling,
        ):
            for item in await anyio.to_thread.run_sync(self.poll):
                yield item


# ----------------------------------------------------------------------- member state


def protocol_message(text: Any) -> dict[str, Any] | None:
    """The JSON object Claude Code puts in ``text`` for protocol messages, else ``None``."""
    if not isinstance(text, str) or not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("type"), str) else None


def _seconds(stamp: Any) -> float | None:
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        return float(stamp)
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (AttributeError, TypeError, ValueError):
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def is_active(
    last_activity: float | str | None, now: float, window_s: float = ACTIVE_WINDOW_S
) -> bool:
    """True if ``last_activity`` (UNIX seconds or ISO-8601) is within ``window_s`` of ``now``.

    A time in the future (clock skew) counts as active; ``None`` or garbage does not.
    """
    when = _seconds(last_activity)
    return when is not None and now - when <= window_s


def member_state_from_entry(entry: Mapping[str, Any], now: float) -> MemberState:
    """The state of the entry's sender (``entry["from"]``) if it is its last entry.

    The research's rule (:mod:`backchannel.core.presence` applies it to the hub's record):

    * ``type == "shutdown_approved"`` (what Claude Code writes when a teammate approves
      a shutdown) or ``"shutdown_response"`` with ``approve: true`` (the SendMessage
      tool's input form) → ``"terminated"``;
    * any other entry, ``idle_notification`` included, is activity: ``"active"`` if its
      ``timestamp`` is within :data:`ACTIVE_WINDOW_S` of ``now`` or unreadable, else
      ``"idle"``.
    """
    proto = protocol_message(entry.get("text")) or {}
    kind = proto.get("type")
    if kind == "shutdown_approved" or (
        kind == "shutdown_response" and proto.get("approve") is True
    ):
        return "terminated"
    stamp = entry.get("timestamp")
    return "active" if _seconds(stamp) is None or is_active(stamp, now) else "idle"
