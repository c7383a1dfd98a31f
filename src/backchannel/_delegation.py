"""Agents as asynchronous tools: delegate, get the answer back, never hang.

``delegate(to, task)`` returns at once with a pending id. The callee runs an ordinary
session ``{caller_session}--{tool_use_id}`` whose input is the task; its ``agent_stop``
output becomes the caller's tool result, delivered between the caller's turns. The
results of one caller turn's delegations are gathered into one ``tool_result`` message;
a delegation past its deadline yields a synthesized error so no turn hangs, and an
answer arriving after that is delivered as a late result.

Across hubs the task goes to the callee hub's ``/api/chat`` with a reply descriptor
``{"callbackService": NAME, "bearerToken": TOKEN}``; the callee hub POSTs the answer to
the caller hub's ``/api/tools/response``. Both hubs resolve service names in their own
callback registry; a token is signed by the caller hub and works once.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from backchannel._base import JobHandler
from backchannel._outbox import OutboxMixin
from backchannel.core import delegation as rules
from backchannel.core import delivery
from backchannel.errors import InvalidRequest, NotFound, Unauthorized
from backchannel.stores.base import Tx
from backchannel.types import (
    HUB_SENDER,
    Delegation,
    DelegationState,
    InboxMessage,
    Job,
    LedgerEntry,
    MemberKind,
    Message,
    MessageKind,
    Route,
    Session,
    SessionState,
)

CHAT_PATH = "/api/chat"
#: Member kinds whose runtime the hub reaches through hooks, not by starting sessions.
HOOK_KINDS = frozenset({MemberKind.CLAUDE_CODE, MemberKind.CODEX, MemberKind.GEMINI})
RESPONSE_PATH = "/api/tools/response"


class DelegationMixin(OutboxMixin):
    """Delegation (see the module docstring)."""

    async def delegate(
        self,
        team: str,
        member: str,
        session_id: str | None,
        to: str,
        task: str,
        *,
        timeout_s: float | None = None,
        tool_use_id: str | None = None,
    ) -> Delegation:
        """Call ``to`` (a member, or ``agent@service`` on another hub) as a tool. Returns
        at once; the answer arrives later as a ``tool_result`` message."""
        timeout = rules.check_delegate(to, task, timeout_s)
        tuid = tool_use_id or "tu_" + uuid.uuid4().hex[:16]
        delivery.check_message_id(tuid)
        now = self.clock.now()
        remote = "@" in to
        if remote:
            agent, _, service = to.partition("@")
            delivery.check_name("agent", agent)
            svc = self.callbacks.resolve(service)
            if not self.callbacks.secret:
                raise InvalidRequest(
                    "delegating to another hub needs a callback secret to sign the reply "
                    "token; set BACKCHANNEL_CALLBACK_SECRET",
                    field="to",
                )
        else:
            delivery.check_name("recipient", to)

        def fn(tx: Tx) -> Delegation:
            caller = self._timer_session(tx, team, member, session_id)
            if caller.state is not SessionState.ACTIVE:
                raise InvalidRequest(
                    f"delegate from a turn: session {caller.session_id!r} has no open turn",
                    field="session",
                )
            batch = f"{caller.session_id}#{caller.turn}"
            if tx.find_delegation(team, caller_session=caller.session_id, tool_use_id=tuid):
                raise InvalidRequest(
                    f"tool_use_id {tuid!r} was already used in this session", field="tool_use_id"
                )
            d = Delegation(
                team=team,
                delegation_id="dlg_" + uuid.uuid4().hex[:16],
                route=Route.OUTBOUND if remote else Route.LOCAL,
                caller=member,
                caller_session=caller.session_id,
                tool_use_id=tuid,
                callee=to,
                task=task,
                created_at=now,
                deadline=now + timeout,
                batch=batch,
            )
            if remote:
                total = len(tx.list_delegations(team, batch=batch)) + 1
                token = rules.make_token(
                    self.callbacks.secret or "",
                    {
                        "session_id": caller.session_id,
                        "tool_use_id": tuid,
                        "tool_id": f"{team}/{d.delegation_id}",
                        "name": "delegate",
                        "total_tools": total,
                    },
                    now=now,
                    ttl=timeout + rules.TOKEN_GRACE,
                )
                tx.insert_delegation(d)
                self._enqueue_post(
                    tx,
                    team,
                    service=svc.name,
                    path=CHAT_PATH,
                    body={
                        "agent": agent,
                        "message": task,
                        "session_id": caller.session_id,
                        "tool_use_id": tuid,
                        "timeout_s": timeout,
                        "reply": {
                            "callbackService": self.callbacks.service_name,
                            "bearerToken": token,
                        },
                    },
                    bearer=svc.token,
                    purpose="chat",
                    ref=f"{team}/{d.delegation_id}",
                    now=now,
                )
            else:
                if tx.get_member(team, to) is None:
                    raise delivery.unknown_recipient(
                        to, team, [m.name for m in tx.list_members(team)]
                    )
                if to == member:
                    raise InvalidRequest("delegate to another member, not yourself", field="to")
                d = dataclasses.replace(
                    d, callee_session=rules.sub_session(caller.session_id, tuid)
                )
                tx.insert_delegation(d)
                self._start_callee(tx, d, sender=member, now=now)
            tx.add_job(
                Job(
                    team,
                    rules.DEADLINE_JOB,
                    d.deadline,
                    now,
                    caller.session_id,
                    {"delegation_id": d.delegation_id},
                )
            )
            self._scheduled.append(d.deadline)
            return d

        d = await self.store.transact(fn)
        self._flush_due()
        if d.callee_session:
            self._waiters.notify(team, d.callee)
        return d

    def _start_callee(self, tx: Tx, d: Delegation, *, sender: str, now: float) -> None:
        """Open the callee's session for this request and give it the task.

        Agents attached through hooks (Claude Code, Codex, Gemini) cannot be started in a
        new session by the hub: their task goes to the member, and whichever session of
        theirs takes it answers it with its next ``agent_stop``."""
        assert d.callee_session is not None
        callee = d.callee.partition("@")[0]
        member = tx.get_member(d.team, callee)
        pinned: str | None = d.callee_session
        if member is not None and member.kind in HOOK_KINDS:
            pinned = None
        elif tx.get_session(d.team, d.callee_session) is None:
            tx.put_session(Session(d.team, d.callee_session, callee, SessionState.IDLE, now, now))
        # the reply route stays in the delegation record, never in the message
        msg = Message(
            team=d.team,
            message_id=f"task-{d.delegation_id}",
            sender=sender,
            to=callee,
            text=d.task,
            kind=MessageKind.DELEGATION,
            created_at=now,
            fingerprint=delivery.fingerprint(sender, callee, d.task, None, "delegation", pinned),
            meta={"delegation_id": d.delegation_id},
        )
        self._insert(tx, msg, pinned)

    def _after_lease(
        self, tx: Tx, session: Session, got: Sequence[InboxMessage], now: float
    ) -> None:
        super()._after_lease(tx, session, got, now)
        for m in got:
            did = m.message.meta.get("delegation_id")
            if m.message.kind is MessageKind.DELEGATION and isinstance(did, str):
                d = tx.get_delegation(session.team, did)
                if d is not None and d.callee_session != session.session_id:
                    tx.update_delegation(dataclasses.replace(d, callee_session=session.session_id))

    async def list_delegations(self, team: str, *, member: str | None = None) -> list[Delegation]:
        return await self.store.read(lambda tx: tx.list_delegations(team, member=member))

    async def get_delegation(self, team: str, delegation_id: str) -> Delegation:
        d = await self.store.read(lambda tx: tx.get_delegation(team, delegation_id))
        if d is None:
            raise NotFound(f"unknown delegation {delegation_id!r} in team {team!r}")
        return d

    # -- the callee hub: a task arrives from another hub ------------------------------
    async def accept_chat(
        self,
        team: str,
        caller: str,
        agent: str,
        message: str,
        *,
        reply_service: str,
        reply_token: str,
        session_id: str | None = None,
        tool_use_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Delegation:
        """``POST /api/chat``: run ``agent`` on ``message`` and send its answer to
        ``reply_service``. Idempotent on ``(session_id, tool_use_id)``."""
        self.callbacks.resolve(reply_service)  # refused at ingress when unknown
        if not isinstance(reply_token, str) or not reply_token:
            raise InvalidRequest("reply.bearerToken is missing", field="reply.bearerToken")
        timeout = rules.check_delegate(agent, message, timeout_s)
        delivery.check_name("agent", agent)
        caller_session = (
            delivery.check_session_id(session_id)
            if session_id
            else "remote-" + uuid.uuid4().hex[:12]
        )
        tuid = tool_use_id or "tu_" + uuid.uuid4().hex[:16]
        now = self.clock.now()

        def fn(tx: Tx) -> Delegation:
            known = tx.find_delegation(team, caller_session=caller_session, tool_use_id=tuid)
            if known is not None:
                return known
            if tx.get_member(team, agent) is None:
                raise delivery.unknown_recipient(
                    agent, team, [m.name for m in tx.list_members(team)]
                )
            d = Delegation(
                team=team,
                delegation_id="dlg_" + uuid.uuid4().hex[:16],
                route=Route.INBOUND,
                caller=caller,
                caller_session=caller_session,
                tool_use_id=tuid,
                callee=agent,
                task=message,
                created_at=now,
                deadline=now + timeout,
                batch=f"{caller_session}#inbound",
                callee_session=rules.sub_session(caller_session, tuid),
                reply_service=reply_service,
                reply_token=reply_token,
            )
            tx.insert_delegation(d)
            self._start_callee(tx, d, sender=caller, now=now)
            return d

        d = await self.store.transact(fn)
        self._waiters.notify(team, agent)
        return d

    # -- the caller hub: an answer arrives from another hub -----------------------------
    async def accept_tool_response(self, token: str, result: Any) -> Delegation:
        """``POST /api/tools/response``: verify the one-time token and deliver ``result``.
        A tampered, expired or replayed token is refused (``Unauthorized``)."""
        now = self.clock.now()
        claims = rules.verify_token(self.callbacks.secret, token, now=now)
        team, _, delegation_id = str(claims["tool_id"]).partition("/")
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        delivery.check_text(text, self.config.max_text)

        def fn(tx: Tx) -> Delegation:
            if not tx.spend_token(str(claims["jti"]), float(claims["exp"])):
                raise Unauthorized("this callback token was already used; a token works once")
            d = tx.get_delegation(team, delegation_id)
            if d is None or (d.caller_session, d.tool_use_id) != (
                claims["session_id"],
                claims["tool_use_id"],
            ):
                raise Unauthorized("this callback token matches no delegation of this hub")
            return self._resolve(tx, d, text, now)

        d = await self.store.transact(fn)
        self._waiters.notify(d.team, d.caller)
        return d

    # -- resolving ------------------------------------------------------------------------
    def _resolve(self, tx: Tx, d: Delegation, result: str, now: float) -> Delegation:
        """An answer for a caller of this hub: the tool result, or a late result."""
        if d.state is DelegationState.PENDING:
            d = dataclasses.replace(
                d, state=DelegationState.ANSWERED, result=result, answered_at=now
            )
            tx.update_delegation(d)
            self._deliver_batch(tx, d.team, d.batch, now)
        elif d.state is DelegationState.TIMED_OUT:
            d = dataclasses.replace(d, state=DelegationState.LATE, result=result, answered_at=now)
            tx.update_delegation(d)
            self._tool_result(
                tx,
                d,
                rules.late_text(d),
                {"late": True, "results": [rules.result_of(d) | {"result": result}]},
                now,
            )
        return d

    def _deliver_batch(self, tx: Tx, team: str, batch: str, now: float) -> None:
        """Once none of a caller turn's delegations is pending (and that turn is over),
        give the caller all their results in one message."""
        ds = tx.list_delegations(team, batch=batch)
        if not ds or any(x.state is DelegationState.PENDING for x in ds):
            return
        caller = tx.get_session(team, ds[0].caller_session)
        if (
            caller is not None
            and caller.state is SessionState.ACTIVE
            and f"{caller.session_id}#{caller.turn}" == batch
        ):
            return  # the turn that delegated is still running: gathered at its agent_stop
        if tx.get_message(team, f"results-{batch}") is not None:
            return  # delivered already
        self._tool_result(
            tx,
            ds[0],
            rules.results_text(ds),
            {"results": [rules.result_of(x) for x in ds]},
            now,
            message_id=f"results-{batch}",
        )

    def _tool_result(
        self,
        tx: Tx,
        d: Delegation,
        text: str,
        meta: dict[str, Any],
        now: float,
        *,
        message_id: str | None = None,
    ) -> None:
        caller = tx.get_session(d.team, d.caller_session)
        pinned = (
            d.caller_session
            if caller is not None and caller.state is not SessionState.TERMINATED
            else None
        )
        msg = Message(
            team=d.team,
            message_id=message_id or f"late-{d.delegation_id}",
            sender=HUB_SENDER,
            to=d.caller,
            text=text,
            kind=MessageKind.TOOL_RESULT,
            created_at=now,
            fingerprint=delivery.fingerprint(
                HUB_SENDER, d.caller, text, None, "tool_result", pinned, meta
            ),
            summary=text.splitlines()[0][:120],
            meta=meta,
        )
        if tx.get_message(d.team, msg.message_id) is None:
            self._insert(tx, msg, pinned)

    def _fire_deadline(self, tx: Tx, job: Job, now: float) -> Iterable[tuple[str, str]]:
        d = tx.get_delegation(job.team, str(job.payload.get("delegation_id")))
        if d is None or d.state is not DelegationState.PENDING:
            return ()
        timed_out = dataclasses.replace(
            d, state=DelegationState.TIMED_OUT, error=rules.timeout_error(d)["error"]
        )
        tx.update_delegation(timed_out)
        self._deliver_batch(tx, d.team, d.batch, now)
        return ((d.team, d.caller),)

    def _job_handlers(self) -> dict[str, JobHandler]:
        return {**super()._job_handlers(), rules.DEADLINE_JOB: self._fire_deadline}

    # -- turns: the callee's answer, the caller's gathering ---------------------------------
    def _after_stop(
        self,
        tx: Tx,
        session: Session,
        output: str,
        checkpoint_turn: bool,
        ledger: Sequence[LedgerEntry],
        now: float,
        woken: set[tuple[str, str]],
    ) -> dict[str, Any]:
        extra = super()._after_stop(tx, session, output, checkpoint_turn, ledger, now, woken)
        d = tx.find_delegation(session.team, callee_session=session.session_id)
        if (
            d is not None
            and not checkpoint_turn
            and d.state in (DelegationState.PENDING, DelegationState.TIMED_OUT)
        ):
            if d.route is Route.INBOUND:
                answered = dataclasses.replace(
                    d, state=DelegationState.ANSWERED, result=output, answered_at=now
                )
                tx.update_delegation(answered)
                self._enqueue_post(
                    tx,
                    d.team,
                    service=d.reply_service or "",
                    path=RESPONSE_PATH,
                    body={"result": output},
                    bearer=d.reply_token,
                    purpose="reply",
                    ref=f"{d.team}/{d.delegation_id}",
                    now=now,
                )
            else:
                self._resolve(tx, d, output, now)
                woken.add((d.team, d.caller))
            extra = {**extra, "answered_delegation": d.delegation_id}
        # the turn that delegated has ended: deliver its results if they are all in
        self._deliver_batch(tx, session.team, f"{session.session_id}#{session.turn}", now)
        return extra

    # -- the outbox's verdicts ----------------------------------------------------------------
    def _outbox_dead(self, tx: Tx, job: Job, reason: str, now: float) -> None:
        super()._outbox_dead(tx, job, reason, now)
        team, _, delegation_id = str(job.payload.get("ref", "")).partition("/")
        d = tx.get_delegation(team, delegation_id)
        if d is None:
            return
        purpose = job.payload.get("purpose")
        if purpose == "chat" and d.state is DelegationState.PENDING:
            failed = dataclasses.replace(
                d,
                state=DelegationState.FAILED,
                error=f"the callee's hub refused the task: {reason}",
                answered_at=now,
            )
            tx.update_delegation(failed)
            self._deliver_batch(tx, team, d.batch, now)
        elif purpose == "reply":
            failed = dataclasses.replace(
                d,
                state=DelegationState.FAILED,
                error=f"the answer could not be delivered: {reason}",
            )
            tx.update_delegation(failed)
            # the callee's operator sees why, in the callee's inbox and the dashboard
            text = (
                f"Your answer to {d.caller}'s request {d.tool_use_id} could not be delivered to "
                f"{d.reply_service}: {reason}."
            )
            msg = Message(
                team=team,
                message_id=f"undeliverable-{d.delegation_id}",
                sender=HUB_SENDER,
                to=d.callee,
                text=text,
                kind=MessageKind.SYSTEM,
                created_at=now,
                fingerprint=delivery.fingerprint(HUB_SENDER, d.callee, text, None, "system"),
                summary=f"answer to {d.caller} undeliverable",
                meta={"delegation_id": d.delegation_id, "reason": reason},
            )
            if tx.get_message(team, msg.message_id) is None:
                self._insert(tx, msg, None)
