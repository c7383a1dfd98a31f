"""Delegating to an A2A agent: ``delegate(to="agent@service")`` where ``service`` is a
callback-registry entry of ``type: a2a`` (needs ``a2a-sdk``).

The outbox runs the call like any of its POSTs (durable, leased, retried with backoff):
the official A2A client reads the agent card at the registered URL, sends the task as
one message (``returnImmediately``, so no connection is held open for long) and follows
the task by polling ``GetTask`` until it ends. The remote task id is kept in the job,
so a hub that restarts mid-call follows the same task instead of sending it again.

* The final answer (the task's artifacts' text, or its status message, or a Message
  answer) resolves the delegation: the caller's tool result, or a late result after the
  deadline, exactly as for a member of this hub.
* ``input-required`` ends the call too: the agent's question is the result.
* ``failed``, ``rejected``, ``canceled`` fail the delegation with the agent's words; a
  ``rejected`` task (another hub's budget refused it) is a refusal the caller hears as
  such, never retried.
* Connection errors, timeouts, 408/425/429/5xx are retried; other refusals are final.

The message names the conversation chain the task goes on in, as ``/api/chat``'s
``chain`` does, in its ``metadata`` under ``"backchannel.chain"`` (``{"id", "hop"}``): a
backchannel hub on the other side continues that chain, so two hubs whose agents always
delegate to each other over A2A stop at the chain budget. Other agents ignore it.

The hub only talks to the registered service: redirects are never followed, and an
agent card whose interfaces point to another origin is refused. Its answers are bounded
as all of the hub's are (:mod:`backchannel.outbound`): one too large, compressed or never
ended fails the call, named, and the address's password and the token are in no
reason. It never asks the agent for push notifications, so no request can make the
agent call an address of its choosing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from backchannel import outbound
from backchannel.core import delegation as rules
from backchannel.core.budget import A2A_CHAIN_KEY, ChainRef, check_chain
from backchannel.errors import InvalidRequest
from backchannel.types import Job

if TYPE_CHECKING:
    from a2a.client import Client
    from a2a.types.a2a_pb2 import AgentCard, Task
    from google.protobuf.struct_pb2 import Struct

    from backchannel.callbacks import Service
    from backchannel.hub.outbox import Outbox

log = logging.getLogger("backchannel.a2a")

POLL_START, POLL_CAP = 0.2, 5.0
#: The most one request to the agent (its card, a send, a poll) takes, its answer read.
REQUEST_DEADLINE = 60.0
GIVE_UP_AFTER = rules.TOKEN_GRACE  # past the deadline, a late answer is no longer awaited
#: how a delegation's error begins when the agent rejected the task (its refusal)
REJECTED = "the A2A agent rejected the task"
#: an agent that took the task and never finished it
LATE = (
    "no answer long after the deadline: the A2A agent took the task and had not finished it "
    f"{GIVE_UP_AFTER:g} s past the delegation's deadline, so it was given up on"
)


class _Final(Exception):
    """The call is over with this outcome (``DEAD`` or ``RETRY``) and detail."""

    def __init__(
        self, outcome: rules.Outcome, detail: str, *, reached: bool = True, refused: bool = False
    ) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail
        self.reached = reached  # False: no answer came (connection, name, TLS, timeout)
        self.refused = refused  # True: the agent's server refused it (an HTTP status)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def check_card(card: AgentCard, base: str) -> None:
    """Refuse a card that sends the hub anywhere but the registered service."""
    if not card.supported_interfaces:
        raise _Final(rules.Outcome.DEAD, "the A2A agent's card lists no interface")
    for iface in card.supported_interfaces:
        if _origin(iface.url) != _origin(base):
            raise _Final(
                rules.Outcome.DEAD,
                f"the A2A agent's card points to {iface.url!r}, outside the registered service "
                f"{base!r}; register that address instead",
            )


def answer_text(task: Task) -> str:
    texts = [p.text for a in task.artifacts for p in a.parts if p.WhichOneof("content") == "text"]
    if texts:
        return "\n".join(texts)
    return "\n".join(p.text for p in task.status.message.parts if p.WhichOneof("content") == "text")


def _named_chain(*places: Struct) -> ChainRef | None:
    """The conversation chain an answer names in its metadata (``"backchannel.chain"``, the
    first of ``places`` that has it): a backchannel hub on the other side names the chain
    its member's turn went on in, one hop further. A whole double is the whole number it
    spells (metadata is a protobuf ``Struct``); one that is not a chain is left out, since
    the answer is owed whatever its metadata says."""
    from google.protobuf.json_format import MessageToDict

    for meta in places:
        if A2A_CHAIN_KEY not in meta.fields:
            continue
        value = MessageToDict(meta).get(A2A_CHAIN_KEY)
        if isinstance(value, dict) and isinstance(value.get("hop"), float):
            hop = value["hop"]
            value = {**value, "hop": int(hop) if hop.is_integer() else hop}
        try:
            return check_chain(value)
        except InvalidRequest:
            log.info("an A2A answer named an unusable chain: %r", value)
            return None
    return None


def task_chain(task: Task) -> ChainRef | None:
    """The chain a finished task's answer names: on the task, its status or message, or
    an artifact."""
    return _named_chain(
        task.metadata,
        task.status.message.metadata,
        *(a.metadata for a in reversed(task.artifacts)),
    )


def _classify(exc: BaseException) -> _Final:
    from a2a.client.errors import A2AClientTimeoutError, AgentCardResolutionError

    detail = f"{type(exc).__name__}: {exc}"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, outbound.AnswerRefused):
            # too large, compressed, or never ended: the same agent answers the same
            said = detail if str(cause) in detail else f"{detail}: {cause}"
            return _Final(rules.Outcome.DEAD, f"the A2A agent's answer was not taken: {said}")
        cause = cause.__cause__
    status: int | None = None
    if isinstance(exc, AgentCardResolutionError):
        status = exc.status_code
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPStatusError):
        status = cause.response.status_code
    if status is not None:
        return _Final(rules.classify(status), detail, refused=True)
    if isinstance(exc, A2AClientTimeoutError | httpx.HTTPError) or isinstance(
        cause, httpx.HTTPError
    ):
        return _Final(rules.Outcome.RETRY, detail, reached=False)
    return _Final(rules.Outcome.DEAD, f"the call to the A2A agent failed: {detail}")


async def _follow(client: Client, task: Task, payload: dict[str, Any], remember: Any) -> Task:
    from a2a.types.a2a_pb2 import GetTaskRequest, TaskState

    ongoing = (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    if task.id:
        await remember(task.id)
    pause = POLL_START
    while task.status.state in ongoing:
        await asyncio.sleep(pause)
        pause = min(pause * 2, POLL_CAP)
        task = await client.get_task(GetTaskRequest(id=task.id))
        await remember(task.id)  # the agent answered: its task is alive
    return task


async def call(
    svc: Service,
    agent: str,
    text: str,
    message_id: str,
    payload: dict[str, Any],
    remember: Any,
    chain: Any = None,
) -> tuple[bool, str, ChainRef | None]:
    """Send ``text`` to the agent and wait for its end: ``(answered, text, chain)``;
    ``answered`` is False when the agent's task failed (``text`` says why). ``chain``
    (``{"id", "hop"}``): the conversation chain the task goes on in, named in the
    message's metadata; the chain returned is the one the answer names (None: none)."""
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
    from a2a.types.a2a_pb2 import (
        GetTaskRequest,
        Message,
        Part,
        Role,
        SendMessageConfiguration,
        SendMessageRequest,
        TaskState,
    )

    base = svc.agent_url(agent)
    headers = {"Authorization": f"Bearer {svc.token}"} if svc.token else {}
    async with outbound.client(deadline=REQUEST_DEADLINE, headers=headers, timeout=30.0) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        check_card(card, base)
        config = ClientConfig(
            streaming=False,
            httpx_client=http,
            supported_protocol_bindings=["JSONRPC", "HTTP+JSON"],
        )
        client = ClientFactory(config).create(card)
        known = payload.get("a2a_task")
        if isinstance(known, str) and known:
            task = await client.get_task(GetTaskRequest(id=known))
        else:
            message = Message(role=Role.ROLE_USER, message_id=message_id, parts=[Part(text=text)])
            if isinstance(chain, dict):
                message.metadata.update({A2A_CHAIN_KEY: chain})
            request = SendMessageRequest(
                message=message,
                configuration=SendMessageConfiguration(return_immediately=True),
            )
            got = None
            async for event in client.send_message(request):
                got = event
            if got is None:
                raise _Final(
                    rules.Outcome.DEAD, "the A2A agent answered with neither a task nor a message"
                )
            if got.HasField("message"):
                said = "\n".join(
                    p.text for p in got.message.parts if p.WhichOneof("content") == "text"
                )
                return True, said, _named_chain(got.message.metadata)
            task = got.task
        task = await _follow(client, task, payload, remember)
    state = task.status.state
    words = answer_text(task)
    if state == TaskState.TASK_STATE_COMPLETED:
        return True, words, task_chain(task)
    if state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED):
        return True, f"[the agent asks back] {words}", task_chain(task)
    if state == TaskState.TASK_STATE_REJECTED:
        # the agent will not take the task (another hub: a spent budget): a refusal,
        # final like any other, in the agent's words, which name the way out
        return False, REJECTED + (f": {words}" if words else ""), None
    name = TaskState.Name(state).removeprefix("TASK_STATE_").lower()
    return False, f"the A2A agent's task ended {name}" + (f": {words}" if words else ""), None


async def run_a2a_job(hub: Outbox, job: Job, svc: Service) -> None:
    """The outbox's part for ``type: a2a`` services (see the module docstring)."""
    p = dict(job.payload)
    try:
        import a2a.client  # noqa: F401
    except ImportError:
        detail = (
            f"this hub did not send the task: service {svc.name!r} is an A2A agent and "
            "a2a-sdk is not installed where the hub runs: pip install 'backchannel[a2a]' "
            "there, restart the hub, then delegate again"
        )
        await hub.finish(job, rules.Outcome.DEAD, detail, None, refused=False)
        return
    if p.get("purpose") != "chat":
        detail = f"service {svc.name!r} is an A2A agent: it takes tasks, not {p.get('purpose')}"
        await hub.finish(job, rules.Outcome.DEAD, detail, None, refused=False)
        return
    body = p["body"]
    team, _, delegation_id = str(p.get("ref", "")).partition("/")
    lease = hub.callbacks.retry.timeout + 5.0

    give_up_at = float("inf")  # set once the delegation is read

    async def remember(task_id: str) -> None:
        if hub.clock.now() > give_up_at:  # a task that stays working is not followed forever
            raise _Final(rules.Outcome.DEAD, LATE)
        # the agent answered about its task: the retry budget is for failures in a row,
        # so a fault after the agent worked longer than the budget is retried, not fatal
        # (the outbox starts the budget again at the next failure)
        p["first_at"], p["attempt"] = None, 0
        if p.get("a2a_task") != task_id:
            p["a2a_task"] = task_id
            await keep_leased()

    async def keep_leased() -> None:
        now = hub.clock.now()
        await hub.store.transact(lambda tx: tx.reschedule_job(job.job_id, now + lease, p))

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(lease / 2)
            await keep_leased()

    beat = asyncio.create_task(heartbeat())
    try:
        d = await hub.store.read(lambda tx: tx.get_delegation(team, delegation_id))
        if d is None:
            raise _Final(rules.Outcome.DEAD, f"unknown delegation {delegation_id!r}")
        give_up_at = d.deadline + GIVE_UP_AFTER
        if hub.clock.now() > give_up_at:
            raise _Final(rules.Outcome.DEAD, LATE)
        answered, text, named = await call(
            svc,
            str(body["agent"]),
            str(body["message"]),
            delegation_id,
            p,
            remember,
            body.get("chain"),
        )
    except _Final as final:
        await hub.finish(
            dataclasses.replace(job, payload=p),
            final.outcome,
            final.detail,
            None,
            reached=final.reached,
            refused=final.refused,
        )
        return
    except Exception as exc:  # the client's errors: retried or final, as HTTP would be
        verdict = _classify(exc)
        log.info(
            "A2A call for %s: %s", p.get("ref"), outbound.scrub(verdict.detail, svc.url, svc.token)
        )
        await hub.finish(
            dataclasses.replace(job, payload=p),
            verdict.outcome,
            verdict.detail,
            None,
            reached=verdict.reached,
            refused=verdict.refused,
        )
        return
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    if not answered:  # a rejection is the agent's refusal; a task that ended, its end
        await hub.finish(
            dataclasses.replace(job, payload=p),
            rules.Outcome.DEAD,
            text,
            None,
            refused=text.startswith(REJECTED),
        )
        return
    room = max(1024, hub.config.max_text - 4096)  # the tool result wraps the answer
    if len(text.encode()) > room:
        text = text.encode()[:room].decode(errors="ignore") + "\n[answer cut at the size limit]"
    await hub.answered(job, text, named)
