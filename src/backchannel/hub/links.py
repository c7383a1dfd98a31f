"""Bidirectional links: a finished turn goes straight into the linked peer's session.

``send_message`` from a session's turn to another member opens a link unless one is
open between the two members (or the sender opts out with ``link=False``). From then
on, when either side's turn ends, its output (the closing text outside ``<message>``
blocks) is delivered to the other as ``[From <member>] <text>``, pinned to the peer's
session so it waits for the peer's turn to end. Checkpoint turns cross nothing and use
no budget. Each crossing uses one turn; a spent link closes (``budget_exhausted``) and
both sides are told. Only the initiator closes a link; a link closes when either
session terminates, and survives a session restart (its id stays).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from backchannel.core import links as rules
from backchannel.core import notices
from backchannel.errors import BudgetExhausted, Forbidden, InvalidRequest, NotFound
from backchannel.hub.context import Ctx, Env
from backchannel.hub.pipeline import Pipeline, Send
from backchannel.stores.base import Tx
from backchannel.types import (
    BROADCAST,
    InboxMessage,
    LedgerEntry,
    Link,
    LinkState,
    Session,
    SessionState,
)


class Links:
    """Links (see the module docstring)."""

    def __init__(self, env: Env, pipeline: Pipeline) -> None:
        self.env = env
        self.store, self.clock = env.store, env.clock
        self.pipeline = pipeline

    async def list_links(
        self,
        team: str,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Link]:
        """A team's links (or one member's), in the order they opened: those opened
        after link ``after`` (the last one of the page before), at most ``limit`` (all
        when None). Links are kept as long as their team, closed ones too, so ``after``
        names one the team still has."""

        def read(tx: Tx) -> list[Link]:
            start = None
            if after is not None:
                last = tx.get_link(team, after)
                if last is None:
                    raise InvalidRequest(
                        f"after names no link of team {team!r} ({after!r}); give the last "
                        "link id of the page before, or none for the first page",
                        field="after",
                    )
                start = (last.created_at, last.link_id)
            return tx.list_links(team, member=member, open_only=open_only, after=start, limit=limit)

        return await self.store.read(read)

    async def links_overview(self, team: str, finished: int) -> tuple[list[Link], list[Link], int]:
        """The dashboard's links in one read, bounded by the open links and ``finished``,
        not by every link the team ever closed: the open links (oldest first), the latest
        ``finished`` closed ones (newest first) and how many closed links there are."""

        def read(tx: Tx) -> tuple[list[Link], list[Link], int]:
            return (
                tx.list_links(team, open_only=True),
                tx.latest_closed_links(team, finished),
                tx.count_closed_links(team),
            )

        return await self.store.read(read)

    async def get_link(self, team: str, link_id: str) -> Link:
        link = await self.store.read(lambda tx: tx.get_link(team, link_id))
        if link is None:
            raise NotFound(f"unknown link {link_id!r} in team {team!r}", link_id=link_id)
        return link

    # -- opening and closing, as part of a send ----------------------------------------
    def check_close(self, s: Send) -> None:
        """Refuse ``close_link`` unless the sender opened the link it would close."""
        message = s.message
        if not s.options.close_link:
            return
        if message.to == BROADCAST:
            raise InvalidRequest("close_link needs one recipient, not '*'", field="close_link")
        link = s.open_link()
        if link is None:
            raise InvalidRequest(
                f"there is no open link between {message.sender!r} and {message.to!r} to "
                "close; send without close_link",
                field="close_link",
            )
        if link.initiator != message.sender:
            raise Forbidden(
                f"only {link.initiator!r}, who opened link {link.link_id}, can close it; "
                "you may simply stop replying (silence is valid)",
                link_id=link.link_id,
            )

    def after_send(self, s: Send) -> None:
        """A stored send closes the link it asked to close, or opens one (the rules:
        :func:`backchannel.core.links.may_change_links` and ``opens_link``)."""
        c, tx, message, options = s.c, s.c.tx, s.message, s.options
        if not rules.may_change_links(message.kind, message.sender, message.to):
            return
        now = message.created_at
        if options.close_link:
            link = s.open_link()
            if link is not None:
                self.close(c, link, "closed_by_initiator", now)
            return
        if not options.link or s.open_link() is not None:
            return
        session = s.turn_session()
        callee = tx.get_member(message.team, message.to) if session is not None else None
        if session is None or not rules.opens_link(callee.kind if callee else None):
            return
        team = tx.get_team(message.team)
        settings: Mapping[str, Any] = team.settings if team else {}
        budget = options.link_budget or rules.team_budget(settings)
        responder_session = s.recipients[0].session if s.recipients else None
        if responder_session is None:
            live = tx.list_sessions(message.team, message.to, which="live", limit=2)
            responder_session = live[0].session_id if len(live) == 1 else None
        link = Link(
            team=message.team,
            link_id="lnk_" + uuid.uuid4().hex[:16],
            initiator=message.sender,
            initiator_session=session.session_id,
            responder=message.to,
            responder_session=responder_session,
            budget=budget,
            created_at=now,
            history=(
                {
                    "at": now,
                    "event": "opened",
                    "by": message.sender,
                    "message_id": message.message_id,
                },
            ),
        )
        if tx.insert_link(link).link_id != link.link_id:
            return  # a concurrent first send opened it
        for member in (link.initiator, link.responder):
            peer = link.peer_of(member)[0]
            self._notice(
                c,
                link,
                member,
                rules.rules_text(settings, peer, budget),
                now,
                summary=f"linked with {peer}",
                event="opened",
            )

    def _side_session(self, link: Link, member: str) -> str | None:
        return link.initiator_session if member == link.initiator else link.responder_session

    def _notice(
        self,
        c: Ctx,
        link: Link,
        member: str,
        text: str,
        now: float,
        *,
        summary: str,
        event: str,
    ) -> None:
        """A ``system`` message from the hub to one side of a link."""
        sid = self._side_session(link, member)
        s = c.tx.get_session(link.team, sid) if sid else None
        pinned = sid if s is not None and s.state is not SessionState.TERMINATED else None
        meta = {"link_id": link.link_id, "event": event}
        msg = notices.system(link.team, member, text, now, summary=summary, meta=meta)
        self.pipeline.insert(c, msg, pinned)

    def close(self, c: Ctx, link: Link, reason: str, now: float) -> Link:
        """Close ``link`` for ``reason`` and tell both sides."""
        closed = dataclasses.replace(
            link,
            state=LinkState.CLOSED,
            closed_at=now,
            close_reason=reason,
            history=(*link.history, {"at": now, "event": "closed", "reason": reason}),
        )
        c.tx.update_link(closed)
        for member in (link.initiator, link.responder):
            self._notice(
                c,
                closed,
                member,
                rules.closed_text(closed, reason, member),
                now,
                summary=f"link with {closed.peer_of(member)[0]} closed: {reason}",
                event="closed",
            )
        return closed

    # -- binding the responder's session ---------------------------------------------
    def _bind(self, c: Ctx, link: Link, session: Session) -> Link:
        if link.responder_session is not None or session.member != link.responder:
            return link
        bound = dataclasses.replace(link, responder_session=session.session_id)
        c.tx.update_link(bound)
        return bound

    def on_lease(self, c: Ctx, session: Session, got: Sequence[InboxMessage]) -> None:
        """A session handed a link's message is that link's responder side."""
        for m in got:
            link_id = m.message.meta.get("link_id")
            if isinstance(link_id, str):
                link = c.tx.get_link(session.team, link_id)
                if link is not None and link.state is LinkState.OPEN:
                    self._bind(c, link, session)

    def _session_links(self, c: Ctx, session: Session) -> list[Link]:
        """Open links this session is on (binding unbound ones where it is the responder)."""
        out = []
        for link in c.tx.list_links(session.team, member=session.member, open_only=True):
            if link.responder == session.member and link.responder_session is None:
                link = self._bind(c, link, session)
            if session.session_id in (link.initiator_session, link.responder_session):
                out.append(link)
        return out

    # -- crossing at the end of a turn ---------------------------------------------------
    def after_stop(
        self,
        c: Ctx,
        session: Session,
        output: str,
        checkpoint_turn: bool,
        ledger: Sequence[LedgerEntry],
        now: float,
    ) -> dict[str, Any]:
        """A turn's output crosses each open link of its session."""
        tx = c.tx
        crossed: list[dict[str, Any]] = []
        for link in self._session_links(c, session):
            peer, peer_session = link.peer_of(session.member)
            if peer == session.member:
                continue  # a link to oneself (an older hub opened them): no peer to reach
            decision = rules.decide_crossing(link, peer, output, checkpoint_turn, ledger)
            if decision.action is not rules.Crossing.CROSS:
                if decision.action is rules.Crossing.REPEAT:
                    tx.update_link(
                        dataclasses.replace(
                            link,
                            history=(
                                *link.history,
                                {"at": now, "event": "repeat_not_injected", "from": session.member},
                            ),
                        )
                    )
                continue
            n = link.turns_used + 1
            pinned = peer_session
            if pinned is not None:
                peer_s = tx.get_session(session.team, pinned)
                if peer_s is None or peer_s.state is SessionState.TERMINATED:
                    pinned = None
            msg = notices.crossing(
                link, session.member, session.session_id, peer, output, n, pinned, now
            )
            try:
                self.pipeline.insert(c, msg, pinned)
            except BudgetExhausted as exc:
                self._crossing_refused(c, link, session, exc, now)
                c.wake(session.team, peer)
                continue
            # re-read: the crossing may have spent the pair's budget, which closes the link
            used = dataclasses.replace(
                tx.get_link(link.team, link.link_id) or link,
                turns_used=n,
                history=(
                    *link.history,
                    {
                        "at": now,
                        "event": "crossing",
                        "n": n,
                        "from": session.member,
                        "message_id": msg.message_id,
                    },
                ),
            )
            tx.update_link(used)
            crossed.append(
                {"link_id": link.link_id, "to": peer, "turns_used": n, "budget": link.budget}
            )
            if decision.closes and used.state is LinkState.OPEN:
                self.close(c, used, "budget_exhausted", now)
        return {"crossed": crossed}

    def _crossing_refused(
        self, c: Ctx, link: Link, session: Session, exc: BudgetExhausted, now: float
    ) -> None:
        """A turn's output over the pair's or the chain's budget: it does not cross, its
        sender is told why, and the link closes (nothing more could cross it)."""
        peer = link.peer_of(session.member)[0]
        self._notice(
            c,
            link,
            session.member,
            f"Your turn's output did not reach {peer}: {exc.message}",
            now,
            summary=f"output not sent to {peer}: budget spent",
            event="refused",
        )
        current = c.tx.get_link(link.team, link.link_id)
        if current is not None and current.state is LinkState.OPEN:
            self.close(c, current, "conversation_budget", now)

    def on_terminate(self, c: Ctx, session: Session, reason: str = "session_terminated") -> None:
        """A session that terminated closes its links for ``reason`` (see the module
        docstring)."""
        tx, now = c.tx, self.clock.now()
        # one entry of the live sessions' index, not every session the member ever had
        live = bool(tx.list_sessions(session.team, session.member, which="live", limit=1))
        for link in tx.list_links(session.team, member=session.member, open_only=True):
            # a side whose member has no live session left can take no more turns, whether
            # or not the link ever bound one of its sessions
            if not live or session.session_id in (link.initiator_session, link.responder_session):
                self.close(c, link, reason, now)
