"""A streaming model over the OpenAI chat-completions API, through the official ``openai``
client: OpenAI itself and every server that speaks the same protocol (OpenRouter, vLLM,
Ollama, LM Studio …), chosen by ``base_url``.

Each text delta is published as its SSE chunk arrives; tool calls streamed in fragments
(keyed by ``index``) are assembled into whole calls; usage, including cached prompt
tokens, is read from the final chunk (``stream_options.include_usage``).

Retries are split by phase (see :mod:`parley.models.errors`): the client retries 5xx,
408, 409 and connection errors before the stream starts (``max_retries``, exponential
backoff with jitter, honouring ``Retry-After`` up to two minutes); a failure once streaming
has begun is raised as a ``retriable`` :class:`~parley.models.errors.ProviderError` for
:class:`~parley.models.fallover.Fallover` to retry.  A 429 is never the client's: a
response hook on its HTTP client marks it ``x-should-retry: false`` as it arrives, and it
is raised at once as :class:`~parley.models.errors.RateLimited` (or, for
``insufficient_quota``, as a final error that says the quota is spent).  Every reply
carries the limits the response's ``x-ratelimit-*`` headers reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import httpx2
import openai
from openai.types.chat import ChatCompletionChunk

from parley.errors import InvalidRequest
from parley.models._wire import NO_CLIENT_RETRY, ProviderModel, cause_text
from parley.models.completion import estimate_usage
from parley.models.errors import ProviderError, redact
from parley.ports.host import DeltaSink, ModelReply, ModelRequest
from parley.schemas.messages import AssistantMessage, Prefix, ToolCall, ToolMessage, UserMessage
from parley.schemas.records import Usage

# ValueError: not JSON; TypeError, AttributeError: JSON of the wrong shape.
_STREAM_FAILURES = (openai.OpenAIError, httpx2.HTTPError, ValueError, TypeError, AttributeError)

QUOTA_CODE = "insufficient_quota"
"""OpenAI's error ``code`` (and ``type``) for an account out of quota or credit, sent
with a 429 like a rate limit, though no wait mends it."""

OUTPUT_CEILING_FIELDS = ("max_completion_tokens", "max_tokens")
"""The request fields that bound an answer's tokens, newest first (OpenAI counts them
against the tokens-per-minute limit when the call arrives)."""


class OpenAIChatModel(ProviderModel):
    """A model served over chat completions.

    ``timeout`` (seconds) bounds each HTTP attempt's connect and every read: the longest
    the server may stay silent, before the first byte or between chunks.  ``max_retries``
    is the client's own retry budget for failures before the stream starts (429s
    excepted: they are parley's).  ``extra_headers`` are sent with every request (e.g.
    OpenRouter's ``HTTP-Referer``); ``extra_body`` adds request fields (``temperature``,
    ``max_tokens`` …; ``max_completion_tokens`` or ``max_tokens`` there is the
    :attr:`output_ceiling`).  With no ``api_key`` the client reads ``OPENAI_API_KEY``; a
    local server that needs no key accepts any placeholder.  The key is held by the
    client only: it is not an attribute of this object, never in its repr, and redacted
    from every error text.
    """

    client_errors = (
        openai.OpenAIError,
        openai.APIStatusError,
        openai.APITimeoutError,
        openai.APIConnectionError,
    )
    stream_failures = _STREAM_FAILURES
    end_marker = "finish_reason"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        name: str | None = None,
    ) -> None:
        if not model:
            raise InvalidRequest("OpenAIChatModel needs a model name")
        if timeout <= 0 or max_retries < 0:
            raise InvalidRequest("timeout must be positive and max_retries non-negative")
        self._model = model
        self._name = name or f"openai:{model}"
        self._timeout = timeout
        self._max_retries = max_retries
        self._extra_body = dict(extra_body) if extra_body else None
        self._output_ceiling = _output_ceiling(self._name, self._extra_body or {})
        try:
            self._client = openai.OpenAI(
                api_key=api_key,
                base_url=base_url,
                timeout=timeout,
                max_retries=max_retries,
                default_headers=dict(extra_headers) if extra_headers else None,
                # The SDK's own defaults (connection limits, redirects), plus the hook.
                http_client=openai.DefaultHttpxClient(
                    event_hooks={"response": [_leave_429s_to_parley]}
                ),
            )
        except openai.OpenAIError as exc:
            raise InvalidRequest(
                f"{self._name}: {redact(str(exc), api_key)} "
                "(a local server that needs no key accepts any placeholder)"
            ) from None

    @property
    def output_ceiling(self) -> int | None:
        """The most tokens an answer may have, as the request sends it
        (``max_completion_tokens`` or ``max_tokens`` in ``extra_body``); None when it sends
        none (admission then assumes its default)."""
        return self._output_ceiling

    # ------------------------------------------------------------------ encoding

    def encode(self, request: ModelRequest) -> dict[str, Any]:
        """The request's ``messages`` and ``tools`` in the chat-completions wire form.  The
        prefix part (system message and tools) depends on the prefix alone and is
        canonical, so equal prefixes are byte-identical on the wire and prompt caches hit."""
        body: dict[str, Any] = {"messages": encode_messages(request)}
        tools = encode_tools(request.prefix)
        if tools:
            body["tools"] = tools
        return body

    # ------------------------------------------------------------------ streaming

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        """Stream one answer: each text delta to ``on_delta`` as its chunk arrives.

        Raises :class:`ProviderError` when the provider fails (``retriable`` once the
        stream has started); whatever ``on_delta`` raises (an interrupt) propagates, after
        the HTTP stream is closed."""
        body = self.encode(request)
        chunks = self._start(
            lambda: self._client.chat.completions.create(
                model=self._model,
                messages=cast(Any, body["messages"]),
                tools=cast(Any, body.get("tools", openai.omit)),
                stream=True,
                stream_options={"include_usage": True},
                extra_body=self._extra_body,
            )
        )
        return self._read(chunks, _Assembly(), request, on_delta)

    # ------------------------------------------------------------------ errors

    def _redact(self, text: str) -> str:
        return redact(text, self._client.api_key)

    def _api_message(self, exc: Any) -> str:
        body = exc.body
        if isinstance(body, Mapping):
            error = body.get("error", body)
            if isinstance(error, Mapping) and isinstance(error.get("message"), str):
                return str(error["message"])
        return str(exc.message)

    def _is_quota(self, exc: Any) -> bool:
        error = exc.body.get("error", exc.body) if isinstance(exc.body, Mapping) else None
        if not isinstance(error, Mapping):
            return False
        return QUOTA_CODE in (error.get("code"), error.get("type"))

    def _stream_error(self, exc: Exception) -> ProviderError:
        """A failure once streaming had begun: the client cannot retry it, a new attempt
        against the same provider usually works."""
        if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
            what = f"the stream stalled for more than {self._timeout}s"
        elif isinstance(exc, openai.APIConnectionError | httpx2.HTTPError):
            what = f"the stream was cut: {cause_text(exc)}"
        elif isinstance(exc, openai.APIError):
            what = f"the provider reported an error mid-stream: {self._api_message(exc)}"
        else:
            what = f"malformed chunk: {type(exc).__name__}: {exc}"
        return ProviderError(
            f"{self._name}: {self._redact(what)}",
            provider=self._name,
            retriable=True,
            phase="stream",
        )


# ---------------------------------------------------------------------------- encoding


def encode_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """Parley messages as chat-completions messages: the system prompt first, assistant
    tool calls as ``tool_calls``, tool results as ``tool`` messages with their call id."""
    encoded: list[dict[str, Any]] = []
    system_prompt = request.prefix.system_prompt
    if system_prompt:
        encoded.append({"role": "system", "content": system_prompt})
    for message in request.messages:
        if isinstance(message, UserMessage):
            encoded.append({"role": "user", "content": message.text})
        elif isinstance(message, AssistantMessage):
            item: dict[str, Any] = {
                "role": "assistant",
                # null rather than "" beside tool calls: what the API itself returns.
                "content": message.text if message.text or not message.tool_calls else None,
            }
            if message.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in message.tool_calls
                ]
            encoded.append(item)
        elif isinstance(message, ToolMessage):
            encoded.append(
                {"role": "tool", "tool_call_id": message.call_id, "content": message.content}
            )
    return encoded


def encode_tools(prefix: Prefix) -> list[dict[str, Any]]:
    """The prefix's tools as function tools, built from its canonical bytes: key order in
    the declared schemas (which differs between a host's code and a database round trip)
    cannot change the bytes sent, so equal prefixes keep hitting the provider's cache."""
    canonical = json.loads(prefix.canonical_bytes())
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool["description"],
                "parameters": tool["parameters"],
            },
        }
        for tool in canonical["tools"]
    ]


# ---------------------------------------------------------------------------- assembly


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Assembly:
    """Accumulates one streamed answer."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    usage: Usage | None = None
    finished: bool = False

    def absorb(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk in; return its text delta."""
        if chunk.usage is not None:
            details = chunk.usage.prompt_tokens_details
            self.usage = Usage(
                input_tokens=chunk.usage.prompt_tokens or 0,
                output_tokens=chunk.usage.completion_tokens or 0,
                cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
            )
        pieces: list[str] = []
        for choice in chunk.choices or ():
            if choice.index:  # only the first choice is ours (n is never set)
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    pieces.append(delta.content)
                if delta.refusal:
                    pieces.append(delta.refusal)
                for fragment in delta.tool_calls or ():
                    self._absorb_call(fragment)
            if choice.finish_reason:
                self.finished = True
        piece = "".join(pieces)
        if piece:
            self.text.append(piece)
        return piece

    def _absorb_call(self, fragment: Any) -> None:
        index = getattr(fragment, "index", None)
        if not isinstance(index, int):
            # Some servers omit the index and send each call whole: a new call each time.
            index = len(self.calls)
        call = self.calls.setdefault(index, _PartialCall())
        if fragment.id and not call.id:
            call.id = fragment.id
        function = fragment.function
        if function is not None:
            if function.name and not call.name:
                call.name = function.name
            if function.arguments:
                call.arguments.append(function.arguments)

    def reply(self, request: ModelRequest, model: str) -> ModelReply:
        """The finished answer."""
        text = "".join(self.text)
        calls = tuple(
            ToolCall(
                id=partial.id or f"call_{index}",
                name=partial.name,
                # A call without arguments is an empty object, not an empty string, so the
                # tool's parser and a later replay both see valid JSON.
                arguments="".join(partial.arguments) or "{}",
            )
            for index, partial in sorted(self.calls.items())
        )
        usage = self.usage if self.usage is not None else estimate_usage(request, text, calls)
        return ModelReply(text=text, tool_calls=calls, usage=usage, model=model)


# ---------------------------------------------------------------------------- helpers


def _leave_429s_to_parley(response: httpx2.Response) -> None:
    """Tell the client not to retry a 429 (it obeys ``x-should-retry`` over its own rules):
    parley's admission waits it out, holding no worker (see :mod:`parley.models.errors`)."""
    if response.status_code == 429:
        name, value = NO_CLIENT_RETRY
        response.headers[name] = value


def _output_ceiling(name: str, extra_body: Mapping[str, Any]) -> int | None:
    for field_name in OUTPUT_CEILING_FIELDS:
        value = extra_body.get(field_name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(
                f"{name}: extra_body[{field_name!r}] must be a positive whole number of "
                f"tokens, not {value!r}"
            )
        return value
    return None


OpenAICompatible = OpenAIChatModel
"""The same model, under a name that says it serves any OpenAI-compatible server."""
