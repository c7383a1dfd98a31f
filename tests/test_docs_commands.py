"""The commands the README and docs/ show a newcomer are the real ones: every
``backchannel SUB [SUBSUB] ... --flag`` names a command and an option the CLI has, and
every ``curl`` that posts a body says it is JSON (the hub refuses a form body)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

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


def _attached_files(runtime: str, member: str, tmp: Path) -> dict[str, Any]:
    """What ``attach`` writes for ``demo/member`` into an empty project, parsed."""
    from backchannel.runtimes.attach import AttachOptions, plan

    opts = AttachOptions("demo", member, tmp, "http://127.0.0.1:8765")
    files: dict[str, Any] = {}
    for change in plan(runtime, opts):
        parse = tomllib.loads if change.path.suffix == ".toml" else json.loads
        files[change.path.name] = parse(change.after)
    return files


@pytest.mark.parametrize(
    ("page", "runtime", "member"),
    [
        ("claude-code.md", "claude-code", "lead"),
        ("codex.md", "codex", "worker"),
        ("gemini.md", "gemini", "worker"),
    ],
)
def test_the_files_a_runtime_page_shows_are_the_ones_attach_writes(
    page: str, runtime: str, member: str, tmp_path: Path
) -> None:
    """Step 2 of each runtime page shows the files ``attach`` writes: each shown file has
    the keys the written one has (a key attach adds that the page leaves out, such as
    Claude Code's pre-approved tool permission, is news to a reader comparing the two),
    the same backchannel server entry and hook handler, and the same hook events."""
    text = (ROOT / "docs" / "runtimes" / page).read_text()
    step = text[text.index("## 2. Attach") : text.index("## 3.")]
    files = _attached_files(runtime, member, tmp_path)
    shown_toml = re.search(r"```toml\n(.*?)```", step, re.S)
    if shown_toml is not None:  # the first one: the stdio entry, not the --http variant
        assert tomllib.loads(shown_toml.group(1)) == files["config.toml"]
    wrong = []
    for block in re.findall(r"```json\n(.*?)```", step, re.S):
        shown = json.loads(block)
        first = next(iter(shown))
        name = next(n for n, f in files.items() if next(iter(f)) == first)
        real = files[name]
        if set(shown) != set(real):
            wrong.append(f"{name}: the page shows {sorted(shown)}, attach writes {sorted(real)}")
        for key in ("mcpServers", "permissions", "enabledMcpjsonServers", "ui"):
            if key in shown and shown[key] != real.get(key):
                wrong.append(f"{name}: {key} {shown[key]} != {real.get(key)}")
        if "hooks" in shown:
            if set(shown["hooks"]) != set(real["hooks"]):
                wrong.append(f"{name}: hook events {sorted(shown['hooks'])} != {sorted(real['hooks'])}")  # fmt: skip
            if shown["hooks"]["SessionStart"] != real["hooks"]["SessionStart"]:
                wrong.append(f"{name}: SessionStart {shown['hooks']['SessionStart']}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_serve_synopsis_names_every_option_serve_has() -> None:
    """The README's ``backchannel serve [...]`` block is where a newcomer looks for how
    to run the hub: every option it shows is real (continuation lines too) and every
    option ``serve`` takes is there (it lacked ``--home``)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(backchannel serve \[.*?)```", text, re.S)
    assert block is not None, "no serve synopsis in the README"
    shown = set(re.findall(r"\[(--[a-z][a-z-]*)", block.group(1)))
    serve = getattr(get_command(app), "commands", {})["serve"]
    real = {o for p in serve.params for o in [*p.opts, *getattr(p, "secondary_opts", ())]}
    real = {o for o in real if o.startswith("--")} - {"--help", "--dispatch"}
    assert shown == real, (
        f"README shows {sorted(shown - real)} serve lacks; lacks {sorted(real - shown)}"
    )
