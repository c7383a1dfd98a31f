"""``inbox-file``: append to the Claude Code team inbox the member's agent polls.

Setting::

    {"type": "inbox-file",
     "root": "~/.claude/teams",   # optional; default $CLAUDE_CONFIG_DIR/teams or ~/.claude/teams
     "team": "my-team",           # optional; the Claude Code team name, default the hub team
     "inbox": "researcher",       # optional; the inbox name, default the member name
     "color": "blue",             # optional; the entry's color
     "session": "<hub session>"}  # optional; hold messages while that session's turn runs

Each message becomes one entry ``{from: sender, text, summary?, msg_id: message_id,
color?}`` whose ``text`` is the message framed as every adapter frames it
(``[From sender] ...``, see :mod:`backchannel.core.framing`: so a text can neither pose
as another sender's message nor as one of Claude Code's JSON protocol messages), written by :class:`~backchannel.delivery.claude_inbox.InboxWriter` (Claude
Code's own lock, atomic replace, read back). An entry whose ``msg_id`` is already in the
inbox is not written again, so a redelivery after a crash is a no-op unless the agent had
already read and pruned the entry. ``InboxWriteError`` (lock not won before the writer's
deadline, I/O error) is transient: the dispatcher retries.

A write runs in a thread and has the writer's deadline plus 5 s (``attempt_timeout``);
on a filesystem that does not answer (a hung network mount) the attempt fails as
transient past it, and the thread, which cannot be interrupted, is left waiting. While
it waits no other write to the member's inbox starts (each attempt fails at once, saying
so), so a stuck filesystem costs one thread, not one per retry; the copy is given up
once the retries are spent, the sender told. Should the stuck write complete later, the
entry is in the inbox all the same (a copy given up may have reached the agent).

The lock is proper-lockfile's (the directory ``<inbox>.lock``, stale after 10 s). A stale
one is taken over under a ``flock`` on it, and only while it is still that directory and
still stale (:class:`~backchannel.delivery.claude_inbox.InboxLock`): of the hub's writers
(its threads, other hub processes) that find it stale at once, one takes it over and
the others wait for the new lock, so no two write the inbox at once and no append is
lost. Claude Code's own writers take a stale lock over as proper-lockfile does, without
that step.

One inbox file, one member. Claude Code names a file by the team and inbox names with
every character but letters, digits, ``_`` and ``-`` made ``-``, so ``a.b`` and ``a-b``
(or ``x y`` and ``x-y``) name one file, and a member reading it would read the other's
messages. A setting that would share a file with another member of the team is refused
when it is set (:func:`inbox_clash`); and every write first claims the file for its
member (:func:`claim_inbox`, a mark in the hub's private state directory): a file another
member's delivery still names (one of another hub team, or one set before this check) is
not written, the message a dead letter saying why. The claim is checked in the thread
that appends, one step with the append (:func:`write_claimed`), never on the event loop.
A claim whose member is no longer delivered to the file is taken over only if it is
still that member's (a check and a swap under a ``flock``, :func:`take_inbox`): of two
writers (threads, hub processes) taking one outdated claim over at once, one does, and
the other's message is a dead letter as for any file another member holds.

The state directory is the user's, shared by every hub they run, each with its store
(two teams' SQLite files, a SQLite file and a PostgreSQL database), and two stores may
have a team and a member of the same names delivered to one inbox file. So a claim also
names the store it is made for (:class:`StoreMark`: a hash of the identity the store
keeps in itself, so one PostgreSQL database reached as ``localhost`` and as
``127.0.0.1`` is one store) and the hub that made it; a hub holds a shared ``flock`` on its store's presence file in
``claude-inboxes/`` from its first claim until its dispatcher stops (or its store is
collected, or its process ends). A claim of another store whose hub is
serving (its presence file is locked) is never taken over: the message is a dead letter
naming that hub. One whose hub has stopped is taken over, under the claim's lock. A
claim written before claims named their store is read as before, and made the store's
of the first hub of its member to write; one that names the store by where it is (as
claims did before stores kept an identity) is this store's, and made to name its
identity at the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from backchannel.delivery.base import (
    Adapter,
    AdapterContext,
    AdapterError,
    PermanentDeliveryError,
    agent_text,
)
from backchannel.delivery.claude_inbox import (
    AppendResult,
    InboxIdTaken,
    InboxTeamDeleted,
    InboxWriteError,
    InboxWriter,
    default_root,
    inbox_dir_name,
    inbox_path,
    name_problem,
)
from backchannel.errors import InvalidRequest, UnknownMember, UnknownTeam
from backchannel.files import private_dirs, state_mark, write_mark
from backchannel.types import InboxMessage

__all__ = [
    "InboxFileAdapter",
    "StoreMark",
    "claim_inbox",
    "claim_team_files",
    "delivered_to",
    "held_elsewhere",
    "inbox_clash",
    "inbox_of",
    "note_read",
    "release_presence",
    "store_mark",
    "take_inbox",
    "taken_elsewhere",
    "write_claimed",
    "writer_is_ours",
]

T = TypeVar("T")

_HOW = (
    "Claude Code names an inbox file by the team and inbox names with every character "
    "but letters, digits, '_' and '-' made '-' (two for a character past U+FFFF)"
)


def inbox_of(team: str, member: str, setting: Mapping[str, Any] | None) -> Path | None:
    """The inbox file ``member`` of hub team ``team`` is delivered to with ``setting``,
    or ``None`` when it is not an ``inbox-file`` setting (or a malformed one)."""
    if not setting or setting.get("type") != InboxFileAdapter.type:
        return None
    root, cc_team, inbox = (setting.get(k) for k in ("root", "team", "inbox"))
    if not all(v is None or isinstance(v, str) for v in (root, cc_team, inbox)):
        return None
    base = Path(os.path.abspath(Path(root).expanduser())) if root else default_root()
    return inbox_path(cc_team or team, inbox or member, os.path.abspath(base))


def _same_file_key(path: Path) -> str:
    """One key for every name of one inbox file: the team and inbox names casefolded, as
    a case-insensitive filesystem (macOS's) takes them."""
    path = Path(os.path.abspath(path))
    return os.path.join(str(path.parent.parent.parent), path.parent.parent.name.casefold(),
                        path.name.casefold())  # fmt: skip


def inbox_clash(
    team: str,
    member: str,
    setting: Mapping[str, Any],
    others: Mapping[str, Mapping[str, Any]],
) -> None:
    """Refuse an ``inbox-file`` setting whose inbox file is one another member of the
    team is delivered to (:class:`InvalidRequest` naming that member and the way out)."""
    mine = inbox_of(team, member, setting)
    if mine is None:
        return
    for name, theirs in sorted(others.items()):
        other = inbox_of(team, name, theirs)
        if other is not None and _same_file_key(other) == _same_file_key(mine):
            raise InvalidRequest(
                f"member {member!r} would be delivered to the Claude Code inbox file {mine}, "
                f"which member {name!r} of team {team!r} is delivered to ({_HOW}, and a "
                "filesystem may ignore case): each agent would read the other's messages. "
                "Give the member an 'inbox' (or a 'team') of its own in its delivery "
                "setting, or change the other member's",
                field="delivery",
            )


def _claims() -> Path:
    from backchannel.runtimes.seen import state_dir

    return state_dir() / "claude-inboxes"


def _claim_of(path: Path) -> Path:
    return state_mark(_claims(), _same_file_key(path))


@dataclass(frozen=True, slots=True)
class StoreMark:
    """The store a claim is made for: ``key``, a hash of the store's identity
    (:attr:`~backchannel.stores.base.Store.identity`, kept in the store, the same for
    every hub however it reaches the store), ``hub``, how the hub is named to a user
    whose write the claim refuses, and ``legacy``, the keys claims named this store by
    before stores kept an identity (a hash of where the store is: its SQLite file's real
    path, its PostgreSQL host, port and database), still read as this store's."""

    key: str
    hub: str
    legacy: frozenset[str] = frozenset()

    def names(self, key: str) -> bool:
        """Whether a claim naming the store ``key`` names this store."""
        return key == self.key or key in self.legacy


_marks: weakref.WeakKeyDictionary[Any, StoreMark] = weakref.WeakKeyDictionary()
#: store -> what closes its presence file (``flock``-ed shared while the store serves):
#: called by :func:`release_presence`, or when the store is collected
_present: weakref.WeakKeyDictionary[Any, weakref.finalize[[int], None]] = (
    weakref.WeakKeyDictionary()
)
_present_lock = threading.Lock()


def store_mark(store: Any) -> StoreMark:
    """The :class:`StoreMark` of ``store`` (the same for every hub of one store)."""
    with contextlib.suppress(TypeError):
        if (mark := _marks.get(store)) is not None:
            return mark
    url = getattr(store, "url", None)
    if isinstance(url, str) and url.startswith("sqlite://"):
        where = "sqlite://" + os.path.realpath(url[len("sqlite://") :])
    elif isinstance(url, str) and url.startswith(("postgresql://", "postgres://")):
        where = _database(url)
    elif isinstance(url, str) and "://" in url and url.split("://", 1)[1]:
        where = url
    else:  # a store only this object opens (memory)
        where = f"memory://{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(8)}"
    located = _key(where)
    identity = getattr(store, "identity", None)
    hub = f"the hub (process {os.getpid()} on {socket.gethostname()}) of the store {where}"
    if not (isinstance(identity, str) and identity):
        # a store that keeps no identity (or is not open yet, so not remembered): named
        # by where it is, as claims were before stores kept one
        return StoreMark(located, hub)
    mark = StoreMark(_key(f"identity:{identity}"), hub, frozenset({located}))
    with contextlib.suppress(TypeError):
        _marks[store] = mark
    return mark


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _database(url: str) -> str:
    """A PostgreSQL URL as the database it names (host, port, database), whoever
    connects and however: hubs of one database are hubs of one store."""
    try:
        import psycopg

        info = psycopg.conninfo.conninfo_to_dict(url)
    except Exception:
        return url  # as given (masked): read as one store by every hub that gives it
    host, port = info.get("host") or "localhost", info.get("port") or "5432"
    return f"postgresql://{host}:{port}/{info.get('dbname') or info.get('user') or ''}"


def _presence_file(key: str) -> Path:
    return _claims() / f"store-{key}.live"


def _be_present(store: Any, mark: StoreMark) -> None:
    """Hold ``store``'s presence file (a shared ``flock``) while ``store`` lives, so
    hubs of other stores see its claims held by a hub that is serving."""
    with _present_lock:
        if store in _present:
            return
        private_dirs(_claims())
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(_presence_file(mark.key), flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # a look (below) holds it an instant at most
        except OSError:
            os.close(fd)
            raise
        _present[store] = weakref.finalize(store, os.close, fd)


def release_presence(store: Any) -> None:
    """Give up ``store``'s presence file: this hub no longer serves its inbox files (its
    dispatcher stopped), so a hub of another store may take their claims over."""
    with _present_lock:
        close = _present.pop(store, None)
    if close is not None:
        close()  # closes the descriptor once: the finalizer is spent


def _serving(key: str) -> bool:
    """Whether a hub of the store ``key`` holds its presence file (is serving)."""
    try:
        fd = os.open(_presence_file(key), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the look's lock, if it took it
    return False


def _claim_body(path: Path, team: str, member: str, mark: StoreMark | None = None) -> str:
    body = {"team": team, "member": member, "path": str(path)}
    if mark is not None:
        body |= {"store": mark.key, "hub": mark.hub}
    return json.dumps(body)


def _read_claim(claim: Path) -> tuple[str, str] | None:
    try:
        owner = json.loads(claim.read_text(encoding="utf-8"))
        return str(owner["team"]), str(owner["member"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return ("", "")  # unreadable: taken over like one whose member is gone


def _read_store(claim: Path) -> tuple[str, str] | None:
    """The store key and hub a claim names, ``None`` for one that names none (made
    before claims named their store, or unreadable)."""
    try:
        owner = json.loads(claim.read_text(encoding="utf-8"))
        store, hub = owner.get("store"), owner.get("hub")
    except (OSError, ValueError, AttributeError):
        return None
    return (store, str(hub)) if isinstance(store, str) and store else None


class InboxHeldElsewhere(PermanentDeliveryError):
    """The inbox file's claim is held by a serving hub of another store."""


def _held_elsewhere_reason(path: Path, hub: str) -> str:
    return (
        f"inbox {path}: nothing written: the file is claimed by another hub, {hub}, "
        "which is serving and delivers to it a member of the same name of its own store "
        "(the claims of inbox files are kept in the user's state directory, which every "
        "hub of the user shares); the agent reading it is that hub's. Give this member "
        "an 'inbox' (or a 'team') of its own in its delivery setting, or stop the other "
        "hub (its claim is then taken over)"
    )


def held_elsewhere(path: Path, mark: StoreMark) -> str | None:
    """The hub of another store holding the claim of ``path`` while it serves, or
    ``None`` (no claim, this store's, one made before claims named their store, or its
    hub has stopped)."""
    held = _read_store(_claim_of(path))
    if held is None or mark.names(held[0]) or not _serving(held[0]):
        return None
    return held[1]


def _team_claim_of(inboxes: Path) -> Path:
    return state_mark(_claims(), "unclaimed-files:" + _same_file_key(Path(inboxes) / "x.json"))


def claim_team_files(inboxes: Path, store: Any) -> str | None:
    """Claim for ``store`` the files of the Claude Code ``inboxes`` directory that no
    member reads itself (``user.json``, a lead's inbox): their entries are taken in by
    one store's hubs only, never by hubs of two stores sharing the directory. ``None``
    once the claim is this store's (made now, taken over from another store whose hub
    has stopped, or this store's before); else the serving hub of another store that
    holds it. As for an inbox file's claim (:func:`claim_inbox`): a file 0600 in
    ``claude-inboxes/``, a check and a swap under its lock, and this hub present
    (serving) from its first claim."""
    mark = store_mark(store)
    _be_present(store, mark)
    claim = _team_claim_of(inboxes)
    body = json.dumps({"path": str(inboxes), "store": mark.key, "hub": mark.hub})
    for _ in range(3):  # a claim that changes hands between looks: looked at again
        held = _read_store(claim)
        if held is not None and held[0] == mark.key:
            return None
        if held is not None and not mark.names(held[0]) and _serving(held[0]):
            return held[1]
        # none yet, this store's by its old key, or its hub stopped: this store's now
        if _swap(claim, functools.partial(_claim_store_is, claim, held), body):
            return None
    raise InboxWriteError(f"cannot claim the files of {inboxes}: its claim kept changing hands")


def _read_note_of(path: Path) -> Path:
    return state_mark(_claims(), "read:" + _same_file_key(path))


def _read_note(note: Path) -> dict[str, list[str]]:
    try:
        value = json.loads(note.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        k: [i for i in v if isinstance(i, str)]
        for k, v in value.items()
        if isinstance(k, str) and isinstance(v, list)
    }


def taken_elsewhere(path: Path, mark: StoreMark) -> frozenset[str]:
    """The ids of the entries of the inbox file ``path`` that the hubs of stores other
    than ``mark``'s have taken in (:func:`note_read`): theirs, never to be taken in by
    this store's as well (a file taken over from a stopped hub, the entries of another
    store's members)."""
    note = _read_note(_read_note_of(path))
    return frozenset(i for key, ids in note.items() if not mark.names(key) for i in ids)


def note_read(path: Path, mark: StoreMark, ids: Collection[str], present: Collection[str]) -> None:
    """Note that the hubs of the store ``mark`` have taken in the entries ``ids`` of the
    inbox file ``path``, which holds ``present`` now: one note per file in
    ``claude-inboxes/`` (0600, rewritten whole under its lock), one list of ids per
    store, each cut to the entries still in the file."""
    note = _read_note_of(path)
    keep = frozenset(present)

    def update() -> bool:
        held = _read_note(note)
        held[mark.key] = sorted(ids)
        body = {
            k: [i for i in v if i in keep]
            for k, v in held.items()
            if k == mark.key or not mark.names(k)
        }
        write_mark(note, json.dumps({k: v for k, v in body.items() if v}))
        return True

    _locked(note, update)


def writer_is_ours(inboxes: Path, sender: str, mark: StoreMark) -> bool | None:
    """Whose agent ``sender`` (the ``from`` of an entry in the Claude Code ``inboxes``
    directory) is, by the claim of its own inbox file there: ``True`` a member of the
    store ``mark``, ``False`` a member of another store whose hub is serving, ``None``
    not known (its file has no claim naming a store, or that store's hub stopped)."""
    held = _read_store(_claim_of(Path(inboxes) / f"{inbox_dir_name(sender)}.json"))
    if held is None:
        return None
    if mark.names(held[0]):
        return True
    return False if _serving(held[0]) else None


def _claim_store_is(claim: Path, held: tuple[str, str] | None) -> bool:
    return _read_store(claim) == held


def _locked(mark: Path, step: Callable[[], bool]) -> bool:
    """``step()`` under a ``flock`` of ``mark``'s lock file (0600, beside it)."""
    private_dirs(mark.parent)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(mark.with_name(mark.name + ".lock"), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return step()
    finally:
        os.close(fd)  # releases the flock


def _swap(claim: Path, ok: Callable[[], bool], body: str) -> bool:
    """Replace ``claim`` with ``body`` if ``ok()``: the check and the replacement one
    step under a ``flock`` of the claim's lock file."""

    def step() -> bool:
        if ok():
            write_mark(claim, body)
            return True
        return False

    return _locked(claim, step)


def claim_inbox(
    path: Path, team: str, member: str, mark: StoreMark | None = None
) -> tuple[str, str] | None:
    """Claim the inbox file ``path`` for ``member`` of hub team ``team`` (of the store
    ``mark``): ``None`` once the claim is theirs (made now, or theirs before), else the
    ``(team, member)`` that holds it. A claim is a file 0600 in ``claude-inboxes/`` of
    the hub's state directory (0700), named after the file's path
    (:func:`~backchannel.files.state_mark`), made whole at once; :func:`write_claimed`
    takes over one whose member is no longer delivered to the file (:func:`take_inbox`).

    With ``mark``: a claim of another store held by a hub that is serving raises
    :class:`InboxHeldElsewhere` naming that hub; one whose hub has stopped is taken
    over; one that names no store (written before claims did) and these names is made
    this store's."""
    claim = _claim_of(path)
    body = _claim_body(path, team, member, mark)
    for _ in range(3):  # a claim that changes hands between looks: looked at again
        owner = _read_claim(claim)
        if owner is None:
            if write_mark(claim, body, create=True):
                return None
            owner = _read_claim(claim)  # another writer claimed it meanwhile
        if mark is None or owner is None:
            return None if owner == (team, member) else owner
        held = _read_store(claim)
        if held is not None and not mark.names(held[0]):
            if _serving(held[0]):
                raise InboxHeldElsewhere(_held_elsewhere_reason(path, held[1]))
            # its hub stopped: taken over, if still that claim
            _swap(claim, functools.partial(_claim_store_is, claim, held), body)
            continue
        if (held is None or held[0] != mark.key) and owner == (team, member):
            # made before claims named their store, or named it by where it is: this
            # store's, by its identity, from now on
            _swap(claim, functools.partial(_claim_store_is, claim, held), body)
            continue
        return None if owner == (team, member) else owner
    raise InboxWriteError(f"cannot claim it for {member!r}: its claim kept changing hands")


def take_inbox(
    path: Path, team: str, member: str, holder: tuple[str, str], mark: StoreMark | None = None
) -> tuple[str, str] | None:
    """Take the claim of ``path`` over for ``member`` from ``holder`` (no longer delivered
    there), only if ``holder`` still holds it (for the store ``mark``, or none): the check
    and the replacement are one step under a ``flock`` of the claim's lock file, so of
    two writers (threads, hub processes) taking one outdated claim over at once, exactly
    one does; the other finds the winner holding it. What :func:`claim_inbox` answers
    after."""
    claim = _claim_of(path)

    def still() -> bool:
        store = _read_store(claim)
        mine = store is None or mark is None or mark.names(store[0])
        return mine and _read_claim(claim) == holder

    if _swap(claim, still, _claim_body(path, team, member, mark)):
        return None
    return claim_inbox(path, team, member, mark)


@dataclass(frozen=True, slots=True)
class _Held:
    owner: tuple[str, str]


def _claim_then(
    path: Path,
    team: str,
    member: str,
    taking: tuple[str, str] | None,
    write: Callable[[], T],
    store: Any = None,
) -> T | _Held:
    """One step, in one thread: claim ``path`` (or take it over from ``taking``) for
    ``store``'s member, then ``write`` if the claim is ``member``'s, else :class:`_Held`
    naming the holder."""
    try:
        mark = None
        if store is not None:
            mark = store_mark(store)
            _be_present(store, mark)
        owner = claim_inbox(path, team, member, mark)
        if owner is not None and owner == taking:
            owner = take_inbox(path, team, member, owner, mark)
    except OSError as exc:  # the hub's own state directory: transient
        raise InboxWriteError(f"cannot claim it for {member!r}: {exc}") from exc
    return _Held(owner) if owner is not None else write()


async def delivered_to(hub: Any, owner: tuple[str, str], path: Path) -> bool:
    """Whether ``owner``'s delivery setting (in ``hub``) still names ``path``."""
    if not all(owner):
        return False
    with contextlib.suppress(UnknownMember, UnknownTeam):
        m = await hub.get_member(*owner)
        theirs = inbox_of(owner[0], owner[1], m.delivery)
        return theirs is not None and _same_file_key(theirs) == _same_file_key(path)
    return False


async def write_claimed(
    hub: Any,
    path: Path,
    team: str,
    member: str,
    write: Callable[[], T],
    run: Callable[[Callable[[], T | _Held]], Awaitable[T | _Held]] | None = None,
) -> T:
    """``write()`` to the inbox file ``path`` for ``member`` of ``team``, once the file is
    claimed for them (:func:`claim_inbox`): the claim check and the write are one call of
    ``run`` (a worker thread). A claim whose member ``hub`` no longer delivers to the file
    is taken over (:func:`take_inbox`); a file another member is still delivered to is
    not written: :class:`PermanentDeliveryError` naming why, as is a file a serving
    hub of another store holds (:class:`InboxHeldElsewhere`). Raises
    :class:`InboxWriteError` when the claim cannot be read or made."""
    runner = run or (lambda fn: anyio.to_thread.run_sync(fn))
    taking: tuple[str, str] | None = None
    store = getattr(hub, "store", None)
    for _ in range(3):  # a claim that changes hands between looks: looked at again
        step = functools.partial(_claim_then, path, team, member, taking, write, store)
        out = await runner(step)
        if not isinstance(out, _Held):
            return out
        if await delivered_to(hub, out.owner, path):
            raise PermanentDeliveryError(_held_reason(path, team, out.owner))
        taking = out.owner
    raise InboxWriteError(f"cannot claim it for {member!r}: its claim kept changing hands")


def _held_reason(path: Path, team: str, owner: tuple[str, str]) -> str:
    who = (
        f"member {owner[1]!r} of this team" if owner[0] == team else "a member of another hub team"
    )
    return (
        f"inbox {path}: nothing written: the file is the inbox of {who}, whose delivery "
        f"setting names it too ({_HOW}, so names that differ can name one file); the "
        "agent reading it is not this member. Give this member an 'inbox' (or a "
        "'team') of its own in its delivery setting"
    )


class InboxFileAdapter(Adapter):
    """See the module docstring."""

    type = "inbox-file"

    def __init__(self, ctx: AdapterContext, *, writer: InboxWriter | None = None) -> None:
        super().__init__(ctx)
        root = ctx.str_option("root")
        self.writer = writer or InboxWriter(root)
        self.inbox_team = ctx.str_option("team") or ctx.team
        self.inbox = ctx.str_option("inbox") or ctx.member
        for what, name in (("team", self.inbox_team), ("inbox", self.inbox)):
            if (problem := name_problem(what, name)) is not None:
                raise PermanentDeliveryError(problem)
        self.color = ctx.str_option("color")
        # one append waits at most the writer's deadline for the lock
        self.attempt_timeout = self.writer.deadline_s + 5.0
        # set once the thread of the last write returned (see deliver)
        self._writing: threading.Event | None = None
        self._writing_since = 0.0

    async def deliver(self, item: InboxMessage) -> str:
        m = item.message
        if self._writing is not None and not self._writing.is_set():
            raise AdapterError(
                f"inbox {self.path}: the write started "
                f"{time.monotonic() - self._writing_since:.0f} s ago has still not returned "
                "(the filesystem does not answer); no other write starts until it does. "
                "Check the filesystem the inbox is on"
            )

        def append() -> AppendResult:
            return self.writer.append(
                self.inbox_team,
                self.inbox,
                msg_id=m.message_id,
                from_=m.sender,
                text=agent_text(item),
                summary=m.summary,
                color=self.color,
            )

        async def run(step: Callable[[], Any]) -> Any:
            done = threading.Event()  # set once the thread returns

            def call() -> Any:
                try:
                    return step()
                finally:
                    done.set()

            self._writing, self._writing_since = done, time.monotonic()
            async with asyncio.timeout(self.attempt_timeout):
                # abandoned, not waited for, when the attempt times out or the worker
                # is cancelled: a thread stuck in the kernel cannot be interrupted
                return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)

        path, team, member = Path(self.path), self.ctx.team, self.ctx.member
        try:
            result = await write_claimed(self.ctx.hub, path, team, member, append, run)
        except TimeoutError:
            raise AdapterError(
                f"inbox {self.path}: the write did not answer within "
                f"{self.attempt_timeout:g} s (the filesystem does not answer); check the "
                "filesystem the inbox is on"
            ) from None
        except InboxTeamDeleted as exc:  # no agent reads the inbox: a dead letter at once
            raise PermanentDeliveryError(f"inbox {self.path}: {exc}") from exc
        except InboxIdTaken as exc:  # writing again finds the same entry: never retried
            raise PermanentDeliveryError(f"inbox {self.path}: {exc}") from exc
        except InboxWriteError as exc:
            raise AdapterError(f"inbox {self.path}: {exc}") from exc
        except OSError as exc:  # not expected (the writer wraps I/O errors), but transient
            raise AdapterError(f"inbox {self.path}: {exc}") from exc
        if result.already_present:
            return f"already in {result.path}"
        return f"written to {result.path}"

    @property
    def path(self) -> str:
        return str(self.writer.path_for(self.inbox_team, self.inbox))

    def describe(self) -> str:
        return f"inbox-file {self.path}"
