"""One line per thing worth seeing while a hosted team works: each delegation, each link
crossing and its budget, a timer firing, a late answer, a dropped duplicate.

Pure functions of what the runner already holds (a delivered message, a tool call, the
hub's answer to ``agent_stop``); the runner hands each line to its ``story`` callback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.client import Received


def _short(text: str, width: int = 70) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def on_input(session: str, m: Received) -> list[str]:
    """What a delivered message means for the story (nothing for plain traffic)."""
    if m.kind == "timer":
        return [f"{session}: timer fired, {_short(m.text)}"]
    if m.kind == "tool_result":
        if m.meta.get("late"):
            who = ", ".join(r.get("to", "?") for r in m.meta.get("results", [])) or m.sender
            return [f"{session}: late answer from {who} arrives after its deadline"]
        parts = []
        for r in m.meta.get("results", []):
            if "result" in r:
                parts.append(f"{r.get('to')} answered")
            else:
                reason = r.get("reason", "failed")
                parts.append(f"{r.get('to')} {'timed out' if reason == 'timeout' else reason}")
        if parts:
            return [f"{session}: delegation results arrive: {'; '.join(parts)}"]
    return []


def on_tool_call(member: str, name: str, args: Mapping[str, Any]) -> list[str]:
    """A tool call that changes the team's state."""
    if name == "delegate":
        deadline = args.get("timeout_s")
        limit = f" (deadline {float(deadline):g} s)" if deadline is not None else ""
        return [
            f"{member} delegates to {args.get('to')}: {_short(str(args.get('task', '')))}{limit}"
        ]
    if name == "set_timer":
        seconds = float(args.get("minutes", 0)) * 60
        return [
            f"{member} sets an {args.get('intent')} timer due in {seconds:g} s: "
            f"{_short(str(args.get('note', '')), 50)}"
        ]
    if name == "send_message":
        return [f"{member} -> {args.get('to')}: {_short(str(args.get('message', '')), 50)}"]
    return []


def on_stop(member: str, answer: Mapping[str, Any]) -> list[str]:
    """What the hub did with a turn's end: link crossings and dropped repeats."""
    lines = []
    for c in answer.get("crossed", []):
        used, budget = c.get("turns_used", 0), c.get("budget", 0)
        spent = "; budget spent, link closed" if budget and used >= budget else ""
        lines.append(
            f"link crossing: {member}'s output -> {c.get('to')} (turn {used} of {budget}){spent}"
        )
    for to in answer.get("duplicates_dropped", []):
        lines.append(f"hub drops {member}'s closing message to {to}: it repeats what the turn sent")
    return lines
