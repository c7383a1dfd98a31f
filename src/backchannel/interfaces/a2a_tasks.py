"""A2A tasks run by hub members: the executor, the durable task store, the handler.

A ``message/send`` to member M from member C (the authenticated caller) opens M's
session ``a2a-{task_id}`` (one per task, like a delegation's sub-session) and sends it
the message text, with the A2A ids in the message's ``meta["a2a"]``. The member works on
it as on any input; its next ``agent_stop`` (not a checkpoint turn's) is the answer:

* the closing text becomes the task's artifact and the task is ``completed``;
* ``data["a2a"]`` on that ``agent_stop`` may say more: ``state`` (``completed``,
  ``input-required`` to ask the caller back, ``failed``, ``rejected``), ``artifacts``
  (a list of ``{"parts": [...], "name"?, "artifact_id"?, "append"?, "last_chunk"?}`` in
  A2A JSON, sent in order instead of the text artifact);
* a session that ends without answering fails the task; ``tasks/cancel`` ends the
  session and cancels the task;
* a message a conversation budget refuses (the pair's or the chain's) is ``rejected``,
  with the refusal's words and how the team's human extends the budget.

A follow-up message naming the task goes to the same session. Tasks live in the hub's
store (table ``a2a_tasks``), so get, list and cancel work after a hub restart, and a
task whose answer came while no executor watched it (the hub restarted meanwhile) is
brought up to date from the session's transcript when it is next read.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import Event, EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskStore, TaskUpdater
from a2a.server.tasks.task_manager import append_artifact_to_task
from a2a.types.a2a_pb2 import (
    Artifact,
    CancelTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InternalError, InvalidParamsError, TaskNotCancelableError
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError, SerializeToJsonError

from backchannel.core import budget as budget_rules
from backchannel.core import messages
from backchannel.errors import BackchannelError, BudgetExhausted, InvalidRequest
from backchannel.hub import Hub, Outgoing
from backchannel.hub.context import Ctx
from backchannel.hub.delegations import HOOK_KINDS
from backchannel.types import A2AClaim, A2ATask, MessageKind, SessionState

log = logging.getLogger("backchannel.a2a")

STATE_KEY = "backchannel.a2a"
#: Where the handler leaves the hub message id of a request's message for the executor
#: (computed from the message as the caller sent it, before the SDK fills in its ids).
INPUT_KEY = "backchannel.a2a.input"
#: Where the handler leaves, for the executor, the future it resolves once the member's
#: message is stored (or will never be): a send of the same message waits for it.
STARTING_KEY = "backchannel.a2a.starting"
SESSION_PREFIX = "a2a-"

TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
_TERMINAL_NAMES = frozenset(TaskState.Name(s) for s in TERMINAL)
INTERRUPTED = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
_ANSWER_STATES = {
    "completed": TaskState.TASK_STATE_COMPLETED,
    "input-required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "failed": TaskState.TASK_STATE_FAILED,
    "rejected": TaskState.TASK_STATE_REJECTED,
}


@dataclass(frozen=True, slots=True)
class Caller:
    """Whom a request is for (``team``/``member``) and who sent it (``caller``)."""

    team: str
    member: str
    caller: str


def caller_of(context: ServerCallContext) -> Caller:
    who = context.state.get(STATE_KEY)
    if not isinstance(who, Caller):  # the gate sets it on every request it lets through
        raise RuntimeError("A2A request without an authenticated caller")
    return who


def session_for(task_id: str) -> str:
    return f"{SESSION_PREFIX}{task_id}"


def input_id(who: Caller, message: Message) -> str:
    """The id of the hub message that hands the member a caller's A2A message: one per
    member, caller and message (its ``messageId`` and all it holds), so the same message
    sent again (its sender lost the answer and retried) is never handed over twice, and
    is found again (:meth:`MemberRequestHandler.on_message_send`). Another message under
    a ``messageId`` used before is a message of its own."""
    body = json.dumps(MessageToDict(message), sort_keys=True, ensure_ascii=False)
    key = "\n".join((who.member, who.caller, body)).encode("utf-8", "surrogatepass")
    return "a2a-" + hashlib.sha256(key).hexdigest()[:40]


T = TypeVar("T")
#: The longest a wait goes without looking again: another process of the hub (sharing
#: its store) that changes a task wakes no waiter of this one.
LOOK_AGAIN = 5.0


#: The longest an executor waits for the SDK to save the answer it handed over.
SETTLE = 30.0

#: How long a send of a message sent before waits for the hub that started its task
#: (another hub on the store, or this one before a restart) to save the task, before it
#: writes the task down from its claim itself (:meth:`HubTaskStore.adopt`).
ADOPT_AFTER = 2.0


async def watch(
    hub: Hub, team: str, look: Callable[[], Awaitable[T | None]], every: float = LOOK_AGAIN
) -> T:
    """The first thing ``look()`` finds (not None), asked again at every change the team's
    sessions report (an event, a termination; see :mod:`backchannel.hub`'s waiters) and at
    least every ``every`` seconds. The event is taken before each look, so a change
    between the look and the wait is never slept through. Every wait of the A2A handler
    and executor is this one."""
    while True:
        changed = hub._waiters.event(team, None)
        found = await look()
        if found is not None:
            return found
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=every)


# -- answers: what the member's transcript says ------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    state: TaskState
    text: str
    artifacts: tuple[Mapping[str, Any], ...] | None = None  # None: the text is the artifact
    as_message: bool = False  # answer with a Message instead of a Task, if none was shown yet
    #: the conversation chain the answer goes on in (``{"id", "hop"}``: the member's turn's
    #: chain, one hop further), named in the answer's metadata so the caller's hub goes on
    #: from there; None when the turn worked in none
    chain: Mapping[str, Any] | None = None

    def metadata(self) -> dict[str, Any]:
        """The metadata every part of the answer carries (the chain, if any)."""
        return {} if self.chain is None else {budget_rules.A2A_CHAIN_KEY: dict(self.chain)}


def answer_in(
    events: Sequence[Mapping[str, Any]], after_turn: int, session_state: str
) -> Answer | None:
    """The member's answer in its transcript: the first ``agent_stop`` of a turn after
    ``after_turn`` that is not a checkpoint turn. A terminated session with no answer
    fails the task. ``None`` while the member is still at work."""
    checkpoint_turns = {
        e["turn"]
        for e in events
        if e.get("kind") == "turn_start" and (e.get("data") or {}).get("checkpoint")
    }
    for e in events:
        turn = int(e.get("turn", 0))
        if e.get("kind") != "agent_stop" or turn <= after_turn or turn in checkpoint_turns:
            continue
        data = e.get("data") or {}
        spec = data["a2a"] if isinstance(data.get("a2a"), dict) else {}
        state = _ANSWER_STATES.get(str(spec.get("state", "completed")))
        artifacts = spec.get("artifacts")
        if state is None:
            return Answer(
                TaskState.TASK_STATE_FAILED,
                f"the member answered with an unknown A2A state {spec.get('state')!r}; use "
                f"one of {', '.join(_ANSWER_STATES)}",
            )
        if artifacts is not None and not (
            isinstance(artifacts, list) and all(isinstance(a, dict) for a in artifacts)
        ):
            return Answer(TaskState.TASK_STATE_FAILED, "the member's a2a.artifacts is not a list")
        return Answer(
            state,
            str(e.get("text", "")),
            None if artifacts is None else tuple(artifacts),
            spec.get("reply") == "message",
        )
    if session_state == SessionState.TERMINATED.value:
        return Answer(TaskState.TASK_STATE_FAILED, "the member's session ended before it answered")
    return None


def progress_in(events: Sequence[Mapping[str, Any]], after_turn: int) -> bool:
    """Whether the member has shown work on this input beyond starting its turn."""
    shown = {"thought", "tool_call", "tool_result", "agent_output"}
    return any(e.get("kind") in shown and int(e.get("turn", 0)) > after_turn for e in events)


def _text_part(text: str) -> Part:
    return Part(text=text)


def _artifact_events(task_id: str, context_id: str, answer: Answer) -> list[Event]:
    """The artifact updates an answer makes (text as one artifact, or the member's own)."""
    out: list[Event] = []
    if answer.state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_FAILED):
        return out  # these answers travel as the status message
    if answer.state is TaskState.TASK_STATE_REJECTED:
        return out
    specs: Sequence[Mapping[str, Any]] = (
        answer.artifacts
        if answer.artifacts is not None
        else ([{"parts": [{"text": answer.text}], "name": "answer"}] if answer.text else [])
    )
    for i, spec in enumerate(specs):
        art = ParseDict(
            {
                "artifactId": str(spec.get("artifact_id") or f"{task_id}-a{i}"),
                "parts": list(spec.get("parts") or []),
                **({"name": str(spec["name"])} if spec.get("name") else {}),
                **({"metadata": answer.metadata()} if answer.chain is not None else {}),
            },
            Artifact(),
        )
        out.append(
            TaskArtifactUpdateEvent(
                task_id=task_id,
                context_id=context_id,
                artifact=art,
                append=bool(spec.get("append", False)),
                last_chunk=bool(spec.get("last_chunk", False)),
            )
        )
    return out


def _status_message(task_id: str, context_id: str, answer: Answer) -> Message | None:
    if answer.state is TaskState.TASK_STATE_COMPLETED and answer.artifacts is None:
        return None  # the text is the artifact
    if not answer.text:
        return None
    msg = Message(
        role=Role.ROLE_AGENT,
        message_id=uuid.uuid4().hex,
        task_id=task_id,
        context_id=context_id,
        parts=[_text_part(answer.text)],
    )
    msg.metadata.update(answer.metadata())
    return msg


def _status_event(task_id: str, context_id: str, answer: Answer) -> TaskStatusUpdateEvent:
    status = TaskStatus(state=answer.state)
    status.timestamp.FromDatetime(datetime.now(UTC))
    msg = _status_message(task_id, context_id, answer)
    if msg is not None:
        status.message.CopyFrom(msg)
    event = TaskStatusUpdateEvent(task_id=task_id, context_id=context_id, status=status)
    event.metadata.update(answer.metadata())
    return event


def chain_of(message: Message) -> budget_rules.ChainRef | None:
    """The conversation chain a message names in its metadata (``"backchannel.chain":
    {"id", "hop"}``, as another hub's ``/api/chat`` names it), or None. Checked as strictly
    as ``/api/chat``'s ``chain``; a JSON number reaches the hub as a float, so a whole one
    (``3.0``) is the whole number it spells. Anything else is an invalid-params error
    naming the field."""
    key = budget_rules.A2A_CHAIN_KEY
    if key not in message.metadata.fields:
        return None
    value = MessageToDict(message.metadata).get(key)
    if isinstance(value, dict) and isinstance(value.get("hop"), float):
        hop = value["hop"]
        value = {**value, "hop": int(hop) if hop.is_integer() else hop}
    try:
        return budget_rules.check_chain(value)
    except InvalidRequest as exc:
        # check_chain's field ("chain", "chain.id", "chain.hop") is its message's first
        # word; here the chain is the metadata key
        sub = str(exc.details.get("field", "chain")).removeprefix("chain")
        field = f'message.metadata["{key}"]{sub}'
        why = exc.message.partition(" ")[2]
        raise InvalidParamsError(f"{field} {why}", data={"field": field}) from None


def rejection(team: str, exc: BudgetExhausted) -> str:
    """Why a message a budget refused was rejected, and the way out: the refusal's own
    words (which budget, its team setting), then how the team's human extends it."""
    key = exc.details.get("key")
    if not isinstance(key, str) or not key:
        return exc.message
    return (
        f"{exc.message} To let it through, the team's human extends the budget (extend_budget):"
        f" `backchannel budget extend {team} {key} --by N`, or POST "
        f'/v1/teams/{team}/budgets/extend {{"key": "{key}", "by": N}}.'
    )


def message_text(message: Message) -> str:
    """What the member reads: text parts as they are, data parts as JSON, files by name."""
    out = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            out.append(part.text)
        elif kind == "data":
            out.append(json.dumps(MessageToDict(part.data), ensure_ascii=False))
        elif kind == "url":
            out.append(f"[file {part.filename or ''} at {part.url}]")
        elif kind == "raw":
            out.append(f"[file {part.filename or ''}, {len(part.raw)} bytes, {part.media_type}]")
    return "\n".join(out)


# -- the durable task store ----------------------------------------------------------------


class HubTaskStore(TaskStore):
    """A2A tasks in the hub's store, visible only to the member who gave them."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        #: tasks an executor of this process is watching, or whose answer it has handed
        #: to the SDK and the SDK has not yet saved (:meth:`MemberExecutor.execute`)
        self.live: set[str] = set()
        #: set when a task's answer (a state it ends or asks back in) is saved
        self.settling: dict[str, asyncio.Event] = {}
        #: tasks an executor of this process gave up because a send of the same message
        #: on another hub claimed it first (:class:`Claimed`): the A2A library writes a
        #: request that failed before its task existed down as a failed task, which for
        #: these would be a second task for one message; they are never written
        self.claimed_away: set[str] = set()

    async def _record(self, team: str, task_id: str) -> A2ATask | None:
        return await self.hub.store.read(lambda tx: tx.get_a2a_task(team, task_id))

    async def save(self, task: Task, context: ServerCallContext) -> None:
        if task.id in self.claimed_away:
            # the library's failed task for a send whose message another hub's send
            # claimed first: that send's task is the message's one task
            log.debug("A2A task %s not written: its message is another task's", task.id)
            return
        who = caller_of(context)
        now = self.hub.clock.now()
        body = MessageToDict(task)
        state = TaskState.Name(task.status.state)

        def fn(tx: Any) -> None:
            old = tx.get_a2a_task(who.team, task.id)
            if old is not None and (old.member, old.owner) != (who.member, who.caller):
                raise PermissionError("task belongs to someone else")
            if old is not None and old.state in _TERMINAL_NAMES and old.state != state:
                # a task ends once: the first end written stands (a cancel and the
                # member's answer raced, each read the task before the other wrote)
                log.info("A2A task %s ended %s; not %s", task.id, old.state, state)
                return
            extra = json.loads(old.body).get("bc", {}) if old is not None else {}
            tx.put_a2a_task(
                A2ATask(
                    who.team,
                    task.id,
                    who.member,
                    who.caller,
                    task.context_id,
                    state,
                    json.dumps({"task": body, "bc": extra}),
                    old.created_at if old is not None else now,
                    now,
                )
            )

        await self.hub.store.transact(fn)
        # a send of the same message again, or a resubscription, waits for this (watch)
        self.hub._waiters.notify_watchers(who.team)
        settled = self.settling.get(task.id)
        if settled is not None and task.status.state in TERMINAL | INTERRUPTED:
            settled.set()

    async def adopt(self, who: Caller, claim: A2AClaim, message: Message) -> None:
        """Write down, working, the task a claim names when no hub has saved it: the hub
        that started it keeps none until its member shows work, and may be another hub
        on the store or gone (a restart). From then on any hub answers it from the store
        and brings it up to date from the member's transcript (:meth:`get`); a task
        saved meanwhile is left as it is."""
        sent = _copy(message)
        sent.task_id, sent.context_id = claim.task_id, claim.context_id
        task = Task(id=claim.task_id, context_id=claim.context_id, history=[sent])
        task.status.state = TaskState.TASK_STATE_WORKING
        task.status.timestamp.FromDatetime(datetime.now(UTC))
        body = json.dumps({"task": MessageToDict(task), "bc": {}})
        now = self.hub.clock.now()
        state = TaskState.Name(task.status.state)

        def fn(tx: Any) -> None:
            if tx.get_a2a_task(who.team, claim.task_id) is None:
                tx.put_a2a_task(
                    A2ATask(
                        who.team,
                        claim.task_id,
                        who.member,
                        who.caller,
                        claim.context_id,
                        state,
                        body,
                        now,
                        now,
                    )
                )

        await self.hub.store.transact(fn)
        self.hub._waiters.notify_watchers(who.team)

    async def set_turn(self, who: Caller, task_id: str, turn: int) -> None:
        """Remember the session's turn before this input: its answer is a later turn."""

        def fn(tx: Any) -> None:
            old = tx.get_a2a_task(who.team, task_id)
            if old is None:
                return
            body = json.loads(old.body)
            body["bc"] = {"after_turn": turn}
            tx.put_a2a_task(A2ATask(**{**_fields(old), "body": json.dumps(body)}))

        await self.hub.store.transact(fn)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        who = caller_of(context)
        rec = await self._record(who.team, task_id)
        if rec is None or (rec.member, rec.owner) != (who.member, who.caller):
            return None
        task = _task_of(rec)
        if task.status.state in TERMINAL or task_id in self.live:
            return task
        return await self._catch_up(who, rec, task, context)

    async def _catch_up(
        self, who: Caller, rec: A2ATask, task: Task, context: ServerCallContext
    ) -> Task:
        """A task nobody watched while its member answered (the hub restarted): apply
        the answer from the transcript now."""
        if task.status.state not in (
            TaskState.TASK_STATE_SUBMITTED,
            TaskState.TASK_STATE_WORKING,
        ):
            return task
        after = int(json.loads(rec.body).get("bc", {}).get("after_turn", 0))
        answer = await read_answer(self.hub, who, task.id, after)
        if answer is None:
            return task
        # the answer's artifacts whole, in place of any part of them the executor of
        # another hub saved already (its artifact updates are saved before its end): each
        # once, as the A2A library applies them
        del task.artifacts[:]
        for event in [*_artifact_events(task.id, task.context_id, answer)]:
            assert isinstance(event, TaskArtifactUpdateEvent)
            append_artifact_to_task(task, event)
        task.status.CopyFrom(_status_event(task.id, task.context_id, answer).status)
        await self.save(task, context)
        saved = await self._record(who.team, task.id)  # a cancel may have ended it first
        return task if saved is None else _task_of(saved)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        who = caller_of(context)
        recs = await self.hub.store.read(
            lambda tx: tx.list_a2a_tasks(who.team, who.member, who.caller)
        )
        # the SDK's own paging and filtering, over this caller's tasks
        page = InMemoryTaskStore(owner_resolver=lambda _ctx: "caller", use_copying=False)
        for rec in recs:
            task = _task_of(rec)
            if task.status.state not in TERMINAL and task.id not in self.live:
                task = await self._catch_up(who, rec, task, context)
            await page.save(task, context)
        return await page.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        raise NotImplementedError("A2A tasks are kept; they are not deleted")


def _fields(obj: A2ATask) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in A2ATask.__slots__}


def _task_of(rec: A2ATask) -> Task:
    try:
        task: Task = ParseDict(json.loads(rec.body)["task"], Task(), ignore_unknown_fields=True)
        return task
    except (ValueError, KeyError, ParseError) as exc:
        raise RuntimeError(f"stored A2A task {rec.task_id!r} is unreadable: {exc}") from exc


def reply_message(answer: Answer, context_id: str) -> Message:
    """The Message that answers a send when the member answered with one (``reply:
    message``) before its task was shown."""
    parts = [_text_part(answer.text)] if answer.text else []
    for spec in answer.artifacts or ():
        parts += [ParseDict(p, Part()) for p in spec.get("parts") or []]
    msg = Message(
        role=Role.ROLE_AGENT, message_id=uuid.uuid4().hex, context_id=context_id, parts=parts
    )
    msg.metadata.update(answer.metadata())
    return msg


async def read_answer(hub: Hub, who: Caller, task_id: str, after_turn: int) -> Answer | None:
    return (await read_progress(hub, who, task_id, after_turn))[0]


async def read_progress(
    hub: Hub, who: Caller, task_id: str, after_turn: int
) -> tuple[Answer | None, bool]:
    """The member's answer (None while it works) and whether it has shown work."""
    events: list[dict[str, Any]] = []
    since = 0
    while True:  # the whole transcript, uncut (the answer is the closing text in full)
        try:
            data = await hub.get_session_data(
                who.team, session_for(task_id), since=since, max_chars=1_000_000, limit=500
            )
        except BackchannelError:
            gone = "the member's session for this task is gone"
            return Answer(TaskState.TASK_STATE_FAILED, gone), True
        events += data["events"]
        if data["next_since"] is None:
            break
        since = int(data["next_since"])
    answer = answer_in(events, after_turn, data["session"]["state"])
    if answer is not None and answer.state is not TaskState.TASK_STATE_FAILED:
        answer = dataclasses.replace(answer, chain=await answer_chain(hub, who, task_id))
    return answer, progress_in(events, after_turn)


async def answer_chain(hub: Hub, who: Caller, task_id: str) -> dict[str, Any] | None:
    """The chain the member's answer goes on in: its task session's, one hop further, as
    a send of that turn would be (``/api/tools/response`` names it the same way)."""
    session = await hub.store.read(lambda tx: tx.get_session(who.team, session_for(task_id)))
    if session is None:
        return None
    ref = hub.budgets.answer_chain(session)
    return None if ref is None else budget_rules.chain_wire(ref)


# -- the executor ----------------------------------------------------------------------------


class Claimed(Exception):
    """The message is claimed by another task (:func:`claiming`)."""

    def __init__(self, claim: A2AClaim) -> None:
        super().__init__(f"message {claim.message_id} started task {claim.task_id}")
        self.claim = claim


class _QuietWhenClaimed(logging.Filter):
    """Drops the A2A library's ``ERROR … Execution failed`` / ``Consumer … Failed``
    tracebacks when the executor stopped because another hub's send of the same message
    claimed it first: that is the expected end of a race the request handler answers
    with the one task (:meth:`MemberRequestHandler.on_message_send`), logged there at
    ``INFO``, not a failure an operator should chase."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, Claimed)


#: tasks an executor of this process started for a message a send on another hub may
#: repeat (a claimed message): that hub writes the task down from the claim while this
#: executor waits for the member (:meth:`HubTaskStore.adopt`), before it is shown here
_ADOPTABLE: set[str] = set()

#: what the A2A library logs when the Task an executor shows is in the store already
_REPLACED = "Task %s already exists. Ignoring task replacement."


class _QuietWhenAdopted(logging.Filter):
    """Turns the A2A library's ``ERROR Task … already exists. Ignoring task replacement.``
    into an ``INFO`` line when another hub on the store wrote the task down from its
    claim (a send of the same message there, waiting for the member) before this hub's
    executor showed it: the library goes on from the stored task, which holds the same
    message, and the member's answer completes it. The expected end of that race, not
    a failure an operator should chase."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == _REPLACED and args and args[0] in _ADOPTABLE:
            record.msg = (
                "A2A task %s was written down by a send of the same message on another "
                "hub before this hub showed it; it goes on from the stored task"
            )
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def _forget_adoptable(task_id: str) -> None:
    """Drop ``task_id`` from :data:`_ADOPTABLE` once its executor is over, a while later:
    the library handles the events the executor enqueued after it returns."""
    asyncio.get_running_loop().call_later(SETTLE, _ADOPTABLE.discard, task_id)


for _filter in (_QuietWhenClaimed(), _QuietWhenAdopted()):
    logging.getLogger("a2a.server.agent_execution.active_task").addFilter(_filter)


def claiming(claim: A2AClaim, send: Callable[[Ctx], T]) -> Callable[[Ctx], T]:
    """``send`` (the transaction function that hands the member a caller's message),
    claiming the message for its task first in the same transaction: a repeat of the
    message on any hub on the store finds the task. If a send of the same message
    (another hub's, in flight at the same time) claimed it first, nothing is stored
    and :class:`Claimed` names that claim."""

    def fn(c: Ctx) -> T:
        held = c.tx.claim_a2a_message(claim)
        if held.task_id != claim.task_id:
            raise Claimed(held)
        return send(c)

    return fn


class MemberExecutor(AgentExecutor):
    """Hands an A2A message to the member's session and reports its answer."""

    def __init__(self, hub: Hub, tasks: HubTaskStore) -> None:
        self.hub = hub
        self.tasks = tasks
        self.canceling: set[str] = set()
        #: tasks whose answer execute() has taken, set once it is handed to the SDK: a
        #: cancel that comes later waits for it and cancels nothing (the answer won)
        self.answering: dict[str, asyncio.Event] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        call = context.call_context
        assert call is not None
        assert context.task_id
        assert context.context_id
        assert context.message is not None
        who = caller_of(call)
        task_id, context_id = context.task_id, context.context_id
        updater = TaskUpdater(event_queue, task_id, context_id)
        message = context.message
        shown = context.current_task is not None

        async def show() -> None:
            # the Task appears once the member shows work (or the client asked for it
            # at once); until then the member may still answer with a plain Message
            nonlocal shown
            if not shown:
                shown = True
                task = Task(id=task_id, context_id=context_id, history=[message])
                task.status.state = TaskState.TASK_STATE_SUBMITTED
                await event_queue.enqueue_event(task)
                await updater.start_work()

        at_once = context.configuration is not None and context.configuration.return_immediately
        claim_id = call.state.get(INPUT_KEY)
        if at_once and claim_id is None:
            await show()
        sid = session_for(task_id)
        self.tasks.live.add(task_id)
        if claim_id is not None:
            _ADOPTABLE.add(task_id)
        try:
            if (await self.hub.get_member(who.team, who.member)).kind in HOOK_KINDS:
                raise InvalidRequest(
                    f"{who.member} runs in a runtime attached through hooks, which the hub "
                    "cannot start in a session of its own; send it a message instead"
                )
            task_input = Outgoing(
                who.member,
                message_text(context.message) or "(an empty message)",
                message_id=str(claim_id or f"a2a-{uuid.uuid4().hex}"),
                kind=MessageKind.DELEGATION,
                to_session=sid,
                link=False,
                chain=chain_of(context.message),  # the other hub's, when it named one
                meta={
                    "a2a": {
                        "task_id": task_id,
                        "context_id": context_id,
                        "message_id": context.message.message_id,
                    }
                },
            )
            # the session opens with its input, in one transaction: a message refused at
            # the door (a spent budget, a full inbox) leaves no session behind
            first = self.hub.sending(who.team, who.caller, task_input)
            if claim_id is not None:
                claim = A2AClaim(who.team, claim_id, task_id, context_id, self.hub.clock.now())
                first = claiming(claim, first)
            try:
                # Claimed (a send of the same message on another hub stored it first)
                # ends this executor with no event: the handler answers with that
                # task, and this one is never shown
                session = await self.hub.open_session(who.team, who.member, sid, first=first)
            except Claimed:
                self.tasks.claimed_away.add(task_id)
                asyncio.get_running_loop().call_later(
                    SETTLE, self.tasks.claimed_away.discard, task_id
                )
                raise
            finally:
                _resolve(call.state.get(STARTING_KEY))  # stored, or refused: repeats look
            if at_once:
                await show()  # a claimed message's task shows once the claim is its own
            await self.tasks.set_turn(who, task_id, session.turn)
            if context.current_task is not None:
                await updater.start_work()
            answer = await self._wait(who, task_id, session.turn, show)
        except BudgetExhausted as exc:
            # A2A's word for a message the agent will not take is ``rejected``: the
            # caller (another hub's outbox among them) hears a refusal, not a failure
            answer = Answer(TaskState.TASK_STATE_REJECTED, rejection(who.team, exc))
        except BackchannelError as exc:
            answer = Answer(TaskState.TASK_STATE_FAILED, exc.message)
        except BaseException:
            self.tasks.live.discard(task_id)
            _forget_adoptable(task_id)
            raise
        settled = self.tasks.settling[task_id] = asyncio.Event()
        answered = asyncio.Event()
        try:
            if task_id in self.canceling:
                self.canceling.discard(task_id)
                return  # cancel() reports the outcome
            # from here the answer wins over a cancel (taken in the same step of the
            # event loop as the look above: one of the two, never both)
            self.answering[task_id] = answered
            if answer.as_message and not shown:
                await event_queue.enqueue_event(reply_message(answer, context_id))
                return  # a send of it again reads the Message from the transcript
            await show()
            for event in _artifact_events(task_id, context_id, answer):
                await event_queue.enqueue_event(event)
            await event_queue.enqueue_event(_status_event(task_id, context_id, answer))
            answered.set()
            # the task stays live until the SDK has saved the answer: a send of the same
            # message again that finds the task neither saved nor live takes its executor
            # for gone (a restart) and would start the message over as a task of its own
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), timeout=SETTLE)
        finally:
            answered.set()
            if self.answering.get(task_id) is answered:
                del self.answering[task_id]
            if self.tasks.settling.get(task_id) is settled:
                del self.tasks.settling[task_id]
            self.tasks.live.discard(task_id)
            _forget_adoptable(task_id)

    async def _wait(
        self, who: Caller, task_id: str, after_turn: int, show: Callable[[], Awaitable[None]]
    ) -> Answer:
        async def answered() -> Answer | None:
            answer, progressed = await read_progress(self.hub, who, task_id, after_turn)
            if answer is None and progressed:
                await show()
            return answer

        return await watch(self.hub, who.team, answered)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        call = context.call_context
        assert call is not None
        assert context.task_id
        assert context.context_id
        who = caller_of(call)
        answering = self.answering.get(context.task_id)
        if answering is not None:
            # the member's answer came first and is on its way to the caller: the task
            # ends as it says, and the handler refuses the cancel (TaskNotCancelable)
            await answering.wait()
            return
        self.canceling.add(context.task_id)
        try:
            await self.hub.terminate_session(
                who.team,
                who.member,
                session_for(context.task_id),
                f"A2A task canceled by {who.caller}",
            )
        except BackchannelError as exc:
            log.info("cancel of A2A task %s: %s", context.task_id, exc.message)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


# -- the handler: resubscribe to a task this process did not start -------------------------


def check_encodable(params: SendMessageRequest) -> None:
    """Refuse a request the hub could not write down: the protobuf JSON parser takes
    ``NaN``, ``Infinity`` and numbers too large for a float (as infinity) in ``data``
    parts and metadata, which no JSON can carry on, so the task, its history and the
    member's message could not be stored or shown. A conversation chain named in the
    metadata is checked here too, before a task starts (:func:`chain_of`)."""
    try:
        MessageToDict(params)
    except (SerializeToJsonError, ValueError):
        raise InvalidParamsError(
            "the message holds NaN, Infinity or a number too large for a float, which JSON "
            "cannot carry; send finite numbers (a large one as a string)"
        ) from None
    chain_of(params.message)


def check_text(params: SendMessageRequest, max_text: int) -> None:
    """Refuse a message whose text the hub would not hand the member (over its text
    limit, or holding a NUL) as invalid params, before a task starts: otherwise the task
    would be kept, failed, with the whole message in its history."""
    try:
        messages.check_text(message_text(params.message), max_text)
    except BackchannelError as exc:
        raise InvalidParamsError(
            f"message.parts: {exc.message}", data={"field": "message.parts"}
        ) from None


def claim_of(tx: Any, team: str, mid: str) -> A2AClaim | None:
    """The claim on the hub message ``mid`` (:func:`input_id`): the task the message
    started. A message handed over before the store kept claims (schema 18) names its
    task in its ``meta["a2a"]``."""
    held: A2AClaim | None = tx.get_a2a_claim(team, mid)
    if held is not None:
        return held
    sent = tx.get_message(team, mid)
    a2a = sent.meta.get("a2a") if sent is not None else None
    if not isinstance(a2a, dict) or not isinstance(a2a.get("task_id"), str):
        return None
    return A2AClaim(team, mid, a2a["task_id"], str(a2a.get("context_id", "")), sent.created_at)


def _copy(message: Message) -> Message:
    out = Message()
    out.CopyFrom(message)
    return out


def _resolve(starting: object) -> None:
    if isinstance(starting, asyncio.Future) and not starting.done():
        starting.set_result(None)


class MemberRequestHandler(DefaultRequestHandler):
    """The SDK's handler, plus resubscription to tasks whose executor is gone (started
    before a restart): the stored task, then its changes as the transcript shows them."""

    def __init__(self, hub: Hub, tasks: HubTaskStore, **kwargs: Any) -> None:
        super().__init__(agent_executor=MemberExecutor(hub, tasks), task_store=tasks, **kwargs)
        self.hub = hub
        self.tasks = tasks
        #: a hub message id (:func:`input_id`) -> resolved once a send that found it not
        #: sent before has stored it, or given up: a send of it meanwhile waits
        self.starting: dict[str, asyncio.Future[None]] = {}

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Message | Task:
        check_encodable(params)
        check_text(params, self.hub.config.max_text)
        repeat = await self._repeat(params, context)
        if repeat is None:
            sent = _copy(params.message)  # the SDK names its new task in it
            try:
                answer: Message | Task = await super().on_message_send(params, context)
            except Claimed as exc:  # a send of it on another hub stored it first
                log.info(
                    "A2A message %s was started as task %s by a send on another hub",
                    exc.claim.message_id,
                    exc.claim.task_id,
                )
                repeat = await self._claimed(exc.claim, sent, context)
                if repeat is None:
                    raise InternalError(f"the task {exc.claim.task_id} of it is gone") from None
            finally:
                self._started(context)
        if repeat is not None:  # sent before: what a send of it answers (or answered)
            at_once = params.configuration.return_immediately
            if isinstance(repeat, Message) or at_once:
                return repeat
            return await self._settled(repeat, context)
        if (
            isinstance(answer, Task)
            and not params.configuration.return_immediately
            and answer.status.state not in TERMINAL | INTERRUPTED
        ):
            # the SDK ends a blocking send with the task as it last saw it when the
            # task's events stop before its end (a cancel ends the executor, and the
            # canceled state is written past the send's subscription): the send answers
            # with the task as it ends, as the cancel and GetTask do
            answer = await self._settled(answer, context)
        return answer

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        check_encodable(params)
        check_text(params, self.hub.config.max_text)
        repeat = await self._repeat(params, context)
        if repeat is None:
            held: A2AClaim | None = None
            sent = _copy(params.message)  # the SDK names its new task in it
            try:
                async for event in super().on_message_send_stream(params, context):
                    yield event
            except Claimed as exc:  # a send of it on another hub stored it first
                log.info(
                    "A2A message %s was started as task %s by a send on another hub",
                    exc.claim.message_id,
                    exc.claim.task_id,
                )
                held = exc.claim
            finally:
                self._started(context)
            if held is None:
                return
            repeat = await self._claimed(held, sent, context)
            if repeat is None:
                raise InternalError(f"the task {held.task_id} of this message is gone")
        # sent before: its task, and its changes from now on
        if isinstance(repeat, Message) or repeat.status.state in TERMINAL | INTERRUPTED:
            yield repeat  # where a stream of the first send ended
            return
        async for event in self.on_subscribe_to_task(SubscribeToTaskRequest(id=repeat.id), context):
            yield event

    def _started(self, context: ServerCallContext) -> None:
        """The send whose :meth:`_repeat` found its message not sent before is over
        (answered, failed, or its caller gone): sends of it that wait look again."""
        starting = context.state.pop(STARTING_KEY, None)
        _resolve(starting)
        mid = context.state.get(INPUT_KEY)
        if mid is not None and self.starting.get(mid) is starting:
            del self.starting[mid]

    async def _repeat(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message | None:
        """The task a message started (or, for a follow-up, went on in) when its caller
        sent it before, or the Message that answered it; None for a message not sent
        before. Another hub's outbox (the message names its chain) that lost the answer
        to a send (a timeout, a cut connection) sends it again with the same
        ``messageId``: the member was handed it once and works on it in that task, and
        the repeat is answered as the send was. Other clients' messages are each a
        message of their own, as the A2A conformance kit expects of a ``messageId`` it
        sends again."""
        message = params.message
        if budget_rules.A2A_CHAIN_KEY not in message.metadata.fields:
            return None  # not a hub's: see docs/decisions.md, "An A2A message sent again"
        who = caller_of(context)
        mid = context.state[INPUT_KEY] = input_id(who, message)
        # a send of it that found it not sent before may not have stored it yet (the two
        # sends raced, the first one's caller gone): wait for that one, then look. The
        # look and the claim are one step of the event loop, so one send claims it
        while (pending := self.starting.get(mid)) is not None and not pending.done():
            await asyncio.shield(pending)
        claim = self.starting[mid] = asyncio.get_running_loop().create_future()
        try:
            held = await self.hub.store.read(lambda tx: claim_of(tx, who.team, mid))
        except BaseException:
            self._drop_claim(mid, claim)
            raise
        if held is None:
            context.state[STARTING_KEY] = claim  # resolved by the executor, or _started
            return None
        self._drop_claim(mid, claim)
        return await self._claimed(held, message, context)

    async def _claimed(
        self, held: A2AClaim, message: Message, context: ServerCallContext
    ) -> Task | Message | None:
        """What a send of ``message``, which started (or went on in) the task ``held``
        names, answers: the task, or the Message the member answered with; from the
        store, whichever hub on it started the task, and after a restart. None if the
        task cannot be answered (a follow-up's task gone)."""
        who = caller_of(context)
        task_id, context_id = held.task_id, held.context_id
        if message.task_id:
            # a follow-up, handed over before: sent to the task again it would wait for an
            # answer after the one the member gave it, or be refused once the task ended
            return await self._followed_up(task_id, context)
        task = await self.tasks.get(task_id, context)
        if task is not None:
            return task
        # a task not shown (none is kept until it is): answered, or to be answered,
        # with a Message, or shown once its member shows work. A task whose executor is
        # not in this process (another hub's, or gone with a restart) is written down
        # from its claim after a while, and answered from the store from then on
        loop = asyncio.get_running_loop()
        adopt_at = loop.time() + ADOPT_AFTER

        async def found() -> tuple[Task | Message | None] | None:
            answer = await read_answer(self.hub, who, task_id, 0)
            if answer is not None and answer.as_message:
                return (reply_message(answer, context_id),)
            task = await self.tasks.get(task_id, context)
            if task is not None:
                return (task,)
            if task_id not in self.tasks.live and loop.time() >= adopt_at:
                return (None,)
            return None

        got = (await watch(self.hub, who.team, found, every=ADOPT_AFTER / 4))[0]
        if got is not None:
            return got
        await self.tasks.adopt(who, held, message)
        return await self.tasks.get(task_id, context)

    def _drop_claim(self, mid: str, claim: asyncio.Future[None]) -> None:
        _resolve(claim)
        if self.starting.get(mid) is claim:
            del self.starting[mid]

    async def _followed_up(self, task_id: str, context: ServerCallContext) -> Task | None:
        """The task a follow-up sent before went on in, once its executor has taken the
        follow-up: while the executor of this process runs, the question the task asked
        before it is no answer to the follow-up."""

        async def taken() -> tuple[Task | None] | None:
            task = await self.tasks.get(task_id, context)
            if task is None:
                return (None,)
            if task_id in self.tasks.live and task.status.state in INTERRUPTED:
                return None
            return (task,)

        return (await watch(self.hub, caller_of(context).team, taken))[0]

    async def _settled(self, task: Task, context: ServerCallContext) -> Task:
        """``task`` once it ends or asks back, as a blocking send answers."""
        last = task

        async def settled() -> Task | None:
            nonlocal last
            if last.status.state in TERMINAL | INTERRUPTED:
                return last
            fresh = await self.tasks.get(last.id, context)
            if fresh is None:
                return last
            last = fresh
            return fresh if fresh.status.state in TERMINAL | INTERRUPTED else None

        return await watch(self.hub, caller_of(context).team, settled)

    async def _changed(self, task: Task, context: ServerCallContext) -> Task | None:
        """The task once its state is no longer ``task``'s; None once it is gone."""

        async def changed() -> tuple[Task | None] | None:
            fresh = await self.tasks.get(task.id, context)
            if fresh is None or fresh.status.state != task.status.state:
                return (fresh,)
            return None

        return (await watch(self.hub, caller_of(context).team, changed))[0]

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        running_here = await self._active_task_registry.get(params.id) is not None
        task: Task | None = await super().on_cancel_task(params, context)
        if task is not None and task.status.state in TERMINAL - {TaskState.TASK_STATE_CANCELED}:
            # the member's answer won the race with this cancel: the task ended as the
            # answer says, which a cancel that came after it would be refused
            raise TaskNotCancelableError(
                f"task {params.id} ended {TaskState.Name(task.status.state)} (the "
                "member answered) before the cancel reached it; read it with GetTask"
            )
        if not running_here and task is not None:
            # started before a restart: no executor was there to end the session
            who = caller_of(context)
            with contextlib.suppress(BackchannelError):
                await self.hub.terminate_session(
                    who.team,
                    who.member,
                    session_for(params.id),
                    f"A2A task canceled by {who.caller}",
                )
        return task

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        if await self._active_task_registry.get(params.id) is not None:
            async for event in super().on_subscribe_to_task(params, context):
                yield event
            return
        task = await self.tasks.get(params.id, context)
        if task is None or task.status.state in TERMINAL:
            async for event in super().on_subscribe_to_task(params, context):
                yield event  # the SDK's errors: not found, terminal
            return
        yield task
        while task.status.state not in TERMINAL | INTERRUPTED:
            fresh = await self._changed(task, context)
            if fresh is None:
                return
            for art in fresh.artifacts[len(task.artifacts) :]:
                yield TaskArtifactUpdateEvent(
                    task_id=fresh.id, context_id=fresh.context_id, artifact=art
                )
            yield TaskStatusUpdateEvent(
                task_id=fresh.id, context_id=fresh.context_id, status=fresh.status
            )
            task = fresh
