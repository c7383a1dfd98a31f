"""The model interface the built-in runner talks to, and token/cost accounting.

A :class:`Model` turns a conversation (in a neutral form) plus tool definitions into one
reply: text, tool calls, or both. Providers (:mod:`.scripted`, :mod:`.providers`)
translate to and from their wire formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from backchannel.errors import ModelError as ModelError  # re-exported

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asked for. ``unparsed``: the arguments as the model wrote
    them, when they are not a JSON object (``arguments`` is then empty); the call is not
    run, the model hears why, and the call goes back to it as it was written."""

    call_id: str
    name: str
    arguments: Mapping[str, Any]
    unparsed: str | None = None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One entry of a conversation. ``tool`` messages answer the call ``call_id``.
    ``carries_on``: a ``user`` message the runner adds within a turn (asking a cut
    answer to go on), not a turn's input: the turn goes on across it."""

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str | None = None
    is_error: bool = False
    carries_on: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True, slots=True)
class ModelReply:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = "end_turn"


class Model(Protocol):
    """Anything that can answer a conversation with tools."""

    name: str

    async def complete(
        self, system: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        """One model call. Raises :class:`ModelError` on a failure retrying did not fix."""
        ...


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0

    def cost(self, u: Usage) -> float:
        return (
            u.input_tokens * self.input
            + u.output_tokens * self.output
            + u.cache_read_tokens * self.cache_read
            + u.cache_write_tokens * self.cache_write
        ) / 1_000_000


#: List prices by model family (first matching prefix wins); a team file's ``price``
#: overrides them, and a model matching none costs nothing (local servers).
PRICES: dict[str, Price] = {
    "claude-opus": Price(15.0, 75.0, 1.5, 18.75),
    "claude-sonnet": Price(3.0, 15.0, 0.3, 3.75),
    "claude-haiku": Price(1.0, 5.0, 0.1, 1.25),
    "gpt-4o": Price(2.5, 10.0, 1.25, 0.0),
    "gpt-4o-mini": Price(0.15, 0.6, 0.075, 0.0),
}


def price_for(model: str, override: Mapping[str, float] | None = None) -> Price:
    if override:
        return Price(**{k: float(v) for k, v in override.items()})
    for prefix, price in PRICES.items():
        if model.startswith(prefix):
            return price
    return Price()


def estimate_tokens(text: str) -> int:
    """A rough count for offline models: about four characters a token."""
    return max(1, len(text) // 4) if text else 0
