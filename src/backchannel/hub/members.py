"""Teams and members: creation, settings, and authentication by token.

Tokens are 256-bit random strings; only their SHA-256 hashes are stored. An
authenticated token is remembered briefly (see ``TOKEN_CACHE_SECONDS``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backchannel.core import messages as rules
from backchannel.errors import AlreadyExists, InvalidRequest, UnknownMember, UnknownTeam
from backchannel.hub.checks import DeliveryChecks
from backchannel.hub.context import Env
from backchannel.hub.quotas import Quotas
from backchannel.stores.base import Tx
from backchannel.types import HUB_SENDER, USER, Member, MemberKind, Team

__all__ = ["Members", "hash_token", "new_token"]


def new_token() -> str:
    return "bc_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


#: How long an authenticated token is remembered. A rotation or removal clears this
#: process's cache at once; another hub process on the same store clears its own when
#: the store tells it of the change (PostgreSQL's notification; on SQLite, which says
#: only that another process committed, within a quarter second of any such commit),
#: and within this at the latest.
TOKEN_CACHE_SECONDS = 5.0


@dataclass
class _Cached:
    member: Member
    until: float


class Members:
    """Teams and members (see the module docstring)."""

    def __init__(self, env: Env, quotas: Quotas, *, check_delivery: bool = True) -> None:
        self.env = env
        self.store, self.clock = env.store, env.clock
        self.quotas = quotas
        # refuse delivery settings the registered adapters do not understand (they
        # register their checks here, see hub/checks.py); off for a hub whose dispatcher
        # brings adapters of its own
        self.check_delivery = check_delivery
        self.delivery_checks = DeliveryChecks()
        self._tokens: dict[str, _Cached] = {}
        self._forgot = 0  # how often the cache was forgotten: a read under way then caches nothing

    @property
    def token_generation(self) -> int:
        """How often the cached tokens were forgotten: a caller that authenticated once
        looks its member up again when this moved (a token may have stopped working)."""
        return self._forgot

    def forget_tokens(self, team: str | None = None) -> None:
        """Forget the cached tokens (of ``team``'s members only, if given), and the
        answers of reads under way (they may have read before the change)."""
        self._forgot += 1
        if team is None:
            self._tokens.clear()
        else:
            for digest in [d for d, c in self._tokens.items() if c.member.team == team]:
                del self._tokens[digest]

    async def create_team(
        self, name: str, *, settings: Mapping[str, Any] | None = None
    ) -> tuple[Team, str]:
        """Create a team and its ``user`` member. Returns the team and ``user``'s token."""
        rules.check_name("team", name)
        grace = (settings or {}).get("exit_grace_seconds")
        if grace is not None and (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not 0 <= grace <= 2_592_000
        ):
            raise InvalidRequest(
                f"exit_grace_seconds must be a number of seconds from 0 to 2592000 (30 days), "
                f"not {grace!r}",
                field="settings.exit_grace_seconds",
            )
        now = self.clock.now()
        token = new_token()
        team = Team(name, now, dict(settings or {}))
        user = Member(name, USER, MemberKind.HUMAN, now, hash_token(token))

        def fn(tx: Tx) -> None:
            if tx.get_team(name) is not None:
                raise AlreadyExists(f"team {name!r} already exists; pick another name")
            tx.insert_team(team)
            tx.insert_member(user)

        await self.store.transact(fn)
        return team, token

    async def get_team(self, name: str) -> Team:
        team = await self.store.read(lambda tx: tx.get_team(name))
        if team is None:
            raise UnknownTeam(f"unknown team {name!r}; create it first", team=name)
        return team

    async def list_teams(self, *, after: str | None = None, limit: int | None = None) -> list[Team]:
        """The teams by name: those after the name ``after`` (the last one of the page
        before), at most ``limit`` (all when None)."""
        return await self.store.read(lambda tx: tx.list_teams(after=after, limit=limit))

    async def count_teams(self) -> int:
        """How many teams there are, without reading them."""
        return await self.store.read(lambda tx: tx.count_teams())

    async def add_member(
        self,
        team: str,
        name: str,
        kind: MemberKind | str = MemberKind.LLM,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> tuple[Member, str]:
        """Add a member and return it with its secret token (shown only here)."""
        rules.check_name("member", name)
        try:
            kind = MemberKind(kind)
        except ValueError:
            choices = ", ".join(k.value for k in MemberKind)
            raise InvalidRequest(f"unknown member kind {kind!r}; use one of: {choices}") from None
        if name == HUB_SENDER:
            raise InvalidRequest(f"{HUB_SENDER!r} is reserved for the hub's own messages")
        if name.casefold() in (HUB_SENDER, USER) and name != USER:
            # framed "[From User]", a member's text would pass for the human's (or the hub's)
            raise InvalidRequest(
                f"member name {name!r} reads as the reserved {name.casefold()!r} (the "
                "team's human, the hub's own messages); choose another name",
                field="name",
            )
        if self.check_delivery and delivery:
            # off the event loop: a check may ask a program (tmux) on this host
            await asyncio.to_thread(self.delivery_checks.check, delivery)
        token = new_token()
        member = Member(
            team,
            name,
            kind,
            self.clock.now(),
            hash_token(token),
            dict(delivery or {}),
            dict(settings or {}),
        )

        def fn(tx: Tx) -> None:
            if tx.get_team(team) is None:
                raise UnknownTeam(f"unknown team {team!r}; create it first", team=team)
            if tx.get_member(team, name) is not None:
                raise AlreadyExists(f"member {name!r} already exists in team {team!r}")
            self._clash(tx, team, name, delivery)
            tx.insert_member(member)

        await self.store.transact(fn)
        return member, token

    async def update_member(
        self,
        team: str,
        name: str,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Member:
        """Change how a member's messages reach it (``delivery``) or its ``settings``;
        what is not given stays."""
        if self.check_delivery and delivery:
            # off the event loop: a check may ask a program (tmux) on this host
            await asyncio.to_thread(self.delivery_checks.check, delivery)

        def fn(tx: Tx) -> Member:
            m = tx.get_member(team, name)
            if m is None:
                if tx.get_team(team) is None:
                    raise UnknownTeam(f"unknown team {team!r}", team=team)
                raise UnknownMember(f"unknown member {name!r} in team {team!r}", member=name)
            new = dataclasses.replace(
                m,
                delivery=dict(delivery) if delivery is not None else m.delivery,
                settings=dict(settings) if settings is not None else m.settings,
            )
            if new.delivery != m.delivery:
                self._clash(tx, team, name, new.delivery)
            tx.update_member(new)
            if new.delivery != m.delivery and tx.push_circuit(team, name) is not None:
                # a circuit is about the old target: the new one is tried afresh
                tx.set_push_circuit(team, name, None)
            return new

        member = await self.store.transact(fn)
        self.forget_tokens()  # cached members carry the old settings
        self.quotas.forget()  # and the room left under the old limits
        if delivery is not None:
            # this hub's own worker on the old target holds its circuit in memory until
            # it stops at its next look: the circuit is about the old target, shown no more
            self.env.push_circuits.close(team, name)
        return member

    def _clash(self, tx: Tx, team: str, name: str, delivery: Mapping[str, Any] | None) -> None:
        """Refuse ``delivery`` for ``name`` if it would deliver where another member of
        the team does (the registered clash checks: one inbox file for two members)."""
        if not (self.check_delivery and delivery and self.delivery_checks):
            return
        others = {m.name: m.delivery for m in tx.list_members(team) if m.name != name}
        self.delivery_checks.clash(team, name, delivery, others)

    async def list_members(
        self, team: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Member]:
        """A team's members by name: those after the name ``after`` (the last one of the
        page before: a member removed since still marks the place), at most ``limit``
        (all when None)."""

        def fn(tx: Tx) -> list[Member]:
            if tx.get_team(team) is None:
                raise UnknownTeam(f"unknown team {team!r}", team=team)
            return tx.list_members(team, after=after, limit=limit)

        return await self.store.read(fn)

    async def get_member(self, team: str, name: str) -> Member:
        member = await self.store.read(lambda tx: tx.get_member(team, name))
        if member is None:
            raise UnknownMember(f"unknown member {name!r} in team {team!r}", member=name)
        return member

    async def authenticate(self, token: str) -> Member | None:
        """The member whose token this is, or ``None``. Positive answers are cached
        briefly (tokens are 256-bit random strings; only their hashes are stored)."""
        return await self.member_of_token(hash_token(token))

    async def member_of_token(self, digest: str) -> Member | None:
        """The member whose token hashes to ``digest``, or ``None``: what
        :meth:`authenticate` answers, for a caller that kept only the hash (a dashboard's
        ticket, a request that waits and asks again). A token rotated or removed in this
        process is refused at once (the cache is forgotten); in another hub process on
        the same store, as soon as the store tells this one of the change (see
        ``TOKEN_CACHE_SECONDS``)."""
        now = self.clock.now()
        cached = self._tokens.get(digest)
        if cached is not None and cached.until > now:
            return cached.member
        forgot = self._forgot
        member = await self.store.read(lambda tx: tx.member_by_token_hash(digest))
        if member is not None and forgot == self._forgot:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            self._tokens[digest] = _Cached(member, now + TOKEN_CACHE_SECONDS)
        return member
