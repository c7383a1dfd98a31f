"""The closing-text parser and the normalizer: predictable on any input, never lossy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backchannel.core.turns import (
    Block,
    BlockAction,
    digest,
    normalize,
    parse_closing_text,
    route_blocks,
)
from backchannel.types import LedgerEntry

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,10}", fullmatch=True)
plain = st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=80)


def test_blocks_and_output() -> None:
    text = "Done.\n<message to=\"lead\">totals: 42</message>\nThanks <message to='rev'>check it</message>"
    parsed = parse_closing_text(text)
    assert [(b.to, b.body) for b in parsed.blocks] == [("lead", "totals: 42"), ("rev", "check it")]
    assert parsed.output == "Done.\n\nThanks"


@pytest.mark.parametrize(
    ("text", "blocks", "output"),
    [
        ('<MESSAGE TO="a">x</Message>', [("a", "x")], ""),
        ("<message to=a>bare</message>", [("a", "bare")], ""),
        ('<message id="1" to="a" urgent>x</message>', [("a", "x")], ""),
        ('<message data-to="z" to="a">x</message>', [("a", "x")], ""),
        (
            '<message from="a">no recipient</message>',
            [],
            '<message from="a">no recipient</message>',
        ),
        ('<message to="a">never closed', [], '<message to="a">never closed'),
        ("stray </message> close", [], "stray </message> close"),
        (
            '<message to="a">outer <message to="b">inner</message> tail</message>',
            [("b", "inner")],
            '<message to="a">outer  tail</message>',
        ),
        ('<message to="a"></message>', [("a", "")], ""),
        ('<message to="a">x</message >', [("a", "x")], ""),
        ('<message to="a b">x</message>', [("a b", "x")], ""),
    ],
)
def test_malformed_and_odd_blocks_are_predictable(
    text: str, blocks: list[tuple[str, str]], output: str
) -> None:
    parsed = parse_closing_text(text)
    assert [(b.to, b.body) for b in parsed.blocks] == blocks
    assert parsed.output == output


def test_very_long_body() -> None:
    body = "x" * 500_000
    parsed = parse_closing_text(f'before <message to="a">{body}</message> after')
    assert parsed.blocks[0].body == body
    assert parsed.output == "before  after"


@given(plain)
def test_text_without_tags_is_all_output(text: str) -> None:
    parsed = parse_closing_text(text)
    assert parsed.blocks == ()
    assert normalize(parsed.output) == normalize(text)


@settings(max_examples=300)
@given(st.lists(st.one_of(plain, st.tuples(names, plain)), max_size=8))
def test_well_formed_blocks_roundtrip(parts: list[str | tuple[str, str]]) -> None:
    text = "".join(
        p if isinstance(p, str) else f'<message to="{p[0]}">{p[1]}</message>' for p in parts
    )
    parsed = parse_closing_text(text)
    expected_blocks = [p for p in parts if isinstance(p, tuple)]
    assert [(b.to, b.body) for b in parsed.blocks] == expected_blocks
    outside = "".join(p for p in parts if isinstance(p, str))
    assert normalize(parsed.output) == normalize(outside)


@settings(max_examples=500)
@given(st.text(alphabet=st.sampled_from(list("<>/messagtoMESAGTO=\"' ab\n")), max_size=120))
def test_parser_never_crashes_and_never_loses_text(text: str) -> None:
    parsed = parse_closing_text(text)
    rest, pos = [], 0
    for b in parsed.blocks:
        assert b.start >= pos, "blocks are ordered and do not overlap"
        span = text[b.start : b.end]
        assert span.lower().startswith("<message")
        assert b.body in span
        rest.append(text[pos : b.start])
        pos = b.end
    rest.append(text[pos:])
    # the output is exactly the text outside the blocks (trimmed, blank runs collapsed)
    assert normalize(parsed.output) == normalize("".join(rest))


@pytest.mark.parametrize(
    "variant", ["hello world", "hello\nworld", "  hello world ", "hello \t\n  world"]
)
def test_whitespace_variants_normalize_the_same(variant: str) -> None:
    assert normalize(variant) == "hello world"
    assert digest(variant) == digest("hello world")


@given(st.text())
def test_normalize_is_idempotent_and_trimmed(text: str) -> None:
    n = normalize(text)
    assert normalize(n) == n
    assert n == n.strip()
    assert "  " not in n


def test_route_blocks_against_ledger_and_itself() -> None:
    ledger = [LedgerEntry("t", "s", "lead", digest("totals: 42"), "m-1", 0.0)]
    blocks = [
        Block("lead", " totals:\n42 ", 0, 0),  # a repeat of the tool send
        Block("rev", "totals: 42", 0, 0),  # same words, other recipient: flows
        Block("lead", "and one more thing", 0, 0),
        Block("lead", "and one  more thing", 0, 0),  # repeats the block before it
        Block("ghost", "hello", 0, 0),
        Block("me", "talking to myself", 0, 0),
        Block("lead", "   ", 0, 0),
    ]
    got = [d.action for d in route_blocks(blocks, "me", ["lead", "rev", "me"], ledger)]
    assert got == [
        BlockAction.DUPLICATE,
        BlockAction.SEND,
        BlockAction.SEND,
        BlockAction.DUPLICATE,
        BlockAction.UNKNOWN,
        BlockAction.UNKNOWN,
        BlockAction.EMPTY,
    ]


def test_broadcast_in_ledger_covers_everyone() -> None:
    ledger = [LedgerEntry("t", "s", "*", digest("all done"), "m-1", 0.0)]
    got = route_blocks([Block("lead", "all done", 0, 0)], "me", ["lead", "me"], ledger)
    assert got[0].action is BlockAction.DUPLICATE
