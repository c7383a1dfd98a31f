"""Link rules: which send opens a link, budgets, what crosses, and the texts both sides
are told."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backchannel.core import timers
from backchannel.core.turns import already_sent
from backchannel.types import BROADCAST, HUB_SENDER, LedgerEntry, Link, MemberKind, MessageKind

DEFAULT_BUDGET = 8

DEFAULT_RULES = (
    "You are now linked with {peer}: when either of you finishes a turn, its final output "
    "goes to the other as input, for at most {budget} turns. Rules: contribute before "
    "acknowledging; never restate the peer; ask only what blocks you; silence is valid; "
    "receiving input does not oblige a reply.\n"
    'Heartbeats: (1) always hold an anchor on your own task: set_timer(intent="anchor", '
    'minutes={anchor_minutes}, note="return to <your task>"); (2) absorb what {peer} '
    "says without answering unless it changes your work; (3) before you answer, set a new "
    "anchor; (4) when your anchor fires, it wins: go back to your task, the conversation "
    "waits; (5) to see how {peer} is doing, set a check timer instead of asking."
)


def team_budget(settings: Mapping[str, Any]) -> int:
    value = settings.get("link_budget", DEFAULT_BUDGET)
    return value if isinstance(value, int) and value > 0 else DEFAULT_BUDGET


def rules_text(settings: Mapping[str, Any], peer: str, budget: int) -> str:
    """The anti-chattiness rules both sides get when a link opens (team-configurable
    through the ``link_rules`` setting, with ``{peer}`` and ``{budget}`` placeholders)."""
    template = settings.get("link_rules")
    if not isinstance(template, str) or not template.strip():
        template = DEFAULT_RULES
    try:
        return template.format(
            peer=peer, budget=budget, anchor_minutes=timers.DEFAULT_ANCHOR_MINUTES
        )
    except (KeyError, IndexError, ValueError):
        return template


def may_change_links(kind: MessageKind, sender: str, to: str) -> bool:
    """Only a direct message from a member to one other member opens or closes a link
    (a note to self has no peer: a link to oneself would feed each turn's output back
    in as input)."""
    return kind is MessageKind.DIRECT and to not in (BROADCAST, sender) and sender != HUB_SENDER


def opens_link(callee_kind: MemberKind | None) -> bool:
    """A send from a session's turn, with no link open between the two and the sender
    not opting out, opens a link, unless the recipient is a human (who reads at their
    own pace: there are no turns to carry) or no member at all."""
    return callee_kind is not None and callee_kind is not MemberKind.HUMAN


def frame(member: str, text: str) -> str:
    """How a crossing reads on the other side."""
    return f"[From {member}] {text}"


def visible(text: str) -> bool:
    """Whether ``text`` shows anything: not only whitespace and format characters (the
    zero-width space, joiners, a byte order mark), which ``str.split`` keeps."""
    return any(not ch.isspace() and unicodedata.category(ch) != "Cf" for ch in text)


class Crossing(StrEnum):
    CROSS = "cross"
    EMPTY = "empty"  # nothing to say: crosses nothing, uses no turn
    CHECKPOINT = "checkpoint"  # a checkpoint answer: crosses nothing, uses no turn
    REPEAT = "repeat"  # already sent to this peer during the turn


@dataclass(frozen=True, slots=True)
class CrossingDecision:
    action: Crossing
    closes: bool = False  # this crossing spends the budget


def decide_crossing(
    link: Link, peer: str, output: str, checkpoint_turn: bool, ledger: Sequence[LedgerEntry]
) -> CrossingDecision:
    if checkpoint_turn:
        return CrossingDecision(Crossing.CHECKPOINT)
    if not visible(output):
        return CrossingDecision(Crossing.EMPTY)
    if already_sent(peer, output, ledger) is not None:
        return CrossingDecision(Crossing.REPEAT)
    return CrossingDecision(Crossing.CROSS, closes=link.turns_used + 1 >= link.budget)


def closed_text(link: Link, reason: str, member: str) -> str:
    peer = link.peer_of(member)[0]
    if reason == "budget_exhausted":
        return (
            f"Your link with {peer} is closed: its budget of {link.budget} turns is spent. "
            f"Your turns no longer reach {peer}, and every other route to {peer} counts "
            "against the same conversation budget between you. Carry on with your own task."
        )
    if reason == "conversation_budget":
        return (
            f"Your link with {peer} is closed: the conversation budget between you (or of "
            "this conversation chain) is spent, and nothing more passes by any route until it "
            "resets or the team's human extends it. Carry on with your own task."
        )
    if reason == "closed_by_initiator":
        return f"Your link with {peer} was closed by {link.initiator}."
    if reason == "member_removed":
        return f"Your link with {peer} is closed: {peer} was removed from the team."
    if reason == "session_terminated":
        return f"Your link with {peer} is closed: a session on it terminated."
    if reason == "session_silent":
        return (
            f"Your link with {peer} is closed: a session on it showed no sign of life while "
            "messages waited for it (its process ended without saying so). What waited for "
            "it goes to that member's next session."
        )
    return f"Your link with {peer} is closed ({reason})."
