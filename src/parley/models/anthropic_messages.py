"""A streaming model over the Anthropic Messages API, through the official ``anthropic``
client.

``text_delta`` events are published as they arrive; ``input_json_delta`` fragments are
assembled into whole ``tool_use`` calls (their raw JSON kept verbatim); usage comes from
``message_start`` and ``message_delta``.  Parley's ``input_tokens`` counts every prompt
token, so it is Anthropic's ``input_tokens`` plus the cache reads and writes, and
``cached_tokens`` is ``cache_read_input_tokens``.

The encoding is native: the system prompt as a system block, tools with ``input_schema``,
assistant turns as text and ``tool_use`` blocks, tool results as ``tool_result`` blocks
(``is_error`` kept) in a user message, consecutive same-role messages merged as the API
requires.  With ``prompt_cache`` (the default) the system block and the newest message
carry ``cache_control`` breakpoints, so the prefix (tools + system) and the conversation so
far are read from Anthropic's prompt cache on the next step.

Retries are split by phase as for every provider (see :mod:`parley.models.errors`): the
client retries 5xx (529 among them), 408, 409 and connection errors before the stream
starts; a 429 is parley's (a client middleware marks it ``x-should-retry: false``) and is
raised at once as :class:`~parley.models.errors.RateLimited`, unless it says a spend limit
is reached.  What Anthropic sends for a spent account (:data:`QUOTA_ERROR_CODES`, a
``billing_error``, a 402, or a 400 "Your credit balance is too low") becomes a final error
that says the credit is exhausted.  Every reply carries the limits of the response's
``anthropic-ratelimit-*`` headers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
import httpx2

from parley.errors import CodecError, Conflict, InvalidRequest
from parley.models._wire import NO_CLIENT_RETRY, ProviderModel, cause_text
from parley.models.completion import estimate_usage
from parley.models.errors import ProviderError, redact
from parley.models.rate_headers import retry_delay
from parley.ports.host import DeltaSink, ModelReply, ModelRequest, NativeCompaction
from parley.schemas.compactions import NativeItem
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    Prefix,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from parley.schemas.records import Usage

# The longest Retry-After the client may sleep through.  The anthropic client honours any
# value (the openai one refuses more than two minutes); a driver asleep inside the client
# notices no interrupt, so a longer wait is better spent on the next provider.
MAX_RETRY_AFTER = 120.0

# Error types an ``error`` event may carry mid-stream that a new attempt can get past.
# ValueError: not JSON; TypeError, AttributeError: JSON of the wrong shape.
_STREAM_FAILURES = (
    anthropic.AnthropicError,
    httpx2.HTTPError,
    ValueError,
    TypeError,
    AttributeError,
)
_TRANSIENT_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})

QUOTA_ERROR_CODES = frozenset(
    {
        # 429s (RateLimitError) that are not about rate: a spend limit no wait mends.
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        # 402s: the billed organization's limit or credit.
        "linked_organization_spend_limit_reached",
        "linked_organization_billing_unavailable",
    }
)
"""``error.details.error_code`` values that say the account cannot be billed for more
(the SDK's ``types.shared`` error classes).  ``ramp_limit_exceeded``, also a 429, is a rate
(how fast usage may grow) and stays :class:`~parley.models.errors.RateLimited`."""

CREDIT_TOO_LOW = "credit balance is too low"
"""What Anthropic says, in a 400 ``invalid_request_error``, to an account without credit
("Your credit balance is too low to access the Anthropic API ...")."""

_EPHEMERAL = {"type": "ephemeral"}

NATIVE_PROVIDER = "anthropic"
"""Whose native compaction items this model makes and reads."""

COMPACTION_BETA = "compact-2026-09-04"
"""The beta of the ``compaction`` request parameter and of the block it returns."""


class AnthropicModel(ProviderModel):
    """A Claude model over the Messages API.

    ``timeout`` (seconds) bounds each HTTP attempt's connect and every read (the longest
    the server may stay silent, before the first byte or between events); ``max_retries``
    is the client's own retry budget before the stream starts (429s excepted: they are
    parley's).  ``max_tokens`` is every request's output ceiling (which the API requires,
    and admission reserves).  With no ``api_key`` the
    client's own lookup applies (``ANTHROPIC_API_KEY`` …).  The key is held by the client
    only: never in this object's repr, redacted from every error text."""

    client_errors = (
        anthropic.AnthropicError,
        anthropic.APIStatusError,
        anthropic.APITimeoutError,
        anthropic.APIConnectionError,
    )
    stream_failures = _STREAM_FAILURES
    end_marker = "message_stop"

    # The provider's options, each keyword-only and defaulted (as its SDK's client takes
    # them): not an argument list a caller has to get in order.
    def __init__(  # noqa: PLR0913
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 4096,
        timeout: float = 60.0,
        max_retries: int = 2,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        prompt_cache: bool = True,
        name: str | None = None,
    ) -> None:
        if not model:
            raise InvalidRequest("AnthropicModel needs a model name")
        if timeout <= 0 or max_retries < 0 or max_tokens < 1:
            raise InvalidRequest(
                "timeout and max_tokens must be positive and max_retries non-negative"
            )
        self._model = model
        self._name = name or f"anthropic:{model}"
        self._max_tokens = max_tokens
        self._timeout = timeout
        self._max_retries = max_retries
        self._extra_body = dict(extra_body) if extra_body else None
        self._prompt_cache = prompt_cache
        try:
            self._client = anthropic.Anthropic(
                api_key=api_key,
                base_url=base_url,
                timeout=timeout,
                max_retries=max_retries,
                default_headers=dict(extra_headers) if extra_headers else None,
                middleware=[_ClientRetries(self._name)],
            )
        except (anthropic.AnthropicError, ValueError, TypeError) as exc:
            raise InvalidRequest(
                f"{self._name}: cannot set up the client (pass api_key or set "
                f"ANTHROPIC_API_KEY): {redact(str(exc), api_key)}"
            ) from None
        client = self._client
        if client.api_key is None and client.auth_token is None and client.credentials is None:
            raise InvalidRequest(
                f"{self._name}: no credentials: pass api_key or set ANTHROPIC_API_KEY"
            )

    @property
    def output_ceiling(self) -> int:
        """The most tokens an answer may have: the ``max_tokens`` every request sends."""
        return self._max_tokens

    # ------------------------------------------------------------------ encoding

    def encode(self, request: ModelRequest) -> dict[str, Any]:
        """The request's ``system``, ``tools`` and ``messages`` in the Messages wire form.
        ``system`` and ``tools`` depend on the prefix alone and are canonical, so equal
        prefixes are byte-identical on the wire."""
        body: dict[str, Any] = {}
        system = encode_system(request.prefix, cache=self._prompt_cache)
        if system:
            body["system"] = system
        tools = encode_tools(request.prefix)
        if tools:
            body["tools"] = tools
        body["messages"] = encode_messages(request, cache=self._prompt_cache)
        return body

    # ------------------------------------------------------------------ native compaction

    @property
    def native_provider(self) -> str:
        """Anthropic's compaction blocks are what this model makes and reads."""
        return NATIVE_PROVIDER

    def compact_natively(self, request: ModelRequest) -> NativeCompaction:
        """Anthropic's own compaction of ``request``'s conversation: a request with the
        ``compaction`` parameter, answered by one ``compaction`` block alone (its readable
        summary, its opaque parts, its signature), kept as received.
        :class:`ProviderError` as any call's; ``Conflict`` for a block with no summary
        (the API's failed compaction: nothing to store)."""
        body = self.encode(request)
        message = self._start(
            lambda: self._client.beta.messages.create(
                model=self._model,
                max_tokens=self._max_tokens,
                messages=cast(Any, body["messages"]),
                system=cast(Any, body.get("system", anthropic.omit)),
                tools=cast(Any, body.get("tools", anthropic.omit)),
                betas=[COMPACTION_BETA],
                compaction={"type": "summarize"},
                extra_body=self._extra_body,
            )
        )
        blocks = [b for b in cast(Any, message).content if b.type == "compaction" and b.content]
        if not blocks:
            raise Conflict(f"{self._name}: the compaction returned no summary: nothing stored")
        block = blocks[-1]
        usage = cast(Any, message).usage
        return NativeCompaction(
            item=NativeItem(provider=NATIVE_PROVIDER, item=block.to_dict(mode="json")),
            text=str(block.content),
            usage=Usage(
                input_tokens=(usage.input_tokens or 0)
                + (usage.cache_read_input_tokens or 0)
                + (usage.cache_creation_input_tokens or 0),
                output_tokens=usage.output_tokens or 0,
                cached_tokens=usage.cache_read_input_tokens or 0,
            ),
        )

    # ------------------------------------------------------------------ streaming

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Stream one answer: each text delta to ``on_delta`` as its event arrives.

        Raises :class:`ProviderError` when the provider fails (``retriable`` once the
        stream has started); whatever ``on_delta`` raises (an interrupt) propagates, after
        the HTTP stream is closed."""
        body = self.encode(request)
        # A compaction block is a beta's: a request that carries one says so.
        beta = {"anthropic-beta": COMPACTION_BETA} if request.native is not None else None
        events = self._start(
            lambda: self._client.messages.create(
                model=self._model,
                max_tokens=self._max_tokens,
                messages=cast(Any, body["messages"]),
                system=cast(Any, body.get("system", anthropic.omit)),
                tools=cast(Any, body.get("tools", anthropic.omit)),
                stream=True,
                extra_headers=beta,
                extra_body=self._extra_body,
            )
        )
        return self._read(events, _Assembly(), request, on_delta)

    # ------------------------------------------------------------------ errors

    def _redact(self, text: str) -> str:
        return redact(text, self._client.api_key, self._client.auth_token)

    def _api_message(self, exc: Any) -> str:
        return str(exc.api_message or exc.message)

    def _is_quota(self, exc: Any) -> bool:
        if exc.error_code in QUOTA_ERROR_CODES or exc.type == "billing_error":
            return True
        if exc.status_code == 402:
            return True
        message = exc.api_message
        return (
            exc.status_code == 400
            and isinstance(message, str)
            and CREDIT_TOO_LOW in message.lower()
        )

    def _stream_error(self, exc: Exception) -> ProviderError:
        """A failure once streaming had begun: the client cannot retry it; a new attempt
        against the same provider usually works, unless the provider rejected the request
        itself in an ``error`` event."""
        retriable = True
        if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
            what = f"the stream stalled for more than {self._timeout}s"
        elif isinstance(exc, anthropic.APIConnectionError | httpx2.HTTPError):
            what = f"the stream was cut: {cause_text(exc)}"
        elif isinstance(exc, anthropic.APIStatusError):
            kind = exc.type
            retriable = kind is None or kind in _TRANSIENT_TYPES
            what = f"error event mid-stream: {kind or 'unknown'}: {self._api_message(exc)}"
        elif isinstance(exc, anthropic.AnthropicError):
            what = f"{type(exc).__name__}: {exc}"
        else:
            what = f"malformed event: {type(exc).__name__}: {exc}"
        return ProviderError(
            f"{self._name}: {self._redact(what)}",
            provider=self._name,
            retriable=retriable,
            phase="stream",
        )


# ---------------------------------------------------------------------------- encoding


def encode_system(prefix: Prefix, *, cache: bool = True) -> list[dict[str, Any]]:
    """The system prompt as one text block (none if empty: the API refuses empty text)."""
    if not prefix.system_prompt:
        return []
    block: dict[str, Any] = {"type": "text", "text": prefix.system_prompt}
    if cache:
        block["cache_control"] = dict(_EPHEMERAL)
    return [block]


def encode_tools(prefix: Prefix) -> list[dict[str, Any]]:
    """The prefix's tools, built from its canonical bytes so that key order in the
    declared schemas cannot change the bytes sent (and miss the prompt cache)."""
    canonical = json.loads(prefix.canonical_bytes())
    return [
        {
            "name": tool["name"],
            "description": tool["description"],
            "input_schema": tool["parameters"],
        }
        for tool in canonical["tools"]
    ]


def encode_messages(request: ModelRequest, *, cache: bool = True) -> list[dict[str, Any]]:
    """Parley messages as Messages-API messages, consecutive same-role content merged."""
    encoded: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            # An assistant step that said nothing: the API refuses empty content, and
            # dropping it loses nothing the model could use.
            return
        if encoded and encoded[-1]["role"] == role:
            encoded[-1]["content"].extend(blocks)
        else:
            encoded.append({"role": role, "content": blocks})

    native = request.native
    if native is not None:
        if native.provider != NATIVE_PROVIDER:
            raise CodecError(f"a native compaction item of {native.provider!r} sent to Anthropic")
        # Sent back verbatim, first, as the assistant's: it stands in for what it covers.
        add("assistant", [dict(native.item)])
    for message in request.messages:
        add(*_role_and_blocks(message))
    if cache and encoded:
        # A breakpoint on the newest block caches the conversation so far: the next step
        # repeats all of it and reads it from the cache.
        last = encoded[-1]["content"][-1]
        encoded[-1]["content"][-1] = {**last, "cache_control": dict(_EPHEMERAL)}
    return encoded


def _role_and_blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """One parley message as a Messages-API role and its content blocks."""
    if isinstance(message, UserMessage):
        return "user", [{"type": "text", "text": message.text}] if message.text else []
    if isinstance(message, AssistantMessage):
        blocks: list[dict[str, Any]] = []
        if message.text:
            blocks.append({"type": "text", "text": message.text})
        blocks.extend(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": _tool_input(call.arguments),
            }
            for call in message.tool_calls
        )
        return "assistant", blocks
    if not isinstance(message, ToolMessage):
        raise TypeError(f"not a message parley sends: {message!r}")
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": message.call_id,
        "content": message.content,
    }
    if message.is_error:
        result["is_error"] = True
    return "user", [result]


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's raw arguments as the object ``tool_use`` requires.  Arguments that are not
    a JSON object (the model produced garbage, and got an error result for it) are kept
    under one key, so the model can still see what it said."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    return {"_raw_arguments": arguments}


# ---------------------------------------------------------------------------- assembly


@dataclass
class _Block:
    kind: str
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    initial_input: Any = None


@dataclass
class _Assembly:
    """Accumulates one streamed message."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    saw_usage: bool = False
    finished: bool = False

    def absorb(self, event: Any) -> str:
        """Take one event in; return its text delta."""
        kind = event.type
        if kind == "message_start":
            self._usage(event.message.usage)
        elif kind == "content_block_start":
            block = event.content_block
            self.blocks[event.index] = _Block(
                kind=block.type,
                id=getattr(block, "id", "") or "",
                name=getattr(block, "name", "") or "",
                initial_input=getattr(block, "input", None),
            )
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                if delta.text:
                    self.text.append(delta.text)
                return str(delta.text or "")
            if delta.type == "input_json_delta":
                self.blocks.setdefault(event.index, _Block(kind="tool_use")).parts.append(
                    delta.partial_json or ""
                )
        elif kind == "message_delta":
            if event.usage is not None:
                self._usage(event.usage)
        elif kind == "message_stop":
            self.finished = True
        return ""

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        self.saw_usage = True
        # message_delta counts are cumulative: the latest value wins.
        if usage.input_tokens is not None:
            self.input_tokens = usage.input_tokens
        if getattr(usage, "output_tokens", None) is not None:
            self.output_tokens = usage.output_tokens
        if usage.cache_read_input_tokens is not None:
            self.cache_read = usage.cache_read_input_tokens
        if usage.cache_creation_input_tokens is not None:
            self.cache_write = usage.cache_creation_input_tokens

    def reply(self, request: ModelRequest, model: str) -> ModelReply:
        """The finished message."""
        text = "".join(self.text)
        calls = tuple(
            ToolCall(id=block.id or f"toolu_{index}", name=block.name, arguments=_arguments(block))
            for index, block in sorted(self.blocks.items())
            if block.kind == "tool_use"
        )
        if self.saw_usage:
            usage = Usage(
                input_tokens=self.input_tokens + self.cache_read + self.cache_write,
                output_tokens=self.output_tokens,
                cached_tokens=self.cache_read,
            )
        else:
            usage = estimate_usage(request, text, calls)
        return ModelReply(text=text, tool_calls=calls, usage=usage, model=model)


def _arguments(block: _Block) -> str:
    if block.parts:
        return "".join(block.parts) or "{}"
    # No deltas: the whole input came with content_block_start (or there is none).
    if isinstance(block.initial_input, dict) and block.initial_input:
        return json.dumps(block.initial_input)
    return "{}"


# ---------------------------------------------------------------------------- client


class _ClientRetries(anthropic.Middleware):
    """Keeps the client's retries to what is the client's (runs inside its retry loop,
    once per attempt).  A 429 is marked ``x-should-retry: false``, which the client obeys
    over its own rules: parley's admission waits it out, holding no worker.  A retried
    status whose ``Retry-After`` exceeds :data:`MAX_RETRY_AFTER` counts as failed rather
    than put the client to sleep, so a fallover moves on."""

    def __init__(self, provider: str) -> None:
        self._provider = provider

    def handle(
        self, request: anthropic.APIRequest, call_next: anthropic.CallNext
    ) -> anthropic.APIResponse[Any]:
        response = call_next(request)
        status = response.status_code
        if status == 429:
            name, value = NO_CLIENT_RETRY
            response.http_response.headers[name] = value
        elif status in (408, 409) or status >= 500:
            delay = retry_delay(response.headers)
            if delay is not None and delay > MAX_RETRY_AFTER:
                response.http_response.close()
                raise ProviderError(
                    f"{self._provider}: HTTP {status}: the provider asks to wait {delay:.0f}s "
                    f"before retrying, more than {MAX_RETRY_AFTER:.0f}s",
                    provider=self._provider,
                    retriable=False,
                    phase="request",
                    status=status,
                )
        return response
