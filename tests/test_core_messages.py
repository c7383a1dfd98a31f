"""The pure delivery rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backchannel.core import messages as rules
from backchannel.errors import InvalidName, MessageIdConflict, TooLarge, UnknownRecipient
from backchannel.types import DeliveryState, Message, MessageKind, Recipient


@pytest.mark.parametrize("name", ["a", "worker-1", "A_b-9", "x" * 64])
def test_valid_names(name: str) -> None:
    assert rules.check_name("member", name) == name


@pytest.mark.parametrize("name", ["", "-a", "_a", "a b", "a/b", "x" * 65, "é", "a.b"])
def test_invalid_names_say_what_is_allowed(name: str) -> None:
    with pytest.raises(InvalidName, match="letters, digits"):
        rules.check_name("member", name)


def test_text_limit_names_size_and_way_out() -> None:
    rules.check_text("x" * 10, 10)
    with pytest.raises(TooLarge, match="11 bytes, over the 10-byte limit; split it") as exc:
        rules.check_text("x" * 11, 10)
    assert exc.value.details == {"limit": 10, "size": 11}


def test_text_limit_counts_utf8_bytes() -> None:
    with pytest.raises(TooLarge):
        rules.check_text("é" * 6, 10)


def _msg(fp: str) -> Message:
    return Message("t", "m1", "a", "b", "hi", MessageKind.DIRECT, 0.0, fp)


def test_replay_same_content_other_content_conflicts() -> None:
    fp = rules.fingerprint("a", "b", "hi", None, "direct")
    assert rules.decide_replay(None, fp) is rules.Replay.NEW
    assert rules.decide_replay(_msg(fp), fp) is rules.Replay.REPLAY
    other = rules.fingerprint("a", "b", "hi!", None, "direct")
    with pytest.raises(MessageIdConflict, match="already used for a different message"):
        rules.decide_replay(_msg(fp), other)


@given(st.text(), st.text())
def test_fingerprint_distinguishes_text(a: str, b: str) -> None:
    same = rules.fingerprint("s", "r", a, None, "direct") == rules.fingerprint(
        "s", "r", b, None, "direct"
    )
    assert same == (a == b)


def test_fingerprint_covers_sender_recipient_summary_and_session() -> None:
    base = rules.fingerprint("s", "r", "t", None, "direct")
    assert base != rules.fingerprint("s2", "r", "t", None, "direct")
    assert base != rules.fingerprint("s", "r2", "t", None, "direct")
    assert base != rules.fingerprint("s", "r", "t", "sum", "direct")
    assert base != rules.fingerprint("s", "r", "t", None, "direct", "sess")


def test_unknown_recipient_suggests_close_names() -> None:
    with pytest.raises(UnknownRecipient) as exc:
        rules.resolve_recipients(
            "alpha", "wrker-1", "lead", ["lead", "worker-1", "worker-2", "user"]
        )
    assert exc.value.details["suggestions"][0] == "worker-1"
    assert (
        "unknown recipient 'wrker-1' in team 'alpha'; did you mean 'worker-1'" in exc.value.message
    )


def test_unknown_recipient_without_close_names_points_to_member_list() -> None:
    with pytest.raises(UnknownRecipient, match="list the team's members") as exc:
        rules.resolve_recipients("alpha", "zzzzzz", "lead", ["lead", "user"])
    assert exc.value.details["suggestions"] == []


def test_broadcast_reaches_everyone_but_the_sender() -> None:
    got = rules.resolve_recipients("t", "*", "b", ["c", "a", "b", "user"])
    assert got == (Recipient("a"), Recipient("c"), Recipient("user"))


def test_direct_recipient_with_session() -> None:
    assert rules.resolve_recipients("t", "a", "b", ["a", "b"], "s1") == (Recipient("a", "s1"),)


@pytest.mark.parametrize(
    ("attempts", "action"),
    [
        (1, rules.ExpiryAction.REQUEUE),
        (4, rules.ExpiryAction.REQUEUE),
        (5, rules.ExpiryAction.DEAD),
        (6, rules.ExpiryAction.DEAD),
    ],
)
def test_lease_expiry_requeues_until_last_attempt(
    attempts: int, action: rules.ExpiryAction
) -> None:
    assert rules.after_lease_expiry(attempts, 5) is action


def test_dead_letter_notice_goes_to_sender_and_says_what_to_do() -> None:
    m = Message("t", "m9", "lead", "w", "count the files\nplease", MessageKind.DIRECT, 0.0, "fp")
    notice = rules.dead_letter_notice(
        m, Recipient("w"), "not acknowledged after 5 delivery attempts"
    )
    assert notice.to == "lead"
    assert "m9 to w was not delivered: not acknowledged after 5 delivery attempts" in notice.text
    assert "'count the files'" in notice.text
    assert notice.meta["dead_message_id"] == "m9"


def test_aggregate_state_is_least_advanced_copy() -> None:
    assert (
        rules.aggregate_state([DeliveryState.ACKED, DeliveryState.QUEUED]) is DeliveryState.QUEUED
    )
    assert rules.aggregate_state([DeliveryState.ACKED, DeliveryState.DEAD]) is DeliveryState.ACKED
    assert rules.aggregate_state([DeliveryState.DEAD]) is DeliveryState.DEAD


def test_nul_characters_are_refused_the_same_on_every_store() -> None:
    from backchannel.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="NUL character"):
        rules.check_text("a\x00b", 100)
