"""Conversation budgets: the backstop against loops that no route can bypass.

Two budgets bound what agents say to each other without a human in between:

* **per pair of members** (team settings ``pair_budget``, ``pair_window``): every
  agent-originated exchange between two members counts, whichever route carries it
  (a ``send_message`` with or without a link, a link crossing, a closing
  ``<message>`` block, a broadcast's copy, a delegation's task and its answer). An
  exchange is a change of speaker: ``A→B`` then ``B→A`` are two; several messages in a
  row from ``A`` to ``B`` are one, so a lead handing out work or a worker reporting
  progress is not a loop, and two agents that always answer each other spend one unit
  per message. Once spent, nothing agent-originated passes between the two until the
  window that began with their first exchange has passed, or a human or administrator
  extends it.
* **per chain** (team setting ``chain_budget``): every message belongs to a chain,
  started by a human's message, a timer, or a task from outside the team's agents, and
  carries its hop count. An agent's send inherits the chain of the input that started
  its turn, one hop further. A send past the chain's budget is refused, which stops
  rings of three or more agents that no pair limit sees.

Messages from humans never count; they start a new chain. Everything here is pure:
the hub loads the records, asks these functions, and writes what they return.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backchannel.errors import InvalidRequest
from backchannel.types import MESSAGE_ID_PATTERN, Budget

DEFAULT_PAIR_BUDGET = 24
DEFAULT_PAIR_WINDOW = 3600.0
DEFAULT_CHAIN_BUDGET = 32
MAX_EXTEND = 1000
#: Highest hop another hub may name for a task's chain (``/api/chat``'s ``chain.hop``).
MAX_HOP = 1_000_000
#: Where an A2A message names its chain (``{"id", "hop"}``, as ``/api/chat``'s ``chain``):
#: a key of the message's ``metadata``.
A2A_CHAIN_KEY = "backchannel.chain"
_CHAIN_ID_RE = re.compile(MESSAGE_ID_PATTERN)


class Scope(StrEnum):
    PAIR = "pair"
    CHAIN = "chain"


@dataclass(frozen=True, slots=True)
class Limits:
    pair_budget: int = DEFAULT_PAIR_BUDGET
    pair_window: float = DEFAULT_PAIR_WINDOW
    chain_budget: int = DEFAULT_CHAIN_BUDGET


def _positive(value: Any, default: float) -> Any:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return value if ok else default


#: Limits by the settings they were read from (kept with them, so the id is theirs):
#: every send reads its team's, and a store hands back the same settings object until
#: the team changes. Settings are never changed in place (a team is frozen).
_READ: dict[int, tuple[Mapping[str, Any], Limits]] = {}


def limits(settings: Mapping[str, Any]) -> Limits:
    """The team's budgets. A missing or unusable value means the default: a budget can be
    raised, never switched off."""
    known = _READ.get(id(settings))
    if known is not None and known[0] is settings:
        return known[1]
    read = Limits(
        int(_positive(settings.get("pair_budget"), DEFAULT_PAIR_BUDGET)),
        float(_positive(settings.get("pair_window"), DEFAULT_PAIR_WINDOW)),
        int(_positive(settings.get("chain_budget"), DEFAULT_CHAIN_BUDGET)),
    )
    if len(_READ) >= 1024:
        _READ.clear()
    _READ[id(settings)] = (settings, read)
    return read


def pair_key(a: str, b: str) -> str:
    return f"pair:{a}|{b}" if a <= b else f"pair:{b}|{a}"


def chain_key(chain_id: str) -> str:
    return f"chain:{chain_id}"


#: the keys of the records of the chain each member was handed last (never shown)
CONTEXT = "ctx:"


def context_key(member: str) -> str:
    return CONTEXT + member


def key_members(key: str) -> tuple[str, ...]:
    """The two members of a pair key (empty for a chain key)."""
    scope, _, rest = key.partition(":")
    return tuple(rest.split("|")) if scope == Scope.PAIR.value else ()


# -- chains ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ChainRef:
    chain_id: str
    hop: int


def chain_for_send(
    *, counted: bool, turn_chain: ChainRef | None, message_id: str
) -> ChainRef | None:
    """The chain a new message belongs to. An agent's send continues the chain of its
    turn's input, one hop further (a send with no such input is a task from outside and
    starts a chain at hop 1). A human's message or a timer starts a chain at hop 0; the
    hub's other messages (notices, results) carry none of their own."""
    if counted:
        if turn_chain is None:
            return ChainRef(message_id, 1)
        return ChainRef(turn_chain.chain_id, turn_chain.hop + 1)
    return None


def chain_wire(chain: ChainRef) -> dict[str, Any]:
    """How a task for another hub names its chain (``/api/chat``'s ``chain``)."""
    return {"id": chain.chain_id, "hop": chain.hop}


def check_chain(value: Any) -> ChainRef | None:
    """The chain another hub named for a task (``{"id", "hop"}``; ``None``: none named).
    The id is a message id of the hub that started the chain; the hop a whole number from
    0 to :data:`MAX_HOP`. Anything else is refused, naming the field."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidRequest('chain must be an object {"id": ..., "hop": ...}', field="chain")
    chain_id, hop = value.get("id"), value.get("hop")
    if not isinstance(chain_id, str) or not _CHAIN_ID_RE.fullmatch(chain_id):
        raise InvalidRequest(
            "chain.id must be 1 to 128 letters, digits, '_', '-', '.' or ':', starting with a "
            "letter or digit (a message id of the hub that started the chain)",
            field="chain.id",
        )
    if not isinstance(hop, int) or isinstance(hop, bool) or not 0 <= hop <= MAX_HOP:
        raise InvalidRequest(
            f"chain.hop must be a whole number from 0 to {MAX_HOP}", field="chain.hop"
        )
    return ChainRef(chain_id, hop)


def named_chain(named: ChainRef, record: Budget | None, otherwise: ChainRef | None) -> ChainRef:
    """The chain a task goes on in when another hub named ``named`` for it. The hop named
    may raise the hop the task would otherwise have, never lower it, so a forged small hop
    cannot reset a spent chain: a chain this team keeps a ``record`` of (it reached its
    budget here, or was extended) goes on no lower than the hop recorded (a spent one at
    its budget, where a turn can send nothing further in it, as for a message of this hub
    at that hop), and the chain the send has without the name (``otherwise``) stands when
    it is further."""
    hop = max(named.hop, record.used) if record is not None else named.hop
    if otherwise is not None and otherwise.hop > hop:
        return otherwise
    return named if hop == named.hop else ChainRef(named.chain_id, hop)


def turn_chain(inputs: list[ChainRef | None], previous: ChainRef | None) -> ChainRef | None:
    """The chain a turn works in, from the messages handed to it: the furthest one
    (mixing a fresh input into a batch never resets a long chain); inputs without a
    chain (the hub's notices) leave the previous one in place."""
    known = [c for c in inputs if c is not None]
    if not known:
        return previous
    return max(known, key=lambda c: c.hop)


# -- decisions -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a send may not pass, in words for the sender and in fields for machines."""

    scope: Scope
    key: str
    limit: int
    used: int
    resets_at: float | None  # None: only an extension reopens it
    text: str

    def details(self) -> dict[str, Any]:
        return {
            "budget": self.scope.value,
            "key": self.key,
            "limit": self.limit,
            "used": self.used,
            "resets_at": self.resets_at,
            "extend": "the team's human (user) or an administrator",
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """What one send does to one budget record."""

    refusal: Refusal | None = None
    record: Budget | None = None  # the record to write (None: nothing changes)
    stops: bool = False  # this send spends the budget: tell both sides and the human


def fresh(team: str, key: str, now: float) -> Budget:
    return Budget(team, key, now, updated_at=now)


def current_pair(record: Budget | None, team: str, key: str, now: float, lim: Limits) -> Budget:
    """The pair's record as it stands at ``now``: a passed window starts afresh."""
    if record is None or now >= record.window_start + lim.pair_window:
        return fresh(team, key, now)
    return record


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


#: How every budget refusal begins, whatever route carries it (another hub's included).
NOT_SENT = "not sent: "


def pair_refusal(b: Budget, a: str, to: str, lim: Limits) -> Refusal:
    limit = lim.pair_budget + b.granted
    resets = b.window_start + lim.pair_window
    text = (
        f"{NOT_SENT}{a} and {to} have spent their conversation budget of {limit} exchanges "
        f"(team setting pair_budget). Nothing more from an agent passes between you by any "
        f"route (messages, links, closing blocks, broadcasts, delegations) until {_when(resets)}, "
        "when the window (pair_window) ends, unless the team's human (user) or an "
        "administrator extends the budget. Carry on with your own task."
    )
    return Refusal(Scope.PAIR, b.key, limit, b.used, resets, text)


def chain_refusal(chain: ChainRef, granted: int, lim: Limits) -> Refusal:
    limit = lim.chain_budget + granted
    text = (
        f"{NOT_SENT}this conversation chain ({chain.chain_id}) has gone {limit} hops between "
        "agents since a human, a timer or an outside task started it (team setting "
        "chain_budget). It takes no more messages from agents; it does not reset with time. "
        "The team's human (user) or an administrator can extend it. Carry on with your own "
        "task."
    )
    return Refusal(Scope.CHAIN, chain_key(chain.chain_id), limit, chain.hop - 1, None, text)


def decide_pair(
    record: Budget | None,
    team: str,
    sender: str,
    to: str,
    now: float,
    lim: Limits,
    *,
    refusable: bool = True,
) -> Decision:
    """One agent-originated message from ``sender`` to ``to``. ``refusable=False`` for
    an answer the hub owes (a delegation's result): it counts but is never refused."""
    key = pair_key(sender, to)
    b = current_pair(record, team, key, now, lim)
    limit = lim.pair_budget + b.granted
    if b.used >= limit and refusable:
        return Decision(refusal=pair_refusal(b, sender, to, lim))
    if b.last_from == sender:
        return Decision()  # the same speaker again: not a new exchange
    used = b.used + 1
    stops = used >= limit and b.stopped_at is None
    new = dataclasses.replace(
        b,
        used=used,
        last_from=sender,
        stopped_at=now if stops else b.stopped_at,
        updated_at=now,
    )
    return Decision(record=new, stops=stops)


def decide_chain(
    team: str, chain: ChainRef, record: Budget | None, lim: Limits, now: float
) -> Decision:
    """One agent-originated message at ``chain.hop``. The chain's record exists only once
    it was extended or stopped."""
    granted = record.granted if record else 0
    limit = lim.chain_budget + granted
    if chain.hop > limit:
        return Decision(refusal=chain_refusal(chain, granted, lim))
    if chain.hop < limit:
        return Decision()
    b = record or fresh(team, chain_key(chain.chain_id), now)
    if b.stopped_at is not None and b.used >= chain.hop:
        return Decision()
    return Decision(
        record=dataclasses.replace(b, used=chain.hop, stopped_at=now, updated_at=now), stops=True
    )


def extend(record: Budget, by: int, now: float) -> Budget:
    """Let exactly ``by`` more exchanges (a pair) or hops (a chain) through. The first
    message after an extension is a new exchange whoever sends it, so ``by`` is also the
    number of messages that pass between two agents that always answer."""
    return dataclasses.replace(
        record, granted=record.granted + by, stopped_at=None, last_from=None, updated_at=now
    )


def stop_text(
    scope: Scope, key: str, limit: int, resets_at: float | None, *, for_human: bool
) -> str:
    """What both sides and the team's human are told when a budget is spent. It never
    suggests another route: there is none."""
    if scope is Scope.PAIR:
        a, b = key_members(key)
        what = f"The conversation between {a} and {b} has spent its budget of {limit} exchanges"
        until = f"until {_when(resets_at)}" if resets_at is not None else "for now"
        rest = f"; nothing more from an agent passes between them by any route {until}."
    else:
        what = f"Conversation chain {key.partition(':')[2]} has reached its budget of {limit} hops"
        rest = "; agents can send nothing more in it."
    if for_human:
        how = (
            f" To let it go on, extend it: `backchannel budget extend TEAM {key} --by N`, "
            f'POST /v1/teams/TEAM/budgets/extend {{"key": "{key}", "by": N}}, or the '
            "dashboard's budgets panel."
        )
    else:
        how = " Finish your own task; the team's human decides whether it goes on."
    return what + rest + how


def budget_json(b: Budget, lim: Limits, now: float) -> dict[str, Any]:
    scope = Scope(b.key.partition(":")[0])
    if scope is Scope.PAIR:
        cur = current_pair(b, b.team, b.key, now, lim)
        limit = lim.pair_budget + cur.granted
        resets: float | None = b.window_start + lim.pair_window
        used = cur.used
    else:
        cur, limit, resets, used = b, lim.chain_budget + b.granted, None, b.used
    return {
        "key": b.key,
        "scope": scope.value,
        "members": list(key_members(b.key)),
        "used": used,
        "limit": limit,
        "granted": cur.granted,
        "spent": used >= limit,
        "window_start": b.window_start,
        "resets_at": resets if used else None,
        "last_from": cur.last_from,
        "updated_at": b.updated_at,
    }
