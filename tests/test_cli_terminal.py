"""The CLI never passes a member's terminal control sequences on to the operator."""

from __future__ import annotations

import json
import os
import subprocess
import time

from backchannel.interfaces.terminal import markup_safe, printable
from tests.conftest import BIN, Server

HOSTILE = "hello\x1b]0;title\x07\x1b[2J\rover\u202eback\x9b1m\nsecond line\tend"
SHOWN = "hello\\x1b]0;title\\x07\\x1b[2J\\x0dover\\u202eback\\x9b1m\nsecond line\tend"


def test_printable_escapes_controls_and_keeps_lines_where_asked() -> None:
    assert printable(HOSTILE, multiline=True) == SHOWN
    one_line = printable("a\nb\tc\x1b[0m")
    assert one_line == "a\\x0ab\\x09c\\x1b[0m"
    assert markup_safe("[red]x\x1b") == "\\[red]x\\x1b"


def _env(srv: Server, token: str) -> dict[str, str]:
    return {**os.environ, "BACKCHANNEL_HOME": str(srv.home), "BACKCHANNEL_TOKEN": token}


def test_inbox_and_tail_print_control_sequences_escaped(server: Server) -> None:
    tokens = server.team("alpha", "lead", "worker")
    with server.client(tokens["lead"]) as c:
        r = c.post(
            "/v1/messages",
            json={"to": "worker", "text": HOSTILE, "summary": "sum\x1b]0;pwned\x07"},
        )
        assert r.status_code == 201, r.text

    inbox = subprocess.run(
        [str(BIN), "inbox"],
        capture_output=True,
        text=True,
        env=_env(server, tokens["worker"]),
        timeout=60,
    )
    assert inbox.returncode == 0, inbox.stderr
    assert SHOWN in inbox.stdout
    assert not set(inbox.stdout) & {"\x1b", "\x07", "\r", "\x9b", "\u202e"}

    tail = subprocess.Popen(
        [str(BIN), "tail", "--after", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(server, tokens["lead"]),
    )
    try:
        assert tail.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while not any("sum" in line for line in lines):
            assert time.monotonic() < deadline, lines
            line = tail.stdout.readline()
            assert line, f"tail ended early: {tail.stderr.read() if tail.stderr else ''}"
            lines.append(line)
        sent = next(line for line in lines if "sum" in line)
        assert "sum\\x1b]0;pwned\\x07" in sent
        assert not set("".join(lines)) & {"\x1b", "\x07"}
    finally:
        tail.kill()
        tail.wait()
        for stream in (tail.stdout, tail.stderr):
            if stream is not None:
                stream.close()


TEXT = "ça marche 😀 — d’accord"
LOCALE = ("LANG", "LC_ALL", "LC_CTYPE", "PYTHONIOENCODING", "PYTHONUTF8")


def _send(server: Server, token: str, text: str) -> None:
    with server.client(token) as c:
        r = c.post("/v1/messages", json={"to": "worker", "text": text})
        assert r.status_code == 201, r.text


def test_a_terminal_that_is_not_utf8_gets_text_escaped_and_json_whole(
    server: Server,
) -> None:
    """A stdout that cannot encode every character (the C locale without UTF-8 mode, an
    ``ascii`` or Latin-1 ``PYTHONIOENCODING``): ``inbox`` prints each character it
    cannot as an escape, never a UnicodeEncodeError traceback (which left the messages
    unacknowledged), and ``--json`` stays JSON that reads back as the text sent."""
    tokens = server.team("alpha", "lead", "worker")
    settings: list[dict[str, str]] = [
        {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
        {"PYTHONIOENCODING": "ascii"},
        {"PYTHONIOENCODING": "latin-1", "TERM": "dumb", "NO_COLOR": "1"},
    ]
    for setting in settings:
        env = {k: v for k, v in _env(server, tokens["worker"]).items() if k not in LOCALE}
        env |= setting
        _send(server, tokens["lead"], TEXT)
        text = subprocess.run([str(BIN), "inbox"], capture_output=True, env=env, timeout=60)
        assert text.returncode == 0, (setting, text.stderr.decode(errors="replace"))
        assert b"Traceback" not in text.stderr
        shown = text.stdout.decode("latin-1")
        assert "\\U0001f600" in shown, (setting, shown)
        assert "marche" in shown
        _send(server, tokens["lead"], TEXT)
        as_json = subprocess.run(
            [str(BIN), "inbox", "--json"], capture_output=True, env=env, timeout=60
        )
        assert as_json.returncode == 0, (setting, as_json.stderr.decode(errors="replace"))
        [message] = json.loads(as_json.stdout)
        assert message["text"] == TEXT
