"""What a chat-completions request (``POST /v1/chat/completions``, as a batch line's
body) takes, in OpenAI's parameters, and what parley makes of it: a turn whose prompt
and imported history are its ``messages`` (:mod:`parley.openai_api.chat_messages`),
whose token budget is ``max_tokens`` or ``max_completion_tokens``, and whose new
session keeps ``metadata``.

The host chooses the model, the system prompt and the tools, as for Responses
(:mod:`parley.openai_api.response_requests`): ``model`` is accepted (the answer names
the model that ran); the system and developer messages (the instructions), the sampling
and the caching parameters are accepted and have no effect; what would change the shape
of the answer parley gives (the client's own tools, several choices, a stream, output
that is not text) is refused, each an :class:`~parley.openai_api.errors.OpenAIError`
naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from parley.openai_api.chat_messages import ChatMessages, read_messages
from parley.openai_api.errors import OpenAIError
from parley.openai_api.response_requests import echoable
from parley.schemas.batches import SeededHistory
from parley.validation import JSON_NUMBER

_TOKENS = Annotated[int, Field(ge=1, le=2**31 - 1, strict=False), JSON_NUMBER]
_WHOLE = Annotated[int, Field(strict=False), JSON_NUMBER]


class ChatCompletionCreate(BaseModel):
    """``POST /v1/chat/completions``: OpenAI's parameters.  A parameter OpenAI does not
    define is refused, and so is one of another JSON type than OpenAI's."""

    model_config = ConfigDict(extra="forbid", strict=True)

    messages: Annotated[list[Any], Field(min_length=1)] = Field(
        description="The conversation: system and developer messages are the instructions, "
        "the newest user message the prompt, the messages before it the imported history"
    )
    model: str | None = Field(None, max_length=200)
    max_tokens: _TOKENS | None = Field(None, description="The turn's token budget")
    max_completion_tokens: _TOKENS | None = Field(None, description="The same, newer name")
    metadata: dict[str, Any] | None = Field(None, description="The new session's metadata")
    # Refused unless they ask for what parley does anyway (check_chat_supported).
    stream: bool | None = None
    n: _WHOLE | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    # Accepted, and without effect: the host decides these.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: _WHOLE | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: _WHOLE | None = None
    stop: str | list[str] | None = None
    store: bool | None = None
    stream_options: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    service_tier: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ChatTurn:
    """What a chat-completions request asks of parley: a turn in a new session."""

    prompt: str
    history: SeededHistory | None
    max_tokens: int | None
    metadata: dict[str, Any] | None
    """The new session's metadata, unchecked (as given)."""


def chat_turn(body: Any) -> ChatTurn:
    """The turn a chat-completions request's ``body`` asks for, or :class:`OpenAIError`
    saying why it cannot be one (its ``param`` names the parameter, within the body)."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "body must be a chat completions request (an object)", param="body")
    try:
        request = ChatCompletionCreate.model_validate(body)
    except ValidationError as exc:
        problem = exc.errors()[0]
        # The parameter, not the branch of its type that pydantic tried last.
        where = str((problem.get("loc") or ("body",))[0])
        raise OpenAIError(
            400, f"{where}: {problem.get('msg', 'invalid')}", param=where, code="invalid_body"
        ) from None
    check_chat_supported(request)
    messages: ChatMessages = read_messages(request.messages)
    return ChatTurn(
        prompt=messages.prompt,
        history=messages.history,
        max_tokens=request.max_completion_tokens or request.max_tokens,
        metadata=request.metadata,
    )


def check_chat_supported(body: ChatCompletionCreate) -> None:
    """Refuse what parley cannot do as asked, before anything is written."""
    for name in ("tools", "functions"):
        if getattr(body, name):
            raise OpenAIError(
                400,
                f"{name} are the host's: parley runs its host's tools itself and calls none "
                f"of the client's; leave {name} out",
                param=name,
            )
    if body.n not in (None, 1):
        raise OpenAIError(400, "parley answers a request once: n must be 1", param="n")
    if body.stream:
        raise OpenAIError(400, "a batch's lines are not streamed", param="stream")
    if (body.response_format or {}).get("type", "text") != "text":
        raise OpenAIError(400, "only text output is served", param="response_format")
    if body.audio is not None or any(m != "text" for m in body.modalities or ()):
        raise OpenAIError(
            400, "only text output is served", param="audio" if body.audio else "modalities"
        )
    if body.model is not None and not echoable(body.model):
        raise OpenAIError(400, "model must be text (UTF-8, no NUL)", param="model")
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise OpenAIError(
            400,
            "max_tokens and max_completion_tokens are the same budget: give one of them",
            param="max_tokens",
        )
