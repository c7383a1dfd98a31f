"""Claude Code inbox files read back: what teammates write reaches the hub, once.

:class:`InboxBridge` is the other half of the ``inbox-file`` adapter. For every team
with ``inbox-file`` members it watches the directory their inboxes live in
(``{root}/{claude team}/inboxes``, from the members' settings) with ``watchfiles``: the
operating system wakes it when a file changes, there is no polling interval. Each
changed ``<name>.json`` whose name is a member's inbox (the ``inbox`` setting, else the
member name, so ``user.json`` is the human's and a lead the hub starts on stdin has one
too) is read, and its entries go to :meth:`backchannel.hub.Hub.take_inbox_entries`,
which brings each in once: chat becomes a hub message from its ``from`` to the file's
owner, protocol frames become the sender's state and a line of traffic, the hub's own
entries are recognised by their ids. The read cursor is in the store, so a rewrite, a
mark-read, pruning and a hub restart bring nothing in twice.

The owner of a file it does not read itself (a lead the hub started on stdin, ``user``)
gets the message by its own delivery: that is the lead relay. Entries for the lead reach
its stdin between turns, framed ``[From name]`` like any message, with no instruction to
forward anything; a message a teammate writes to another teammate's inbox is taken in
for the record but acked at once (that teammate reads its own file), so it never passes
through the lead.

Nothing is read from an ``inboxes`` directory that is a symlink, or that another user
owns or can write, or below such a team directory or teams root
(:func:`~backchannel.delivery.claude_inbox.unsafe_dirs`): its files were not
necessarily written by the user's agents. It is said once, and read once it is fixed.

A file whose claim (:func:`~backchannel.delivery.inbox_file.claim_inbox`) a serving hub
of another store holds is not read: the agent reading it is that hub's member, and its
entries are that hub's to take in (see :func:`~backchannel.delivery.inbox_file.held_elsewhere`).
The files of a directory that no member reads itself (``user.json``, a lead's) are
claimed for the store as a whole (:func:`~backchannel.delivery.inbox_file.claim_team_files`):
while a serving hub of another store holds them, their entries are left to it, and said
so once; but an entry whose writer's own inbox file is claimed is taken in by the hubs
of that claim's store alone (:func:`~backchannel.delivery.inbox_file.writer_is_ours`).
A file taken over from another store's hubs (theirs stopped) brings in only what they
had not taken in: each read notes, beside the claims, the ids its store took in
(:func:`~backchannel.delivery.inbox_file.note_read`), and a hub of another store records
those as skipped (:meth:`~backchannel.hub.Hub.skip_inbox_entries`) rather than taking
them in a second time.

Files are read without the lock: every writer (Claude Code's and ours) replaces the file
by rename, so a read sees one whole version. An unreadable file reads as empty and is
read again at its next change; one unchanged since it was last read and settled (its
:func:`~backchannel.delivery.claude_inbox.file_stamp` the same) is not read again. Teams
and members are listed again every ``rescan_s`` (to pick up new ones; the files
themselves are never polled).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backchannel.delivery.adapters import delivery_type
from backchannel.delivery.base import message_text
from backchannel.delivery.claude_inbox import (
    InboxWriter,
    Stamp,
    default_root,
    file_stamp,
    inbox_path,
    js_timestamp,
    protocol_message,
    read_inbox_or_none,
    stamp_settled,
    team_deleted,
    unsafe_dirs,
)
from backchannel.delivery.inbox_file import (
    StoreMark,
    claim_team_files,
    delivered_to,
    held_elsewhere,
    note_read,
    store_mark,
    taken_elsewhere,
    write_claimed,
    writer_is_ours,
)
from backchannel.errors import BackchannelError, PermanentDeliveryError
from backchannel.files import private_dirs
from backchannel.hub.outage import Outage

if TYPE_CHECKING:
    from backchannel.hub import Hub, TakeResult

__all__ = ["InboxBridge", "InboxOwner"]

log = logging.getLogger("backchannel.delivery.inbox_watch")

#: Why an entry a rewrite dropped is not put back into a file its owner left.
_MOVED = (
    "its member's delivery setting names another inbox now, so nobody reads this file for "
    "it; send the message again"
)
#: Why entries another store's hubs took in are not taken in by this one's.
_THEIRS = "the hubs of another store took them in while that store's claim on the file held"
#: Cursor records of entries gone from their file are dropped after this long.
FORGET_AFTER_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class InboxOwner:
    """Whose file ``<name>.json`` is: the hub team and member, and whether the member
    reads the file itself (an ``inbox-file`` member) or gets its messages another way."""

    team: str
    member: str
    reads_file: bool
    color: str | None = None  # the ``color`` setting its entries are written with


@dataclass
class _Dir:
    """One watched inboxes directory."""

    path: Path
    claude_team: str
    owners: dict[str, InboxOwner]
    task: asyncio.Task[None] | None = None
    seen: dict[str, set[str]] = field(default_factory=dict)  # file -> ids taken in
    forgot_at: dict[str, float] = field(default_factory=dict)
    own: dict[str, dict[str, _Own]] = field(default_factory=dict)  # file -> the hub's entries
    # file -> its stamp when last read and all of it settled (nothing to look at again)
    stamps: dict[str, Stamp] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Own:
    """One of the hub's entries seen in an inbox its owner reads: the entry as the file
    held it, and the unread chat entries that stood before it then (see
    :meth:`InboxBridge._check_own`)."""

    entry: dict[str, Any]
    before: frozenset[str]


def _unread_chat_before(entries: list[dict[str, Any]], index: int) -> frozenset[str]:
    return frozenset(
        e["msg_id"]
        for e in entries[:index]
        if e.get("read") is not True and protocol_message(e.get("text")) is None
    )


class InboxBridge:
    """Watches inbox files and hands new entries to the hub (see the module docstring).

    ``teams`` limits the hub teams served; ``root`` overrides the members' ``root``
    setting (tests). :meth:`scan` reads every watched file once, now; with
    ``watch=False`` nothing else reads them (one-off scans).
    """

    def __init__(
        self,
        hub: Hub,
        *,
        rescan_s: float = 2.0,
        teams: set[str] | None = None,
        root: Path | str | None = None,
        debounce_ms: int = 10,
        force_polling: bool | None = None,
        watch: bool = True,
    ) -> None:
        self.hub = hub
        self.watch = watch
        self.rescan_s = rescan_s
        self.teams = teams
        self.root = Path(root) if root is not None else None
        self.debounce_ms, self.force_polling = debounce_ms, force_polling
        self._dirs: dict[Path, _Dir] = {}
        self._scan_task: asyncio.Task[None] | None = None
        self._warned: set[tuple[str, str]] = set()
        self._unsafe: set[Path] = set()  # directories said to be unsafe, said once
        self._elsewhere: set[tuple[Path, str]] = set()  # files another store's hub holds
        self.taken = 0  # hub messages made, for status and tests
        self._outage = Outage(log, "listing teams for inbox files")

    async def start(self) -> None:
        """Find the directories to watch, start watching them and read every file once."""
        await self.refresh()
        if self.watch:
            self._scan_task = asyncio.create_task(self._refresh_loop(), name="bc-inbox-members")

    async def stop(self) -> None:
        tasks = [t for t in (self._scan_task, *(d.task for d in self._dirs.values())) if t]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._scan_task = None
        self._dirs.clear()

    async def __aenter__(self) -> InboxBridge:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- which files belong to whom ------------------------------------------------
    async def owners(self) -> dict[Path, tuple[str, dict[str, InboxOwner]]]:
        """Inboxes directory -> (Claude Code team, inbox name -> owner), for every hub
        team that has ``inbox-file`` members."""
        found: dict[Path, tuple[str, dict[str, InboxOwner]]] = {}
        for team in await self.hub.list_teams():
            if self.teams is not None and team.name not in self.teams:
                continue
            try:
                members = await self.hub.list_members(team.name)
            except BackchannelError:
                continue
            files = [m for m in members if delivery_type(m.delivery) == "inbox-file"]
            for m in files:
                claude_team = _opt(m.delivery, "team") or team.name
                inbox = _opt(m.delivery, "inbox") or m.name
                path = _inbox_file(claude_team, inbox, self.root or _opt(m.delivery, "root"))
                _, owners = found.setdefault(path.parent, (claude_team, {}))
                color = _opt(m.delivery, "color")
                owners[path.stem] = InboxOwner(team.name, m.name, True, color)
            for d, (claude_team, owners) in found.items():
                if not any(o.team == team.name for o in owners.values()):
                    continue
                for m in members:  # the others' inboxes: user.json, a lead's
                    stem = inbox_path(claude_team, m.name, d.parent.parent).stem
                    owners.setdefault(stem, InboxOwner(team.name, m.name, False))
        return found

    async def refresh(self) -> None:
        """List teams and members again: watch new directories, drop gone ones."""
        wanted = await self.owners()
        for path in [p for p in self._dirs if p not in wanted]:
            d = self._dirs.pop(path)
            if d.task is not None:
                d.task.cancel()
        for path, (claude_team, owners) in wanted.items():
            have = self._dirs.get(path)
            if have is None:
                d = self._dirs[path] = _Dir(path, claude_team, owners)
                if self.watch:
                    name = f"bc-inbox-watch-{claude_team}"
                    d.task = asyncio.create_task(self._watch(d), name=name)
            elif have.owners != owners:
                d = have
                d.owners = owners
                d.seen.clear()  # a new owner may make old entries takeable
                d.stamps.clear()  # so every file is read again
                await self._scan_dir(d)

    async def _refresh_loop(self) -> None:
        pause = self.rescan_s
        while True:
            await asyncio.sleep(pause)
            try:
                await self.refresh()
            except Exception as exc:  # said once an outage, tried less often while it lasts
                pause = max(self.rescan_s, self._outage.failed(exc))
            else:
                self._outage.ok()
                pause = self.rescan_s

    # -- reading -------------------------------------------------------------------
    async def scan(self) -> list[TakeResult]:
        """Read every watched file now; what each file's entries came to."""
        out: list[TakeResult] = []
        for d in list(self._dirs.values()):
            out.extend(await self._scan_dir(d))
        return out

    async def _scan_dir(self, d: _Dir, names: set[str] | None = None) -> list[TakeResult]:
        out = []
        for name in sorted(d.owners if names is None else names & d.owners.keys()):
            result = await self._scan_file(d, name)
            if result is not None:
                out.append(result)
        return out

    async def _scan_file(self, d: _Dir, name: str) -> TakeResult | None:
        owner = d.owners[name]
        path = d.path / f"{name}.json"
        if (problem := await asyncio.to_thread(unsafe_dirs, path)) is not None:
            if d.path not in self._unsafe:
                self._unsafe.add(d.path)
                log.warning("not reading the inboxes in %s: %s", d.path, problem)
            return None
        self._unsafe.discard(d.path)
        files_ours = True
        if owner.reads_file:  # a file a serving hub of another store holds is its to read
            mark = store_mark(self.hub.store)
            if (other := await asyncio.to_thread(held_elsewhere, path, mark)) is not None:
                if (path, other) not in self._elsewhere:
                    self._elsewhere.add((path, other))
                    log.warning("not reading inbox %s: it is claimed by another hub, %s, "
                                "whose agent reads it; give member %r of team %r an "
                                "'inbox' of its own", path, other, owner.member, owner.team)  # fmt: skip
                return None
        else:  # a file no member reads itself: one store's hubs read it, the serving one's
            try:
                other = await asyncio.to_thread(claim_team_files, d.path, self.hub.store)
            except OSError as exc:  # the hub's own state directory: looked at again
                log.warning("not reading inbox %s for now: cannot claim it: %s", path, exc)
                return None
            if other is not None and (path, other) not in self._elsewhere:
                self._elsewhere.add((path, other))
                log.warning("inbox %s: the files of %s that no member reads itself are read "
                            "by another hub, %s, which is serving; only the entries of "
                            "members whose own inbox file this hub claims are taken in "
                            "here. Give team %r's inbox-file members a Claude Code 'team' "
                            "of their own, or stop the other hub (its claim is then taken "
                            "over)", path, d.path, other, owner.team)  # fmt: skip
            files_ours = other is None
        stamp = await asyncio.to_thread(file_stamp, path)  # before the read: see file_stamp
        if stamp is not None and d.stamps.get(name) == stamp:
            return None  # unchanged since it was read and settled: nothing new in it
        d.stamps.pop(name, None)
        read = await asyncio.to_thread(read_inbox_or_none, path)
        entries = read or []
        settled = read is not None
        if read is not None and owner.reads_file:
            settled = await self._check_own(d, name, owner, entries) and settled
        seen = d.seen.setdefault(name, set())
        new = [e for e in entries if e["msg_id"] not in seen]
        if not owner.reads_file and new:
            # each entry is the store's whose member wrote it (its own file's claim says),
            # else the store's that holds these files: never taken in by two stores
            mine = await asyncio.to_thread(_ours, d.path, new, store_mark(self.hub.store))
            keep = [e for e, ours in zip(new, mine, strict=True) if ours is not False
                    and (ours or files_ours)]  # fmt: skip
            if len(keep) < len(new):
                settled = False  # the rest is read again once its store's hub stops
            new = keep
        if not new:
            if settled and stamp is not None and stamp_settled(stamp):
                d.stamps[name] = stamp
            return None
        key = f"{d.claude_team}/{name}"
        mark = store_mark(self.hub.store)
        elsewhere = await asyncio.to_thread(taken_elsewhere, path, mark)
        if elsewhere:
            # read by another store's hubs before (its claim taken over since, or the
            # entries of its members): what they took in is theirs, never taken in twice
            theirs = [e for e in new if e["msg_id"] in elsewhere]
            if theirs:
                try:
                    await self.hub.skip_inbox_entries(owner.team, key, theirs, _THEIRS)
                except BackchannelError as exc:
                    log.warning("inbox %s: could not take it over: %s", path, exc.message)
                    return None
                seen.update(e["msg_id"] for e in theirs)
                new = [e for e in new if e["msg_id"] not in elsewhere]
        try:
            result = await self.hub.take_inbox_entries(
                owner.team, key, owner.member, new, owner_reads_file=owner.reads_file
            )
        except BackchannelError as exc:
            log.warning("inbox %s: could not take in its entries: %s", path, exc.message)
            return None
        for sender in result.unknown_senders:
            if (owner.team, sender) not in self._warned:
                self._warned.add((owner.team, sender))
                log.warning("inbox %s has entries from %r, which is not a member of team %r; "
                            "add the member and they are taken in", path, sender, owner.team)  # fmt: skip
        unknown = set(result.unknown_senders)
        if settled and stamp is not None and not unknown and stamp_settled(stamp):
            # else read again at the next look
            d.stamps[name] = stamp
        seen.update(e["msg_id"] for e in new if e.get("from") not in unknown)
        self.taken += len(result.messages)
        if owner.reads_file and (result.own_ids or result.own_before):
            own, index = d.own.setdefault(name, {}), {e["msg_id"]: i for i, e in enumerate(entries)}
            for eid in (*result.own_ids, *result.own_before):  # before: taken in before a restart
                if (i := index.get(eid)) is not None and entries[i].get("read") is not True:
                    own.setdefault(eid, _Own(entries[i], _unread_chat_before(entries, i)))
        present = [e["msg_id"] for e in entries]
        seen.intersection_update(present)
        try:  # for a hub of another store that takes the file over later
            await asyncio.to_thread(note_read, path, mark, seen, present)
        except OSError as exc:
            log.warning("inbox %s: cannot note what was taken in: %s", path, exc)
        now = time.monotonic()
        if now - d.forgot_at.get(name, 0.0) > 3600:
            d.forgot_at[name] = now
            with contextlib.suppress(BackchannelError):
                await self.hub.forget_inbox_entries(owner.team, key, present, FORGET_AFTER_S)
        return result

    async def _check_own(
        self, d: _Dir, name: str, owner: InboxOwner, entries: list[dict[str, Any]]
    ) -> bool:
        """Put back, once, the hub's entries a rewrite dropped before the owner read them;
        dead-letter one dropped again (or that cannot be put back). ``False`` when one is
        to be looked at again at the next read (the hub could not be asked).

        Claude Code's reader removes the entries it consumes (it does not keep them marked
        ``read``), so an entry gone is normally an entry read. But its reader consumes
        the unread chat of an inbox in file order, all it read at once, under the lock:
        it never removes an entry and leaves an unread chat entry that stood before it.
        A rewrite that does so was made from a copy read before the hub's entry was there
        by something that took no lock (a tool, an editor, a reader whose lock was taken
        over): the entry was dropped, not read. An entry gone with everything before it
        counts as read (a stale rewrite of that shape cannot be told from a read, and
        putting back an entry read would show it twice). An entry that stops being unread
        (``read: true``) is read.

        What is put back is made from the hub's stored message
        (:meth:`~backchannel.hub.Hub.put_back_inbox_entry`), framed as the adapter
        frames it, never copied from the file: an entry that reuses a hub message's id
        (with other words, or the id of a message to someone else) puts back nothing
        of its own. Only the timestamp of an entry that was the hub's word for word is
        kept (Claude Code matches entries on sender, timestamp and text); any other is
        the message's. A put-back is a write like the adapter's, through the file's
        claim (:func:`~backchannel.delivery.inbox_file.write_claimed`): into a file
        another member now holds nothing is put back, the copy is dead-lettered; so is
        one whose owner's delivery setting no longer names the file (this map of owners
        lags the settings until its next refresh), since nobody reads it there."""
        own = d.own.get(name)
        if not own:
            return True
        settled = True
        present = {e["msg_id"]: e for e in entries}
        path = d.path / f"{name}.json"
        for eid, item in list(own.items()):
            now = present.get(eid)
            if now is not None:
                if now.get("read") is True:
                    del own[eid]
                continue
            del own[eid]
            if not item.before & present.keys():
                continue  # read, with what stood before it
            why = (
                f"its entry in {path} was dropped by a rewrite of the file that took no "
                f"lock (made from a copy read before the entry was written), before "
                f"{owner.member} read it"
            )
            try:
                back = await self.hub.put_back_inbox_entry(owner.team, eid, owner.member, why)
            except BackchannelError as exc:
                log.warning("inbox %s: could not put back %s: %s", path, eid, exc.message)
                own[eid] = item  # asked again at the next read
                settled = False
                continue
            if back.message is None:
                continue  # no copy of the owner's: the id was not the hub's entry for it
            if back.before:  # the store says so, whatever bridge put it back, restarts or not
                await self._lost(owner, eid, f"{why}; it was put back once and dropped again")
                continue
            if not await delivered_to(self.hub, (owner.team, owner.member), path):
                # the owner's setting moved on since this map was made: nobody reads here
                await self._lost(owner, eid, f"{why}; not put back: {_MOVED}")
                continue
            m = back.message  # the hub's words, as the adapter wrote them, never the file's
            e, text = item.entry, message_text(m)
            stamp = e.get("timestamp")  # kept when the entry was the hub's, as written:
            if not (isinstance(stamp, str) and e.get("from") == m.sender and e.get("text") == text):
                stamp = js_timestamp(m.created_at)  # Claude Code keys entries on it too
            writer = InboxWriter(d.path.parent.parent)
            put_back = functools.partial(
                writer.append, d.claude_team, name, msg_id=eid, from_=m.sender, text=text,
                summary=m.summary, color=owner.color, timestamp=stamp,
            )  # fmt: skip
            try:  # through the file's claim, as every write: never into another's inbox
                await write_claimed(self.hub, path, owner.team, owner.member, put_back)
            except PermanentDeliveryError as exc:  # another member holds the file now
                await self._lost(owner, eid, f"{why}; not put back: {exc.message}")
                continue
            except (OSError, BackchannelError) as exc:  # InboxWriteError, I/O
                await self._lost(owner, eid, f"{why}; putting it back failed: {exc}")
                continue
            log.warning("inbox %s: %s; put it back", path, why)
            entry = {"msg_id": eid, "from": m.sender, "text": text, "timestamp": stamp}
            own[eid] = _Own(entry, _unread_chat_before(entries, len(entries)))
            settled = False  # the file changed: read it again
        return settled

    async def _lost(self, owner: InboxOwner, eid: str, reason: str) -> None:
        try:
            await self.hub.lost_inbox_entry(owner.team, eid, owner.member, reason)
        except BackchannelError as exc:
            log.warning("could not dead-letter %s for %s: %s", eid, owner.member, exc.message)

    async def _watch(self, d: _Dir) -> None:
        """Watch ``d`` for good: a watch stays on the directory it was set on, so when
        the directory goes (removed, moved away) or another takes its path, it is made
        again if missing, watched anew and every file read. A Claude Code team deleted
        (:func:`~backchannel.delivery.claude_inbox.team_deleted`) is not made again."""
        while True:
            await self._watch_once(d)
            if not team_deleted(d.path.parent):  # a deleted team is looked at quietly
                log.warning("inbox directory %s was removed or replaced; watching it anew", d.path)

    async def _watch_once(self, d: _Dir) -> None:
        """Watch the directory now at ``d.path`` until it is no longer there."""
        import watchfiles

        if team_deleted(d.path.parent):
            # TeamDelete removed it: not made again (the writer dead-letters what is
            # sent there); watched again once TeamCreate makes it
            await asyncio.sleep(self.rescan_s)
            return
        if unsafe_dirs(d.path / "x.json") is None:  # never made through a symlink
            private_dirs(d.path)
        try:
            st = os.stat(d.path)
        except OSError:
            await asyncio.sleep(self.rescan_s)
            return
        here = (st.st_dev, st.st_ino)

        def same() -> bool:
            try:
                now = os.stat(d.path)
            except OSError:
                return False
            return (now.st_dev, now.st_ino) == here

        changes = watchfiles.awatch(
            d.path,
            watch_filter=lambda _change, name: name.endswith(".json") or Path(name) == d.path,
            debounce=self.debounce_ms,
            step=min(50, max(1, self.debounce_ms)),
            rust_timeout=max(1, int(self.rescan_s * 1000)),
            yield_on_timeout=True,  # wake now and then to check the directory is the same
            recursive=False,
            force_polling=self.force_polling,
        )
        pending = asyncio.ensure_future(anext(changes))
        try:
            await asyncio.sleep(0)  # the watch is set up before the first read
            await self._safe_scan(d, None)
            while True:
                batch = await pending
                pending = asyncio.ensure_future(anext(changes))
                if any(Path(p) == d.path for _, p in batch) or not same():
                    return
                names = {Path(p).stem for _, p in batch if Path(p).parent == d.path}
                if names:
                    await self._safe_scan(d, names)
        finally:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
            await changes.aclose()

    async def _safe_scan(self, d: _Dir, names: set[str] | None) -> None:
        try:
            await self._scan_dir(d, names)
        except Exception:
            log.exception("reading the inboxes in %s failed; they are read again at the "
                          "next change", d.path)  # fmt: skip


def _ours(inboxes: Path, entries: list[dict[str, Any]], mark: StoreMark) -> list[bool | None]:
    """:func:`~backchannel.delivery.inbox_file.writer_is_ours` of each entry's sender."""
    whose: dict[str, bool | None] = {}
    out: list[bool | None] = []
    for e in entries:
        sender = e.get("from")
        if not isinstance(sender, str) or not sender:
            out.append(None)
            continue
        if sender not in whose:
            whose[sender] = writer_is_ours(inboxes, sender, mark)
        out.append(whose[sender])
    return out


def _inbox_file(team: str, inbox: str, root: Path | str | None) -> Path:
    return inbox_path(team, inbox, Path(root).expanduser() if root else default_root())


def _opt(setting: Mapping[str, Any], key: str) -> str | None:
    value = setting.get(key)
    return value if isinstance(value, str) and value else None
