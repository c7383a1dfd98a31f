"""The built-in runner: hosts a team file's ``llm`` members on a hub.

For each session of each hosted member (its main session, and one sub-session per
delegation it answers) a turn loop waits for input, reports ``turn_start``, calls the
model with the hub tools, runs the tool calls through the hub, reports every event, and
ends the turn with ``agent_stop`` (whose closing text the hub routes). The model is sent
the session's conversation, bounded by the member's ``context_chars`` (oldest whole turns
dropped first), so a long-lived session never outgrows its model's context. The run ends when
the team is quiet, when ``timeout`` passes, or on Ctrl-C. Inputs of a turn interrupted
before the model answered in it are given back to the hub, so nothing is lost; once the
model has answered, they reached it and are acked, so none reaches a model twice. Their
ids are written down locally until the hub has acked them
(:mod:`backchannel.runner.record`): a runner that gave up on an unreachable hub, or was
killed, before it could ack them has the next runner of the member ack them before it
receives anything, so they are not handed to a model again when their lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from backchannel.client import Client, Received
from backchannel.core.ids import new_request_id
from backchannel.core.messages import MESSAGE_ID_RE
from backchannel.errors import BackchannelError, PeerError, StoreError
from backchannel.models import GIVE_UP_REASON
from backchannel.runner import story
from backchannel.runner.models import (
    ChatMessage,
    Model,
    ModelError,
    ModelReply,
    Usage,
    estimate_tokens,
    price_for,
)
from backchannel.runner.record import SeenRecord, record_path
from backchannel.runner.scripted import ScriptedModel, load_policy
from backchannel.runner.teamfile import MemberSpec, TeamFile
from backchannel.runner.tools import (
    AT_THE_LIMIT,
    CUT_SHORT,
    DEFAULT_TOOLS,
    GO_ON_TIMES,
    TOOLS,
    ToolContext,
    cut_mark,
    cut_short,
    go_on,
    run_tool,
    unparsed_arguments,
)
from backchannel.runtimes.common import format_message
from backchannel.types import MemberKind

log = logging.getLogger("backchannel.runner")

LEASE = 900.0  # a turn may run long; its inputs stay leased meanwhile
#: How long a turn waits for a model API that fails in a way that passes (rate limited,
#: overloaded, a server error, no connection), trying again, before it gives up. The
#: runner makes every try: the providers turn their SDKs' own retries off.
MODEL_PATIENCE = 300.0
#: The first pause between two tries of such an API (it doubles, up to a minute).
MODEL_PAUSE = 1.0
#: How long a model call goes without an answer before the runner says so (and again
#: each time as long again passes).
MODEL_SLOW = 120.0
#: How long the runner keeps calling a hub it cannot reach (restarting, say) before it
#: gives up on what it was doing.
HUB_PATIENCE = 300.0

_T = TypeVar("_T")


def hub_away(exc: BaseException, *, repeatable: bool) -> bool:
    """Is ``exc`` the hub being away for a while, so the call may be made again? A
    refused connection never reached the hub, and a 503 is the hub saying its store
    could not do it now: neither did anything. With ``repeatable`` (reads, acks and
    releases, and calls made again under the id they carry: a send's ``message_id``, an
    event's or a timer's ``request_id``, a delegation's ``tool_use_id``, a session's id)
    any failure to reach it counts; any other call that changes something is not made
    again after a failure that may have reached the hub (it could do it twice)."""
    if isinstance(exc, StoreError):
        return True
    if not isinstance(exc, PeerError) or isinstance(exc, ModelError):
        return False
    cause = exc.__cause__
    if isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout)):
        return True
    return repeatable and isinstance(cause, httpx.TransportError)


def make_model(spec: MemberSpec) -> Model:
    if spec.model == "scripted":
        policy = spec.loaded_policy or load_policy(spec.policy or "echo")
        model = ScriptedModel(spec.name, policy, name=f"scripted:{spec.policy}")
        model.state.update(spec.options)
        return model
    from backchannel.runner.providers import AnthropicModel, OpenAIModel

    assert spec.model_name is not None
    if spec.model == "anthropic":
        return AnthropicModel(spec.model_name, base_url=spec.base_url, api_key_env=spec.api_key_env)
    return OpenAIModel(spec.model_name, base_url=spec.base_url, api_key_env=spec.api_key_env)


def format_input(m: Received) -> str:
    """How a delivered message reads to the model: framed as every adapter frames it."""
    return format_message(m.sender, m.kind, m.text)


def _chars(m: ChatMessage) -> int:
    return len(m.text) + sum(len(c.name) + len(json.dumps(dict(c.arguments))) for c in m.tool_calls)


def bounded(history: list[ChatMessage], limit: int) -> list[ChatMessage]:
    """``history`` without its oldest whole turns, as many as it takes to hold at most
    ``limit`` characters; the turn in progress (from the last ``user`` message that is
    a turn's input, not the runner's "go on" within it) always stays. Whole turns, so a
    tool result never loses its call, nor a carried-on answer its first part."""
    starts = [i for i, m in enumerate(history) if m.role == "user" and not m.carries_on]
    if not starts:
        return history
    size = sum(_chars(m) for m in history)
    first = 0
    for start in starts[1:]:
        if size <= limit:
            break
        size -= sum(_chars(m) for m in history[first:start])
        first = start
    return history[first:] if first else history


@dataclass
class SessionStats:
    member: str
    session: str
    turns: int = 0
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0
    working: bool = False
    stopped: str | None = None
    #: what made a session stop that did not mean to (the model's or the hub's error)
    failure: str = ""
    last_output: str = ""


class SessionLoop:
    """One session's turn loop."""

    def __init__(self, runner: Runner, spec: MemberSpec, client: Client, session: str) -> None:
        self.runner = runner
        self.spec = spec
        self.client = client
        self.session = session
        self.model = make_model(spec)
        self.history: list[ChatMessage] = []
        self.stats = SessionStats(spec.name, session)
        self.allowed = frozenset(spec.tools or DEFAULT_TOOLS)
        # what the tools' definitions add to every request, for estimated counts
        self.tool_chars = sum(
            len(t.name) + len(t.description) + len(json.dumps(dict(t.parameters)))
            for t in (TOOLS[name][0] for name in self.allowed)
        )
        self.price = price_for(self.model.name, spec.price)
        # inputs the model answered in a turn whose ack the hub has not confirmed
        self.unacked: list[str] = []
        # the hub keys of this session's tool calls (a delegation's tool_use_id)
        self.call_keys: set[str] = set()
        # why the session's model failed for good: its inputs are given up, not back
        self.down = ""
        # a reply's token counts were estimated (its API gave none)
        self.estimated = False

    async def run(self) -> None:
        while self.stats.stopped is None:
            got = await self.runner.patient(
                lambda: self.client.receive(
                    limit=20,
                    wait=1.0,
                    session=self.session,
                    lease=LEASE,
                    pinned_only=not self.session.endswith("-main"),
                ),
                repeatable=True,
            )
            if got:
                await self.turn(got)
        while self.down:  # its model failed for good: no message waits for it unheard
            got = await self.runner.patient(
                lambda: self.client.receive(limit=20, wait=1.0, lease=LEASE),
                repeatable=True,
            )
            if got:
                await self._give_up([m.message_id for m in got])

    async def _end(self) -> None:
        """End the session of a member that stopped for good (``down``): its links close
        and both sides are told, so a linked peer does not spend the link's turns on an
        agent that cannot answer; what waits for it goes to the member, given up."""
        await self.runner.patient(
            lambda: self.client.terminate_session(self.session, self.down), repeatable=True
        )

    async def _give_up(self, ids: list[str]) -> None:
        """Give up for good on inputs the session's model will never read (it failed for
        good): each is a dead letter naming why, and its sender is told."""
        why = self.down  # cut to what the hub keeps: a long API error is refused whole
        if len(why) > GIVE_UP_REASON:
            why = why[: GIVE_UP_REASON - 1] + "…"
        await self.runner.patient(lambda: self.client.give_up(ids, why), repeatable=True)
        self.runner.console_note(
            f"{self.spec.name}: {len(ids)} message(s) given up, their senders told: {self.down}"
        )

    async def _complete(self) -> ModelReply:
        """One model call, tried again while the API fails in a way that passes (the
        error says ``retryable``: rate limits, overload, server errors), for up to
        the runner's ``model_patience``: an API that is overloaded for a minute does not
        stop the agent, and the turn's inputs stay leased to it meanwhile. A wait the API
        asked for (``retry_after``) is honoured: the next call comes no sooner, and a
        wait past the patience gives up at once rather than call an API that said no,
        with a note that names the wait. Every try is the runner's, each one named in a
        note: the SDKs make none of their own (:mod:`.providers`). Each wait is drawn from
        the upper half of the doubling pause (and up to a fifth past a wait the API asked
        for): the agents of one run share a key, and a limit that refuses them together
        would otherwise see them all call again in the same instant, every time."""
        tools = [TOOLS[t][0] for t in sorted(self.allowed)]
        deadline: float | None = None
        pause = self.runner.model_pause
        while True:
            try:
                return await self._one_model_call(tools, until=deadline)
            except ModelError as exc:
                if not exc.details.get("retryable"):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.runner.model_patience
                asked = float(exc.details.get("retry_after") or 0.0)
                wait = max(random.uniform(pause / 2, pause), asked * random.uniform(1.0, 1.2))
                if asked <= deadline - now < wait:  # the draw alone must not end the patience
                    wait = deadline - now
                if now + wait > deadline:
                    if asked > pause:
                        self.runner.console_note(
                            f"{self.spec.name}: the model API asks to wait {asked:.0f} s, "
                            f"past the runner's patience ({self.runner.model_patience:.0f} s): "
                            "giving up on this turn now"
                        )
                    raise
                self.runner.console_note(
                    f"{self.spec.name}: {exc.message}; trying again in {wait:.0f} s"
                )
                await asyncio.sleep(wait)
                pause = min(pause * 2, 60.0)

    async def _one_model_call(self, tools: list[Any], *, until: float | None = None) -> ModelReply:
        """One call of the model, with a note each ``model_slow`` seconds it has not
        answered: an API that took the request and never answers keeps the SDK waiting
        ten minutes a try, and the person running the team would see nothing at all.
        ``until``: the end of the patience of a step that failed before (monotonic): a
        try made again ends with it, as a failure that passes (the turn's input goes
        back), so a try that never answers does not hold the turn past the patience."""
        call = asyncio.ensure_future(self.model.complete(self.spec.system, self.history, tools))
        slow, waited = self.runner.model_slow, 0.0
        try:
            while True:
                left = None if until is None else until - time.monotonic()
                done, _ = await asyncio.wait(
                    {call}, timeout=slow if left is None else max(0.0, min(slow, left))
                )
                if done:
                    return call.result()
                if left is not None and left <= slow:
                    raise ModelError(
                        "the model API did not answer within the runner's patience "
                        f"({self.runner.model_patience:g} s) after a failure",
                        retryable=True,
                    )
                waited += slow
                self.runner.console_note(
                    f"{self.spec.name}: the model has not answered in {waited:g} s; still "
                    "waiting (its API may be stuck: the run ends at --timeout, Ctrl-C stops "
                    "it now, and the turn's input goes back to the hub)"
                )
        finally:
            if not call.done():  # interrupted: the call goes with the turn
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call

    async def _report(self, kind: str, text: str = "", data: dict[str, Any] | None = None) -> Any:
        """Report a turn's event, waiting out a hub that is away (restarting), under one
        ``request_id`` chosen here: made again after its answer was lost, the hub
        answers the first answer, so a turn is not started twice nor its closing text
        routed twice."""
        rid = new_request_id()
        return await self.runner.patient(
            lambda: self.client.report_event(self.session, kind, text, data, request_id=rid),
            repeatable=True,
        )

    async def turn(self, inputs: list[Received]) -> None:
        stats, c, sid = self.stats, self.client, self.session
        stats.working = True
        self.runner.changed()
        ids = [m.message_id for m in inputs]
        self.runner.delivered += len(inputs)
        for m in inputs:
            self.runner.tell(story.on_input(sid, m))
        text = "\n\n".join(format_input(m) for m in inputs)
        record = await self.runner.record(self.spec.name)
        await self._report("turn_start", text)
        stats.turns += 1
        self.history.append(ChatMessage("user", text))
        final = ""
        answered = False  # the model answered once this turn: its inputs reached it
        pieces: list[str] = []  # text cut at the output limit, the model asked to go on
        try:
            for step in range(self.spec.max_steps):
                self.history = bounded(self.history, self.spec.context_chars)
                reply = await self._complete()
                if not answered:  # from here on the inputs must never reach a model again
                    answered = True
                    record.add(ids)
                    self.unacked = ids
                usage = self._counted(reply)
                stats.usage += usage
                stats.cost += self.price.cost(usage)
                self.history.append(ChatMessage("assistant", reply.text, reply.tool_calls))
                if not reply.tool_calls:
                    if self._goes_on(reply, len(pieces), step):
                        pieces.append(reply.text)
                        self.history.append(
                            ChatMessage("user", go_on(reply.stop_reason), carries_on=True)
                        )
                        continue
                    final = self._closing(pieces, reply)
                    break
                thought, pieces = "".join(pieces) + reply.text, []
                if thought:
                    await self._report("thought", thought)
                for call in reply.tool_calls:
                    self.runner.tell(story.on_tool_call(self.spec.name, call.name, call.arguments))
                    await self._report(
                        "tool_call",
                        f"{call.name}({call.arguments})",
                        {"tool": call.name, "id": call.call_id},
                    )
                    ctx = ToolContext(
                        c,
                        self.spec.name,
                        sid,
                        self.runner.workspace,
                        self._call_key(call.call_id),
                        again=self._again,
                    )
                    if reply.stop_reason in CUT_SHORT:  # the call may be missing its end
                        result, is_error = cut_short(call.name, reply.stop_reason), True
                    elif call.unparsed is not None:
                        result, is_error = unparsed_arguments(call.name, call.unparsed), True
                    else:
                        result, is_error = await run_tool(
                            ctx, call.name, call.arguments, self.allowed
                        )
                    stats.tool_calls += 1
                    await self._report(
                        "tool_result", result, {"id": call.call_id, "error": is_error}
                    )
                    self.history.append(
                        ChatMessage("tool", result, call_id=call.call_id, is_error=is_error)
                    )
                if self._over_budget():
                    final = self._budget_note()
                    stats.stopped = "budget"
                    self._spent()
                    break
            else:
                final = f"(stopped after {self.spec.max_steps} model calls in one turn)"
        except ModelError as exc:
            self.runner.console_note(f"{self.spec.name}: {exc}")
            stats.failure = exc.message
            if self.session.endswith("-main") and not exc.details.get("retryable"):
                # failed for good (a revoked key, a spent quota, a model that does not
                # exist, a context that is full), before or after it read the inputs:
                # whatever comes for the session while the run lasts is a dead letter
                # its sender hears about (:meth:`run`), not left waiting unheard
                self.down = (
                    f"{self.spec.name}'s model failed for good and {self.spec.name} "
                    f"stopped: {exc.message}"
                )
            if not answered and self.session.endswith("-main"):
                # the inputs never reached the model: given up for good (``down``), or
                # given back
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._interrupted(ids, handed=False, why="model error"))
                stats.stopped = "model error"
                self.runner.changed()
                return
            if answered:
                final = f"(the model failed: {exc})"
            else:
                # a delegation's sub-session, there for its one task: given back, the task
                # would wait for a session nobody serves, and the stop closing the turn
                # would answer the caller with no text. The answer says the task failed.
                final = (
                    f"(the task was not done: {self.spec.name}'s model failed before it "
                    f"read it: {exc.message})"
                )
            stats.stopped = "model error"
        except BaseException:
            # interrupted, or a policy or the hub failed mid-turn: close the turn, so the
            # session is not left in one; inputs the model never saw go back (nothing
            # lost), those it answered are acked (never handed to a model twice)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._interrupted(ids, handed=answered))
            raise
        if self._over_budget() and stats.stopped is None:
            stats.stopped = "budget"
            self._spent()
            final = (final + "\n\n" if final else "") + self._budget_note()
        answer = await self._report("agent_stop", final)
        self.runner.tell(story.on_stop(self.spec.name, answer.model_dump(exclude_unset=True)))
        await self.runner.patient(lambda: c.ack(ids), repeatable=True)
        self._acked(record, ids)
        stats.last_output = final
        if self.down:  # ends while still working: the run must not end before it has
            await self._end()
        stats.working = False
        self.runner.changed()

    def _counted(self, reply: ModelReply) -> Usage:
        """The tokens ``reply`` cost, as its usage gives them, or estimated (about four
        characters a token: :func:`estimate_tokens`, of the system prompt, the
        conversation and the tools' definitions sent) where it gives none: compatible
        servers and proxies leave ``usage`` out, or a count of it, and counted as no
        tokens the agent's ``max_tokens`` and ``budget_usd`` never stopped it. The
        first estimate is named in a note, and the budget note says it counted one."""
        u = reply.usage
        given_in = bool(u.input_tokens or u.cache_read_tokens or u.cache_write_tokens)
        wrote = bool(reply.text or reply.tool_calls)
        if given_in and (u.output_tokens or not wrote):
            return u
        if not self.estimated:
            self.estimated = True
            self.runner.console_note(
                f"{self.spec.name}: the model API gave no token counts; the agent's budget "
                "counts an estimate (about four characters a token)"
            )
        inp = u.input_tokens
        if not given_in:
            sent = sum(map(_chars, self.history)) + self.tool_chars
            inp = estimate_tokens(self.spec.system) + sent // 4
        out = u.output_tokens or (
            estimate_tokens(reply.text)
            + sum(estimate_tokens(c.name + json.dumps(dict(c.arguments))) for c in reply.tool_calls)
        )
        return Usage(inp, out, u.cache_read_tokens, u.cache_write_tokens)

    def _goes_on(self, reply: ModelReply, asked: int, step: int) -> bool:
        """Is the model, whose answer of text only is ``reply``, asked to go on? When the
        answer was cut at the output limit, the model was asked fewer than
        ``GO_ON_TIMES`` times this turn, and the turn has a step and budget left: the
        closing text is sent on as the agent's whole answer, and half of one misleads."""
        return (
            reply.stop_reason in AT_THE_LIMIT
            and asked < GO_ON_TIMES
            and step + 1 < self.spec.max_steps
            and not self._over_budget()
        )

    def _closing(self, pieces: list[str], reply: ModelReply) -> str:
        """The turn's closing text: what the model wrote, across the answers it was asked
        to go on in, marked as cut (:func:`cut_mark`) when the last was cut all the same
        (at the output limit, or by the API's filter, which an empty answer reads as no
        answer at all): never sent on as whole when it may not be."""
        text = "".join(pieces) + reply.text
        if reply.stop_reason not in CUT_SHORT:
            return text
        mark = cut_mark(reply.stop_reason)
        self.runner.console_note(f"{self.spec.name}: {mark}")
        return f"{text}\n\n{mark}" if text else mark

    def _call_key(self, call_id: str) -> str:
        """The key the hub knows a tool call by (a delegation's ``tool_use_id``, which it
        keeps once per session): the model's call id, unless the session used it before
        or the hub would refuse it. Some servers number calls within each answer (Kimi
        K2's ``functions.delegate:0``) or leave them empty; under a repeated id the hub
        would take a second delegation for the first made again and refuse it, or answer
        the first one, long over."""
        key = call_id
        if key in self.call_keys or not MESSAGE_ID_RE.fullmatch(key):
            key = "tu_" + uuid.uuid4().hex[:16]
        self.call_keys.add(key)
        return key

    async def _interrupted(self, ids: list[str], *, handed: bool, why: str = "interrupted") -> None:
        """Close a turn that did not finish. ``handed``: the model answered in it, so
        its inputs reached it and are acked; otherwise they are given back. The session
        is stopped (``why``) at once, but working until that is done: the run ends
        when every agent has stopped and none works, and ended sooner it would cancel
        the give-back, the inputs left leased to a runner that is gone."""
        self.stats.stopped = why
        try:
            await self.client.report_event(self.session, "agent_stop", "", {"interrupted": True})
        finally:
            try:
                if handed:
                    await self.client.ack(ids)
                    self._acked(await self.runner.record(self.spec.name), ids)
                elif self.down:
                    # the session ends (its links close, both sides told: a linked peer
                    # does not spend the link's turns talking to an agent that cannot
                    # answer), and its inputs are dead letters their senders hear about
                    try:
                        await self._end()
                        await self._give_up(ids)
                    except BackchannelError:  # a hub that cannot: given back, not lost
                        await self.runner.release(self.client, ids)
                        raise
                else:
                    await self.runner.release(self.client, ids)
            finally:
                self.stats.working = False

    def _acked(self, record: SeenRecord, ids: list[str]) -> None:
        record.drop(ids)
        if self.unacked == ids:
            self.unacked = []

    async def settle(self) -> None:
        """Ack the inputs of a turn that ended without acking them (the hub was away
        past the runner's patience): the model saw them."""
        if self.unacked:
            ids = self.unacked
            await self.client.ack(ids)
            self._acked(await self.runner.record(self.spec.name), ids)

    async def _again(self, call: Callable[[], Awaitable[_T]]) -> _T:
        return await self.runner.patient(call, repeatable=True)

    def _over_budget(self) -> bool:
        s, spec = self.stats, self.spec
        used = s.usage.input_tokens + s.usage.output_tokens
        return bool(
            (spec.budget_usd and s.cost >= spec.budget_usd)
            or (spec.max_tokens and used >= spec.max_tokens)
        )

    def _spent(self) -> None:
        """The session stopped on its budget: whatever comes for it while the run lasts
        is a dead letter its sender hears about (:meth:`run`), not left waiting for an
        agent that will not take it."""
        if self.session.endswith("-main"):
            self.down = f"{self.spec.name}'s budget is spent and it stopped: {self._budget_note()}"

    def _budget_note(self) -> str:
        s, spec = self.stats, self.spec
        return (
            f"Budget spent (${s.cost:.4f} of ${spec.budget_usd or 0:.2f}, "
            f"{s.usage.input_tokens + s.usage.output_tokens} tokens of {spec.max_tokens or 'unlimited'}"
            f"{', estimated: the model API gave no token counts' if self.estimated else ''}): "
            f"{spec.name} stops here."
        )


class Runner:
    """Hosts a team's llm members. Use :meth:`run`."""

    def __init__(
        self,
        team: TeamFile,
        clients: dict[str, Client],
        *,
        workspace: Path,
        quiet_seconds: float = 2.0,
        timeout: float = 600.0,
        on_change: Callable[[], None] | None = None,
        note: Callable[[str], None] | None = None,
        story: Callable[[str], None] | None = None,
        hub_patience: float = HUB_PATIENCE,
        model_patience: float = MODEL_PATIENCE,
        model_pause: float = MODEL_PAUSE,
        model_slow: float = MODEL_SLOW,
        record_dir: Path | None = None,
    ) -> None:
        self.team = team
        self.clients = clients
        self.workspace = workspace
        self.quiet_seconds = quiet_seconds
        self.timeout = timeout
        self.hub_patience = hub_patience
        self.model_patience = model_patience
        self.model_pause = model_pause
        self.model_slow = model_slow
        self.record_dir = record_dir  # None: runner/ in the user's state directory
        self._records: dict[str, SeenRecord] = {}
        self.loops: dict[str, SessionLoop] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._on_change = on_change
        self._note = note
        self._story = story
        self.delivered = 0  # messages handed to hosted sessions
        self.started = time.monotonic()
        self.ended_because = ""

    def changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def console_note(self, text: str) -> None:
        if self._note is not None:
            self._note(text)

    def tell(self, lines: list[str]) -> None:
        """Hand story lines (see :mod:`backchannel.runner.story`) to the ``story`` callback."""
        if self._story is not None:
            for line in lines:
                self._story(f"{time.monotonic() - self.started:5.1f}s  {line}")

    async def patient(self, call: Callable[[], Awaitable[_T]], *, repeatable: bool = False) -> _T:
        """``call()``, made again while the hub is away (:func:`hub_away`), for up to
        ``hub_patience`` seconds: a hub that restarts under the runner does not stop its
        sessions. Any other error, or the hub away for longer, is raised."""
        deadline: float | None = None
        pause = 0.2
        while True:
            try:
                return await call()
            except BackchannelError as exc:
                if not hub_away(exc, repeatable=repeatable):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.hub_patience
                    self.console_note(
                        f"the hub is away ({exc.message}); trying again for up to "
                        f"{self.hub_patience:.0f} s"
                    )
                elif now >= deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    @property
    def hosted(self) -> list[MemberSpec]:
        return [m for m in self.team.members if m.kind is MemberKind.LLM]

    async def record(self, member: str) -> SeenRecord:
        """``member``'s record of inputs its models were handed and the hub has not
        acked (:mod:`backchannel.runner.record`), read on first use."""
        rec = self._records.get(member)
        if rec is None:
            client = self.clients[member]
            me = await self.patient(client.me, repeatable=True)
            where = client.hub_url or "in-process"
            path = record_path(where, me.team or "", member, self.record_dir)
            rec = self._records.setdefault(member, SeenRecord(path))
        return rec

    async def _settle_record(self, member: str) -> None:
        """Ack what ``member``'s record holds from an earlier runner that could not."""
        rec = await self.record(member)
        if ids := rec.ids:
            self.console_note(
                f"{member}: acking {len(ids)} message(s) its model was handed before the "
                "runner stopped without acking them"
            )
            await self.patient(functools.partial(self.clients[member].ack, ids), repeatable=True)
            rec.drop(ids)

    async def _settle_stopped(self) -> None:
        """Ack the inputs stopped sessions' turns left unacked, now that the hub answers."""
        for sid, lp in self.loops.items():
            task = self.tasks.get(sid)
            if lp.unacked and (task is None or task.done()):
                with contextlib.suppress(BackchannelError):
                    await lp.settle()

    async def release(self, client: Client, ids: list[str]) -> None:
        await client.release(ids)

    async def _discover(self) -> None:
        """Start a loop for every open session of a hosted member (main sessions and the
        sub-sessions delegations create)."""
        for spec in self.hosted:
            client = self.clients[spec.name]
            # its live sessions only: a long run leaves one ended for each delegation
            for s in await client.list_sessions(spec.name, live_only=True):
                sid = s.session_id
                if s.state == "terminated" or sid in self.loops:
                    continue
                loop = SessionLoop(self, spec, client, sid)
                self.loops[sid] = loop
                self.tasks[sid] = asyncio.create_task(self._guard(loop), name=f"bc-session-{sid}")
                self.changed()

    async def _guard(self, loop: SessionLoop) -> None:
        try:
            await loop.run()
        except asyncio.CancelledError:
            raise
        except BackchannelError as exc:
            loop.stats.stopped = f"hub error: {exc.message}"
            loop.stats.failure = exc.message
            self.console_note(f"{loop.session}: {exc.message}")
        except Exception as exc:
            loop.stats.stopped = f"crashed: {exc!r}"
            loop.stats.failure = repr(exc)
            log.exception("session loop %s crashed", loop.session)
            self.console_note(f"{loop.session} crashed: {exc!r}")

    async def _busy(self) -> bool:
        """Is anything still owed to a hosted member, or is anyone working?"""
        if any(lp.stats.working for lp in self.loops.values()):
            return True
        any_client = next(iter(self.clients.values()))
        # one pending delegation or timer is enough to know (never every one read, five
        # times a second); a member sees the delegations it is in
        for client in self.clients.values():
            if await client.delegations(pending_only=True, limit=1):
                return True
        if await any_client.timers(limit=1):
            return True
        for spec in self.hosted:
            main = self.loops.get(f"{spec.name}-main")
            if main is not None and main.stats.stopped:
                continue  # nothing takes its messages now; the run's report names them
            if await self.clients[spec.name].pending() > 0:
                return True
        return False

    async def run(self, task: str, user: Client) -> str:
        """Give ``task`` to the lead, host the team until it is quiet; returns why it ended."""
        for spec in self.hosted:
            await self._settle_record(spec.name)
        for spec in self.hosted:
            opening = functools.partial(self.clients[spec.name].open_session, f"{spec.name}-main")
            await self.patient(opening, repeatable=True)
        await user.send(
            self.team.lead_name, task, session=f"{self.team.lead_name}-main", link=False
        )
        quiet_since: float | None = None
        try:
            while True:
                await self.patient(self._discover, repeatable=True)
                await self._settle_stopped()
                now = time.monotonic()
                if now - self.started > self.timeout:
                    self.ended_because = f"timeout after {self.timeout:.0f} s"
                    break
                if all(
                    lp.stats.stopped and not lp.stats.working
                    for lp in self.loops.values()
                    if lp.session.endswith("-main")
                ):
                    self.ended_because = "every agent stopped"
                    break
                if await self.patient(self._busy, repeatable=True):
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= self.quiet_seconds:
                    self.ended_because = "the team is quiet"
                    break
                await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            self.ended_because = "interrupted"
            raise
        finally:
            await self.stop()
        return self.ended_because

    async def stop(self) -> None:
        for t in self.tasks.values():
            t.cancel()
        for t in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        with contextlib.suppress(Exception):
            await self._settle_stopped()
        self.changed()

    def totals(self) -> dict[str, Any]:
        usage = Usage()
        cost = 0.0
        for lp in self.loops.values():
            usage += lp.stats.usage
            cost += lp.stats.cost
        return {
            "usage": usage,
            "cost": cost,
            "turns": sum(lp.stats.turns for lp in self.loops.values()),
        }
