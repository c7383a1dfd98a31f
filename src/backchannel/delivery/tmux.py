"""``tmux``: type a message into the pane an agent runs in, between its turns.

Setting::

    {"type": "tmux",
     "target": "work:0.1",          # required; session:window.pane, or a pane id like %3
     "session": "auto",             # strongly advised: the agent's hub session id, or "auto"
     "socket_name": "agents",       # optional; tmux -L (default: tmux's default socket)
     "socket_path": "/tmp/t.sock",  # optional; tmux -S (instead of socket_name)
     "agent_commands": ["claude"],  # optional; what may run in the pane's foreground
     "turn_wait": 3,                # optional; seconds to wait for the turn to start
     "hold_max": 1800}              # optional; seconds a message may be held (below)

**Only into the agent.** Text typed into a terminal runs as commands when the agent has
exited and left its shell in the pane. Before every paste the adapter asks tmux for the
pane's foreground program (``#{pane_current_command}``: the name, ``argv[0]`` without
its directory, of the foreground process group of the pane's terminal) and types only
when it is one of ``agent_commands`` (a name or a list of names; default
:data:`DEFAULT_AGENT_COMMANDS`: Claude Code runs as ``claude`` or ``node``, Codex as
``codex``, Gemini CLI as ``node`` or ``gemini``; Claude Code's native build is named by
its version, e.g. ``2.1.330``, which counts as ``claude``). Set it to the agent's own program name
for anything else; a shell's name (``bash``, ``zsh``...) is refused. Otherwise the copy
is **held**: not typed, not dead-lettered, back in the queue; the team's ``user`` gets a
``system`` notice and the hub's log a WARNING naming the program found in the pane, the
dispatcher's status shows the worker ``held``, and the message is typed in as soon as
the agent is back in the foreground (checked every few seconds); the ``user`` is
reminded while it lasts, and a copy still held after ``hold_max`` seconds is given up,
its sender told what the screen showed and for how long. A pane whose
foreground program tmux cannot name is held the same way, and so is an agent that is
stopped (SIGSTOP, a debugger: the leader of the foreground process group, from
``/proc``, is in state ``T``): it reads nothing, tmux would take the paste all the same,
and the message would count delivered while it sat in a terminal nobody reads.

**Between turns only.** With ``session``, the dispatcher leases with that session, and
the hub hands nothing out while the session has an open turn (its runtime reported
``turn_start`` and not yet ``agent_stop``): the message waits ``queued`` and is typed in
when the turn ends. ``"auto"`` follows the member's live session (the most recently
active one that is not terminated: the one its runtime's hooks report turns for), so a
restarted agent with a new session id is followed without changing the setting. After
typing one message the dispatcher waits up to ``turn_wait``
seconds for the turn it starts to be reported before it leases the next, so a second
message is not typed into a turn that is just starting. Without ``session`` nothing
gates the pane: a message is typed in whenever it arrives.

**How.** The pane is looked up first (``display-message -t target``); the text goes into
a private tmux buffer through ``load-buffer -`` (stdin, so size is no issue) and is
pasted with ``paste-buffer -p``: when the program in the pane asked for bracketed paste
(Claude Code, Codex, Gemini CLI, readline do), the text is wrapped in ``ESC[200~ ...
ESC[201~`` and its newlines stay newlines instead of submitting; then, after
:func:`paste_settle` (Gemini CLI takes an Enter within 40 ms of a paste for a newline of
it), ``Enter``. Escape
and other control characters (but newline and tab) are removed from the text first, so
a message cannot end the paste early and type keystrokes of its own. For a ``gemini``
or ``claude-code`` member each ``@`` that no backslash precedes is typed as ``\\@``
(:func:`escape_at`, :data:`AT_READERS`): Gemini CLI and Claude Code read an ``@path`` of
a submitted prompt, pasted or not, as a file to show the model, so a message naming
``@~/.ssh/id_rsa`` would hand the agent's files to its model. A program that
reads its terminal in canonical (line) mode (``cat``, a shell's ``read``, Python's
``input()``; the pane's terminal is asked with ``tcgetattr``) gets at most
:data:`MAX_CANON_LINE` bytes of a line, the rest dropped by the line discipline without
a word: a message with a longer line is refused (dead-lettered, the sender told) rather
than typed in cut.

**Not into a dialog.** Claude Code, Codex and Gemini CLI ask their user before a tool
runs (``Do you want to proceed? ❯ 1. Yes ... 4. No``, ``Would you like to run the
following command? › 1. Yes, proceed (y)``, ``Allow execution of [Shell]? ● 1. Allow
once``), and such a dialog takes Enter (Codex also ``y``) as the user's choice: a
message typed in then approved the tool call (Codex ran it), or was swallowed by the
dialog and counted delivered. Before every paste and every Enter the adapter reads the
screen; while it shows a dialog (:func:`dialog`: below the agent's last prompt line, a
chosen option of a numbered list, ``❯ 1.``, ``› 1.``, ``● 1.``, or a dialog's footer,
``Esc to cancel``; Claude Code's panels and pickers, ``/resume``, ``/mcp``, ``/config``,
say ``Esc to close`` or ``Esc to go back``, Gemini CLI's session browser marks its chosen
row ``❯ #1 │``) the message is **held** like a pane in copy mode: not typed, the
team's ``user`` told, and typed in once the dialog is answered and the agent is back
at its prompt. A dialog that comes up between the look and the paste gets no Enter:
the attempt fails as transient, the next one waits for the dialog to go and presses
only Enter. A dialog on screen after the Enter counts as the text gone from the prompt
(the turn it started asks for a tool). For a ``claude-code``, ``codex`` or ``gemini``
member (:data:`PROMPTED`, whose prompts the adapter knows) a screen without the CLI's
live input line (:func:`live_input`: the last line with a prompt mark, in its frame, with
no more under it than the CLI's footer) and with no dialog it knows is held the same way
once it has stayed so for :data:`UNKNOWN_SCREEN_WAIT` (a screen caught mid-redraw shows
its prompt again within it): a CLI still starting or showing a screen of its own before
its first prompt, a panel, menu or list of suggestions of a wording the adapter has not
met, drawn under the input line or over it (the conversation's echo of an earlier prompt
above it then has no frame, or too much under it, to pass for the input line; Codex's
composer has no frame either, and its echo is told by its mark, drawn faint, the screen
read with its colours: :func:`echo_mark`). Panes of
other members (a human's chat program, an agent of another kind) may show anything and
are typed into as before. A live input line that holds a command its user is typing
(``/mod``: :data:`_COMMAND_MARKS`) holds the message too: typed in after it, the message
was run as that command (Codex: ``Unrecognized command '/[From'``), never reaching the
model, and counted delivered. So does one that holds a draft its user is typing (plain
text not yet sent, :func:`draft`): typed in after it, the message was added to the draft
and submitted with it, the user's half-written text sent to the model and lost to them.
A draft is told from the CLI's placeholder in an empty prompt by the screen's colours
and the cursor (``capture-pane -e`` and ``#{cursor_x}``, read in one tmux command,
:func:`draft`: the placeholder is drawn faint or grey and runs after the cursor at the
input's start; typed text ends at the cursor, so grey text before it is a draft in a
theme that draws typed text grey, and the character under the cursor, drawn in reverse
video by Claude Code and Gemini CLI, is typed text unless a placeholder runs on after
it; a CLI's known placeholder text, :data:`_KNOWN_PLACEHOLDERS`, is none in any
colour), and
from this adapter's own text, pasted by an earlier attempt and waiting for its Enter, by
that text's head. The draft is quoted nowhere (the sender of a message given up after
``hold_max`` would read it). A user may start typing in the moment between the look and
the paste: just before the paste the prompt is read again (with the cursor), and the
paste is made in one tmux command with a check that the cursor has not moved since
(``if-shell -F``, :meth:`TmuxAdapter._paste`), so a key drawn by then holds the message
as a draft; only a key the CLI has read but not yet drawn can still meet the paste.

**Submitted, seen on screen.** tmux takes the keys whether or not the agent submits
anything, so the adapter reads the pane (``capture-pane``). An agent's prompt is the
last line of the screen that begins with a prompt mark (``>``, ``›``, ``❯``, inside a
box's border or not: Claude Code, Codex, Gemini CLI; :func:`input_line`); the text
waits in it while that line (with the rows a narrow pane wraps the input into) holds the
text's first characters (:func:`text_head`) or a paste placeholder (:func:`waits_in_prompt`). The Enter comes only once the prompt shows
the text (up to :data:`SUBMIT_WAIT` seconds): Gemini CLI just done with a turn (its
``AfterAgent`` hook running) read the paste and its Enter in one go later and took the
Enter for a newline. The message counts delivered only once every read for
:data:`SUBMIT_STEADY` seconds shows the prompt without the text (a read caught
mid-redraw may show no prompt), Enter pressed again every :data:`SUBMIT_REPRESS`
seconds while it stays (an agent busy ending a turn ignores one); still there after
:data:`SUBMIT_WAIT` seconds, the attempt fails as below, the text waiting unsubmitted.
Another Enter cannot submit the text twice: it is in the prompt once, and these CLIs
ignore an Enter on an empty prompt. A screen without a prompt mark before the paste is
not checked: the message counts delivered once Enter was pressed.

**Pasted once.** Once the paste went in, the text sits in the agent's prompt, and no
attempt of this adapter pastes it there again. A failed ``Enter`` (a tmux error, or a
command that hangs past :data:`COMMAND_TIMEOUT`) is pressed again in place, up to
:data:`ENTER_TRIES` times; if none works, the adapter remembers the message id, the pane
and who holds the prompt (the foreground process group of the pane's terminal, from
``/proc``; elsewhere the pane's first process) and the attempt fails as transient, its
error saying that the text waits unsubmitted. The dispatcher's retry then presses only
``Enter``. If by then the prompt the text went into is gone (the target is another pane,
or the agent in it was restarted), the text went with it unsubmitted, so the message is
typed in afresh: the model saw it not once. If the pane is gone, the copy is
dead-lettered saying it was typed in but never submitted. If the retries run out, the
copy is dead-lettered with that error (the text waits in the prompt: press Enter there
to submit it, or clear it) and the team's ``user`` is told as well as the sender
(``AdapterError.tell_operator``): only a person at the pane can finish or undo it. An
Enter whose tmux command hung may still have been pressed; the one pressed after it
then meets an empty prompt (or what someone typed there meanwhile). Once an Enter has
failed, what waits unsubmitted is also written to a private file (0600, under
``runtimes.seen.state_dir()``, in ``tmux/``, one per tmux server, team and member),
so a hub restarted before the retry presses only Enter too, rather than pasting the
text a second time.

**Errors.** A pane (or tmux server) that is not there, or whose program has exited (with
``remain-on-exit``), is permanent: the copy is dead-lettered with the reason and the
sender told. A pane in copy mode (someone scrolling, for as long as it takes) is held
like a pane without its agent, the message typed in once the pane leaves copy mode. A
tmux command that hangs is transient and retried (after the paste, only the Enter).
tmux cannot tell whether the agent already saw a message, so a crash between the paste
and the hub's record, or between the paste and its first Enter, types it twice (the
window is milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import termios
import time
import unicodedata
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from backchannel.delivery.base import (
    Adapter,
    AdapterContext,
    AdapterError,
    HeldDelivery,
    PermanentDeliveryError,
    agent_text,
)
from backchannel.errors import InvalidRequest
from backchannel.files import private_dirs, write_atomic
from backchannel.types import InboxMessage

__all__ = [
    "AT_READERS",
    "DEFAULT_AGENT_COMMANDS",
    "ENTER_TRIES",
    "SHELLS",
    "TmuxAdapter",
    "agent_commands",
    "dialog",
    "escape_at",
    "sanitize",
]

log = logging.getLogger("backchannel.delivery.tmux")

#: The member kinds whose CLI reads an ``@path`` of a submitted prompt as a file to show
#: the model (Gemini CLI; Claude Code, which reads the file's content into the request
#: before the prompt): their ``@`` is typed escaped (:func:`escape_at`).
AT_READERS = frozenset({"gemini", "claude-code"})
#: Foreground programs a message is typed into when the setting names none.
DEFAULT_AGENT_COMMANDS = ("claude", "codex", "gemini", "node")
#: Never accepted as an agent: text typed into these runs as commands.
SHELLS = frozenset(
    {"sh", "bash", "zsh", "fish", "dash", "ksh", "mksh", "tcsh", "csh", "ash", "busybox",
     "nu", "xonsh", "pwsh", "elvish", "login", "su", "sudo"}
)  # fmt: skip

#: One tmux command may take this long before the attempt counts as failed.
COMMAND_TIMEOUT = 10.0
#: After a paste, Enter is pressed up to this many times in place before the attempt fails.
ENTER_TRIES = 3
#: The pause before the second Enter; doubled before each one after it.
ENTER_PAUSE = 0.2
#: The pause between a paste and its Enter, and how much longer it gets per byte pasted.
#: Gemini CLI takes an Enter that comes within 40 ms of a bracketed paste (counted from
#: when it has read the paste) as a newline of the paste, not as submitting it: pressed
#: at once, the Enter left the message in its prompt unsubmitted.
PASTE_SETTLE = 0.25
PASTE_SETTLE_PER_BYTE = 1e-5
#: The longest that pause gets (a message of 256 KB or more).
PASTE_SETTLE_MAX = 3.0
#: After an Enter, how long the pasted text may stay in the agent's prompt (read from the
#: screen) before the attempt fails as not submitted: Gemini CLI just done with a turn
#: (its ``AfterAgent`` hook still running, its screen re-rendering) ignores an Enter.
SUBMIT_WAIT = 10.0
#: While the text stays in the prompt, Enter is pressed again this long after the last one.
SUBMIT_REPRESS = 1.0
#: How long every read of the screen must show the prompt without the text before it
#: counts as left (a screen caught mid-redraw may show neither).
SUBMIT_STEADY = 0.5
#: How often the screen is read while waiting for the text to leave the prompt.
SUBMIT_POLL = 0.1
#: What the agents' prompts show for a long paste instead of its text: Gemini CLI
#: ``[Pasted Text: N lines]``, Claude Code ``[Pasted text #1 +N lines]``, Codex
#: ``[Pasted Content N chars]``.
_PLACEHOLDERS = ("[pasted text", "[pasted content")
#: How the agents' CLIs begin their prompt's input line (Gemini CLI and Claude Code ``>``
#: or ``❯``, Codex ``›``), inside a box's border or not.
_PROMPT_MARKS = (">", "›", "❯")
_BORDERS = "│┃|"
#: A dialog's chosen option: a selection mark, then the option's number (Claude Code
#: ``❯ 1. Yes``, Codex ``› 1. Yes, proceed (y)``, Gemini CLI ``● 1. Allow once``), or
#: the chosen row of Gemini CLI's session browser (``/resume``, ``/chat``: ``❯ #1 │ 6 │``).
_CHOICE = re.compile(r"^[>›❯●◉]\s*(?:\d+\.\s|#\d+\s*│)")
#: What a dialog's footer says when it offers no numbered options (Claude Code's ``Enter
#: to stay in auto mode · ... · Esc to cancel``, Codex's ``Press enter to confirm or esc
#: to cancel``; Claude Code's pickers and panels, ``/resume``, ``/mcp``, ``/permissions``:
#: ``Esc to close``, ``/config``: ``Esc to go back``), lower case.
_DIALOG_HINTS = ("esc to cancel", "enter to confirm", "enter to select", "esc to close",
                 "esc to go back")  # fmt: skip
#: The member kinds whose CLIs' prompts :func:`input_line` knows: a screen of theirs
#: showing neither that prompt nor a dialog (:func:`dialog`) is held, not typed into.
PROMPTED = frozenset({"claude-code", "codex", "gemini"})
#: How long such a screen is read again (every :data:`SUBMIT_POLL`) before the message is
#: held: a screen caught mid-redraw shows its prompt again within this.
UNKNOWN_SCREEN_WAIT = 1.0
#: A line of the frame around a CLI's input: a rule (Claude Code's and Gemini CLI's
#: ``────``) or a box's edge (``╭────╮``, ``╰────╯``).
_FRAME = re.compile(r"^[╭┌╰└]?[─━═▔▁-]{3,}")
#: How many lines of its footer a CLI shows below its live input line (:func:`live_input`):
#: Claude Code one (its mode line), Gemini CLI two (workspace and sandbox, their values),
#: Codex two (its status line, its shortcuts). A third is something else: a panel, a
#: search, a list of suggestions whose Enter would pick one. A line the CLI wrapped over
#: several rows of a narrow pane counts once (:func:`_footer_lines`).
FOOTER_MAX = 2
#: Within how many lines above it Claude Code's and Gemini CLI's live input line has its
#: frame's rule (Gemini CLI puts a hint line, ``Shift+Tab to accept edits``, between).
FRAME_ABOVE = 3
#: What a command typed into a CLI's prompt begins with (Claude Code, Codex and Gemini
#: CLI run ``/name`` as their own command, not as a prompt): a message typed in after it
#: would be run as that command.
_COMMAND_MARKS = ("/",)
#: How many times the prompt is read again just before a paste when the cursor moved
#: between that read and the paste (:meth:`TmuxAdapter._paste`).
PASTE_GATE_TRIES = 5
#: What the gated paste prints when the cursor moved and nothing was pasted.
_MOVED = "backchannel-cursor-moved"
#: How many messages typed in but not yet submitted one adapter remembers.
_TYPED_MAX = 64

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")
#: An ``@`` Gemini CLI would read as a file mention (its own pattern: no backslash before it).
_AT = re.compile(r"(?<!\\)@")
#: Claude Code's native build runs as ``~/.local/share/claude/versions/<version>``, so
#: tmux names its foreground program by the version (``2.1.330``), not ``claude``.
_CLAUDE_NATIVE = re.compile(r"\d+\.\d+\.\d+")
_GONE = ("can't find", "no server running", "error connecting", "no such file")
#: The longest line a terminal in canonical mode passes on whole: Linux's line discipline
#: holds 4096 bytes of a line, the last for its newline, and drops what comes after.
MAX_CANON_LINE = 4095


def paste_settle(text: str) -> float:
    """How long to wait between pasting ``text`` and pressing Enter: long enough for the
    program to have read the whole paste, and for Gemini CLI past the 40 ms in which it
    takes an Enter for a newline of the paste."""
    return min(PASTE_SETTLE + len(text.encode("utf-8")) * PASTE_SETTLE_PER_BYTE, PASTE_SETTLE_MAX)


def text_head(text: str) -> str:
    """What of ``text`` (sanitized) an agent's prompt shows at the start of its input
    line while the text waits unsubmitted: its first line up to a tab, at most 20
    characters (a narrow pane may wrap them onto the input's next row:
    :func:`waits_in_prompt` reads it too)."""
    return text.split("\n", 1)[0].split("\t", 1)[0][:20].strip()


def input_line(screen: str) -> str | None:
    """The agent's prompt's input line on ``screen`` (the pane's visible lines), less
    its prompt mark: the last line that begins with one (the conversation above it
    echoes submitted prompts the same way); None when no line does (a screen of
    another kind) or when a dialog shows under it (:func:`dialog`: the line is the
    conversation's echo of a prompt, the CLI's input line hidden by the dialog)."""
    for line in reversed(screen.splitlines()):
        line = line.strip().strip(_BORDERS).strip()
        if _CHOICE.match(line) or any(h in line.lower() for h in _DIALOG_HINTS):
            return None
        if line.startswith(_PROMPT_MARKS):
            return line[1:].strip()
    return None


def live_input(screen: str, kind: str, width: int | None = None) -> str | None:
    """The input line of a :data:`PROMPTED` CLI's prompt on ``screen`` (less its mark)
    when it is the CLI's live one; None when the last line with a prompt mark is only
    the conversation's echo of an earlier prompt, with something the adapter does not
    know drawn below it (a panel, a menu, a list of suggestions that Enter would pick).

    The live input line sits at the bottom of the screen, in its frame: Claude Code's
    between two rules (``────``), Gemini CLI's under a rule and its hint line (or in a
    box, ``│ > ... │``), Codex's composer (unframed) over its status line. Below it come
    the input's own lines up to the frame's edge or a blank line, and then at most
    :data:`FOOTER_MAX` lines of the CLI's footer (Claude Code's mode line, Gemini CLI's
    workspace and model lines, Codex's status line and shortcuts). For Claude Code and
    Gemini CLI the line must also be framed: its border, or a rule within
    :data:`FRAME_ABOVE` lines above it (an echo has the conversation above it).
    ``width``: the pane's (``#{pane_width}``); with it, a footer line the CLI wrapped
    over several rows of a narrow pane counts once (:func:`_footer_lines`)."""
    lines = screen.splitlines()
    for at in range(len(lines) - 1, -1, -1):
        raw = lines[at].strip()
        line = raw.strip(_BORDERS).strip()
        if _CHOICE.match(line) or any(h in line.lower() for h in _DIALOG_HINTS):
            return None
        if line.startswith(_PROMPT_MARKS):
            break
    else:
        return None
    below = [ln.strip() for ln in lines[at + 1 :]]
    end = 0  # the input's own lines (a text typed over several) end at its frame or a blank
    while end < len(below) and below[end] and not _FRAME.match(below[end]):
        end += 1
    footer = [lines[at + 1 + n] for n in range(end, len(below)) if below[n]]
    footer = [ln for ln in footer if not _FRAME.match(ln.strip())]
    if (len(footer) if width is None else _footer_lines(footer, width)) > FOOTER_MAX:
        return None
    if kind != "codex" and not raw.startswith(tuple(_BORDERS)):
        above = [ln.strip() for ln in lines[:at] if ln.strip()][-FRAME_ABOVE:]
        if not any(_FRAME.match(ln) for ln in above):
            return None
    return line[1:].strip()


def _columns(text: str) -> int:
    """How many cells of tmux's grid ``text`` (plain, one line) takes (:func:`_width`)."""
    return sum(_width(c) for c in re.sub(f"{_ZWJ}.", "", text.rstrip()))


def _footer_lines(rows: Sequence[str], width: int) -> int:
    """How many lines of a CLI's footer ``rows`` (rows of the screen, none blank, in a
    pane ``width`` columns wide) are: a row whose first word would have fitted at
    the end of the row above it starts a line of its own; one whose first word would not
    continues the line above, wrapped there by a pane too narrow for it (Codex's status
    line with a long working directory or thread title: three rows in a pane of 40
    columns, one at 160)."""
    lines = 0
    for n, row in enumerate(rows):
        word = row.split(maxsplit=1)[0]
        if n == 0 or _columns(rows[n - 1]) + 1 + _columns(word) <= width:
            lines += 1
    return lines


_SGR = re.compile(r"\x1b\[([0-9;:]*)m")
#: Any other escape sequence ``capture-pane -e`` may leave in a line (none drawn).
_ESCAPE = re.compile(r"\x1b(?:\[[0-9;:?]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def plain(screen: str) -> str:
    """``screen`` as ``capture-pane -e`` gave it (with its escape sequences), less them:
    what ``capture-pane -p`` gives."""
    return _ESCAPE.sub("", screen)


def _grey(params: list[int], at: int) -> tuple[bool, int]:
    """Whether the extended colour at ``params[at:]`` (``38;5;N`` or ``38;2;R;G;B``, less
    the 38) is a grey between black and white, and how many parameters it takes."""
    if at < len(params) and params[at] == 5 and at + 1 < len(params):
        n = params[at + 1]
        if 232 <= n <= 255:  # the grey ramp, 8 to 238
            level = 8 + 10 * (n - 232)
            return 48 <= level <= 216, 2
        if 16 <= n <= 231:  # the colour cube: grey where its three steps are equal
            r, g, b = (n - 16) // 36, (n - 16) // 6 % 6, (n - 16) % 6
            return r == g == b and 1 <= r <= 4, 2
        return n == 8, 2  # bright black
    if at < len(params) and params[at] == 2 and at + 3 < len(params):
        r, g, b = params[at + 1 : at + 4]
        return max(r, g, b) - min(r, g, b) <= 16 and 48 <= (r + g + b) // 3 <= 216, 4
    return False, 1


class _Cell(NamedTuple):
    """One cell of a line as ``capture-pane -e`` gave it: its character (with the marks
    and joined characters tmux keeps in the same cell, :func:`_width`), the column it
    starts at, whether it is drawn faint (SGR ``2``) or grey (``90``, or
    ``38;5;N`` / ``38;2;R;G;B`` of a grey between black and white), and whether in
    reverse video (how Claude Code and Gemini CLI draw their cursor)."""

    char: str
    col: int
    pale: bool
    reverse: bool


#: What joins the character after it to the one before it, in one cell of tmux's grid
#: (an emoji sequence: ``👨\u200d👩\u200d👧`` takes the cells of its first emoji).
_ZWJ = "\u200d"


def _width(char: str) -> int:
    """How many cells of tmux's grid ``char`` takes, as tmux counts them for
    ``#{cursor_x}`` (the C library's ``wcwidth`` in a UTF-8 locale): two for an East
    Asian wide or full-width character (CJK, most emoji), none for a mark that joins
    the character before it (combining marks of any class, Indic and Thai vowel signs,
    enclosing marks such as the keycap's, variation selectors such as the emoji one,
    ``U+FE0F``), a format character (zero-width space and joiner, direction marks) or a
    Hangul vowel or final consonant (``U+1160``-``U+11FF``, drawn in the syllable before
    it); one for anything else, the soft hyphen included."""
    if char == "\xad":
        return 1
    if unicodedata.category(char) in ("Mn", "Me", "Cf") or "\u1160" <= char <= "\u11ff":
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _cells(line: str) -> list[_Cell]:
    """The characters of ``line`` (as ``capture-pane -e`` gave it) with their columns
    and how they are drawn (:class:`_Cell`)."""
    faint = grey = reverse = False
    cells: list[_Cell] = []
    at = col = 0
    while at < len(line):
        if line[at] == "\x1b":
            if m := _SGR.match(line, at):
                params = [int(p) if p.isdigit() else 0 for p in re.split("[;:]", m.group(1))]
                i = 0
                while i < len(params):
                    code = params[i]
                    if code == 0:
                        faint = grey = reverse = False
                    elif code == 2:
                        faint = True
                    elif code == 22:
                        faint = False
                    elif code == 7:
                        reverse = True
                    elif code == 27:
                        reverse = False
                    elif code == 39 or 30 <= code <= 37 or 91 <= code <= 97:
                        grey = False
                    elif code == 90:
                        grey = True
                    elif code in (38, 48):
                        is_grey, took = _grey(params, i + 1)
                        if code == 38:
                            grey = is_grey
                        i += took
                    i += 1
                at = m.end()
                continue
            if m := _ESCAPE.match(line, at):
                at = m.end()
                continue
        char = line[at]
        if cells and (_width(char) == 0 or cells[-1].char.endswith(_ZWJ)):
            # joined to the character before it: in that one's cell, drawn as it is
            cells[-1] = cells[-1]._replace(char=cells[-1].char + char)
        else:
            cells.append(_Cell(char, col, faint or grey, reverse))
            col += _width(char)
        at += 1
    return cells


def _prompt_cells(screen: str) -> tuple[int, list[_Cell]] | None:
    """The index in ``screen`` (``capture-pane -e``, lines split at newlines) of its last
    line that begins with a prompt mark, and that line's cells (:func:`_cells`) from its
    mark on; None when no line does before a dialog's (as :func:`input_line`)."""
    lines = screen.split("\n")
    for at in range(len(lines) - 1, -1, -1):
        raw = lines[at]
        line = plain(raw).strip().strip(_BORDERS).strip()
        if _CHOICE.match(line) or any(h in line.lower() for h in _DIALOG_HINTS):
            return None
        if line.startswith(_PROMPT_MARKS):
            cells = _cells(raw)
            start = next(i for i, cell in enumerate(cells) if cell.char in _PROMPT_MARKS)
            return at, cells[start:]
    return None


#: The placeholders the CLIs show in an empty prompt (Codex 0.171: ``Ask Codex to do
#: anything``, after a turn ``Ask a follow-up question``; Gemini CLI 0.61: ``Type your
#: message or @path/to/file``, in shell mode ``Type your shell command``; Claude Code
#: 2.1: ``Try "<an example>"``): known by their text, they are no draft in whatever
#: colours a theme draws them.
_KNOWN_PLACEHOLDERS = re.compile(
    r"(?:Ask Codex to do anything|Ask a follow-up question|Type your message or "
    r'@path/to/file|Type your shell command|Try "[^"]*")'
)


def _blank(char: str) -> bool:
    return char.isspace() or char in _BORDERS


def draft(
    screen: str, kind: str, cursor: tuple[int, int] | None = None, width: int | None = None
) -> str | None:
    """The text its user is typing in the live input line (:func:`live_input`) of a
    :data:`PROMPTED` CLI on ``screen`` (``capture-pane -e``, with its colours); None
    when the line is empty or shows only the CLI's placeholder, or when no live input
    line shows. ``cursor``: tmux's ``(#{cursor_x}, #{cursor_y})`` of the pane, read with
    the screen; ``width``: the pane's, as for :func:`live_input`.

    A placeholder starts at the cursor at the start of an empty input and runs after
    it; typed text ends at the cursor or runs past it. So a character drawn faint or
    grey (as the CLIs draw their placeholders) is typed text when it stands before the
    cursor (a theme that draws what its user types grey), and the character under the
    cursor (Claude Code and Gemini CLI draw their cursor in reverse video over it) is
    typed text unless it heads a placeholder, faint or grey text running on right after
    it (Claude Code's ``Try "..."`` with the cursor on its ``T``). Where tmux's cursor is
    not on the input line (a CLI drawing a cursor of its own and parking tmux's), the
    cell in reverse video is taken for the cursor. A known placeholder's text
    (:data:`_KNOWN_PLACEHOLDERS`) at the cursor, with nothing typed before it, is no
    draft in any colours."""
    if live_input(plain(screen), kind, width) is None or (found := _prompt_cells(screen)) is None:
        return None
    at, cells = found
    if kind == "codex" and (cells[0].pale or cells[0].reverse):
        return None  # an echo (see echo_mark): no live input line shows
    body = cells[1:]
    lines = screen.split("\n")
    if cursor is not None and cursor[1] == at:
        cx: int | None = cursor[0]
    elif (
        cursor is not None
        and at < cursor[1] < len(lines)
        and all(
            (ln := plain(lines[n]).strip()) and not _FRAME.match(ln)
            for n in range(at + 1, cursor[1] + 1)
        )
    ):
        cx = 1 << 30  # on a line of the input under it: the whole first line comes before
    else:
        cx = next((c.col for c in body if c.reverse), None)
    typed: list[str] = []
    for i, cell in enumerate(body):
        if _blank(cell.char) or cell.char == "\xa0":
            typed.append(" ")
            continue
        if cell.col == cx:
            after = body[i + 1] if i + 1 < len(body) else None
            heads = after is not None and not _blank(after.char) and after.pale
            typed.append("" if heads else cell.char)
        elif cell.pale:
            typed.append(cell.char if cx is not None and cell.col < cx else "")
        elif cell.reverse and cx is None:
            typed.append("")
        else:
            typed.append(cell.char)
    text = "".join(typed).strip()
    if not text:
        return None
    shown = "".join(c.char for c in body if cx is None or c.col >= cx).replace("\xa0", " ")
    before = "".join(c.char for c in body if cx is not None and c.col < cx)
    if not before.strip() and _KNOWN_PLACEHOLDERS.fullmatch(shown.strip().strip(_BORDERS).strip()):
        return None
    return text


def echo_mark(screen: str) -> bool:
    """Whether the last prompt mark on ``screen`` (``capture-pane -e``) is drawn faint:
    Codex draws the mark of its conversation's echo of a submitted prompt faint
    (``\\x1b[1;2m›``), its live composer's bold only. Codex's composer has no frame, so
    an echo with a panel of one or two lines under it reads as the composer with its
    footer (:func:`live_input`) but for this."""
    found = _prompt_cells(screen)
    return found is not None and (found[1][0].pale or found[1][0].reverse)


def dialog(screen: str) -> str | None:
    """The line of a dialog ``screen`` shows below the agent's last prompt line: a
    chosen option of a numbered list (:data:`_CHOICE`; the permission and approval
    dialogs of Claude Code, Codex and Gemini CLI, their trust questions) or a dialog's
    footer (:data:`_DIALOG_HINTS`); None when there is none. These dialogs take Enter
    (and Codex's ``y``) as the user's choice: a message typed into one could approve a
    tool call its user never approved, and would not reach the model."""
    for line in reversed(screen.splitlines()):
        line = line.strip().strip(_BORDERS).strip()
        if _CHOICE.match(line) or any(h in line.lower() for h in _DIALOG_HINTS):
            return line
        if line.startswith(_PROMPT_MARKS):
            return None
    return None


def waits_in_prompt(screen: str, head: str) -> bool:
    """Whether ``screen`` shows a text starting with ``head`` (:func:`text_head`) still
    in the agent's prompt: its :func:`input_line` holds a paste placeholder, or it and
    the rows under it that the input wraps into (up to a blank row or its frame's edge)
    hold ``head``, spaces aside (a CLI wraps the text at a space, before a word that does
    not fit: in a narrow pane the head's last words are on the input's second row)."""
    line = input_line(screen)
    if line is None:
        return False
    if any(p in line.lower() for p in _PLACEHOLDERS):
        return True
    if not head:
        return False
    rows = [row.strip().strip(_BORDERS).strip() for row in screen.splitlines()]
    at = max(n for n, row in enumerate(rows) if row.startswith(_PROMPT_MARKS))
    shown = [line]
    for row in rows[at + 1 :]:
        if not row or _FRAME.match(row):
            break
        shown.append(row)
    return "".join(head.split()) in "".join("".join(shown).split())


def sanitize(text: str) -> str:
    """``text`` safe to paste: newlines normalized to ``\\n``, trailing newlines dropped
    (the Enter that follows submits), other control characters (ESC above all) removed."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    return _CONTROL.sub("", text)


def escape_at(text: str) -> str:
    """``text`` with each ``@`` that no backslash precedes escaped as ``\\@``: Gemini CLI
    reads an unescaped ``@path`` anywhere in a submitted prompt as a file (or an agent,
    or an MCP resource) and puts it before the model, and Claude Code one at the start of
    a line or after a space (its Read tool's result, in the request before the prompt),
    so a teammate's ``@~/.ssh/id_rsa`` would show the agent's files to its model. An
    escaped ``@`` both leave as text."""
    return _AT.sub(r"\\@", text)


@dataclass(frozen=True, slots=True)
class _Typed:
    """A message pasted into a prompt and not submitted yet: the pane, and who held the
    prompt (see :meth:`TmuxAdapter._prompt_owner`)."""

    pane: str
    owner: str


class TmuxAdapter(Adapter):
    """See the module docstring."""

    type = "tmux"
    starts_turn = True

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        target = ctx.str_option("target")
        if not target or target.startswith("-"):
            raise PermanentDeliveryError(
                f"member {ctx.member!r} has a tmux delivery setting without a valid 'target'; "
                "set the member's delivery to e.g. "
                '{"type": "tmux", "target": "session:window.pane", "session": "<hub session>"}'
            )
        self.target = target
        self.socket: list[str] = []
        if path := ctx.str_option("socket_path"):
            self.socket = ["-S", path]
        elif name := ctx.str_option("socket_name"):
            self.socket = ["-L", name]
        self.turn_wait = ctx.float_option("turn_wait", 3.0)
        # pane lookup (2 commands), load, paste, then up to ENTER_TRIES Enters and pauses
        # (and the pause between the paste and the first Enter), then the wait for the
        # text to leave the prompt (its last screen read or Enter may take a command's)
        self.attempt_timeout = (
            (6 + ENTER_TRIES) * COMMAND_TIMEOUT
            + ENTER_PAUSE * 2**ENTER_TRIES
            + PASTE_SETTLE_MAX
            + 2 * SUBMIT_WAIT
            + PASTE_SETTLE
        )
        # message id -> where its text waits unsubmitted (pasted, Enter failed); kept in
        # a file too, for the hub's next process
        key = json.dumps([self.socket, ctx.team, ctx.member])
        self._record = _record_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
        self._typed: OrderedDict[str, _Typed] = self._load()
        self._width: int | None = None  # the pane's, as last looked up
        self.agents = agent_commands(
            ctx.option("agent_commands", DEFAULT_AGENT_COMMANDS), f"member {ctx.member!r}"
        )

    def describe(self) -> str:
        where = f" ({' '.join(self.socket)})" if self.socket else ""
        return f"tmux pane {self.target}{where}"

    async def _tmux(self, *args: str, data: bytes | None = None) -> tuple[int, str]:
        """Run one tmux command; returns its exit status and output (stdout, then stderr)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                "tmux",
                *self.socket,
                *args,
                stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            raise PermanentDeliveryError(
                "tmux is not installed on the hub's host (no 'tmux' on PATH); install it "
                "or give the member another delivery"
            ) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), COMMAND_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise AdapterError(
                f"tmux {args[0]} did not answer within {COMMAND_TIMEOUT:g} s"
            ) from None
        text = (out + err).decode("utf-8", "replace").strip()
        return proc.returncode or 0, text

    async def _check(self, args: Sequence[str], what: str) -> str:
        rc, text = await self._tmux(*args)
        if rc != 0:
            raise AdapterError(f"tmux {what} for pane {self.target} failed: {text or rc}")
        return text

    async def pane(self) -> str:
        """The pane id (``%N``) of the target, checked to exist with a live program.

        Raises :class:`PermanentDeliveryError` and :class:`HeldDelivery` as :meth:`look`."""
        return (await self.look())[0]

    async def look(self, expect: str | None = None) -> tuple[str, str, str]:
        """The target's pane id (``%N``), the pid of the pane's first process and the
        pane's terminal (``/dev/pts/N``), checked. ``expect``: the :func:`text_head` of
        a text an earlier attempt pasted into the prompt, waiting for its Enter (not a
        user's draft).

        Raises :class:`PermanentDeliveryError` when the pane, its session or the tmux
        server is gone, or the program in it has exited; :class:`HeldDelivery` when the
        agent is not in the foreground, is stopped, or the pane is in copy mode.
        """
        # display-message falls back to the current pane for a target that does not
        # exist (tmux 3.3), capture-pane does not: it checks the target first
        rc, text = await self._tmux("capture-pane", "-p", "-t", self.target, "-S", "0", "-E", "0")
        if rc == 0:
            rc, text = await self._tmux(
                "display-message",
                "-p",
                "-t",
                self.target,
                "#{pane_id} #{pane_pid} #{pane_dead} #{pane_in_mode} #{pane_width} "
                "#{pane_tty} #{pane_current_command}",
            )
        if rc != 0:
            if any(s in text.lower() for s in _GONE):
                raise PermanentDeliveryError(
                    f"tmux pane {self.target!r} not found ({text}); the agent's pane is gone: "
                    "restart the agent in that pane, or change the member's delivery target"
                )
            raise AdapterError(f"tmux could not look up pane {self.target!r}: {text or rc}")
        parts = text.split(" ", 6)
        if len(parts) == 6:
            parts.append("")  # tmux could not name the foreground program
        if len(parts) != 7 or not parts[0].startswith("%"):
            raise AdapterError(f"unexpected answer from tmux about pane {self.target!r}: {text!r}")
        pane_id, pane_pid, dead, in_mode, width, tty, foreground = parts
        # the footer under the CLI's input line is read at this width (see live_input)
        self._width = int(width) if width.isdigit() else None
        if dead == "1":
            raise PermanentDeliveryError(
                f"the program in tmux pane {self.target!r} has exited; restart the agent there"
            )
        program = "claude" if _CLAUDE_NATIVE.fullmatch(foreground) else foreground
        if program not in self.agents:
            runs = f"runs {foreground!r}" if foreground else "runs a program tmux cannot name"
            raise HeldDelivery(
                f"tmux pane {self.target!r} {runs} in the foreground, not the "
                f"agent ({' or '.join(self.agents)}); the message is held, not typed: "
                "restart the agent in that pane (or set the member's delivery "
                "'agent_commands' to the agent's program name)"
            )
        if in_mode == "1":  # held, not retried: scrolling back may well outlast retries
            raise HeldDelivery(
                f"tmux pane {self.target!r} is in copy mode (someone is scrolling); "
                "the message is typed in once it leaves copy mode"
            )
        # a stopped agent reads nothing: tmux would take the paste and its Enter all the
        # same, the message would count delivered and go with the pane if it were closed
        if (pgid := _foreground_group(pane_pid)) and _stopped(pgid):
            raise HeldDelivery(
                f"the agent in tmux pane {self.target!r} is stopped (process group {pgid}, "
                "by SIGSTOP or a debugger) and reads nothing; the message is held, not "
                f"typed, until it runs again (kill -CONT -{pgid})"
            )
        # a dialog of the agent's own takes Enter as its user's choice: nothing is typed
        # into it (see dialog)
        raw = await self._screen(pane_id, self._escapes)
        screen = None if raw is None else plain(raw)
        if screen is not None and (shows := dialog(screen)):
            raise self._held_by(pane_id, shows)
        if raw is not None and screen is not None and self.ctx.kind in PROMPTED:
            line = self._live(raw)
            if line is None:
                line = await self._until_prompt(pane_id, screen)
            if line is not None and line.startswith(_COMMAND_MARKS):
                raise self._held_by_command(pane_id, line)
            if line and await self._drafted(pane_id, expect):
                raise self._held_by_draft(pane_id)
        return pane_id, pane_pid, tty

    def _held_by_command(self, pane: str, line: str) -> HeldDelivery:
        """The hold of a message while the prompt in ``pane`` holds a command (``line``)."""
        return HeldDelivery(
            f"the agent's prompt in {self._pane(pane)} holds a command its user "
            f"is typing ({line[:80]!r}); the message is held, not typed (typed after "
            "it, it would be run as that command and never reach the model), until "
            "the prompt is empty again",
            shows=line[:80],
        )

    def _held_by_draft(self, pane: str) -> HeldDelivery:
        """The hold of a message while the prompt in ``pane`` holds a draft (not quoted)."""
        return HeldDelivery(
            f"{self.ctx.member}'s prompt holds text the user is typing; the message "
            f"waits until it is sent or cleared (typed in now, it would be added to "
            f"that text and submitted with it, in {self._pane(pane)})"
        )

    async def _paste(self, pane: str, buffer: str) -> None:
        """Paste ``buffer`` into ``pane``. For a :data:`PROMPTED` CLI the prompt is read
        again (with the cursor) just before, and the paste is made in the same tmux
        command as a check that the cursor has not moved since (``if-shell -F``): a user
        who started typing since the adapter's look holds the message (as a draft)
        instead of having it added to their text. A cursor that moved without a draft
        (the CLI redrawing) is read again, up to :data:`PASTE_GATE_TRIES` times."""
        paste = ["paste-buffer", "-p", "-d", "-b", buffer, "-t", pane]
        if self.ctx.kind not in PROMPTED:
            await self._check(paste, "paste")
            return
        for _ in range(PASTE_GATE_TRIES):
            seen = await self._cursor_screen(pane)
            cursor = None if seen is None else seen[0]
            if seen is None or cursor is None:  # nothing better is known: as before
                await self._check(paste, "paste")
                return
            screen = seen[1]
            if shows := dialog(plain(screen)):
                raise self._held_by(pane, shows)
            line = self._live(screen)
            if line is not None and line.startswith(_COMMAND_MARKS):
                raise self._held_by_command(pane, line)
            if line and draft(screen, self.ctx.kind, cursor, self._width) is not None:
                raise self._held_by_draft(pane)
            if line is not None:
                x, y = cursor
                rc, out = await self._tmux(
                    "if-shell", "-F", "-t", pane, f"#{{==:#{{cursor_x}}.#{{cursor_y}},{x}.{y}}}",
                    " ".join(paste), f"display-message -p {_MOVED}",
                )  # fmt: skip
                if rc != 0:
                    raise AdapterError(f"tmux paste for pane {self.target} failed: {out or rc}")
                if out != _MOVED:
                    return
                log.info("%s: the cursor in %s moved since the prompt was read; reading "
                         "it again before the paste", self.describe(), pane)  # fmt: skip
            await asyncio.sleep(SUBMIT_POLL)
        raise AdapterError(
            f"the agent's prompt in {self._pane(pane)} kept changing (its cursor moving, "
            f"or no prompt showing) in {PASTE_GATE_TRIES} reads just before the paste; "
            "nothing was typed, the next attempt looks again"
        )

    async def _drafted(self, pane: str, expect: str | None) -> bool:
        """Whether the live input line in ``pane`` holds text its user is typing (a
        draft, :func:`draft`: read with the screen's colours, so the CLI's placeholder,
        drawn faint or grey, is none), and not this adapter's own text of the message
        it delivers (``expect``, its :func:`text_head`: pasted by an earlier attempt,
        waiting for its Enter)."""
        seen = await self._cursor_screen(pane)
        if seen is None or draft(seen[1], self.ctx.kind, seen[0], self._width) is None:
            return False
        return not (expect is not None and waits_in_prompt(plain(seen[1]), expect))

    async def _cursor_screen(self, pane: str) -> tuple[tuple[int, int] | None, str] | None:
        """Where the cursor of ``pane`` is (``#{cursor_x}``, ``#{cursor_y}``) and its
        visible lines with their colours (``capture-pane -e``), read by one tmux command
        list, so both come from one moment of the pane; None when tmux cannot read them."""
        try:
            rc, out = await self._tmux(
                "display-message", "-p", "-t", pane, "#{cursor_x} #{cursor_y}", ";",
                "capture-pane", "-p", "-e", "-t", pane,
            )  # fmt: skip
        except AdapterError:
            return None
        if rc != 0:
            return None
        first, _, screen = out.partition("\n")
        x, _, y = first.partition(" ")
        cursor = (int(x), int(y)) if x.isdigit() and y.isdigit() else None
        return cursor, screen

    @property
    def _escapes(self) -> bool:
        """Whether the screen is read with its colours to find the live input line:
        Codex's (:func:`echo_mark`)."""
        return self.ctx.kind == "codex"

    def _live(self, screen: str) -> str | None:
        """:func:`live_input` of the member's kind on ``screen`` (with its colours for
        Codex: a line whose mark is drawn faint is an echo, :func:`echo_mark`)."""
        line = live_input(plain(screen), self.ctx.kind, self._width)
        if line is not None and self._escapes and echo_mark(screen):
            return None
        return line

    def _held_by(self, pane: str, shows: str) -> HeldDelivery:
        """The hold of a message while ``pane`` shows a dialog (``shows``, its line)."""
        return HeldDelivery(
            f"the agent in {self._pane(pane)} shows a dialog of its own ({shows[:80]!r}), "
            "waiting for its user's choice; the message is held, not typed (its keys would "
            "answer the dialog), until the dialog is answered in the pane and the agent is "
            "back at its prompt",
            shows=shows[:80],
        )

    async def _until_prompt(self, pane: str, screen: str) -> str | None:
        """Read the screen of a :data:`PROMPTED` agent that shows no prompt again until
        it shows one, for up to :data:`UNKNOWN_SCREEN_WAIT`, and return its input line
        (None: the screen could not be read); raise :class:`HeldDelivery` when it still
        shows none (or comes up with a dialog)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + UNKNOWN_SCREEN_WAIT
        while loop.time() < deadline:
            await asyncio.sleep(SUBMIT_POLL)
            if (again := await self._screen(pane, self._escapes)) is None:
                return None  # nothing better is known: as for a pane that cannot be read
            if (line := self._live(again)) is not None:
                return line
            screen = plain(again)
            if dialog(screen) is not None:
                break
        if shows := dialog(screen):
            raise self._held_by(pane, shows)
        last = next((ln.strip() for ln in reversed(screen.splitlines()) if ln.strip()), "")
        raise HeldDelivery(
            f"the agent in {self._pane(pane)} shows neither its prompt nor a dialog "
            f"the hub knows (its last line: {last[:80]!r}): a screen of its own, a panel "
            "or a question, or a screen still starting. The message is held, not typed (its "
            "keys could answer what shows), until the agent is back at its prompt; look at "
            "the pane should it stay so",
            shows=last[:80],
        )

    async def ready(self) -> str | None:
        try:
            await self.pane()
        except HeldDelivery as exc:
            return exc.message
        except (AdapterError, PermanentDeliveryError):
            return None  # the delivery attempt reports it
        return None

    async def deliver(self, item: InboxMessage) -> str:
        mid = item.message.message_id
        typed = self._typed.get(mid)
        text = sanitize(agent_text(item))
        if self.ctx.kind in AT_READERS:
            text = escape_at(text)
        try:
            pane, pane_pid, tty = await self.look(text_head(text) if typed else None)
        except PermanentDeliveryError as exc:
            if typed is None:
                raise
            del self._typed[mid]
            self._save()
            raise PermanentDeliveryError(
                f"{exc.message}. The message had been typed into that pane ({typed.pane}) "
                "but never submitted, so the agent did not get it"
            ) from None
        owner = self._prompt_owner(pane_pid)
        lines = text.count("\n") + 1
        if typed is not None:
            if typed == _Typed(pane, owner):
                check = await self._prompt_shown(pane)
                await self._submit(mid, typed, text_head(text), check)
                return (
                    f"submitted in {self._pane(pane)}: typed in by an earlier "
                    f"attempt, {lines} line(s); only Enter was pressed now"
                )
            # the prompt it was typed into is gone (another pane, or the agent restarted):
            # the text went with it unread, so it is typed in afresh
            log.warning("%s: %s was typed into %s but not submitted, and that prompt is gone "
                        "(now %s); typing it in again", self.describe(), mid, typed,
                        _Typed(pane, owner))  # fmt: skip
            del self._typed[mid]
            self._save()
        self._check_lines(text, tty)
        # whether the agent shows a prompt to see the text in, asked before the paste
        # (a screen the paste redraws could be caught without it)
        check = await self._prompt_shown(pane)
        buffer = f"backchannel-{uuid.uuid4().hex[:12]}"
        rc, out = await self._tmux("load-buffer", "-b", buffer, "-", data=text.encode("utf-8"))
        if rc != 0:
            raise AdapterError(f"tmux load-buffer failed: {out or rc}")
        try:
            await self._paste(pane, buffer)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._tmux("delete-buffer", "-b", buffer)
            raise
        # from here on the text is in the prompt: no attempt of this adapter pastes it again;
        # the Enter waits until the program has surely read the paste (see PASTE_SETTLE)
        await self._submit(
            mid, _Typed(pane, owner), text_head(text), check, settle=paste_settle(text)
        )
        return f"typed into {self._pane(pane)}, {lines} line(s)"

    def _check_lines(self, text: str, tty: str) -> None:
        """Refuse ``text`` when the pane's terminal is in canonical mode (the program
        reads it line by line: a shell's ``read``, ``cat``, Python's ``input()``) and a
        line of it is longer than the line discipline passes on: the rest of that line
        would be dropped without a word. A terminal that cannot be read is not refused."""
        if _canonical(tty) is not True:
            return
        for n, line in enumerate(text.split("\n"), 1):
            if (size := len(line.encode("utf-8"))) > MAX_CANON_LINE:
                raise PermanentDeliveryError(
                    f"the program in tmux pane {self.target!r} reads its terminal in canonical "
                    f"(line) mode, which keeps at most {MAX_CANON_LINE} bytes of a line and "
                    f"drops the rest; line {n} of the message is {size} bytes, so nothing was "
                    "typed in. Send it in shorter lines, or have the agent read its messages "
                    "with check_inbox (or run an agent that reads its terminal in raw mode)"
                )

    async def _submit(
        self, mid: str, typed: _Typed, head: str, check: bool, settle: float = 0.0
    ) -> None:
        """Press Enter in the pane that holds ``mid``'s text (``settle`` seconds after
        its paste), up to :data:`ENTER_TRIES` times, and see the text (``head``, see
        :func:`text_head`) leave the agent's prompt (:meth:`_left_prompt`). Fails with
        an :class:`AdapterError` that says the text waits unsubmitted (and remembers it,
        so the next attempt only presses Enter)."""
        self._typed[mid] = typed
        self._typed.move_to_end(mid)
        while len(self._typed) > _TYPED_MAX:
            self._typed.popitem(last=False)
        saved = mid in self._saved
        error = ""
        if settle:
            await asyncio.sleep(settle)
        # the Enter only once the agent shows the text in its prompt: an agent busy
        # ending a turn reads the paste and the Enter in one go later, and Gemini CLI
        # takes that Enter for a newline of the paste. The prompt of an agent of another
        # kind that does not show it (a screen of its own kind, or a retry's, where it
        # may have been cleared) gets the Enter all the same, and nothing is checked
        # after it.
        within = SUBMIT_WAIT if settle or self.ctx.kind in PROMPTED else 0.0
        shown = check and await self._in_prompt(typed.pane, head, within)
        # nor on a dialog that came up since the pane was looked at: Enter there is its
        # user's choice (see dialog)
        if not shown and (screen := await self._screen(typed.pane)) and (shows := dialog(screen)):
            if not saved:
                self._save()
            raise AdapterError(
                f"the message was typed into {self._pane(typed.pane)} as the "
                f"agent brought up a dialog of its own ({shows[:80]!r}); Enter was not "
                "pressed (it would answer the dialog). The next attempt waits until the "
                "dialog is answered and presses only Enter"
            )
        # nor, for a CLI whose prompt is known, when it never showed the text: the keys
        # went to something else on its screen, or it reads nothing now; an Enter would
        # count the message delivered whether or not anything was submitted
        if check and not shown and self.ctx.kind in PROMPTED:
            if not saved:
                self._save()
            raise AdapterError(
                f"the message was typed into {self._pane(typed.pane)}, but the "
                f"agent's prompt did not show it within {within:g} s; Enter was not pressed "
                "(what shows instead could take it as an answer). The next attempt presses "
                "only Enter once the prompt shows the text; should it never do, look at "
                "the pane (the text may wait in its prompt, or have gone elsewhere)"
            )
        for n in range(ENTER_TRIES):
            if n:
                if not saved:  # an Enter failed: the hub's next process must know too
                    self._save()
                    saved = True
                await asyncio.sleep(ENTER_PAUSE * 2 ** (n - 1))
            try:
                await self._check(["send-keys", "-t", typed.pane, "Enter"], "send-keys Enter")
            except AdapterError as exc:
                error = exc.message
                if any(s in error.lower() for s in _GONE):
                    break  # the pane is gone, its prompt with it: the next attempt says so
                continue
            if shown and not await self._left_prompt(typed.pane, head):
                if not saved:
                    self._save()
                raise AdapterError(
                    f"the message is typed into {self._pane(typed.pane)} but "
                    f"not submitted: the agent's prompt still showed it {SUBMIT_WAIT:g} s "
                    "after Enter, pressed again every "
                    f"{SUBMIT_REPRESS:g} s (the agent busy or not taking keys). It waits "
                    "unsubmitted in the agent's prompt; the next attempt presses only Enter. "
                    "Should none succeed, press Enter in the pane to submit it (or clear "
                    "the prompt)",
                    tell_operator=True,
                )
            self._typed.pop(mid, None)
            if saved:
                self._save()
            return
        if not saved:
            self._save()
        raise AdapterError(
            f"the message is typed into {self._pane(typed.pane)} but not "
            f"submitted: {error}. It waits unsubmitted in the agent's prompt; the next attempt "
            "presses only Enter. Should none succeed, press Enter in the pane to submit it "
            "(or clear the prompt)",
            tell_operator=True,
        )

    def _pane(self, pane_id: str) -> str:
        """The pane as messages name it: the member's target, and the pane's id when the
        target is another name for it (``work:1.0``), not twice when it is the id."""
        if pane_id == self.target:
            return f"tmux pane {self.target}"
        return f"tmux pane {self.target} ({pane_id})"

    async def _screen(self, pane: str, escapes: bool = False) -> str | None:
        """The visible lines of ``pane`` (with ``escapes``, their colours: ``-e``); None
        when tmux cannot read them."""
        try:
            rc, screen = await self._tmux(
                "capture-pane", "-p", *(["-e"] if escapes else []), "-t", pane
            )
        except AdapterError:
            return None
        return screen if rc == 0 else None

    async def _prompt_shown(self, pane: str) -> bool:
        """Whether ``pane``'s screen shows an agent's prompt (:func:`input_line`): only
        then is the text looked for there before and after the Enter."""
        screen = await self._screen(pane)
        return screen is not None and input_line(screen) is not None

    async def _in_prompt(self, pane: str, head: str, within: float) -> bool:
        """Whether the agent's prompt in ``pane`` shows the text (:func:`waits_in_prompt`),
        the screen read until it does for up to ``within`` seconds (a screen caught
        mid-redraw, without its prompt, is read again). Seen only after a wait, the text
        was read just now: the Enter comes a moment later (Gemini CLI takes one within
        40 ms of a paste for a newline of it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        first = True
        while True:
            screen = await self._screen(pane)
            if screen is not None and waits_in_prompt(screen, head):
                if not first:
                    await asyncio.sleep(PASTE_SETTLE)
                return True
            if screen is None or loop.time() >= deadline:
                return False
            first = False
            await asyncio.sleep(SUBMIT_POLL)

    async def _left_prompt(self, pane: str, head: str) -> bool:
        """Whether the text typed into ``pane`` left the agent's prompt after its Enter:
        the screen is read (``capture-pane``) until it shows the prompt without the text
        (:func:`waits_in_prompt`) in every read for :data:`SUBMIT_STEADY` seconds (Gemini
        CLI redraws its whole screen at a turn's end, and a screen caught mid-redraw may
        show the conversation but not the prompt under it), pressing Enter again each
        :data:`SUBMIT_REPRESS` seconds the text is there (an agent that ignored the
        Enter, busy ending a turn, takes one once idle), for up to :data:`SUBMIT_WAIT`
        seconds. A screen that cannot be read counts as left (the Enter was pressed):
        nothing better is known."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SUBMIT_WAIT
        pressed = loop.time()
        gone: float | None = None  # since when every read showed the prompt without it
        while True:
            await asyncio.sleep(SUBMIT_POLL)
            if (screen := await self._screen(pane)) is None:
                log.warning("%s: cannot read pane %s to see the message submitted; "
                            "counted as submitted", self.describe(), pane)  # fmt: skip
                return True
            now = loop.time()
            if waits_in_prompt(screen, head):
                gone = None
                if now - pressed >= SUBMIT_REPRESS and now < deadline:
                    log.info("%s: the message still waits in the prompt of %s; Enter "
                             "again", self.describe(), pane)  # fmt: skip
                    with contextlib.suppress(AdapterError):
                        await self._tmux("send-keys", "-t", pane, "Enter")
                    pressed = loop.time()
            elif input_line(screen) is None and dialog(screen) is None:
                gone = None  # mid-redraw: says nothing
            elif gone is None:
                gone = now
            elif now - gone >= SUBMIT_STEADY:
                return True
            if now >= deadline:
                return False

    def _load(self) -> OrderedDict[str, _Typed]:
        """What the hub's earlier process left waiting unsubmitted (see the module
        docstring); a record that cannot be read counts as empty."""
        self._saved: frozenset[str] = frozenset()
        try:
            data = json.loads(self._record.read_text("utf-8"))
            typed = OrderedDict(
                (mid, _Typed(pane, owner))
                for mid, (pane, owner) in data.items()
                if isinstance(pane, str) and isinstance(owner, str)
            )
        except (OSError, ValueError, TypeError, AttributeError):
            return OrderedDict()
        self._saved = frozenset(typed)
        return typed

    def _save(self) -> None:
        """Write what waits unsubmitted to the record (removed when nothing does)."""
        try:
            private_dirs(self._record.parent)
            if self._typed:
                data = {mid: [t.pane, t.owner] for mid, t in self._typed.items()}
                write_atomic(self._record, json.dumps(data), mode=0o600)
            else:
                self._record.unlink(missing_ok=True)
        except OSError as exc:
            _SAVE_FAILURES.failed(self.describe(), self._record, exc)
        self._saved = frozenset(self._typed)

    def _prompt_owner(self, pane_pid: str) -> str:
        """Who holds the pane's prompt: the foreground process group of the pane's
        terminal, read from ``/proc`` (Linux, the hub on tmux's host); else the pane's
        first process. An agent restarted in the pane is another owner, so a text typed
        into the old one's prompt is known to be gone."""
        tpgid = _foreground_group(pane_pid)
        return f"pgid {tpgid}" if tpgid else f"pid {pane_pid}"


def _stat(pid: str) -> list[str] | None:
    """``/proc/<pid>/stat`` from the state on (Linux); None when it cannot be read."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    # pid (comm) state ppid pgrp session tty_nr tpgid ...; comm may hold spaces
    return stat.rsplit(")", 1)[1].split()


def _foreground_group(pane_pid: str) -> str | None:
    """The foreground process group of the terminal of the pane's first process."""
    stat = _stat(pane_pid)
    if stat is None or len(stat) < 6 or stat[5] in ("-1", "0"):
        return None
    return stat[5]


def _stopped(pgid: str) -> bool:
    """Whether the leader of process group ``pgid`` is stopped (SIGSTOP, a job-control
    stop, a debugger's trace stop). A group without a live leader counts as running."""
    stat = _stat(pgid)
    return stat is not None and stat[0] in ("T", "t")


def _canonical(tty: str) -> bool | None:
    """Whether the terminal ``tty`` (the pane's ``/dev/pts/N``) is in canonical mode;
    None when it cannot be opened or read (another host's or user's terminal)."""
    if not tty.startswith("/dev/"):
        return None
    try:
        fd = os.open(tty, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return bool(termios.tcgetattr(fd)[3] & termios.ICANON)
    except termios.error:
        return None
    finally:
        os.close(fd)


class _SaveFailures:
    """Says a record that cannot be written once a minute at most, however many saves
    fail: a full disk (or a read-only one) fails the save of every delivery whose Enter
    fails, and a line for each buried the rest of the log under one story. The first
    failure is logged; the ones after it within ``every`` seconds only counted (at
    debug), and the first after that is logged with their count. Failures are told apart
    by the records' directory and the error, so the adapters of all members share one
    line; at most ``keep`` are remembered."""

    def __init__(self, every: float = 60.0, keep: int = 64) -> None:
        self.every, self.keep = every, keep
        self.clock = time.monotonic
        self._said: dict[tuple[str, int | None], tuple[float, int]] = {}

    def failed(self, where: str, record: Path, exc: OSError) -> None:
        now, key = self.clock(), (str(record.parent), exc.errno)
        said = self._said.get(key)
        if said is not None and now - said[0] < self.every:
            self._said[key] = (said[0], said[1] + 1)
            log.debug("%s: cannot write %s (%s)", where, record, exc)
            return
        again = (
            f" (and {said[1]} other failures the same way in the {now - said[0]:.0f} s before)"
            if said is not None and said[1]
            else " (the same failure again is logged once a minute, with its count)"
        )
        log.warning("%s: cannot write %s (%s); a hub restarted before the next attempt would "
                    "type in again what waits unsubmitted; free space there or make it "
                    "writable (BACKCHANNEL_STATE_DIR moves it)%s", where, record, exc,
                    again)  # fmt: skip
        if len(self._said) >= self.keep:
            self._said.clear()
        self._said[key] = (now, 0)


#: one for the process: every tmux adapter's records live in one directory
_SAVE_FAILURES = _SaveFailures()


def _record_dir() -> Path:
    from backchannel.runtimes.seen import state_dir

    return state_dir() / "tmux"


def agent_commands(value: object, member: str) -> tuple[str, ...]:
    """The ``agent_commands`` option checked: a name or a non-empty list of names, no
    shell. Raises :class:`PermanentDeliveryError` naming the fix."""
    names = [value] if isinstance(value, str) else value
    if (
        not isinstance(names, list | tuple)
        or not names
        or not all(isinstance(n, str) and n.strip() for n in names)
    ):
        raise PermanentDeliveryError(
            f"{member}'s tmux delivery 'agent_commands' must be a program name or a list "
            f'of them, got {value!r}; e.g. "agent_commands": ["claude"]'
        )
    shells = sorted(set(names) & SHELLS)
    if shells:
        raise PermanentDeliveryError(
            f"{member}'s tmux delivery 'agent_commands' names the shell {shells[0]!r}: "
            "messages typed into a shell run as commands; name the agent's own program instead"
        )
    return tuple(names)


def socket_args(setting: Mapping[str, Any]) -> list[str]:
    """The tmux options that name a setting's server: ``-S path``, ``-L name`` or none
    (tmux's default socket)."""
    path, name = setting.get("socket_path"), setting.get("socket_name")
    if isinstance(path, str) and path:
        return ["-S", path]
    if isinstance(name, str) and name:
        return ["-L", name]
    return []


def check_pane(setting: Mapping[str, Any]) -> None:
    """Refuse a ``tmux`` delivery setting whose target is not a pane of the tmux server
    it names, as seen from this host: otherwise it is stored and every message to the
    member is dead-lettered at delivery. Where this host cannot tell (tmux not
    installed, no server on that socket: the agent may be started later, or on another
    host), the setting is accepted and a WARNING says it could not be checked.

    Runs one tmux command (blocking, up to :data:`COMMAND_TIMEOUT`): the hub calls its
    checks off its event loop. Raises :class:`~backchannel.errors.InvalidRequest`."""
    target = setting.get("target")
    if setting.get("type") != "tmux" or not isinstance(target, str) or not target:
        return
    if target.startswith("-"):
        raise InvalidRequest(
            f"the tmux delivery target {target!r} begins with '-', which tmux reads as an "
            "option; give the pane as session:window.pane or its id (%N)",
            field="delivery",
        )
    sock = socket_args(setting)
    tmux = " ".join(["tmux", *sock])

    def unchecked(why: str) -> None:
        log.warning(
            "could not check tmux pane %r (%s): %s; the delivery setting is accepted, and "
            "a pane that is not there when a message comes dead-letters it",
            target, tmux, why,
        )  # fmt: skip

    try:
        # capture-pane checks the target; display-message falls back to the current pane
        done = subprocess.run(
            ["tmux", *sock, "capture-pane", "-p", "-t", target, "-S", "0", "-E", "0"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        unchecked("tmux is not installed on the hub's host (no 'tmux' on PATH)")
        return
    except subprocess.TimeoutExpired:
        unchecked(f"tmux did not answer within {COMMAND_TIMEOUT:g} s")
        return
    if done.returncode == 0:
        return
    said = (done.stdout + done.stderr).decode("utf-8", "replace").strip()
    if "can't find" not in said.lower():
        # no server on that socket (not started yet, or the agent runs on another host)
        unchecked(said or f"tmux exited {done.returncode}")
        return
    raise InvalidRequest(
        f"tmux pane {target!r} does not exist on the hub's tmux server ({tmux}: {said}); "
        f"list the panes with `{tmux} list-panes -a -F "
        "'#{session_name}:#{window_index}.#{pane_index} #{pane_id} #{pane_current_command}'` "
        "and set the member's delivery target to one of them (or start the agent's pane "
        "first)",
        field="delivery",
    )
