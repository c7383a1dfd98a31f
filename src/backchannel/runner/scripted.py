"""The ``scripted`` model: deterministic policies, offline. The default for the demo and
the tests, and a way to rehearse a team before paying for a real model.

A policy is a function of a :class:`ScriptContext` (what arrived this turn, the tool
results so far, a scratch ``state`` that lasts across turns) returning a
:class:`ModelReply`: tool calls to make, or the closing text. Name a built-in policy in a
team file (``model: scripted``, ``policy: echo``) or your own as ``module:function``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import re
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backchannel.runner.models import (
    ChatMessage,
    ModelReply,
    ToolCall,
    ToolSpec,
    Usage,
    estimate_tokens,
)


@dataclass
class ScriptContext:
    member: str
    inputs: list[str]  # the texts that started this turn
    results: list[ChatMessage]  # tool results so far this turn
    step: int  # model calls so far this turn
    turn: int  # turns so far in this session
    state: dict[str, Any] = field(default_factory=dict)  # lasts across turns

    @property
    def text(self) -> str:
        return "\n\n".join(self.inputs)

    def result(self, name_or_index: int = -1) -> str:
        return self.results[name_or_index].text if self.results else ""


Policy = Callable[[ScriptContext], ModelReply | Awaitable[ModelReply]]


def call(name: str, **arguments: Any) -> ToolCall:
    # as long as a real model's call id ("call_" and 24 characters), which names the
    # sub-session of a delegation: what shows them shows ids this long
    return ToolCall("call_" + uuid.uuid4().hex[:24], name, arguments)


def say(text: str) -> ModelReply:
    return ModelReply(text=text)


def use(*calls: ToolCall, text: str = "") -> ModelReply:
    return ModelReply(text=text, tool_calls=tuple(calls), stop_reason="tool_use")


class ScriptedModel:
    """A :class:`Model` that plays a policy; one instance per session."""

    def __init__(self, member: str, policy: Policy, *, name: str = "scripted") -> None:
        self.member = member
        self.policy = policy
        self.name = name
        self.state: dict[str, Any] = {}
        self.turns = 0

    async def complete(
        self, system: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        # this turn: the user messages after the last final answer, then tool results
        start = 0
        for i, m in enumerate(messages):
            if m.role == "assistant" and not m.tool_calls:
                start = i + 1
        turn = messages[start:]
        inputs = [m.text for m in turn if m.role == "user"]
        results = [m for m in turn if m.role == "tool"]
        step = sum(1 for m in turn if m.role == "assistant")
        if step == 0:
            self.turns += 1
        ctx = ScriptContext(self.member, inputs, results, step, self.turns, self.state)
        reply = self.policy(ctx)
        if inspect.isawaitable(reply):
            reply = await reply
        assert isinstance(reply, ModelReply)
        used = Usage(
            input_tokens=sum(estimate_tokens(m.text) for m in messages) + estimate_tokens(system),
            output_tokens=estimate_tokens(reply.text)
            + sum(estimate_tokens(json.dumps(c.arguments)) for c in reply.tool_calls),
        )
        return ModelReply(reply.text, reply.tool_calls, used, reply.stop_reason)


# -- built-in policies -----------------------------------------------------------------


def echo(ctx: ScriptContext) -> ModelReply:
    """Answer every input with what it said."""
    return say(f"Got: {ctx.text}" if ctx.text else "")


def always_answer(ctx: ScriptContext) -> ModelReply:
    """An agent that always has something to say (for testing link budgets)."""
    return say(f"{ctx.member} reply {ctx.turn}")


def quiet(ctx: ScriptContext) -> ModelReply:
    """Never says anything."""
    return say("")


def counter(ctx: ScriptContext) -> ModelReply:
    """Counts the workspace's code by language, and answers with the totals."""
    if ctx.step == 0:
        return use(call("count_lines", path="."))
    totals = json.loads(ctx.result())
    lines = [
        f"{lang}: {v['files']} file{'s' if v['files'] != 1 else ''}, {v['lines']} lines ({v['code']} non-blank)"
        for lang, v in totals.items()
    ]
    all_lines = sum(v["lines"] for v in totals.values())
    return say(f"Code by language ({all_lines} lines in all):\n" + "\n".join(lines))


async def slow_todo_finder(ctx: ScriptContext) -> ModelReply:
    """Lists TODO and FIXME comments, taking its time (``state['delay']`` seconds)."""
    if ctx.step == 0:
        await asyncio.sleep(float(ctx.state.get("delay", 0)))
        return use(call("find_todos", path="."))
    found = [line for line in ctx.result().splitlines() if line and not line.startswith("(")]
    if not found:
        return say("No TODO or FIXME comments in the workspace.")
    more = f"\n(and {len(found) - 40} more)" if len(found) > 40 else ""
    return say(f"{len(found)} TODO/FIXME comments:\n" + "\n".join(found[:40]) + more)


def reviewer(ctx: ScriptContext) -> ModelReply:
    """Cross-checks totals it is sent by counting again itself."""
    claimed = re.search(r"\((\d+) lines in all\)", ctx.text)
    if claimed is None:
        return say("")  # nothing to check: silence is valid
    if ctx.step == 0:
        return use(call("count_lines", path="."))
    mine = sum(v["lines"] for v in json.loads(ctx.result()).values())
    theirs = int(claimed.group(1))
    verdict = "the totals match" if mine == theirs else f"mismatch: I count {mine}"
    return say(f"Cross-check: {verdict} ({theirs} lines claimed, {mine} counted).")


def survey_lead(ctx: ScriptContext) -> ModelReply:
    """The demo's lead: delegates a survey, has it cross-checked, and reports."""
    s = ctx.state
    text = ctx.text
    if "Result of delegate" in text or "Late result of delegate" in text:
        for block in re.split(r"\n\n(?=(?:Late )?[Rr]esult of delegate)", text):
            if "(to='counter')" in block and "ERROR" not in block:
                s["counts"] = block.split(":\n", 1)[-1]
            if "(to='finder')" in block:
                s["todos"] = "late" if "ERROR (timeout)" in block else block.split(":\n", 1)[-1]
    if "Cross-check:" in text:
        s["review"] = text[text.index("Cross-check:") :].splitlines()[0]
    if ctx.step == 0 and "survey" not in s:
        s["survey"] = True
        return use(
            call(
                "set_timer",
                intent="anchor",
                minutes=s.get("anchor_minutes", 0.05),
                note="return to the repository survey: collect counts and TODOs, then report",
            ),
            call(
                "delegate",
                to="counter",
                task="Count this repository's code by language.",
                timeout_s=30,
            ),
            call(
                "delegate",
                to="finder",
                task="List every TODO and FIXME in this repository.",
                timeout_s=s.get("finder_timeout", 1.0),
            ),
            text="Splitting the survey between the counter and the finder.",
        )
    if ctx.step == 0 and "counts" in s and "sent_review" not in s:
        s["sent_review"] = True
        first = s["counts"].splitlines()[0]
        return use(
            call(
                "send_message",
                to="reviewer",
                message=f"Please cross-check: {first}",
                summary="cross-check",
            )
        )
    if ctx.step == 1 and s.get("sent_review") and "reviewed_block" not in s:
        s["reviewed_block"] = True
        first = s["counts"].splitlines()[0]
        # the closing text repeats what send_message already delivered: the hub drops it
        return say(
            f'Totals are with the reviewer.\n<message to="reviewer">Please cross-check: {first}</message>'
        )
    if "ANCHOR:" in text and ctx.step == 0:
        return say("")  # back on task; nothing new to say
    if (
        ctx.step == 0
        and {"counts", "review"} <= s.keys()
        and s.get("todos") not in (None, "late")
        and "reported" not in s
    ):
        s["reported"] = True
        # the whole of each answer, not its heading: the report is what the user reads
        report = f"Survey done.\n{s['counts']}\n{s['review']}\n{s['todos']}"
        return use(
            call(
                "send_message",
                to="user",
                message=report,
                summary="survey report",
                close_link=False,
            ),
            text="Reporting to the user.",
        )
    return say("")


BUILTIN: dict[str, Policy] = {
    "echo": echo,
    "always-answer": always_answer,
    "quiet": quiet,
    "counter": counter,
    "slow-todo-finder": slow_todo_finder,
    "reviewer": reviewer,
    "survey-lead": survey_lead,
}


def load_policy(name: str, search: Sequence[Path] = ()) -> Policy:
    """A built-in policy by name, or ``module:function``, the module imported from the
    directories in ``search`` first (a team file's own, the current one), then the
    import path. The installed ``backchannel`` command's import path starts at its own
    bin directory, not the one it runs in, so a ``mypolicies.py`` beside the team file
    is found only through ``search``."""
    if name in BUILTIN:
        return BUILTIN[name]
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(
            f"unknown scripted policy {name!r}; use one of {', '.join(sorted(BUILTIN))} "
            "or module:function"
        )
    added = [str(d) for d in search if str(d) not in sys.path]
    sys.path[:0] = added
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        where = f" (looked in {', '.join(map(str, search))} and the import path)" if search else ""
        raise ValueError(f"cannot load scripted policy {name!r}: {exc}{where}") from exc
    except Exception as exc:  # the module itself raised while it was imported
        raise ValueError(
            f"cannot load scripted policy {name!r}: importing {module} raised {exc!r}"
        ) from exc
    finally:
        for d in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(d)
    if not callable(fn):
        raise ValueError(f"scripted policy {name!r} is not callable")
    policy: Policy = fn
    return policy
