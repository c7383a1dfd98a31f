"""Real model providers: Anthropic's Messages API and OpenAI-compatible Chat Completions.

Both use the official SDKs (extras ``anthropic`` and ``openai``), with the SDKs' own
retries off (``max_retries=0``): the runner owns every try. Each SDK has its own rules,
and neither fits a turn's: Anthropic's sits out any ``retry-after`` the API sends (an
hour, say) inside one call, OpenAI's up to two minutes a try, each a few tries, so a turn
would wait for hours, silently, whatever the runner's patience. ``base_url`` points the
OpenAI provider at any compatible server (Ollama, vLLM, llama.cpp) and either provider
at a local test server. A failure that passes (429, 408, 409, 5xx, 529, no connection)
raises a :class:`ModelError` marked ``retryable``, with the wait the API asked for: the
runner tries again with its backoff, honouring the wait up to its patience, and says so
each time.

A 200 whose body is not the API's answer (a proxy's error page, a body cut short that
still parses as far as its length says) is a :class:`ModelError` like any other failed
call, never another exception: the runner closes the turn on a ModelError and keeps
what it owes, where an unexpected exception crashes the session.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from backchannel.runner.models import (
    ChatMessage,
    ModelError,
    ModelReply,
    ToolCall,
    ToolSpec,
    Usage,
)

#: A wait longer than any patience: what an infinite ``retry-after`` stands for.
_FOREVER = 365 * 86400.0


def _headers(exc: Exception) -> Any:
    """The headers of the answer behind the SDK's error; None when there was none."""
    return getattr(getattr(exc, "response", None), "headers", None)


def _retryable(sdk: Any, exc: Exception) -> bool:
    """Is the SDK's error one that passes (rate limited, overloaded, a server error, no
    connection), so the same call may work later? A 400 or a 401 will not. An API that
    says so itself (``x-should-retry``, which Anthropic's sends) is believed, as the SDKs
    believe it."""
    if isinstance(exc, sdk.APIConnectionError):  # timeouts too
        return True
    headers = _headers(exc)
    said = headers.get("x-should-retry") if headers is not None else None
    if said in ("true", "false"):
        return bool(said == "true")
    status = getattr(exc, "status_code", None)
    if status == 429 and _error_code(exc) in _SPENT:
        return False
    return isinstance(status, int) and (status in (408, 409, 429) or status >= 500)


#: Error codes of a 429 that is not a rate: a quota or a balance spent, which waiting
#: does not bring back (OpenAI's ``insufficient_quota``; compatible servers copy it).
_SPENT = frozenset({"insufficient_quota"})


def _error_code(exc: Exception) -> str | None:
    """The error's ``code`` (or else ``type``) as the API's body gives it: OpenAI's SDK
    has them on the error, Anthropic's keeps the body (``{"error": {"type": ...}}``)."""
    for name in ("code", "type"):
        value = getattr(exc, name, None)
        if isinstance(value, str):
            return value
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict):
        for name in ("code", "type"):
            value = inner.get(name)
            if isinstance(value, str):
                return value
    return None


def _retry_after(exc: Exception) -> float | None:
    """How long the API asked to wait before the next call (``retry-after-ms``, or
    ``retry-after`` in seconds or as an HTTP date), when its answer said; None when it
    did not (the runner's own pause applies)."""
    headers = _headers(exc)
    if headers is None:
        return None
    for name, unit in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / unit
        except ValueError:
            continue
        if math.isnan(seconds) or seconds < 0:
            continue
        return min(seconds, _FOREVER)  # an infinite wait is a wait past any patience
    value = headers.get("retry-after")
    if value is not None:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # an HTTP date is GMT
            when = when.replace(tzinfo=datetime.UTC)
        now = datetime.datetime.now(datetime.UTC)
        return max(0.0, (when - now).total_seconds())
    return None


def _api_error(sdk: Any, vendor: str, exc: Exception, key: str = "") -> ModelError:
    """The SDK's error as a :class:`ModelError`: ``retryable`` when it passes, and
    ``retry_after`` (seconds) when the API said how long to wait, which the runner
    honours before it calls again. A key refused (401, 403: revoked mid-run, say) is
    told with ``key``, where the key came from: the API's words do not say which of
    the team's keys to fix, and the agent stops on it."""
    retryable = _retryable(sdk, exc)
    wait = _retry_after(exc) if retryable else None
    if wait is None:
        refused = getattr(exc, "status_code", None) in (401, 403) and key
        told = f"{vendor} API error: {exc}" + (f" ({key})" if refused else "")
        return ModelError(told, retryable=retryable)
    return ModelError(
        f"{vendor} API error: {exc} (the API asks to wait {wait:g} s)",
        retryable=retryable,
        retry_after=wait,
    )


def _not_an_answer(api: str, exc: Exception) -> ModelError:
    return ModelError(
        f"the model server's answer is not an answer of {api} ({type(exc).__name__}: "
        f"{exc}); is base_url the API's own address, with no proxy page in the way?"
    )


async def _answer(
    request: Awaitable[Any],
    sdk: Any,
    vendor: str,
    api: str,
    read: Callable[[Any], ModelReply],
    key: str = "",
) -> ModelReply:
    """The reply ``read`` makes of what ``request`` (a call of the ``sdk``'s client)
    answers, every way it can fail a :class:`ModelError`: the SDK's errors (retryable when
    they pass; a refused key told with ``key``, where it came from), and an answer that is
    not ``api``'s (a body that is not JSON, or JSON of another shape: a proxy's page, a
    body cut short)."""
    try:
        resp = await request
    except sdk.APIError as exc:
        raise _api_error(sdk, vendor, exc, key) from exc
    except ValueError as exc:  # the body is not JSON (json's errors are ValueErrors)
        raise _not_an_answer(api, exc) from exc
    if (err := _error_in_answer(resp, vendor)) is not None:
        raise err
    try:
        return read(resp)
    except (AttributeError, TypeError, ValueError) as exc:
        raise _not_an_answer(api, exc) from exc


#: Error types of the Messages API that pass (an answer with one of them, or with a
#: code of 408, 409, 429 or 5xx, is tried again).
_PASSING_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


def _error_in_answer(resp: Any, vendor: str) -> ModelError | None:
    """The error a 200 carries in its body, as the API's error; None for an answer. A
    router that took the request has sent its status by the time the model fails, so it
    tells the failure in the body (OpenRouter's ``{"error": {"code": 502, ...}}``; a
    proxy's ``{"type": "error", "error": {"type": "overloaded_error"}}``): one that
    passes (by its code or type) is ``retryable``, as the same status would be. Not a
    page in the way, which the hint of :func:`_not_an_answer` would send the person
    looking for."""
    err = getattr(resp, "error", None)
    if err is None or not (isinstance(err, dict | str) and err):
        return None
    if isinstance(err, str):
        return ModelError(f"{vendor} API error in a 200 answer: {err}")
    code, kind = err.get("code"), err.get("type")
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    passes = (
        isinstance(code, int)
        and not isinstance(code, bool)
        and (code in (408, 409, 429) or code >= 500)
    ) or kind in _PASSING_TYPES
    said = err.get("message") or json.dumps(err)
    named = f"{code} " if isinstance(code, int) else f"{kind} " if isinstance(kind, str) else ""
    return ModelError(f"{vendor} API error in a 200 answer: {named}{said}", retryable=passes)


def _call_id(block: Any, prefix: str) -> str:
    """The id of a tool call in an answer: the API's, or one made here (``prefix`` and
    random hex) when the answer gave none (no field, null, empty: some compatible servers
    and proxies). The call goes back to the model under it with its result, which needs
    one id the two share; the session must not crash on a call it can run."""
    given = getattr(block, "id", None)
    return given if isinstance(given, str) and given else prefix + uuid.uuid4().hex[:24]


def _count(usage: Any, name: str) -> int:
    """A token count of an answer's ``usage``, 0 when it gives none (no usage, the count
    missing or null: some compatible servers and proxies). The counts are the run's
    accounting, not the answer: an answer the model gave is never refused over them,
    nor may a missing one crash the session that adds it up."""
    value = getattr(usage, name, None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def _call_name(block: Any) -> str:
    """The name of the tool a call asks for, "" when the answer gave none (no field,
    null): a call to no tool the agent has, which the runner answers as such, never a
    crash of the session on a name that is not a string."""
    given = getattr(block, "name", None)
    return given if isinstance(given, str) else ""


def _tool_call(call_id: str, name: str, given: Any) -> ToolCall:
    """A call with the arguments the answer ``given``: an object (the Messages API's
    form) or a string of JSON that holds one (Chat Completions'), whichever API answered,
    since compatible servers and proxies translating between the two give either. Broken
    JSON, or JSON but not an object, is kept as written (``unparsed``): the call is not
    run and the runner tells the model why."""
    args = given
    if isinstance(given, str):
        try:
            args = json.loads(given)
        except ValueError:
            args = None
    if isinstance(args, dict):
        return ToolCall(call_id, name, args)
    written = given if isinstance(given, str) else json.dumps(given)
    return ToolCall(call_id, name, {}, unparsed=written)


def _api_key(env_name: str | None, default_env: str) -> str:
    key = os.environ.get(env_name or default_env)
    if not key:
        raise ModelError(
            f"no API key: set {env_name or default_env} (or api_key_env in the team file), "
            "or use model: scripted to run offline"
        )
    return key


class AnthropicModel:
    """Claude through the Messages API, with tool use and prompt caching (the system
    prompt and the tool definitions are marked cacheable). ``max_retries``: the SDK's own
    tries after the first, none by default (the runner makes them: see the module)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        max_tokens: int = 4096,
        max_retries: int = 0,
    ) -> None:
        try:
            import anthropic
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise ModelError(
                "the anthropic provider needs: pip install 'backchannel[anthropic]'"
            ) from exc
        self.name = model
        self._anthropic = anthropic
        env = api_key_env or "ANTHROPIC_API_KEY"
        self._key = f"the API refused the key in {env}: set a valid one there"
        self._client = anthropic.AsyncAnthropic(
            api_key=_api_key(api_key_env, "ANTHROPIC_API_KEY"),
            base_url=base_url,
            max_retries=max_retries,
        )
        self.max_tokens = max_tokens

    @staticmethod
    def _messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "tool":
                block = {
                    "type": "tool_result",
                    "tool_use_id": m.call_id,
                    "content": m.text,
                    "is_error": m.is_error,
                }
                if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                    out[-1]["content"].append(block)
                else:
                    out.append({"role": "user", "content": [block]})
            elif m.role == "assistant":
                content: list[dict[str, Any]] = [{"type": "text", "text": m.text}] if m.text else []
                content += [
                    {
                        "type": "tool_use",
                        "id": c.call_id,
                        "name": c.name,
                        "input": dict(c.arguments),
                    }
                    for c in m.tool_calls
                ]
                out.append(
                    {"role": "assistant", "content": content or [{"type": "text", "text": ""}]}
                )
            else:
                if out and out[-1]["role"] == "user":
                    prev = out[-1]["content"]
                    blocks = prev if isinstance(prev, list) else [{"type": "text", "text": prev}]
                    out[-1]["content"] = [*blocks, {"type": "text", "text": m.text}]
                else:
                    out.append({"role": "user", "content": m.text})
        return out

    async def complete(
        self, system: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        tool_defs: list[dict[str, Any]] = [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
            for t in tools
        ]
        if tool_defs:
            tool_defs[-1]["cache_control"] = {"type": "ephemeral"}
        system_blocks = [
            {
                "type": "text",
                "text": system or "You are a helpful agent.",
                "cache_control": {"type": "ephemeral"},
            }
        ]
        request = self._client.messages.create(
            model=self.name,
            max_tokens=self.max_tokens,
            system=system_blocks,  # type: ignore[arg-type]
            messages=self._messages(messages),  # type: ignore[arg-type]
            tools=tool_defs,  # type: ignore[arg-type]
        )
        return await _answer(
            request, self._anthropic, "Anthropic", "the Messages API", self._reply, self._key
        )

    @staticmethod
    def _reply(resp: Any) -> ModelReply:
        text = "".join(b.text for b in resp.content if b.type == "text")
        calls = tuple(
            _tool_call(_call_id(b, "toolu_"), _call_name(b), b.input)
            for b in resp.content
            if b.type == "tool_use"
        )
        u = getattr(resp, "usage", None)
        usage = Usage(
            _count(u, "input_tokens"),
            _count(u, "output_tokens"),
            _count(u, "cache_read_input_tokens"),
            _count(u, "cache_creation_input_tokens"),
        )
        return ModelReply(text, calls, usage, resp.stop_reason or "end_turn")


class OpenAIModel:
    """Any OpenAI-compatible Chat Completions server, with tools. ``max_retries``: the
    SDK's own tries after the first, none by default (the runner makes them)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        max_retries: int = 0,
    ) -> None:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise ModelError(
                "the openai provider needs: pip install 'backchannel[openai]'"
            ) from exc
        self.name = model
        self._openai = openai
        env = api_key_env or "OPENAI_API_KEY"
        key = os.environ.get(env) or ("local" if base_url else None)
        if key is None:
            key = _api_key(api_key_env, "OPENAI_API_KEY")
        self._key = (
            f"the API refused the key in {env}: set a valid one there"
            if os.environ.get(env)
            else f"{env} is not set, so the placeholder key 'local' was sent (a local "
            "server needs none): set it to the server's key"
        )
        self._client = openai.AsyncOpenAI(api_key=key, base_url=base_url, max_retries=max_retries)

    @staticmethod
    def _messages(system: str, messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        for m in messages:
            if m.role == "tool":
                out.append({"role": "tool", "tool_call_id": m.call_id, "content": m.text})
            elif m.role == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": m.text or None}
                if m.tool_calls:
                    msg["tool_calls"] = [
                        {
                            "id": c.call_id,
                            "type": "function",
                            "function": {
                                "name": c.name,
                                "arguments": c.unparsed
                                if c.unparsed is not None
                                else json.dumps(dict(c.arguments)),
                            },
                        }
                        for c in m.tool_calls
                    ]
                out.append(msg)
            else:
                out.append({"role": "user", "content": m.text})
        return out

    async def complete(
        self, system: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        tool_defs = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": dict(t.parameters),
                },
            }
            for t in tools
        ]
        request = self._client.chat.completions.create(
            model=self.name,
            messages=self._messages(system, messages),  # type: ignore[arg-type]
            tools=tool_defs or self._openai.NOT_GIVEN,  # type: ignore[arg-type]
        )
        return await _answer(
            request,
            self._openai,
            "OpenAI-compatible",
            "the Chat Completions API",
            self._reply,
            self._key,
        )

    @staticmethod
    def _reply(resp: Any) -> ModelReply:
        if not resp.choices:
            raise ModelError("the model server answered with no choices")
        choice = resp.choices[0]
        calls = []
        for c in choice.message.tool_calls or []:
            fn = getattr(c, "function", None)
            if fn is None:
                continue
            calls.append(_tool_call(_call_id(c, "call_"), _call_name(fn), fn.arguments or "{}"))
        u = getattr(resp, "usage", None)
        usage = Usage(_count(u, "prompt_tokens"), _count(u, "completion_tokens"))
        return ModelReply(
            choice.message.content or "", tuple(calls), usage, str(choice.finish_reason)
        )
