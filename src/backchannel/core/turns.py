"""Turn rules: the closing-text parser, the duplicate ledger, transcript paging.

Closing text is what an agent says when its turn ends. ``<message to="name">body</message>``
blocks in it are explicit sends; the rest is the turn's output. The parser never raises
and never loses text: whatever is not a well-formed block stays in the output.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from backchannel.core import framing
from backchannel.core.messages import suggest
from backchannel.errors import InvalidRequest, TooLarge
from backchannel.types import BROADCAST, LedgerEntry, MessageKind, SessionEvent

_OPEN = re.compile(r"<message\b([^<>]*)>", re.IGNORECASE)
_CLOSE = re.compile(r"</message\s*>", re.IGNORECASE)
_TO = re.compile(r"""(?:^|\s)to\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE)
_BLANKS = re.compile(r"\n{3,}")


@dataclass(frozen=True, slots=True)
class Block:
    """One ``<message to="...">`` block: where it was and what it says."""

    to: str
    body: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ClosingText:
    blocks: tuple[Block, ...]
    output: str  # the text outside the blocks, trimmed


def _to_attr(attrs: str) -> str | None:
    m = _TO.search(attrs)
    if m is None:
        return None
    value = next(g for g in m.groups() if g is not None).strip()
    return value or None


def parse_closing_text(text: str) -> ClosingText:
    """Split closing text into message blocks and output.

    Rules, applied left to right: a block runs from an opening tag to the next closing
    tag; if another opening tag comes first, the earlier one is plain text (the
    innermost block wins). Tag names are case-insensitive; ``to`` may be quoted with
    ``"`` or ``'`` or bare, and other attributes are ignored. An opening tag without a
    ``to``, an unclosed tag and a stray closing tag are all plain text.
    """
    tokens = sorted(
        [(m.start(), 0, m) for m in _OPEN.finditer(text)]
        + [(m.start(), 1, m) for m in _CLOSE.finditer(text)],
        key=lambda t: t[0],
    )
    blocks: list[Block] = []
    parts: list[str] = []
    pos = 0
    opened: re.Match[str] | None = None
    for _, is_close, m in tokens:
        if not is_close:
            opened = m
            continue
        if opened is None:
            continue
        to = _to_attr(opened.group(1))
        if to is not None:
            parts.append(text[pos : opened.start()])
            blocks.append(Block(to, text[opened.end() : m.start()], opened.start(), m.end()))
            pos = m.end()
        opened = None
    parts.append(text[pos:])
    output = _BLANKS.sub("\n\n", "".join(parts)).strip()
    return ClosingText(tuple(blocks), output)


#: What no store keeps in a text: NUL, and a lone UTF-16 surrogate (half an emoji pair).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """A closing text as a store keeps it: NUL and lone surrogates become U+FFFD. A
    closing text is what the model said, not a send its client could fix: refusing it
    would leave the turn open and route nothing."""
    return _UNSTORABLE.sub("\ufffd", text)


def cut_to(text: str, limit: int) -> tuple[str, int]:
    """``text`` within ``limit`` UTF-8 bytes, with a note of how much was cut, and the
    number of bytes cut (0 when it fits)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, 0
    note = f" […cut: {len(data)} bytes, over the hub's {limit}-byte limit]"
    keep = max(0, limit - len(note.encode("utf-8")))
    return data[:keep].decode("utf-8", "ignore") + note, len(data) - keep


def fit_closing_text(parsed: ClosingText, limit: int) -> tuple[ClosingText, int]:
    """``parsed`` with its output and each block's body cut to ``limit`` bytes (each is a
    message on its own), and the bytes cut in all. Parsed first and cut after, so a
    block at the end of a long closing text is never cut open into the output."""
    output, cut = cut_to(parsed.output, limit)
    blocks = []
    for b in parsed.blocks:
        body, n = cut_to(b.body, limit)
        blocks.append(replace(b, body=body))
        cut += n
    return ClosingText(tuple(blocks), output), cut


def stop_print(text: str) -> str:
    """What identifies a closing text exactly (not normalized): the same ``Stop``
    reported again carries the same print."""
    return hashlib.sha256(storable(text).encode("utf-8")).hexdigest()[:32]


def normalize(text: str) -> str:
    """Trim and collapse every run of whitespace to one space."""
    return " ".join(text.split())


def digest(text: str) -> str:
    return hashlib.sha256(normalize(text).encode("utf-8")).hexdigest()


def already_sent(to: str, text: str, ledger: Iterable[LedgerEntry]) -> LedgerEntry | None:
    """The ledger entry that makes sending ``text`` to ``to`` a repeat, if any.

    A text counts as already sent to ``to`` if this turn sent the same normalized text
    to ``to`` or to everyone (``*``). Other recipients do not count: the same words to
    someone else are distinct content and flow.
    """
    d = digest(text)
    for entry in ledger:
        if entry.digest == d and entry.to in (to, BROADCAST):
            return entry
    return None


class BlockAction(StrEnum):
    SEND = "send"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"
    EMPTY = "empty"


@dataclass(frozen=True, slots=True)
class BlockDecision:
    block: Block
    action: BlockAction
    duplicate_of: str | None = None  # the message id already sent
    #: a broadcast some members already got this turn: send to these only
    only: tuple[str, ...] | None = None


def route_blocks(
    blocks: Sequence[Block], sender: str, members: Sequence[str], ledger: Sequence[LedgerEntry]
) -> list[BlockDecision]:
    """Decide each block's fate. Blocks are checked against the ledger *and* against
    earlier blocks of the same closing text."""
    seen = list(ledger)
    out = []
    for b in blocks:
        if not normalize(b.body):
            out.append(BlockDecision(b, BlockAction.EMPTY))
            continue
        if b.to != BROADCAST and (b.to not in members or b.to == sender):
            out.append(BlockDecision(b, BlockAction.UNKNOWN))
            continue
        dup = already_sent(b.to, b.body, seen)
        if dup is not None:
            out.append(BlockDecision(b, BlockAction.DUPLICATE, dup.message_id))
            continue
        only = None
        if b.to == BROADCAST:  # expanded: nobody gets the same text twice in a turn
            d = digest(b.body)
            got = {e.to: e.message_id for e in seen if e.digest == d}
            if got:
                only = tuple(m for m in members if m != sender and m not in got)
                if not only:
                    out.append(BlockDecision(b, BlockAction.DUPLICATE, next(iter(got.values()))))
                    continue
        out.append(BlockDecision(b, BlockAction.SEND, only=only))
        for to in only or (b.to,):
            seen.append(LedgerEntry("", "", to, digest(b.body), "(this closing text)", 0.0))
    return out


#: Control characters a runtime may leave out of what it shows the agent (the tmux
#: adapter types a message in without them); left out of both sides of a comparison.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _comparable(text: str) -> str:
    """``text`` as :func:`is_hub_input` compares it: line breaks of every kind as one,
    control characters left out, whitespace collapsed."""
    return normalize(_CONTROLS.sub("", framing.normalize_breaks(text)))


def handed_text(sender: str, kind: str, text: str) -> str:
    """What a turn's reported input is checked against for one message handed to its
    session (:func:`is_hub_input`): the start of its text, or for a text with nothing
    to read, the header runtimes show it under (``[From name]``)."""
    return _comparable(text)[:200] or normalize(framing.header(sender, kind))


def is_hub_input(turn_text: str, inputs: Sequence[str]) -> bool:
    """Whether a turn's reported input is (one of) ``inputs``, the texts the hub handed
    the session last. A runtime that reports no input text is taken at its word that it
    went on with what it was handed; any other text must carry one of them (a human who
    typed something else started the turn, not the hub). Runtimes report the input as
    the agent read it, framed (:mod:`backchannel.core.framing`): a text's lines that
    begin with ``[`` carry one more ``\\`` there, which is taken off before comparing,
    and control characters may be gone."""
    said = _comparable(turn_text)
    if not said:
        return True
    lines = framing.normalize_breaks(turn_text).split("\n")
    shown = _comparable("\n".join(_unescape(line) for line in lines))
    for t in inputs:
        handed = _comparable(t)[:200]
        if handed and (handed in said or handed in shown):
            return True
    return False


def _unescape(line: str) -> str:
    """A framed line without the ``\\`` framing added in front of it, if it has one."""
    return line[1:] if line[:1] == "\\" and framing.needs_escape(line[1:]) else line


def checkpoint_handed(kinds: Sequence[MessageKind]) -> bool:
    """Whether what a session was handed is a checkpoint prompt and nothing else: a turn
    on it crosses no link and uses no budget."""
    return all(k is MessageKind.CHECKPOINT for k in kinds)


def is_checkpoint_turn(
    pending: bool, reported: object, turn_text: str, checkpoint_texts: Sequence[str]
) -> bool:
    """Only a turn on the checkpoint the hub handed over is a checkpoint turn
    (``pending``): not one the runtime reports as something else (``reported`` is its
    ``checkpoint`` flag), nor one a human started by typing something else meanwhile."""
    return pending and reported is not False and is_hub_input(turn_text, checkpoint_texts)


def checkpoint_policy(settings: Mapping[str, Any]) -> tuple[float, str | None] | None:
    """A member's ``checkpoint`` setting as (idle seconds, prompt text), or ``None``
    when it asks for no checkpoints."""
    policy = settings.get("checkpoint")
    if not isinstance(policy, Mapping) or not policy.get("idle_seconds"):
        return None
    return float(policy["idle_seconds"]), (str(policy.get("text") or "") or None)


def unknown_destination_notice(bad: str, sender: str, team: str, members: Sequence[str]) -> str:
    """The ``system`` message that tells a session its closing block went nowhere."""
    known = [m for m in members if m != sender]
    hint = suggest(bad, known)
    maybe = f" Did you mean {' or '.join(repr(h) for h in hint)}?" if hint else ""
    why = "that is you" if bad == sender else f"team {team!r} has no member {bad!r}"
    return (
        f'Your closing <message to="{bad}"> block was not delivered: {why}.{maybe} '
        f"Known members: {', '.join(known) or '(none)'}. Send it again with "
        f"send_message(to=<name>, message=...)."
    )


# -- transcripts -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TranscriptPage:
    events: tuple[SessionEvent, ...]
    truncated: bool
    next_since: int | None
    note: str


#: The most characters of serialized ``data`` one event may carry, and how deep it may
#: nest; checked where events are accepted, and again when a view shows what is stored.
MAX_EVENT_DATA_CHARS = 64 * 1024
MAX_EVENT_DATA_DEPTH = 32


def data_depth(value: object, stop: int = MAX_EVENT_DATA_DEPTH + 1) -> int:
    """How deep ``value`` nests (a scalar is 0), counted without recursion and no
    further than ``stop``."""
    deepest = 0
    todo: list[tuple[object, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, Mapping):
            children: Iterable[object] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest >= stop:
            return deepest
        todo.extend((child, depth) for child in children)
    return deepest


def check_event_data(data: Mapping[str, Any]) -> None:
    """Refuse event ``data`` that nests too deep (422) or is too large (413)."""
    depth = data_depth(data)
    if depth > MAX_EVENT_DATA_DEPTH:
        raise InvalidRequest(
            f"event data nests more than {MAX_EVENT_DATA_DEPTH} levels deep; flatten it "
            "or send it as text",
            field="data",
        )
    try:
        size = len(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"event data is not plain JSON: {exc}", field="data") from None
    if size > MAX_EVENT_DATA_CHARS:
        raise TooLarge(
            f"event data is {size} characters of JSON, over the {MAX_EVENT_DATA_CHARS}-character "
            "limit; keep large outputs in the event's text, or store them elsewhere and "
            "report a path",
            limit=MAX_EVENT_DATA_CHARS,
            size=size,
        )


def _data_chars(data: Mapping[str, Any]) -> int | None:
    """Characters of ``data`` as JSON, or ``None`` when a view cannot show it."""
    if not data:
        return 0
    if data_depth(data) > MAX_EVENT_DATA_DEPTH:
        return None
    try:
        return len(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    except (TypeError, ValueError):
        return None


def viewable(ev: SessionEvent, room: int | None = None) -> tuple[SessionEvent, int]:
    """The event as a view may show it, and its size (text plus serialized data).
    Data a view cannot show (stored before the limits, or odd), or larger than ``room``,
    is replaced by a note that says so."""
    chars = _data_chars(ev.data)
    if chars is None:
        note = {"omitted": f"data nests deeper than {MAX_EVENT_DATA_DEPTH} levels"}
        ev = replace(ev, data=note)
        chars = _data_chars(note) or 0
    elif room is not None and chars > room:
        note = {"omitted": f"{chars} characters of data cut to fit the page"}
        ev = replace(ev, data=note)
        chars = _data_chars(note) or 0
    return ev, len(ev.text) + chars


def page_transcript(
    events: Sequence[SessionEvent],
    *,
    max_chars: int,
    tail_chars: int | None,
    more: bool,
    skipped: int = 0,
) -> TranscriptPage:
    """Cap a run of events (oldest first) to ``max_chars``, or keep only the last
    ``tail_chars``, counting each event's text and serialized data; say clearly where it
    was cut and how to read on. ``skipped`` events before ``events`` were already cut."""
    if tail_chars is not None:
        kept: list[SessionEvent] = []
        used = 0
        for ev in reversed(events):
            shown, size = viewable(ev)
            if used + size > tail_chars:
                room = tail_chars - used
                if room > 0:
                    shown, _ = viewable(ev, room - min(len(ev.text), room))
                    kept.append(_cut_front(shown, min(len(ev.text), room)))
                break
            kept.append(shown)
            used += size
        kept.reverse()
        skipped += len(events) - len(kept) + (1 if kept and kept[0].text.startswith("[…") else 0)
        note = (
            f"[… {skipped} earlier event(s) cut to keep the last {tail_chars} characters; "
            "read them with since/until …]"
            if skipped or more
            else ""
        )
        return TranscriptPage(tuple(kept), bool(skipped), None, note)
    out: list[SessionEvent] = []
    used = 0
    for ev in events:
        shown, size = viewable(ev)
        if out and used + size > max_chars:
            nxt = out[-1].event_id
            return TranscriptPage(
                tuple(out),
                True,
                nxt,
                f"[… transcript cut at {max_chars} characters; more event(s) follow; "
                f"call again with since={nxt} to read on …]",
            )
        if not out and size > max_chars:
            keep = min(len(ev.text), max_chars)
            shown, _ = viewable(ev, max_chars - keep)
            out.append(_cut_back(shown, keep) if keep < len(ev.text) else shown)
            used = max_chars
            continue
        out.append(shown)
        used += size
    if more and out:
        nxt = out[-1].event_id
        return TranscriptPage(
            tuple(out), True, nxt, f"[… more events follow; call again with since={nxt} …]"
        )
    return TranscriptPage(tuple(out), False, None, "")


def _cut_front(ev: SessionEvent, keep: int) -> SessionEvent:
    return replace(ev, text="[…cut…] " + ev.text[len(ev.text) - keep :])


def _cut_back(ev: SessionEvent, keep: int) -> SessionEvent:
    return replace(ev, text=ev.text[:keep] + " […cut…]")
