"""Agents as asynchronous tools: delegate, get the answer back, never hang.

``delegate(to, task)`` returns at once with a pending id. The callee runs an ordinary
session ``{caller_session}--{tool_use_id}`` whose input is the task, framed like any
message from its teammate; its ``agent_stop`` output (or, when it has no text outside
``<message>`` blocks, its blocks to the caller) becomes the caller's tool result,
delivered between the caller's turns. The results of one caller turn's delegations are
gathered into one ``tool_result`` message; a delegation past its deadline yields a
synthesized error so no turn hangs, and an answer arriving after that is delivered as
a late result.

Across hubs the task goes to the callee hub's ``/api/chat`` when the caller's turn ends
(the reply token counts the turn's delegations), with a reply descriptor
``{"callbackService": NAME, "bearerToken": TOKEN}``; the callee hub POSTs the answer to
the caller hub's ``/api/tools/response``. The callee hub keeps such a request per caller
(the member whose token sent it), in the sub-session
``{caller}:{session_id}--{tool_use_id}``. Both hubs resolve service names in their own
callback registry; a token is signed by the caller hub and is spent by the first
answer: a repeat of that answer is acknowledged, a different one refused (409).
Finished delegations are forgotten after the retention period.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from backchannel.core import budget as budget_rules
from backchannel.core import delegation as rules
from backchannel.core import messages, notices, turns
from backchannel.errors import (
    BudgetExhausted,
    Conflict,
    InvalidRequest,
    NotFound,
    ServiceNotAllowed,
    Unauthorized,
    UnknownService,
)
from backchannel.hub.context import Ctx, Env, JobHandler, JobOutcome
from backchannel.hub.outbox import Outbox
from backchannel.hub.pipeline import Pipeline
from backchannel.hub.quotas import Quotas
from backchannel.hub.timers import Timers
from backchannel.stores.base import Tx
from backchannel.types import (
    Delegation,
    DelegationState,
    InboxMessage,
    Job,
    MemberKind,
    MessageKind,
    Route,
    Session,
    SessionState,
)

CHAT_PATH = "/api/chat"
#: Member kinds whose runtime the hub reaches through hooks, not by starting sessions.
HOOK_KINDS = frozenset({MemberKind.CLAUDE_CODE, MemberKind.CODEX, MemberKind.GEMINI})
RESPONSE_PATH = "/api/tools/response"
#: What an ``Authorization: Bearer`` value may hold: visible ASCII, no spaces.
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")


class Delegations:
    """Delegation (see the module docstring)."""

    def __init__(
        self,
        env: Env,
        timers: Timers,
        quotas: Quotas,
        outbox: Outbox,
        pipeline: Pipeline,
    ) -> None:
        self.env = env
        self.store, self.clock, self.config = env.store, env.clock, env.config
        self.timers = timers  # which session a delegation comes from
        self.quotas = quotas
        self.outbox = outbox
        self.callbacks = outbox.callbacks
        self.pipeline = pipeline

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
        at once; the answer arrives later as a ``tool_result`` message.

        Idempotent on ``tool_use_id`` within the caller's session: the same call again
        (made again when its answer was lost) answers the delegation it made, marked
        ``replayed``, and a different task or callee under it is refused (``Conflict``)."""
        timeout = rules.check_delegate(to, task, timeout_s)
        tuid = tool_use_id or "tu_" + uuid.uuid4().hex[:16]
        messages.check_message_id(tuid, "tool_use_id")
        now = self.clock.now()
        remote = "@" in to
        if remote:
            agent, _, service = to.partition("@")
            messages.check_name("agent", agent)
            svc = self.callbacks.resolve(  # one this team may use
                service, team=team, teams_in_hub=await self._teams_in_hub()
            )
            if not self.callbacks.secret and svc.kind != "a2a":  # A2A answers come back inline
                raise InvalidRequest(
                    "delegating to another hub needs a callback secret to sign the reply "
                    "token; set BACKCHANNEL_CALLBACK_SECRET",
                    field="to",
                )
        else:
            messages.check_name("recipient", to)

        def fn(c: Ctx) -> Delegation:
            tx = c.tx
            caller = self.timers.session_for(c, team, member, session_id, "delegation")
            known = tx.find_delegation(team, caller_session=caller.session_id, tool_use_id=tuid)
            if known is not None:
                if (known.callee, known.task) == (to, task):
                    # this call, made again (its answer was lost): said, so that the
                    # caller knows it is the one delegation, answered once
                    return dataclasses.replace(known, replayed=True)
                raise Conflict(
                    f"tool_use_id {tuid!r} was already used in session {caller.session_id!r} "
                    f"for another delegation ({known.delegation_id} to {known.callee}); give "
                    "each call its own tool_use_id",
                    field="tool_use_id",
                )
            if caller.state is not SessionState.ACTIVE:
                raise InvalidRequest(
                    f"delegate from a turn: session {caller.session_id!r} has no open turn",
                    field="session",
                )
            batch = f"{caller.session_id}#{caller.turn}"
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
                # refused like a task for a member of this hub when it would go past the
                # chain budget (the task carries the turn's chain to the other hub)
                budgets = self.pipeline.budgets
                budgets.check_service_member(tx, team, svc.name, svc.member)
                _, refusal = budgets.outbound_chain(c, team, member, caller, to, now)
                if refusal is None:  # and like a send to it when the pair is spent
                    party = budgets.remote_party(tx, team, to, svc.member)
                    refusal = budgets.across(c, team, member, party, now, refusable=True)
                if refusal is not None:
                    raise BudgetExhausted(refusal.text, **refusal.details())
                # sent when the caller's turn ends, when the turn's count of delegations
                # (the token's ``total_tools``) is known
                tx.insert_delegation(d)
            else:
                if tx.get_member(team, to) is None:
                    raise messages.unknown_recipient(
                        to, team, [m.name for m in tx.list_members(team)]
                    )
                if to == member:
                    raise InvalidRequest("delegate to another member, not yourself", field="to")
                self.quotas.check_inbox(c, team, member, to)  # a task is a queued message
                d = dataclasses.replace(
                    d, callee_session=rules.sub_session(caller.session_id, tuid)
                )
                tx.insert_delegation(d)
                self._start_callee(c, d, sender=member, now=now)
            self._keep_pruned(c, team, now)
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
            c.schedule(d.deadline)
            return d

        return await self.env.transact(fn)

    def _batch_over(self, c: Ctx, team: str, batch: str, now: float) -> None:
        """The caller's turn ``batch`` is over: its tasks for other hubs go out, and its
        results, if all are in, are delivered. The batch is read once when no task goes
        out (nothing changed it in between): most turns delegate nothing."""
        ds = c.tx.list_delegations(team, batch=batch)
        if any(d.route is Route.OUTBOUND and d.state in rules.OPEN_STATES for d in ds):
            self._dispatch_batch(c, team, ds, now)
            self._deliver_batch(c, team, batch, now)
        else:
            self._deliver_batch(c, team, batch, now, ds)

    def _dispatch_batch(self, c: Ctx, team: str, ds: list[Delegation], now: float) -> None:
        """Send the tasks for other hubs of a batch ``ds`` whose turn is over, each with a
        reply token whose ``total_tools`` is the number of delegations the turn issued.
        A turn ends once, so this runs once per batch."""
        for d in ds:
            if d.route is not Route.OUTBOUND or d.state not in rules.OPEN_STATES:
                continue
            agent, _, service = d.callee.partition("@")
            try:
                svc = self.callbacks.resolve(service, team=team, teams_in_hub=c.tx.count_teams())
            except (UnknownService, ServiceNotAllowed) as exc:  # the registry changed since
                # this hub's own registry stopped it: the callee's hub never saw the task
                self._failed(c, d, f"this hub did not send the task: {exc.message}", now)
                continue
            caller = c.tx.get_session(team, d.caller_session)
            chain, refusal = (
                self.pipeline.budgets.outbound_chain(c, team, d.caller, caller, d.callee, now)
                if caller is not None
                else (None, None)
            )
            if refusal is not None:  # the turn's chain went further after the call
                self._failed(c, d, refusal.text, now)
                continue
            token = rules.make_token(
                self.callbacks.secret or "",
                {
                    "session_id": d.caller_session,
                    "tool_use_id": d.tool_use_id,
                    "tool_id": f"{team}/{d.delegation_id}",
                    "name": "delegate",
                    "total_tools": len(ds),
                },
                now=now,
                ttl=max(0.0, d.deadline - now) + rules.TOKEN_GRACE,
            )
            self.outbox.enqueue(
                c,
                team,
                service=svc.name,
                path=CHAT_PATH,
                body={
                    "agent": agent,
                    "message": d.task,
                    "session_id": d.caller_session,
                    "tool_use_id": d.tool_use_id,
                    "timeout_s": max(1.0, round(d.deadline - now, 3)),
                    "reply": {
                        "callbackService": self.callbacks.service_name,
                        "bearerToken": token,
                    },
                    # the chain the task goes on in, so the other hub's budget sees it
                    **({"chain": budget_rules.chain_wire(chain)} if chain else {}),
                },
                bearer=svc.token,
                purpose="chat",
                ref=f"{team}/{d.delegation_id}",
                now=now,
            )

    def _refused(self, c: Ctx, d: Delegation, reason: str, now: float) -> None:
        """The callee's hub answered the task with a refusal (quoted in ``reason``): the
        delegation failed (its batch is told)."""
        self._failed(c, d, f"the callee's hub refused the task: {reason}", now)

    def _unreached(self, c: Ctx, d: Delegation, service: str, reason: str, now: float) -> None:
        """No answer came from the callee's hub (a connection refused, a name not
        resolved, TLS, a timeout): it never saw the task, so this is not its refusal. The
        delegation failed with the cause and the way out (its batch is told)."""
        self._failed(c, d, rules.unreachable_error(service, reason), now)

    def _failed(self, c: Ctx, d: Delegation, error: str, now: float) -> None:
        """The task is not sent: the delegation failed with ``error`` (its batch is told)."""
        failed = dataclasses.replace(d, state=DelegationState.FAILED, error=error, answered_at=now)
        c.tx.update_delegation(failed)
        self._deliver_batch(c, d.team, d.batch, now)

    def turn_over(self, c: Ctx, session: Session, turn: int, now: float) -> None:
        """A turn that delegated is over: its tasks for other hubs go out, and its
        results, if all are in, are delivered."""
        self._batch_over(c, session.team, f"{session.session_id}#{turn}", now)

    def _start_callee(
        self,
        c: Ctx,
        d: Delegation,
        *,
        sender: str,
        now: float,
        chain: budget_rules.ChainRef | None = None,
    ) -> None:
        """Open the callee's session for this request and give it the task. A task from
        another hub goes on in the ``chain`` it named, or starts one at hop 0.

        Agents attached through hooks (Claude Code, Codex, Gemini) cannot be started in a
        new session by the hub: their task goes to the member, and whichever session of
        theirs takes it answers it with its next ``agent_stop``."""
        assert d.callee_session is not None
        tx = c.tx
        callee = d.callee.partition("@")[0]
        member = tx.get_member(d.team, callee)
        pinned: str | None = d.callee_session
        if member is not None and member.kind in HOOK_KINDS:
            pinned = None
        elif tx.get_session(d.team, d.callee_session) is None:
            tx.put_session(Session(d.team, d.callee_session, callee, SessionState.IDLE, now, now))
        # a local caller's task goes on in the chain of the turn that delegated
        turn = d.caller_session if d.route is Route.LOCAL else None
        msg = notices.task(d.team, sender, callee, d.task, d.delegation_id, pinned, now, turn)
        if d.route is Route.INBOUND:
            chain = chain or budget_rules.ChainRef(msg.message_id, 0)
            msg = msg.in_chain(chain.chain_id, chain.hop)
        self.pipeline.insert(c, msg, pinned)

    def on_lease(self, c: Ctx, session: Session, got: Sequence[InboxMessage]) -> None:
        """A task taken by another session of the callee is answered from there."""
        tx = c.tx
        for m in got:
            did = m.message.meta.get("delegation_id")
            if m.message.kind is MessageKind.DELEGATION and isinstance(did, str):
                d = tx.get_delegation(session.team, did)
                if d is not None and d.callee_session != session.session_id:
                    tx.update_delegation(dataclasses.replace(d, callee_session=session.session_id))

    async def _teams_in_hub(self) -> int:
        """How many teams the hub has: a callback service of no team serves only a hub
        of one (:meth:`CallbackConfig.resolve`)."""
        return await self.store.read(lambda tx: tx.count_teams())

    async def list_delegations(
        self,
        team: str,
        *,
        member: str | None = None,
        peer: str | None = None,
        after: str | None = None,
        limit: int | None = None,
        pending_only: bool = False,
    ) -> list[Delegation]:
        """A team's delegations (or a member's, with ``peer`` only those between the two;
        with ``pending_only``, those still pending), in the order they were made: those made after delegation ``after`` (the last one
        of the page before), at most ``limit`` (all when None). Delegations that ended
        long ago are pruned, so a cursor left that long names none: it is refused, and
        the list is read again from its start."""

        def read(tx: Tx) -> list[Delegation]:
            start = None
            if after is not None:
                last = tx.get_delegation(team, after)
                # one the member is not in was never on its pages (and is not its to see)
                if last is None or (
                    member is not None and member not in (last.caller, last.callee)
                ):
                    raise InvalidRequest(
                        f"after names no delegation of yours in team {team!r} ({after!r}); "
                        "give the last delegation id of the page before, or none to start "
                        "again from the first page (one that ended long ago is forgotten)",
                        field="after",
                    )
                start = (last.created_at, last.delegation_id)
            return tx.list_delegations(
                team, member=member, peer=peer, after=start, limit=limit, pending_only=pending_only
            )

        return await self.store.read(read)

    async def delegations_overview(
        self, team: str, finished: int, *, member: str | None = None
    ) -> tuple[list[Delegation], list[Delegation], dict[str, int]]:
        """The dashboard's delegations in one read, bounded by the pending ones and
        ``finished``, not by every delegation the team keeps (a week's, by default): the
        pending ones (oldest first), the latest ``finished`` others (newest first) and how
        many there are in each state; with ``member``, those it is caller or callee of."""

        def read(tx: Tx) -> tuple[list[Delegation], list[Delegation], dict[str, int]]:
            return (
                tx.delegations_by_state(team, pending=True, member=member),
                tx.delegations_by_state(team, pending=False, member=member, limit=finished),
                tx.count_delegations(team, member=member),
            )

        return await self.store.read(read)

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
        chain: Any = None,
    ) -> Delegation:
        """``POST /api/chat``: run ``agent`` on ``message`` and send its answer to
        ``reply_service``. Idempotent on ``(caller, session_id, tool_use_id)``, those
        left out made from the one-time reply token: a repeat from the same caller
        returns its delegation; another caller that sends the same
        ids has a delegation (and a callee session) of its own, and is told nothing of
        the first (see :func:`~backchannel.core.delegation.inbound_session`).

        ``chain`` (``{"id", "hop"}``) is the conversation chain the caller's hub put the
        task in: the task goes on in it at that hop, so the chain budget holds across
        hubs (past it, the task is refused like any send). Without it the task starts a
        new chain at hop 0."""
        # refused at ingress when unknown, when it is another team's, or when its
        # member: binds it to another member: a member names only a service its own team
        # may use and that is not another member's (nothing is called back at another's)
        self.callbacks.resolve_reply(
            reply_service, team=team, teams_in_hub=await self._teams_in_hub(), caller=caller
        )
        carried = budget_rules.check_chain(chain)
        if not isinstance(reply_token, str) or not reply_token:
            raise InvalidRequest("reply.bearerToken is missing", field="reply.bearerToken")
        if len(reply_token) > rules.MAX_BEARER_TOKEN or not _TOKEN_CHARS.fullmatch(reply_token):
            raise InvalidRequest(
                "reply.bearerToken must be 1 to "
                f"{rules.MAX_BEARER_TOKEN} visible ASCII characters (no spaces or controls), "
                "as an HTTP Authorization header carries it; send the token as the caller's "
                "hub issued it",
                field="reply.bearerToken",
            )
        timeout = rules.check_delegate(agent, message, timeout_s)
        messages.check_name("agent", agent)
        # ids the caller left out are made from its one-time reply token, so the same
        # request sent again (its answer lost on the way) finds the task it made
        request = rules.request_key(reply_token)
        remote_session = (
            messages.check_session_id(session_id) if session_id else "remote-" + request[:12]
        )
        caller_session = rules.inbound_session(caller, remote_session)
        tuid = tool_use_id or "tu_" + request[12:28]
        now = self.clock.now()

        def fn(c: Ctx) -> Delegation:
            tx = c.tx
            known = tx.find_delegation(team, caller_session=caller_session, tool_use_id=tuid)
            if known is None and session_id:
                # kept under the caller's own session id before requests were kept per
                # caller: a repeat of it finds it (never another caller's)
                old = tx.find_delegation(team, caller_session=remote_session, tool_use_id=tuid)
                if old is not None and (old.route, old.caller) == (Route.INBOUND, caller):
                    known = old
            if known is not None:
                if (known.route, known.caller) == (Route.INBOUND, caller):
                    return known
                # only a session of this team named like a caller's request gets here
                raise Conflict(
                    f"session_id {remote_session!r} with tool_use_id {tuid!r} names a request "
                    "this team already holds under another owner; send the task with a new "
                    "tool_use_id"
                )
            if tx.get_member(team, agent) is None:
                raise messages.unknown_recipient(
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
            self._start_callee(c, d, sender=caller, now=now, chain=carried)
            self._keep_pruned(c, team, now)
            return d

        return await self.env.transact(fn)

    # -- the caller hub: an answer arrives from another hub -----------------------------
    async def accept_tool_response(
        self, token: str, result: Any, *, chain: Any = None
    ) -> Delegation:
        """``POST /api/tools/response``: verify the one-time token and deliver ``result``.

        ``chain`` (``{"id", "hop"}``, checked as ``/api/chat``'s) is the conversation
        chain the callee hub's answer goes on in: the caller's session goes on in it
        (raised, never lowered), so asking again on every answer stops at the chain
        budget, as it does between two agents of one hub.

        A forged or expired token, or one that names no delegation of this hub, is refused
        (``Unauthorized``, 401). A token spent before is a repeat of a callback this hub
        already took (the callee never saw the acknowledgement): the same result is
        acknowledged again and changes nothing; a different one is refused (``Conflict``,
        409), since the delegation keeps the answer it got first."""
        now = self.clock.now()
        claims = rules.verify_token(self.callbacks.secret, token, now=now)
        team, _, delegation_id = str(claims["tool_id"]).partition("/")
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        messages.check_text(text, self.config.max_text)
        carried = budget_rules.check_chain(chain)

        def fn(c: Ctx) -> Delegation:
            tx = c.tx
            d = tx.get_delegation(team, delegation_id)
            if d is None or (d.caller_session, d.tool_use_id) != (
                claims["session_id"],
                claims["tool_use_id"],
            ):
                raise Unauthorized("this callback token matches no delegation of this hub")
            if not tx.spend_token(str(claims["jti"]), float(claims["exp"])):
                d = tx.get_delegation(team, delegation_id) or d  # as the spender left it
                if d.state in rules.ANSWERED_STATES and d.result == text:
                    return d  # a repeat of the callback already taken
                raise Conflict(
                    f"delegation {d.delegation_id} ({d.tool_use_id}) was already answered "
                    "with a different result; the first answer stands and this one was not "
                    "taken"
                )
            caller = tx.get_session(team, d.caller_session)
            if carried is not None and caller is not None:
                self.pipeline.budgets.answered(c, team, caller, carried, d.callee, now)
            self._answer_counts(c, d, now)
            return self.resolve(c, d, text, now)

        return await self.env.transact(fn)

    # -- resolving ------------------------------------------------------------------------
    def _answer_counts(self, c: Ctx, d: Delegation, now: float) -> None:
        """The answer of another hub's agent (or an A2A agent) to ``d`` is an exchange of
        its pair with the caller, as a local callee's is: owed, so never refused. Counted
        once, when the answer is first taken."""
        if d.state in rules.ANSWERED_STATES:
            return
        budgets = self.pipeline.budgets
        svc = self.callbacks.services.get(d.callee.partition("@")[2])
        party = budgets.remote_party(c.tx, d.team, d.callee, svc.member if svc else None)
        budgets.across(c, d.team, party, d.caller, now, refusable=False)

    def resolve(self, c: Ctx, d: Delegation, result: str, now: float) -> Delegation:
        """An answer for a caller of this hub: the tool result, or a late result."""
        tx = c.tx
        if d.state is DelegationState.PENDING:
            d = dataclasses.replace(
                d, state=DelegationState.ANSWERED, result=result, answered_at=now
            )
            tx.update_delegation(d)
            self._deliver_batch(c, d.team, d.batch, now)
        elif d.state in (DelegationState.TIMED_OUT, DelegationState.FAILED):
            # the caller was given an error for it already; the answer still reaches it
            why = "had timed out" if d.state is DelegationState.TIMED_OUT else "had failed"
            d = dataclasses.replace(d, state=DelegationState.LATE, result=result, answered_at=now)
            tx.update_delegation(d)
            self._tool_result(
                c,
                d,
                rules.late_text(d, why),
                {"late": True, "results": [rules.result_of(d) | {"result": result}]},
                now,
            )
        return d

    def _deliver_batch(
        self, c: Ctx, team: str, batch: str, now: float, read: list[Delegation] | None = None
    ) -> None:
        """Once none of a caller turn's delegations is pending (and that turn is over),
        give the caller all their results in one message (``read``: the batch, as read
        in this transaction after its last change)."""
        tx = c.tx
        ds = read if read is not None else tx.list_delegations(team, batch=batch)
        if not ds or any(x.state is DelegationState.PENDING for x in ds):
            return
        caller = tx.get_session(team, ds[0].caller_session)
        if (
            caller is not None
            and caller.state is SessionState.ACTIVE
            and f"{caller.session_id}#{caller.turn}" == batch
        ):
            return  # the turn that delegated is still running: gathered at its agent_stop
        if tx.get_message(team, rules.results_message_id(batch)) is not None:
            return  # delivered already
        self._tool_result(
            c,
            ds[0],
            rules.results_text(ds),
            {"results": [rules.result_of(x) for x in ds]},
            now,
            message_id=rules.results_message_id(batch),
        )

    def _tool_result(
        self,
        c: Ctx,
        d: Delegation,
        text: str,
        meta: dict[str, Any],
        now: float,
        *,
        message_id: str | None = None,
    ) -> None:
        tx = c.tx
        caller = tx.get_session(d.team, d.caller_session)
        pinned = (
            d.caller_session
            if caller is not None and caller.state is not SessionState.TERMINATED
            else None
        )
        msg = notices.tool_result(
            d.team, d.caller, text, meta, now,
            message_id=message_id or f"late-{d.delegation_id}", pinned=pinned,
        )  # fmt: skip
        if tx.get_message(d.team, msg.message_id) is None:
            self.pipeline.insert(c, msg, pinned)

    def _fire_deadline(self, c: Ctx, job: Job, now: float) -> JobOutcome | None:
        tx = c.tx
        d = tx.get_delegation(job.team, str(job.payload.get("delegation_id")))
        if d is None or d.state is not DelegationState.PENDING:
            return None
        timed_out = dataclasses.replace(
            d, state=DelegationState.TIMED_OUT, error=rules.timeout_error(d)["error"]
        )
        tx.update_delegation(timed_out)
        self._deliver_batch(c, d.team, d.batch, now)
        c.wake(d.team, d.caller)
        return None

    def job_handlers(self) -> dict[str, JobHandler]:
        return {
            rules.DEADLINE_JOB: self._fire_deadline,
            rules.PRUNE_JOB: self._fire_prune,
        }

    # -- retention: finished delegations and their tokens are forgotten -----------------
    def _prune_every(self) -> float:
        return min(self.callbacks.retention, rules.PRUNE_INTERVAL)

    def _keep_pruned(self, c: Ctx, team: str, now: float) -> None:
        """Make sure a team with delegations has its pruning job."""
        if not c.tx.list_jobs(team, kind=rules.PRUNE_JOB):
            due = now + self._prune_every()
            c.tx.add_job(Job(team, rules.PRUNE_JOB, due, now, None, {}))
            c.schedule(due)

    def _fire_prune(self, c: Ctx, job: Job, now: float) -> JobOutcome:
        """Forget the team's delegations that ended more than the retention period ago
        (with their stored reply tokens), and spent token ids past their expiry."""
        tx = c.tx
        tx.prune_delegations(
            job.team,
            ended_before=now - self.callbacks.retention,
            expired_before=now - rules.TOKEN_GRACE,
        )
        tx.prune_spent_tokens(now)
        if not tx.list_delegations(job.team, limit=1):  # one index entry, not them all
            return JobOutcome()  # done; the team's next delegation schedules it again
        due = now + self._prune_every()
        tx.reschedule_job(job.job_id, due, job.payload)
        c.schedule(due)
        return JobOutcome(keep=True)

    # -- turns: the callee's answer, the caller's gathering ---------------------------------
    def closing_text(self, c: Ctx, s: Session, parsed: turns.ClosingText) -> turns.ClosingText:
        """A callee that answers only in ``<message>`` blocks (no text outside them) answers
        with the blocks addressed to its caller: they become the answer, not messages."""
        if parsed.output or not parsed.blocks or s.turn_kind == "checkpoint":
            return parsed
        d = c.tx.find_delegation(s.team, callee_session=s.session_id)
        if d is None or d.state not in rules.OPEN_STATES:
            return parsed
        to_caller = [b for b in parsed.blocks if b.to == d.caller and b.body.strip()]
        if not to_caller:
            return parsed
        return turns.ClosingText(
            tuple(b for b in parsed.blocks if b not in to_caller),
            "\n\n".join(b.body.strip() for b in to_caller),
        )

    def after_stop(
        self, c: Ctx, session: Session, output: str, checkpoint_turn: bool, now: float
    ) -> dict[str, Any]:
        """A callee's turn answers its delegation; the turn's own delegations go out."""
        tx = c.tx
        extra: dict[str, Any] = {}
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
                # an exchange of the callee with the other hub's member that asked: owed
                self.pipeline.budgets.across(c, d.team, d.callee, d.caller, now, refusable=False)
                # the answer names the chain it goes on in (the turn's, one hop further),
                # so the caller's hub goes on from there when its agent asks again
                chain = self.pipeline.budgets.answer_chain(
                    tx.get_session(session.team, session.session_id) or session
                )
                self.outbox.enqueue(
                    c,
                    d.team,
                    service=d.reply_service or "",
                    path=RESPONSE_PATH,
                    body={
                        "result": output,
                        **({"chain": budget_rules.chain_wire(chain)} if chain else {}),
                    },
                    bearer=d.reply_token,
                    purpose="reply",
                    ref=f"{d.team}/{d.delegation_id}",
                    now=now,
                )
            else:
                self.resolve(c, d, output, now)
                c.wake(d.team, d.caller)
            extra = {**extra, "answered_delegation": d.delegation_id}
        # the turn that delegated has ended: send its tasks for other hubs, and deliver
        # its results if they are all in
        self._batch_over(c, session.team, f"{session.session_id}#{session.turn}", now)
        return extra

    # -- the outbox's verdicts ----------------------------------------------------------------
    def post_answered(
        self,
        c: Ctx,
        job: Job,
        text: str,
        now: float,
        chain: budget_rules.ChainRef | None = None,
    ) -> None:
        """The POST of a task answered inline (an A2A agent); an answer that names its
        chain (another hub's) carries it to the caller's session, as
        ``/api/tools/response`` does."""
        team, _, delegation_id = str(job.payload.get("ref", "")).partition("/")
        current = c.tx.get_delegation(team, delegation_id)
        if current is not None:
            caller = c.tx.get_session(team, current.caller_session)
            if chain is not None and caller is not None:
                self.pipeline.budgets.answered(c, team, caller, chain, current.callee, now)
            self._answer_counts(c, current, now)
            self.resolve(c, current, text, now)
            c.wake(team, current.caller)

    def post_dead(
        self,
        c: Ctx,
        job: Job,
        reason: str,
        now: float,
        status: int | None,
        *,
        reached: bool = True,
        refused: bool = True,
    ) -> None:
        """A POST of this part was given up on (``reached``: the other side answered;
        ``refused``: ``reason`` is its refusal, else a sentence of its own)."""
        tx = c.tx
        team, _, delegation_id = str(job.payload.get("ref", "")).partition("/")
        d = tx.get_delegation(team, delegation_id)
        if d is None:
            return
        purpose = job.payload.get("purpose")
        if purpose == "chat" and d.state is DelegationState.PENDING and not reached:
            self._unreached(c, d, str(job.payload.get("service")), reason, now)
        elif purpose == "chat" and d.state is DelegationState.PENDING and refused:
            self._refused(c, d, reason, now)
        elif purpose == "chat" and d.state is DelegationState.PENDING:
            self._failed(c, d, reason, now)
        elif purpose == "reply" and status == 409:
            # the caller holds an answer to this request already (a different one): this
            # answer was not taken, but nothing the caller was given is lost
            tx.update_delegation(
                dataclasses.replace(
                    d, error=f"the caller already held a different answer: {reason}"
                )
            )
            self._notify_callee(
                c,
                d,
                f"undelivered-{d.delegation_id}",
                f"{d.caller} already had a different answer to its request {d.tool_use_id}; "
                f"this answer was not delivered ({reason}).",
                f"answer to {d.caller} not taken: already answered",
                reason,
                now,
            )
        elif purpose == "reply":
            failed = dataclasses.replace(
                d,
                state=DelegationState.FAILED,
                error=f"the answer could not be delivered: {reason}",
            )
            tx.update_delegation(failed)
            # the callee's operator sees why, in the callee's inbox and the dashboard
            self._notify_callee(
                c,
                d,
                f"undeliverable-{d.delegation_id}",
                f"Your answer to {d.caller}'s request {d.tool_use_id} could not be delivered "
                f"to {d.reply_service}: {reason}.",
                f"answer to {d.caller} undeliverable",
                reason,
                now,
            )

    def _notify_callee(
        self,
        c: Ctx,
        d: Delegation,
        message_id: str,
        text: str,
        summary: str,
        reason: str,
        now: float,
    ) -> None:
        msg = notices.system(
            d.team, d.callee, text, now, message_id=message_id, summary=summary,
            meta={"delegation_id": d.delegation_id, "reason": reason},
        )  # fmt: skip
        if c.tx.get_message(d.team, msg.message_id) is None:
            self.pipeline.insert(c, msg, None)
