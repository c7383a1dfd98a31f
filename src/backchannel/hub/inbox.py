"""Hub part: entries read from Claude Code inbox files, taken in exactly once.

A Claude Code teammate writes to another member's inbox file; whatever reads the files
(:mod:`backchannel.delivery.inbox_watch`) hands the entries of one file to
:meth:`InboxFiles.take_inbox_entries`, which, in one store transaction:

* skips the entries already taken in (the read cursor: ids per file, in the store), so a
  rewrite, a mark-read, a pruned file or a hub restart never brings one in twice;
* records, and does not bring in, an entry whose id is a hub message: the hub wrote it
  (the ``inbox-file`` adapter writes the message id as ``msg_id``);
* turns a protocol frame (:func:`backchannel.core.presence.classify`) into a line of the
  team's traffic and the sender's activity, never into chat;
* turns chat into a hub message from the entry's ``from`` to the file's owner, with the
  entry id as ``message_id``. When the owner reads the file itself (an ``inbox-file``
  member), its copy is acked at once: the file is where it reads it, and writing it back
  would show it twice.

An entry from a name that is not a member of the team is left for later (not recorded),
so adding the member brings it in; the result lists those names.

An entry whose ``from`` names a human member (``user``) is refused (recorded, never
brought in): any process of the user's can write any ``from`` into a file, and the hub
cannot tell who wrote it, so a file never speaks for a human, whose messages count
against no budget and whom agents take at its word. Claude Code's own lead writes such
entries into its teammates' files signed with a key only the teammate can check
(``lead_sig``); the teammate reads them from its file, so the hub's record lacks them
and no delivery does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backchannel.core import messages as rules
from backchannel.core import notices, presence
from backchannel.errors import BackchannelError
from backchannel.hub.context import Ctx, Env
from backchannel.hub.pipeline import Pipeline, SendOptions
from backchannel.types import (
    DeliveryEvent,
    DeliveryState,
    InboxEntry,
    MemberActivity,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
)

__all__ = ["InboxFiles", "PutBack", "TakeResult"]

log = logging.getLogger("backchannel.inbox")

_FORGED = (
    "its sender {sender!r} is a human member, and an inbox file cannot speak for a human "
    "(anything that can write {inbox} can write any sender); a human sends through the "
    "hub, or through the lead's prompt"
)
#: Imported chat: no link is opened and no agent rule refuses it (the teammate already sent it).
_IMPORTED = SendOptions(link=False, by_agent=False)


@dataclass(frozen=True, slots=True)
class TakeResult:
    """What :meth:`InboxFiles.take_inbox_entries` did with one file's entries."""

    messages: tuple[str, ...] = ()  # ids of the hub messages made from chat
    protocol: tuple[tuple[str, str], ...] = ()  # (sender, frame type) taken as state
    own: int = 0  # entries the hub wrote itself
    own_ids: tuple[str, ...] = ()  # their ids
    refused: tuple[tuple[str, str], ...] = ()  # (entry id, why) recorded, not brought in
    unknown_senders: tuple[str, ...] = ()  # left for later: not members of the team
    already: int = 0  # taken in before
    recipients: frozenset[str] = field(default_factory=frozenset)
    #: ids of the hub's entries taken in before (a bridge started since watches them
    #: too); only when the owner reads the file
    own_before: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PutBack:
    """The answer of :meth:`InboxFiles.put_back_inbox_entry`: the hub's message to write
    back (None: the member has no written copy, there is nothing to put back), and
    whether it was put back before (then it is not put back again)."""

    message: Message | None
    before: bool = False


#: The history event recording that a dropped inbox entry was put back.
_PUT_BACK = "inbox_put_back"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


class InboxFiles:
    """See the module docstring."""

    def __init__(self, env: Env, pipeline: Pipeline) -> None:
        self.env = env
        self.store, self.clock, self.config = env.store, env.clock, env.config
        self.pipeline = pipeline

    async def take_inbox_entries(
        self,
        team: str,
        inbox: str,
        owner: str,
        entries: Sequence[Mapping[str, Any]],
        *,
        owner_reads_file: bool,
    ) -> TakeResult:
        """Take in the entries of one inbox file (see the module docstring).

        ``inbox`` names the file for the cursor (``"<claude team>/<inbox name>"``);
        ``owner`` is the member the file belongs to; each entry carries its id in
        ``msg_id``. Idempotent: a second call with the same entries changes nothing.
        """
        ids = [str(e["msg_id"]) for e in entries]
        now = self.clock.now()

        def fn(c: Ctx) -> TakeResult:
            tx = c.tx
            known = tx.inbox_known(team, inbox, ids) if ids else set()
            members = {m.name: m for m in tx.list_members(team)}
            records: list[InboxEntry] = []
            made: list[str] = []
            proto: list[tuple[str, str]] = []
            refused: list[tuple[str, str]] = []
            unknown: set[str] = set()
            read: list[str] = []  # chat its owner reads from the file itself
            own: list[str] = []
            own_before: list[str] = []
            already = 0
            for e in entries:
                eid = str(e["msg_id"])
                if eid in known:
                    already += 1
                    if (
                        owner_reads_file
                        and (mine := tx.get_message(team, eid)) is not None
                        and mine.meta.get("inbox") != inbox  # not chat taken from this file
                    ):
                        own_before.append(eid)
                    continue
                known.add(eid)  # the same id twice in one file counts once
                sender = _text(e.get("from"))
                at = presence.entry_time(e.get("timestamp"), now)
                if (mine := tx.get_message(team, eid)) is not None:
                    own.append(eid)
                    records.append(InboxEntry(team, inbox, eid, mine.sender, "hub", at, now))
                    continue
                if (member := members.get(sender)) is None:
                    unknown.add(sender)
                    continue
                if member.kind is MemberKind.HUMAN:
                    refused.append((eid, _FORGED.format(sender=sender, inbox=inbox)))
                    records.append(InboxEntry(team, inbox, eid, sender, "skipped", at, now))
                    continue
                kind = presence.classify(e)
                record = InboxEntry(team, inbox, eid, sender, kind.kind, at, now, kind.terminates)
                if not kind.is_chat:
                    proto.append((sender, kind.kind))
                    detail = f"{sender}: {kind.kind}"
                    tx.add_history(team, DeliveryEvent(eid, owner, now, "inbox_protocol", detail))
                    records.append(record)
                    continue
                why = self._take_chat(c, team, inbox, owner, eid, sender, e, now, owner_reads_file)
                if why is None:
                    made.append(eid)
                    records.append(record)
                    if owner_reads_file:
                        read.append(eid)
                else:
                    refused.append((eid, why))
                    records.append(InboxEntry(team, inbox, eid, sender, "skipped", at, now))
            if records:
                tx.inbox_record(records)
            if read:
                # the owner reads them from its file: that handed them over
                got = [m for eid in read if (m := tx.get_message(team, eid)) is not None]
                self.pipeline.budgets.on_read_from_file(c, team, owner, got, now)
            return TakeResult(
                tuple(made),
                tuple(proto),
                len(own),
                tuple(own),
                tuple(refused),
                tuple(sorted(unknown)),
                already,
                frozenset({owner} if made else ()),
                own_before=tuple(own_before),
            )

        result = await self.env.transact(fn)
        for eid, why in result.refused:
            log.warning("inbox %s: entry %s was not taken in: %s", inbox, eid, why)
        if result.messages or result.protocol:
            self.env.waiters.notify_members(team, result.recipients)
        return result

    def _take_chat(
        self,
        c: Ctx,
        team: str,
        inbox: str,
        owner: str,
        eid: str,
        sender: str,
        e: Mapping[str, Any],
        now: float,
        owner_reads_file: bool,
    ) -> str | None:
        """Store one chat entry as a message; the reason it cannot be, or None."""
        text, summary = _text(e.get("text")), e.get("summary")
        summary = summary if isinstance(summary, str) and summary else None
        try:
            rules.check_message_id(eid)
            rules.check_text(text, self.config.max_text)
        except BackchannelError as exc:
            return exc.message
        meta = {"inbox": inbox}
        if isinstance(stamp := e.get("timestamp"), str):
            meta["timestamp"] = stamp
        message = Message(
            team=team,
            message_id=eid,
            sender=sender,
            to=owner,
            text=text,
            kind=MessageKind.DIRECT,
            created_at=now,
            fingerprint=rules.fingerprint(sender, owner, text, summary, "direct", None, meta),
            summary=summary,
            meta=meta,
        )
        try:
            self.pipeline.insert(c, message, None, _IMPORTED)
        except BackchannelError as exc:
            return exc.message
        if owner_reads_file:
            c.tx.transition(
                team,
                eid,
                owner,
                from_states=(DeliveryState.QUEUED,),
                to_state=DeliveryState.ACKED,
                now=now,
                event="acked",
                detail=f"read by {owner} from its inbox file {inbox}",
            )
        return None

    async def put_back_inbox_entry(
        self, team: str, message_id: str, member: str, detail: str
    ) -> PutBack:
        """``member``'s written copy of ``message_id`` was dropped from its inbox file
        before it read it (see :mod:`backchannel.delivery.inbox_watch`): may it be put
        back? The answer carries the hub's stored message, so what is written back is
        the hub's own words (an entry in the file that reuses the id says nothing about
        them), and nothing when ``member`` has no written copy of it (the id names a
        message to someone else, or a copy queued or dead, or chat taken in from a file).
        A copy is put back once: the first answer records it in the message's history
        (``inbox_put_back``), and every later one, whatever bridge or hub process asks
        and after any restart, says it was (``before``)."""
        now = self.clock.now()

        def fn(c: Ctx) -> PutBack:
            tx = c.tx
            msg = tx.get_message(team, message_id)
            written = (DeliveryState.LEASED, DeliveryState.DELIVERED, DeliveryState.ACKED)
            if msg is None or not any(
                d.recipient.member == member and d.state in written
                for d in tx.deliveries(team, message_id)
            ):
                return PutBack(None)
            events = {ev.event for ev in tx.history(team, message_id) if ev.member == member}
            if "leased" not in events:  # never written by the hub: chat taken from a file
                return PutBack(None)
            if _PUT_BACK in events:
                return PutBack(msg, before=True)
            tx.add_history(team, DeliveryEvent(message_id, member, now, _PUT_BACK, detail))
            return PutBack(msg)

        return await self.env.transact(fn)

    async def lost_inbox_entry(self, team: str, message_id: str, member: str, reason: str) -> bool:
        """The copy of ``message_id`` for ``member``, written to its inbox file and counted
        delivered, is gone from the file before ``member`` read it (a rewrite dropped it,
        see :mod:`backchannel.delivery.inbox_watch`): it is dead, and its sender is told.
        False when the copy is not a written one (dead already, queued, or unknown)."""
        now = self.clock.now()

        def fn(c: Ctx) -> bool:
            moved = c.tx.transition(
                team,
                message_id,
                member,
                # leased: written, and the dispatcher has not recorded it yet
                from_states=(DeliveryState.LEASED, DeliveryState.DELIVERED, DeliveryState.ACKED),
                to_state=DeliveryState.DEAD,
                now=now,
                event="dead",
                detail=reason,
                dead_reason=reason,
            )
            if not moved:
                return False
            msg = c.tx.get_message(team, message_id)
            if (
                msg is not None
                and msg.kind is not MessageKind.SYSTEM
                and c.tx.get_member(team, msg.sender) is not None
            ):
                notice = notices.dead_letter(msg, Recipient(member), reason, now)
                if c.tx.get_message(team, notice.message_id) is None:
                    self.pipeline.insert(c, notice, None)
            return True

        moved = await self.env.transact(fn)
        if moved:
            log.warning("inbox entry %s for %s is dead: %s", message_id, member, reason)
        return moved

    async def skip_inbox_entries(
        self, team: str, inbox: str, entries: Sequence[Mapping[str, Any]], why: str
    ) -> int:
        """Record ``entries`` of ``inbox`` as read without taking them in (``skipped``):
        entries the hubs of another store took in while its claim on the file held, read
        by this store's when it took the file over. Idempotent; the number recorded."""
        now = self.clock.now()
        records = [
            InboxEntry(
                team,
                inbox,
                str(e["msg_id"]),
                _text(e.get("from")),
                "skipped",
                presence.entry_time(e.get("timestamp"), now),
                now,
            )
            for e in entries
        ]
        if records:
            await self.store.transact(lambda tx: tx.inbox_record(records))
            log.info("inbox %s: %d entries taken in by another store's hub are left: %s",
                     inbox, len(records), why)  # fmt: skip
        return len(records)

    async def forget_inbox_entries(
        self, team: str, inbox: str, keep: Sequence[str], older_than: float
    ) -> int:
        """Drop cursor records of ``inbox`` taken in more than ``older_than`` seconds ago
        whose ids are not in ``keep`` (the ids the file still holds): they cannot come
        back, and the cursor stays as small as the files."""
        before, kept = self.clock.now() - older_than, frozenset(keep)
        return await self.store.transact(lambda tx: tx.inbox_forget(team, inbox, before, kept))

    async def member_activity(self, team: str) -> list[MemberActivity]:
        """Each member's activity as its inbox traffic shows it (members that wrote
        nothing are left out); :func:`backchannel.core.presence.activity_state` turns one
        into ``active``/``idle``/``terminated``."""
        return await self.store.read(lambda tx: tx.inbox_activity(team))

    async def member_states(self, team: str) -> dict[str, dict[str, Any]]:
        """Per member with inbox traffic: ``state`` (``active``/``idle``/``terminated``, by
        the hub's clock now), ``last_activity``, ``last_event`` and ``terminated_at``."""
        now = self.clock.now()
        return {
            a.member: {
                "state": presence.activity_state(a, now).value,
                "last_activity": a.last_at,
                "last_event": a.last_kind,
                "terminated_at": a.terminated_at,
            }
            for a in await self.member_activity(team)
        }
