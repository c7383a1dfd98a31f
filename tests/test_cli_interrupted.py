"""``backchannel inbox`` stopped before its messages are all written: by Ctrl-C, by a
reader that closed the pipe (``| head -1``) or by a full disk. A message is acked only
once it was written; one that was not goes back to the inbox at once (not at the end of
its lease), and the command ends as a Unix tool does, without a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from tests.conftest import BIN, Server


def _env(srv: Server, token: str) -> dict[str, str]:
    return {**os.environ, "BACKCHANNEL_HOME": str(srv.home), "BACKCHANNEL_TOKEN": token}


def _send(srv: Server, token: str, *texts: str) -> list[str]:
    ids = []
    with srv.client(token) as c:
        for text in texts:
            r = c.post("/v1/messages", json={"to": "worker", "text": text})
            assert r.status_code == 201, r.text
            ids.append(r.json()["message_id"])
    return ids


def _receive_now(srv: Server, token: str) -> list[dict[str, Any]]:
    """What the inbox hands out at once (no wait: a message still leased is not in it)."""
    with srv.client(token) as c:
        r = c.get("/v1/inbox", params={"limit": 50, "wait": 0})
        r.raise_for_status()
        got: list[dict[str, Any]] = r.json()["messages"]
        return got


def _pending(srv: Server, token: str) -> int:
    with srv.client(token) as c:
        r = c.get("/v1/inbox/pending")
        r.raise_for_status()
        return int(r.json()["pending"])


def test_a_pipe_closed_before_the_inbox_is_written_gives_its_messages_back_at_once(
    server: Server,
) -> None:
    """``backchannel inbox | head -1`` where the reader is gone before the first line:
    nothing was shown, so nothing is acked, and the messages are back in the inbox at
    once (they stayed leased for the whole lease when SIGPIPE ended the command before
    it could give them back). The command ends quietly, as a Unix tool does on SIGPIPE."""
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two", "three")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        proc = subprocess.run(
            [str(BIN), "inbox"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=_env(server, tokens["worker"]),
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == -signal.SIGPIPE, proc.stderr.decode(errors="replace")
    assert proc.stderr == b""
    back = _receive_now(server, tokens["worker"])
    assert sorted(m["message_id"] for m in back) == sorted(sent)


def test_a_full_disk_under_the_inbox_loses_no_message(server: Server) -> None:
    """stdout on a full disk (``/dev/full``): with ``--json`` the messages were acked
    before the array was written, and so lost; without it a traceback left them leased.
    Now the failure is named and every message is back in the inbox at once."""
    tokens = server.team("alpha", "lead", "worker")
    for args in (["inbox", "--json"], ["inbox"]):
        sent = _send(server, tokens["lead"], "one", "two")
        with open("/dev/full", "wb") as full:
            proc = subprocess.run(
                [str(BIN), *args],
                stdout=full,
                stderr=subprocess.PIPE,
                env=_env(server, tokens["worker"]),
                timeout=60,
            )
        stderr = proc.stderr.decode(errors="replace")
        assert proc.returncode == 1, (args, stderr)
        assert "Traceback" not in stderr
        assert "No space left on device" in stderr, stderr
        back = _receive_now(server, tokens["worker"])
        assert sorted(m["message_id"] for m in back) == sorted(sent), args
        with server.client(tokens["worker"]) as c:
            c.post("/v1/inbox/ack", json={"message_ids": sent}).raise_for_status()


def test_ctrl_c_while_a_message_is_being_written_acks_it_and_exits_130(
    server: Server,
) -> None:
    """Ctrl-C the instant a message is being shown: the message was written, so it is
    acked before the command exits 130 (the interrupt cancelled the ack that followed
    the print, and the message came back at the end of its lease: shown twice). The
    moment is pinned: the message is larger than the pipe, so the command is still
    writing it when the signal comes."""
    tokens = server.team("alpha", "lead", "worker")
    text = "x" * (200 * 1024)  # more than a pipe holds (64 KiB)
    [sent] = _send(server, tokens["lead"], text)
    proc = subprocess.Popen(
        [str(BIN), "inbox"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(server, tokens["worker"]),
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.read(1)  # the print has begun, and cannot be done yet
        assert first == b"[", proc.stderr.read().decode(errors="replace")
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.stdout.read()
        stderr = proc.stderr.read().decode(errors="replace")
        assert proc.wait(60) == 130, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert "Traceback" not in stderr
    assert (first + rest).count(text.encode()) == 1, f"{len(first + rest)} bytes written"
    assert _pending(server, tokens["worker"]) == 0, f"{sent} was shown and not acked"
