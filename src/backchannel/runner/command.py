"""``backchannel run``: set a team up on a hub, host it with the runner, show progress,
and print the team's report."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table

from backchannel.client import Client
from backchannel.config import open_store
from backchannel.errors import AlreadyExists, InvalidRequest
from backchannel.interfaces.terminal import markup_safe, printable
from backchannel.models import Delegation, Link
from backchannel.runner.host import Runner
from backchannel.runner.teamfile import TeamFile


def print_line(console: Console, line: str, *, style: str = "", whole: bool = False) -> None:
    """One line of the run's story or notes, as written: its words may come from a
    model or an error (``[From user]``, ``[a-z]``, ``[/b]``), so nothing in it is read
    as rich markup (which would drop it, or fail the run), and control characters are
    shown, not sent to the terminal. ``whole``: never wrapped (no terminal)."""
    console.print(printable(line), style=style, markup=False, soft_wrap=whole)


@dataclass
class RunResult:
    team: str
    ended_because: str
    sessions: list[dict[str, Any]] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    delegations: list[Delegation] = field(default_factory=list)
    duplicates_dropped: int = 0
    to_user: list[dict[str, Any]] = field(default_factory=list)
    cost: float = 0.0
    tokens: int = 0
    #: hosted member -> messages still waiting for it on the hub when the run ended:
    #: none of its models saw them (given back by a failed turn, or never received)
    waiting: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The sessions a failure stopped (the model's, the hub's, a crash), rather than
        their budget or the run's end: a run with any did not do what it was asked."""
        return [s for s in self.sessions if s.get("failure")]


async def setup_team(admin: Client, team: TeamFile, name: str) -> dict[str, str]:
    """Create the team and its members; returns member -> token (``user`` included)."""
    try:
        created = await admin.create_team(name, team.settings())
    except AlreadyExists:
        raise InvalidRequest(
            f"team {name!r} already exists on this hub; run with --team NEW_NAME "
            "(each run sets up its team afresh)"
        ) from None
    tokens = {"user": created.user_token}
    for m in team.members:
        settings: dict[str, Any] = {}
        if m.checkpoint is not None:
            settings["checkpoint"] = m.checkpoint.model_dump(exclude_none=True)
        added = await admin.add_member(name, m.name, m.kind.value, m.delivery, settings=settings)
        tokens[m.name] = added.token
    return tokens


def waiting_line(member: str, n: int, team: str) -> str:
    """What a run says of ``n`` messages left waiting for ``member``, unseen by its
    model: where they are, and the way to run again (not in the same team)."""
    return (
        f"{n} message{'s' if n != 1 else ''} for {member} never reached its model: "
        f"{'they wait' if n != 1 else 'it waits'} on the hub in team {team}, which this "
        "run made; to have it done, run again with --team NEW_NAME (each run sets its "
        "team up afresh), once what stopped this one is fixed"
    )


async def tell_waiting(hosted: dict[str, Client], team: str, console: Console) -> None:
    """On Ctrl-C, with no report to come: say what went back to the hub unseen."""
    for member, client in hosted.items():
        with contextlib.suppress(Exception):
            if n := await client.pending():
                print_line(console, waiting_line(member, n, team), whole=not console.is_terminal)


def progress(runner: Runner, extra: dict[str, Any]) -> Group:
    table = Table(title=f"team {runner.team.team}", expand=False)
    for col in ("session", "state", "turns", "tools", "tokens", "cost"):
        table.add_column(
            col, justify="right" if col in ("turns", "tools", "tokens", "cost") else "left"
        )
    for lp in runner.loops.values():
        s = lp.stats
        state = s.stopped or ("working" if s.working else "idle")
        style = (
            "bold green"
            if s.working
            else ("red" if s.stopped and s.stopped != "interrupted" else "")
        )
        table.add_row(
            lp.session,
            f"[{style}]{state}[/]" if style else state,
            str(s.turns),
            str(s.tool_calls),
            str(s.usage.input_tokens + s.usage.output_tokens),
            f"${s.cost:.4f}",
        )
    t = runner.totals()
    line = (
        f"messages {runner.delivered} · links open {extra.get('links', 0)} · "
        f"timers pending {extra.get('timers', 0)} · delegations pending {extra.get('delegations', 0)}"
        f"\ncost ${t['cost']:.4f}"
    )
    return Group(table, line)


#: Wider than any table the runner shows: the room :class:`Unbounded` measures in.
_ROOM = 100_000


class Unbounded:
    """``renderable`` laid out at its own width, whatever the console's. Written to a
    file or a pipe there is no terminal to fit, only the 80 columns rich assumes, into
    which a table would cut its longest cells short (a delegation's sub-session id);
    printed whole, each id stays on its row, uncut."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = Measurement.get(console, options.update(width=_ROOM), self.renderable).maximum
        yield from console.render(self.renderable, options.update(width=width))


async def run_team(
    team: TeamFile,
    task: str,
    *,
    url: str,
    admin_token: str | None,
    workspace: Path,
    team_name: str | None = None,
    time_limit: float = 600.0,
    quiet_seconds: float = 2.0,
    console: Console | None = None,
) -> RunResult:
    """Set ``team`` up on the hub at ``url`` (HTTP, or a store URL opened in-process), host
    its llm members on ``task`` until it is quiet, and gather the report."""
    console = console or Console(stderr=True)
    name = team_name or team.team
    hub = None
    if url.startswith(("http://", "https://")):
        admin = Client(url, admin_token)
    else:
        from backchannel.hub import Hub

        hub = Hub(open_store(url))
        admin = Client.local(hub)
    await admin.start()
    clients: dict[str, Client] = {}
    try:
        tokens = await setup_team(admin, team, name)
        for member, token in tokens.items():
            c = Client(url, token) if hub is None else Client.local(hub, token)
            await c.start()
            clients[member] = c
        user = clients["user"]
        hosted = {m.name: clients[m.name] for m in team.members if m.name in clients}
        counts: dict[str, Any] = {}
        # no terminal: no width to fit, only rich's 80 columns, which would split a long
        # story line (a session id, a task) in two; each is printed whole, as the table is
        whole = not console.is_terminal
        runner = Runner(
            team,
            hosted,
            workspace=workspace,
            timeout=time_limit,
            quiet_seconds=quiet_seconds,
            note=lambda line: print_line(console, line, style="red", whole=whole),
            story=lambda line: print_line(console, line, whole=whole),
        )

        async def refresh(live: Live) -> None:
            any_c = next(iter(hosted.values()))
            while True:
                with contextlib.suppress(Exception):
                    counts["links"] = len(await any_c.links(open_only=True))
                    counts["timers"] = len(await any_c.timers())
                    # the team's human sees every one; the pending ones alone are read
                    counts["delegations"] = len(await user.delegations(pending_only=True))
                live.update(progress(runner, counts))
                await asyncio.sleep(0.5)

        # no terminal: the live display shows nothing, and the last table is printed
        # whole once the run ends (a terminal keeps the last one the live display drew)
        terminal = console.is_terminal
        with Live(
            progress(runner, counts),
            console=console,
            refresh_per_second=4,
            transient=not terminal,
        ) as live:
            ticker = asyncio.create_task(refresh(live))
            try:
                ended = await runner.run(task, user)
            except asyncio.CancelledError:  # Ctrl-C: the turns in progress gave back
                await tell_waiting(hosted, name, console)  # what their models had not seen
                raise
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
                live.update(progress(runner, counts))
        if not terminal:
            console.print(Unbounded(progress(runner, counts)), crop=False)
        return await report(runner, hosted, user, name, ended)
    finally:
        for c in clients.values():
            with contextlib.suppress(Exception):
                await c.close()
        await admin.close()
        if hub is not None:
            await hub.close()


#: How many messages to the user the report reads from the hub at a time.
REPORT_PAGE = 100


async def report(
    runner: Runner, hosted: dict[str, Client], user: Client, name: str, ended: str
) -> RunResult:
    any_c = next(iter(hosted.values()))
    result = RunResult(name, ended)
    result.links = await any_c.links()
    result.delegations = await user.delegations()  # the team's human sees every one
    for lp in runner.loops.values():
        data = await any_c.session_data(lp.session)
        result.duplicates_dropped += sum(e.kind == "duplicate_dropped" for e in data.events)
        s = lp.stats
        result.sessions.append(
            {
                "session": lp.session,
                "member": s.member,
                "turns": s.turns,
                "tool_calls": s.tool_calls,
                "tokens": s.usage.input_tokens + s.usage.output_tokens,
                "cost": round(s.cost, 6),
                "stopped": s.stopped,
                "failure": s.failure,
                "down": lp.down,
                "last_output": s.last_output,
            }
        )
    for member, client in hosted.items():
        with contextlib.suppress(Exception):
            if n := await client.pending():
                result.waiting[member] = n
    # every message to the user, a bounded page at a time: the report is where they are
    # read, so a page left unread would be shown to no one
    while True:
        got = await user.receive(limit=REPORT_PAGE)
        if got:
            await user.ack([m.message_id for m in got])
        result.to_user += [{"from": m.sender, "kind": m.kind, "text": m.text} for m in got]
        if len(got) < REPORT_PAGE:
            break
    t = runner.totals()
    result.cost = t["cost"]
    result.tokens = t["usage"].input_tokens + t["usage"].output_tokens
    return result


def print_report(result: RunResult, console: Console) -> None:
    console.print(
        f"\n[bold]Report for team {result.team}[/bold] — ended because {result.ended_because}"
    )
    t = Table(title="sessions")
    for col in ("session", "turns", "tools", "tokens", "cost"):
        t.add_column(col)
    outputs = []
    for s in result.sessions:
        t.add_row(
            markup_safe(s["session"]),
            str(s["turns"]),
            str(s["tool_calls"]),
            str(s["tokens"]),
            f"${s['cost']:.4f}",
        )
        last = (s["last_output"] or "").strip().splitlines()
        if last:
            outputs.append(f"  {printable(s['session'])}: {printable(last[0][:100])}")
    console.print(t)
    if outputs:
        console.print("last output of each session:", *outputs, sep="\n", markup=False)
    if result.links:
        lt = Table(title="links")
        for col in ("peers", "turns used", "state", "why closed"):
            lt.add_column(col)
        for link in result.links:
            lt.add_row(
                markup_safe(f"{link['initiator']} <-> {link['responder']}"),
                f"{link['turns_used']}/{link['budget']}",
                link["state"],
                markup_safe(link["close_reason"] or ""),
            )
        console.print(lt)
    if result.delegations:
        dt = Table(title="delegations")
        for col in ("from", "to", "task", "state"):
            dt.add_column(col)
        for d in result.delegations:
            dt.add_row(
                markup_safe(d["caller"]),
                markup_safe(d["callee"]),
                markup_safe(d["task"][:50]),
                d["state"],
            )
        console.print(dt)
    console.print(f"duplicate closing messages suppressed: {result.duplicates_dropped}")
    for s in result.failed:
        console.print(f"{s['session']} stopped: {s['stopped']}: {s['failure']}", markup=False)
        if s.get("down"):
            console.print(
                f"what was sent to {s['member']} went back to its senders as dead letters; "
                "to have it done, run again with --team NEW_NAME (each run sets its team "
                "up afresh), once what stopped it is fixed",
                markup=False,
            )
    for member, n in result.waiting.items():
        console.print(waiting_line(member, n, result.team), markup=False)
    for m in result.to_user:
        console.print(
            f"[bold]to user[/bold] from {markup_safe(m['from'])}: "
            f"{markup_safe(m['text'], multiline=True)}"
        )
    console.print(f"tokens {result.tokens}, cost ${result.cost:.4f}")
