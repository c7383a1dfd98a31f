"""Credentials and removal: token rotation, member removal, team removal.

What happens to a removed member's traffic (the contract, also in docs/decisions.md):

* copies still ``queued`` or ``leased`` for it become ``dead`` with the reason
  ``recipient '<name>' was removed from team '<team>'``, and each sender gets the usual
  ``system`` notice (nothing vanishes without a word);
* messages it sent that are still queued for others are delivered as usual;
* its sessions terminate, which closes their links and tells the peers; links not yet
  bound to one of its sessions close with the reason ``member_removed``;
* its pending timers and other scheduled jobs of its sessions are cancelled;
* its token stops working at once (this process forgets every cached token), and a
  request that waits with it (:meth:`Admin.watch_revocation`) is woken: in this process
  at once, in another hub process on the same store within the store's wake-up latency
  (:meth:`Admin.on_external_change` asks the store whether the tokens its requests wait
  with still work whenever another process changed a team's credentials, or may have).

Removing a team deletes everything stored for it; the answer says how many undelivered
copies went with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from backchannel.errors import InvalidRequest, UnknownMember, UnknownTeam
from backchannel.hub.context import Ctx, Env
from backchannel.hub.links import Links
from backchannel.hub.members import Members, hash_token, new_token
from backchannel.hub.messages import Messages
from backchannel.hub.pipeline import Pipeline
from backchannel.hub.quotas import Quotas
from backchannel.hub.sessions import Sessions
from backchannel.stores.base import Tx
from backchannel.types import USER, DeliveryState, EventKind, JobState, SessionState

#: Copies settled per round when a member is removed (each round is one store call).
_BATCH = 1000

#: The least time between two looks at the store for the tokens requests of this
#: process wait with, when other processes' changes keep coming (SQLite says only that
#: something changed, up to every quarter second: the same latency its wake-ups give).
CHECK_INTERVAL = 0.25

log = logging.getLogger("backchannel.hub")


@dataclass(frozen=True, slots=True)
class Removal:
    """What removing a member (or a team) settled."""

    team: str
    name: str | None
    dead_letters: int = 0  # copies for the removed member, now dead (senders told)
    sessions_terminated: int = 0
    links_closed: int = 0
    jobs_cancelled: int = 0
    dropped: int = 0  # team removal: undelivered copies deleted with the team

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Admin:
    """Token rotation and removal (see the module docstring)."""

    def __init__(
        self,
        env: Env,
        members: Members,
        quotas: Quotas,
        messages: Messages,
        sessions: Sessions,
        links: Links,
        pipeline: Pipeline,
    ) -> None:
        self.env = env
        self.store, self.clock = env.store, env.clock
        self.members, self.quotas, self.messages = members, quotas, messages
        self.sessions, self.links, self.pipeline = sessions, links, pipeline
        #: Events of requests that wait with a token, by the token's hash: set when the
        #: token stops working here (see :meth:`watch_revocation`).
        self._waiting: dict[str, set[asyncio.Event]] = {}
        #: The team of each watched token (by hash): whose credentials to look at again
        #: when another process changes a team's (see :meth:`on_external_change`).
        self._team_of: dict[str, str] = {}
        #: Teams whose watched tokens are to be looked at again (``None``: every team).
        self._recheck: set[str | None] = set()
        self._checker: asyncio.Task[None] | None = None

    async def rotate_token(self, team: str, name: str) -> str:
        """Give a member a new token and return it; the old one fails from now on."""
        token = new_token()

        def fn(tx: Tx) -> str:
            old = tx.get_member(team, name)
            if old is None or not tx.set_token_hash(team, name, hash_token(token)):
                self._missing(tx, team, name)
            assert old is not None
            return old.token_hash

        self._revoke([await self.store.transact(fn)])
        return token

    async def remove_member(self, team: str, name: str, *, reason: str = "") -> Removal:
        """Remove a member (see the module docstring for what happens to its traffic)."""
        if name == USER:
            raise InvalidRequest(
                f"every team keeps its {USER!r} member; rotate its token instead, or remove "
                "the team",
                field="name",
            )
        why = f"recipient {name!r} was removed from team {team!r}" + (
            f" ({reason})" if reason else ""
        )
        advice = f"It will not be delivered: {name} is no longer a member of the team."
        now = self.clock.now()

        def fn(c: Ctx) -> Removal:
            tx = c.tx
            revoked.clear()
            if tx.get_member(team, name) is None:
                self._missing(tx, team, name)
            terminated = cancelled = closed = 0
            for link in tx.list_links(team, member=name, open_only=True):
                self.links.close(c, link, "member_removed", now)
                closed += 1
            for s in tx.list_sessions(team, name):
                for job in tx.list_jobs(team, session_id=s.session_id, pending_only=True):
                    cancelled += tx.finish_job(job.job_id, JobState.CANCELLED, now)
                if s.state is SessionState.TERMINATED:
                    continue
                tx.ledger_clear(team, s.session_id)
                done = dataclasses.replace(
                    s, state=SessionState.TERMINATED, updated_at=now, turn_started_at=None
                )
                tx.put_session(done)
                self.sessions.event(c, done, EventKind.SESSION, "terminated: member removed")
                self.pipeline.terminated(c, done, "member_removed")
                terminated += 1
            for m in tx.list_members(team):
                c.wake(team, m.name)  # peers were told
            dead = 0
            while batch := tx.undelivered(team, name, _BATCH):
                for d in batch:
                    moved = tx.transition(
                        team,
                        d.message_id,
                        name,
                        from_states=[DeliveryState.QUEUED, DeliveryState.LEASED],
                        to_state=DeliveryState.DEAD,
                        now=now,
                        event="dead",
                        detail=why,
                        dead_reason=why,
                    )
                    if moved:
                        dead += 1
                        self.messages.dead_notice(c, d, why, now, advice)
            revoked.append(tx.get_member(team, name).token_hash)  # type: ignore[union-attr]
            tx.delete_member(team, name)
            return Removal(team, name, dead, terminated, closed, cancelled)

        revoked: list[str] = []
        removal = await self.env.transact(fn)
        self._revoke(revoked)
        self.env.waiters.notify_watchers(team)
        return removal

    async def remove_team(self, team: str) -> Removal:
        """Delete a team and everything stored for it."""

        def fn(tx: Tx) -> Removal:
            if tx.get_team(team) is None:
                raise UnknownTeam(f"unknown team {team!r}; list teams to see them", team=team)
            revoked[:] = [m.token_hash for m in tx.list_members(team)]
            return Removal(team, None, dropped=tx.delete_team(team))

        revoked: list[str] = []
        removal = await self.store.transact(fn)
        self._revoke(revoked)
        self.env.waiters.notify(team, None)
        return removal

    def _revoke(self, token_hashes: list[str]) -> None:
        """Tokens that stopped working: forget every cached token (a client in this
        process that authenticated once looks its member up again: see
        ``Members.token_generation``) and stop the requests waiting with these."""
        self.members.forget_tokens()
        self.quotas.forget()  # a name added again starts with a fresh count
        for digest in token_hashes:
            for event in self._waiting.pop(digest, ()):
                event.set()

    @contextlib.contextmanager
    def watch_revocation(
        self, token_hash: str, event: asyncio.Event, team: str | None = None
    ) -> Iterator[None]:
        """Set ``event`` if the token hashing to ``token_hash`` (of a member of
        ``team``) is rotated away, or its member or team removed, while the ``with``
        lasts: a long-poll that may wait an hour stops waiting then, and answers why.
        By this process, at once; by another hub process on the same store, once this
        one hears of the change (:meth:`on_external_change`). Without ``team``, only a
        store that says nothing of whose change it saw (SQLite) tells another process's
        revocation."""
        events = self._waiting.setdefault(token_hash, set())
        events.add(event)
        if team is not None:
            self._team_of[token_hash] = team
        try:
            yield
        finally:
            events.discard(event)
            if not events and self._waiting.get(token_hash) is events:
                del self._waiting[token_hash]
                self._team_of.pop(token_hash, None)

    def on_external_change(self, team: str | None, member: str | None) -> None:
        """Another process changed the store. A change the store says is a team's as a
        whole (PostgreSQL notifies ``(team, None)`` for a rotation or a removal), or
        one it cannot attribute (``(None, None)``: SQLite's, or a fallback), may have
        revoked a token a request of this process waits with: look the watched tokens
        of that team (or of all) up again, at most every :data:`CHECK_INTERVAL`. A
        change to one member's inbox is a delivery, and revokes nothing.

        Either kind also forgets the cached tokens (of that team, or all): a request that
        does not wait is refused with a rotated token as soon as this process hears,
        not when the cache's answer is ``TOKEN_CACHE_SECONDS`` old. With nothing
        changed, the cache answers with no store read."""
        if member is not None:
            return
        self.members.forget_tokens(team)  # cached answers (of the team) may be stale
        if not self._waiting:
            return
        self._recheck.add(team)
        if self._checker is None or self._checker.done():
            self._checker = asyncio.ensure_future(self._check())

    async def close(self) -> None:
        """Stop looking watched tokens up (the hub closes its store next)."""
        checker, self._checker = self._checker, None
        if checker is not None and not checker.done():
            checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checker

    async def _check(self) -> None:
        """Look up the watched tokens of the teams in ``_recheck`` until none are left;
        those that no longer belong to a member are revoked here (:meth:`_revoke`)."""
        while self._recheck:
            teams, self._recheck = self._recheck, set()
            every = None in teams
            digests = [d for d in self._waiting if every or self._team_of.get(d, None) in teams]
            if digests:
                try:
                    gone = await self.store.read(_no_member(digests))
                except Exception as exc:  # a store outage: the next change asks again
                    log.debug("could not look watched tokens up again: %s", exc)
                    gone = []
                if gone:
                    self._revoke(gone)
            await asyncio.sleep(CHECK_INTERVAL)

    @staticmethod
    def _missing(tx: Tx, team: str, name: str) -> None:
        if tx.get_team(team) is None:
            raise UnknownTeam(f"unknown team {team!r}; list teams to see them", team=team)
        raise UnknownMember(
            f"unknown member {name!r} in team {team!r}; list its members to see them",
            member=name,
        )


def _no_member(digests: list[str]) -> Callable[[Tx], list[str]]:
    """A read: which of the token hashes ``digests`` belong to no member (any more)."""
    return lambda tx: [d for d in digests if tx.member_by_token_hash(d) is None]
