"""The commands the README and docs/ show a newcomer are the real ones: every
``backchannel SUB [SUBSUB] ... --flag`` names a command and an option the CLI has, and
every ``curl`` that posts a body says it is JSON (the hub refuses a form body)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.main import get_command

from backchannel.interfaces.cli import app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs").glob("*/*.md")),
]
PAGES = [p for p in PAGES if p.name != "decisions.md"]  # a record, not instructions


def _commands(text: str) -> list[tuple[int, list[str]]]:
    """Each ``backchannel ...`` run in code (a span that starts with it, or a block's line,
    ``$(...)``, ``&&`` or ``;``), as words, with its line; not a quoted message."""
    found = []
    code = re.finditer(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", text, re.S)
    for m in code:
        body = m.group(1) if m.group(1) is not None else m.group(2)
        start = m.start(1) if m.group(1) is not None else m.start(2)
        for c in re.finditer(
            r"(?:^\s*|\$\(|&& |; )backchannel((?: +[^\s`'\"|;&)#]+)+)", body, re.M
        ):
            line = text[: start + c.start()].count("\n") + 1
            found.append((line, c.group(1).split()))
    return found


def _where(page: Path, line: int) -> str:
    return f"{page.relative_to(ROOT)}:{line}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_backchannel_command_and_flag_in_the_docs_is_real(page: Path) -> None:
    root = get_command(app)
    groups = getattr(root, "commands", {})
    wrong = []
    for line, words in _commands(page.read_text()):
        first = words[0]
        if not re.fullmatch(r"[a-z][a-z-]*", first) or first not in groups:
            if re.fullmatch(r"[a-z][a-z-]*", first):
                wrong.append(f"{_where(page, line)}: no command `backchannel {first}`")
            continue
        cmd, rest, named = groups[first], words[1:], first
        sub = getattr(cmd, "commands", None)
        if sub is not None:
            if not rest or rest[0] not in sub:
                if rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
                    wrong.append(
                        f"{_where(page, line)}: no command `backchannel {first} {rest[0]}`"
                    )
                continue
            cmd, rest, named = sub[rest[0]], rest[1:], f"{first} {rest[0]}"
        options = {"--help", "-h"}
        for p in cmd.params:
            options.update(p.opts)
            options.update(getattr(p, "secondary_opts", ()))
        for w in rest:
            flag = w.split("=")[0].rstrip(",.:")
            if re.fullmatch(r"--?[a-z][a-z-]*", flag) and flag not in options:
                wrong.append(f"{_where(page, line)}: `backchannel {named}` has no {flag}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_wrong_flag_and_a_wrong_command() -> None:
    text = "```sh\nbackchannel member add t w --knid codex\nbackchannel teams list\n```\n"
    assert [w for _, w in _commands(text)] == [
        ["member", "add", "t", "w", "--knid", "codex"],
        ["teams", "list"],
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_curl_that_posts_json_says_so(page: Path) -> None:
    text = page.read_text()
    wrong = []
    for m in re.finditer(r"curl (?:[^\n]*\\\n)*[^\n]*", text):
        call = m.group(0)
        if re.search(r"(?:^|\s)(?:-d|--data)\s", call) and "application/json" not in call:
            line = text[: m.start()].count("\n") + 1
            wrong.append(
                f"{_where(page, line)}: posts a body without Content-Type: application/json"
            )
    assert not wrong, "\n".join(wrong)


def _attach_dirs(text: str) -> list[str]:
    """Where a page's ``attach`` commands for one member write, as ``line: member dir``;
    a command without ``--dir`` writes into the directory the reader happens to be in."""
    found = []
    for line, words in _commands(text):
        if words[:1] != ["attach"] or "--member" not in words:
            continue
        member = words[words.index("--member") + 1]
        where = words[words.index("--dir") + 1] if "--dir" in words else "(the current directory)"
        found.append(f"{line}: {member} {where}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_attach_commands_for_one_member_write_into_one_project(page: Path) -> None:
    """A page that attached ``worker`` with ``--dir ~/src/app-worker`` and then shows the
    one-time hook grant without ``--dir`` has the reader, still in the hub's terminal,
    attach the hub's directory instead."""
    by_member: dict[str, set[str]] = {}
    for entry in _attach_dirs(page.read_text()):
        _, member, where = entry.split(" ", 2)
        by_member.setdefault(member, set()).add(where)
    wrong = {m: sorted(d) for m, d in by_member.items() if len(d) > 1}
    assert not wrong, f"{page.relative_to(ROOT)}: {wrong}"


def test_the_attach_checker_sees_a_grant_without_its_project() -> None:
    text = (
        "```sh\nbackchannel attach codex --team t --member w --dir ~/src/w\n```\n"
        "```sh\nbackchannel attach codex --team t --member w --trust-hooks\n```\n"
    )
    assert _attach_dirs(text) == ["2: w ~/src/w", "5: w (the current directory)"]
