"""Hook payloads never make the hub open a file; the command hook reads only its own
runtime's transcripts, regular files, the tail, without blocking."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backchannel.runtimes import transcripts
from backchannel.runtimes.channel_tags import STOP_ID_FIELD
from backchannel.runtimes.transcripts import (
    TRANSCRIPT_TAIL_BYTES,
    TranscriptRefused,
    enrich,
    last_assistant_text,
)
from tests.conftest import Server, start_server

from .agents import hook_cmd, make_team
from .helpers import FIXTURES, fixture

EXPECTED = 'src/ holds 420 lines of Python.\n<message to="lead">420 lines in src/</message>'


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("transcripts") / "home")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def claude_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "claude-config"
    (config / "projects" / "-proj").mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    return config / "projects" / "-proj"


def _no_reader(fifo: Path) -> bool:
    """True when nobody has the FIFO open for reading (a writer's non-blocking open fails)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        return exc.errno == errno.ENXIO
    os.close(fd)
    return False


def _stop(runtime: str, path: Path) -> dict[str, object]:
    stop = fixture(runtime, "Stop", transcript_path=str(path))
    del stop["last_assistant_message"]
    return stop


# -- over HTTP: the hub opens nothing ------------------------------------------------------


@pytest.mark.parametrize("runtime", ["claude-code", "codex"])
def test_a_fifo_named_in_a_hook_posted_over_http_is_never_opened(
    srv: Server, tmp_path: Path, runtime: str
) -> None:
    team = f"fifo-{runtime}"
    tokens = make_team(srv, team, f"w:{runtime}", "lead")
    fifo = tmp_path / "transcript.jsonl"
    os.mkfifo(fifo)
    secret = tmp_path / "other-session.jsonl"  # another agent's transcript on the hub's host
    secret.write_text((FIXTURES / "claude-code" / "transcript.jsonl").read_text())
    auth = {"Authorization": f"Bearer {tokens['w']}"}
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        for path in (fifo, secret):
            r = c.post(f"/v1/hooks/{runtime}", json=_stop(runtime, path), headers=auth)
            assert r.status_code == 200, r.text
            assert c.get("/healthz").status_code == 200
        assert _no_reader(fifo)
        inbox = c.get("/v1/inbox", headers={"Authorization": f"Bearer {tokens['lead']}"})
        assert inbox.json()["messages"] == []  # nothing of the other transcript was routed
        sid = str(_stop(runtime, fifo)["session_id"])
        events = c.get(f"/v1/sessions/{sid}/transcript", headers=auth).json()["events"]
        # the other transcript's words, not "420" alone: that turns up in timestamps
        assert events and not any("420 lines" in json.dumps(e) for e in events)


# -- the command hook, on the agent's machine -----------------------------------------------


def test_the_command_hook_reads_a_transcript_in_the_runtime_directory(
    srv: Server, claude_dir: Path
) -> None:
    tokens = make_team(srv, "happy", "w:claude-code", "lead")
    transcript = claude_dir / "s.jsonl"
    transcript.write_text((FIXTURES / "claude-code" / "transcript.jsonl").read_text())
    env = {
        "BACKCHANNEL_URL": srv.url,
        "BACKCHANNEL_TOKEN": tokens["w"],
        "CLAUDE_CONFIG_DIR": os.environ["CLAUDE_CONFIG_DIR"],
    }
    run = hook_cmd("claude-code", json.dumps(_stop("claude-code", transcript)), env=env)
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, "{}", "")
    with srv.client(tokens["lead"]) as c:
        assert [m["text"] for m in c.get("/v1/inbox").json()["messages"]] == ["420 lines in src/"]


def test_a_stop_hook_that_runs_before_the_transcript_is_written_still_reaches_the_hub(
    srv: Server, claude_dir: Path
) -> None:
    # Claude Code may run the Stop hook of a session's first turn before it first writes
    # the transcript; the payload carries the closing text, and the missing file is no
    # reason to drop the event (it once made the hook fail open, the turn's end unseen)
    tokens = make_team(srv, "unwritten", "w:claude-code", "lead")
    missing = claude_dir / "not-yet.jsonl"
    stop = fixture(
        "claude-code", "Stop", transcript_path=str(missing), last_assistant_message=EXPECTED
    )
    env = {
        "BACKCHANNEL_URL": srv.url,
        "BACKCHANNEL_TOKEN": tokens["w"],
        "CLAUDE_CONFIG_DIR": os.environ["CLAUDE_CONFIG_DIR"],
    }
    run = hook_cmd("claude-code", json.dumps(stop), env=env)
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, "{}", "")
    with srv.client(tokens["lead"]) as c:
        assert [m["text"] for m in c.get("/v1/inbox").json()["messages"]] == ["420 lines in src/"]
    with srv.client(tokens["w"]) as c:
        events = c.get(f"/v1/sessions/{stop['session_id']}/transcript").json()["events"]
    assert "agent_stop" in [e["kind"] for e in events]


def test_enriching_never_raises(claude_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backchannel.runtimes import transcripts

    def broken(path: str, runtime: str) -> tuple[bytes, bool]:
        raise RuntimeError("a disk that lies")

    monkeypatch.setattr(transcripts, "_read_tail", broken)
    stop = _stop("claude-code", claude_dir / "s.jsonl")
    payload, note = enrich("claude-code", stop)
    assert payload is stop and note is not None and "a disk that lies" in note


def test_the_command_hook_refuses_a_fifo_without_blocking(srv: Server, claude_dir: Path) -> None:
    tokens = make_team(srv, "fifo-cmd", "w:claude-code")
    fifo = claude_dir / "s.jsonl"
    os.mkfifo(fifo)
    env = {
        "BACKCHANNEL_URL": srv.url,
        "BACKCHANNEL_TOKEN": tokens["w"],
        "CLAUDE_CONFIG_DIR": os.environ["CLAUDE_CONFIG_DIR"],
    }
    run = hook_cmd("claude-code", json.dumps(_stop("claude-code", fifo)), env=env)
    assert (run.returncode, run.stdout.strip()) == (0, "{}")
    assert "is not a regular file" in run.stderr
    assert _no_reader(fifo)


def test_a_transcript_outside_the_runtime_directory_is_refused(
    tmp_path: Path, claude_dir: Path
) -> None:
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text((FIXTURES / "claude-code" / "transcript.jsonl").read_text())
    payload, note = enrich("claude-code", _stop("claude-code", outside))
    assert "last_assistant_message" not in payload
    assert note is not None and "not inside claude-code's transcript directory" in note
    # nor through a symlink that sits inside it
    link = claude_dir / "link.jsonl"
    link.symlink_to(outside)
    with pytest.raises(TranscriptRefused, match="not inside"):
        last_assistant_text(link)
    # nor another runtime's directory
    with pytest.raises(TranscriptRefused):
        last_assistant_text(claude_dir / "x.jsonl", "codex")


def test_only_the_tail_is_read(claude_dir: Path) -> None:
    transcript = claude_dir / "big.jsonl"
    early = json.dumps(
        {"type": "assistant", "message": {"id": "m1", "content": [{"type": "text", "text": "x"}]}}
    )
    filler = json.dumps({"type": "user", "message": {"content": "y" * 1000}})
    lines = [early] + [filler] * (TRANSCRIPT_TAIL_BYTES // 1000 + 10)
    transcript.write_text("\n".join(lines) + "\n")
    assert last_assistant_text(transcript) is None  # the early message is beyond the tail
    transcript.write_text("\n".join([*lines, early]) + "\n")
    assert last_assistant_text(transcript) == "x"


def test_a_codex_rollout_is_read_from_codex_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = tmp_path / "codex-home" / "sessions" / "2026" / "11" / "22"
    sessions.mkdir(parents=True)
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))
    rollout = sessions / "rollout-1.jsonl"
    entries = [
        {"type": "session_meta", "payload": {"id": "s"}},
        {
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "renamed foo to bar"}],
            },
        },
        {"type": "event_msg", "payload": {"type": "token_count"}},
    ]
    rollout.write_text("".join(json.dumps(e) + "\n" for e in entries))
    payload, note = enrich("codex", _stop("codex", rollout))
    assert (payload["last_assistant_message"], note) == ("renamed foo to bar", None)


# -- what names a Claude Code stop -------------------------------------------------------


def _entry(kind: str, uuid: str, content: object, msg_id: str | None = None) -> dict[str, object]:
    message: dict[str, object] = {"role": kind, "content": content}
    if msg_id:
        message["id"] = msg_id
    return {"type": kind, "uuid": uuid, "message": message}


def _turn(n: int, closing: str = "Done.") -> list[dict[str, object]]:
    """One turn as Claude Code 2.1 writes it: the prompt, a tool call and its result, the
    answer (one entry per content block), and its bookkeeping after the answer."""
    return [
        _entry("user", f"u{n}", f"prompt {n}"),
        _entry("assistant", f"a{n}-call", [{"type": "tool_use", "id": f"t{n}"}], f"m{n}-1"),
        _entry("user", f"r{n}", [{"type": "tool_result", "tool_use_id": f"t{n}"}]),
        _entry("assistant", f"a{n}-text", [{"type": "text", "text": "Looked."}], f"m{n}-2"),
        _entry("assistant", f"a{n}-end", [{"type": "text", "text": closing}], f"m{n}-2"),
        {"type": "last-prompt", "lastPrompt": f"prompt {n}"},
        {"type": "attachment", "uuid": f"x{n}", "attachment": {"type": "prompt_snapshot"}},
    ]


def _ended(n: int) -> list[dict[str, object]]:
    """What Claude Code writes once turn ``n``'s ``Stop`` hooks have run."""
    return [
        {"type": "attachment", "uuid": f"h{n}", "attachment": {"type": "hook_success"}},
        {"type": "system", "uuid": f"s{n}", "subtype": "stop_hook_summary"},
        {"type": "system", "uuid": f"d{n}", "subtype": "turn_duration"},
    ]


def _claude_stop_id(claude_dir: Path, entries: list[dict[str, object]], said: str) -> object:
    transcript = claude_dir / "s.jsonl"
    transcript.write_text("".join(json.dumps(e) + "\n" for e in entries))
    stop = fixture("claude-code", "Stop", transcript_path=str(transcript))
    payload, note = enrich("claude-code", {**stop, "last_assistant_message": said})
    assert note is None
    return payload.get(STOP_ID_FIELD)


def test_a_claude_code_stop_is_named_by_its_last_assistant_message(claude_dir: Path) -> None:
    """Two turns that end with the same words are told apart by the uuid of each one's
    last assistant message; the same turn's stop read again finds the same one."""
    first = _claude_stop_id(claude_dir, _turn(1), "Looked.\nDone.")
    assert first == "a1-end"
    assert _claude_stop_id(claude_dir, _turn(1), "Looked.\nDone.") == first
    later = _turn(1) + _ended(1) + _turn(2)
    assert _claude_stop_id(claude_dir, later, "Looked.\nDone.") == "a2-end"


def test_a_transcript_behind_the_stop_names_no_turn(
    claude_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transcript that does not plainly end with this stop's answer names nothing (the
    hub then tells a repeat by its words): one that ends with a prompt not yet answered,
    or a tool's result, one whose last answer is not the words the stop reports."""
    monkeypatch.setattr(transcripts, "TRANSCRIPT_WAIT_SECONDS", 0.0)
    behind = _turn(1) + _ended(1) + _turn(2)[:1]
    assert _claude_stop_id(claude_dir, behind, "Looked.\nDone.") is None
    mid_turn = _turn(1) + _ended(1) + _turn(2)[:3]
    assert _claude_stop_id(claude_dir, mid_turn, "Looked.\nDone.") is None
    assert _claude_stop_id(claude_dir, _turn(1), "Something else.") is None
    no_uuid = [{k: v for k, v in e.items() if k != "uuid"} for e in _turn(1)]
    assert _claude_stop_id(claude_dir, no_uuid, "Looked.\nDone.") is None


def _sidechain(n: int) -> list[dict[str, object]]:
    """A subagent's exchange, which Claude Code writes to the session's transcript marked
    ``isSidechain`` (a background task's may come after the turn's own answer)."""
    entries = [
        _entry("user", f"sc{n}-ask", f"subagent task {n}"),
        _entry("assistant", f"sc{n}-end", [{"type": "text", "text": "Subagent done."}], f"sm{n}"),
    ]
    return [{**e, "isSidechain": True} for e in entries]


def test_a_subagents_messages_in_the_transcript_are_not_the_turns_answer(
    claude_dir: Path,
) -> None:
    """A subagent's messages written after the turn's answer are neither its closing text
    nor what names its stop: they are the subagent's, not the session's model's."""
    entries = _turn(1)
    entries = entries[:5] + _sidechain(1) + entries[5:] + _sidechain(2)
    assert _claude_stop_id(claude_dir, entries, "Looked.\nDone.") == "a1-end"
    transcript = claude_dir / "s.jsonl"
    assert last_assistant_text(transcript) == "Looked.\nDone."
    # a Stop without last_assistant_message: the closing text is read from the transcript
    stop = fixture("claude-code", "Stop", transcript_path=str(transcript))
    del stop["last_assistant_message"]
    payload, note = enrich("claude-code", stop)
    assert note is None and payload["last_assistant_message"] == "Looked.\nDone."
    assert payload[STOP_ID_FIELD] == "a1-end"


def test_a_transcript_that_shows_nothing_of_the_stops_turn_names_no_turn(
    claude_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interactive Claude Code writes its transcript behind: a channel push's turn may
    have none of its entries there yet when its ``Stop`` hook runs, and the transcript
    then ends with the turn before, whose ``Stop`` hooks have run (``stop_hook_summary``)
    and whose answer may be the same words. Its uuid would name this stop as that one's
    again, and the turn's crossing would be lost; an answer whose stop hooks have run is
    an earlier stop's, and names nothing."""
    monkeypatch.setattr(transcripts, "TRANSCRIPT_WAIT_SECONDS", 0.0)
    channel = [
        {"type": "queue-operation", "operation": "enqueue", "content": "<channel ...>"},
        {"type": "queue-operation", "operation": "dequeue"},
    ]
    for behind in (_turn(1) + _ended(1), _turn(1) + _ended(1) + channel):
        assert _claude_stop_id(claude_dir, behind, "Looked.\nDone.") is None
        assert _claude_stop_id(claude_dir, behind[:-1], "Looked.\nDone.") is None


def test_the_hook_waits_a_moment_for_the_transcript_to_show_the_stops_answer(
    claude_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interactive Claude Code may run a ``Stop`` hook before it writes the turn's answer
    to the transcript: the hook reads it again, for a moment, until it does; a transcript
    that shows an answer of other words is not waited for."""
    transcript = claude_dir / "s.jsonl"
    first, rest = _turn(1) + _ended(1) + _turn(2)[:3], _turn(2)[3:]
    transcript.write_text("".join(json.dumps(e) + "\n" for e in first))
    reads: list[int] = []
    read_tail = transcripts._read_tail

    def flushed_after_the_first_read(path: str, runtime: str) -> tuple[bytes, bool]:
        got = read_tail(path, runtime)
        if not reads:  # the runtime writes the answer while the hook waits
            with transcript.open("a") as f:
                f.writelines(json.dumps(e) + "\n" for e in rest)
        reads.append(1)
        return got

    monkeypatch.setattr(transcripts, "_read_tail", flushed_after_the_first_read)
    stop = fixture("claude-code", "Stop", transcript_path=str(transcript))
    payload, note = enrich("claude-code", {**stop, "last_assistant_message": "Looked.\nDone."})
    assert note is None and payload.get(STOP_ID_FIELD) == "a2-end"
    assert len(reads) == 2

    reads.clear()
    payload, note = enrich("claude-code", {**stop, "last_assistant_message": "Other words."})
    assert STOP_ID_FIELD not in payload and len(reads) == 1
