"""What ``POST /v1/responses`` takes, in OpenAI's parameters, and what parley makes of
them: the prompt of an ``input``, the answers of its ``mcp_approval_response`` items, the
parameters it refuses (each an :class:`~parley.openai_api.errors.OpenAIError`
naming the parameter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from parley.openai_api.errors import OpenAIError
from parley.validation import JSON_NUMBER, MAX_PROMPT_BYTES, MAX_STEER_BYTES


class ResponseCreate(BaseModel):
    """``POST /v1/responses``: OpenAI's parameters.  The host chooses the model, the
    system prompt and the tools: ``model`` is recorded, ``instructions`` and the sampling
    parameters are accepted and have no effect, and ``tools`` (functions the client would
    run) are refused.  A parameter OpenAI does not define is refused, and so is one of
    another JSON type than OpenAI's (``"stream": "true"`` is not true)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: (
        Annotated[str, Field(min_length=1, pattern=r"\S")]
        | Annotated[list[dict[str, Any]], Field(min_length=1)]
    ) = Field(
        description="The prompt, or a message list whose newest user message is the prompt "
        "(earlier messages are not replayed: the stored history is what the model sees)"
    )
    model: str | None = Field(None, max_length=200)
    previous_response_id: str | None = Field(
        None, description="Continue after this response, in its conversation"
    )
    conversation: str | dict[str, Any] | None = Field(
        None, description="A conversation (a session id, or {'id': …}) to continue"
    )
    background: bool | None = Field(None, description="Answer at once, status queued")
    stream: bool | None = Field(None, description="Answer with the response's event stream")
    max_output_tokens: (
        Annotated[int, Field(ge=1, le=2**31 - 1, strict=False), JSON_NUMBER] | None
    ) = Field(None, description="The turn's token budget (input and output)")
    store: bool | None = None
    tools: list[dict[str, Any]] | None = None
    text: dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    # Accepted, and without effect: the host decides these.
    instructions: str | None = None
    metadata: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: Annotated[int, Field(strict=False), JSON_NUMBER] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Field(strict=False), JSON_NUMBER] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    include: list[str] | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: str | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    access_programs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None


def prompt_of(value: str | list[dict[str, Any]]) -> str:
    """The prompt of a request's ``input``: the string, or the text of the newest user
    message, which must come last (parley runs its host's tools itself: there is no
    ``function_call_output`` of the client's to take)."""
    if isinstance(value, str):
        text = value
    else:
        users = [
            n
            for n, item in enumerate(value)
            if item.get("role") == "user" and item.get("type", "message") == "message"
        ]
        if not users:
            raise OpenAIError(
                400, "input has no user message (its newest one is the prompt)", param="input"
            )
        last = users[-1]
        if last != len(value) - 1:
            kind = value[last + 1].get("type") or value[last + 1].get("role")
            raise OpenAIError(
                400,
                f"input[{last + 1}] ({kind}) follows the newest user message: the prompt "
                "must come last (parley runs its host's tools; it takes no tool outputs)",
                param=f"input[{last + 1}]",
            )
        text = _text_of(value[last].get("content"), f"input[{last}].content")
    return checked_prompt(text, "input")


def checked_prompt(text: str, param: str) -> str:
    """``text`` if it can be a turn's prompt (not blank, no NUL, UTF-8, at most
    :data:`~parley.validation.MAX_PROMPT_BYTES`), else :class:`OpenAIError` naming
    ``param``, the request's parameter it came from."""
    if not text.strip():
        raise OpenAIError(400, f"{param} is empty: there is no prompt", param=param, code="empty")
    if "\x00" in text:
        raise OpenAIError(400, f"{param} contains a NUL character", param=param)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise OpenAIError(400, f"{param} is not valid UTF-8", param=param) from None
    if size > MAX_PROMPT_BYTES:
        raise OpenAIError(
            400, f"{param} is {size} bytes; the limit is {MAX_PROMPT_BYTES}", param=param
        )
    return text


@dataclass(frozen=True, kw_only=True)
class ApprovalResponseItem:
    """An ``mcp_approval_response`` input item: a person's answer to a waiting call."""

    position: int
    approval_id: str
    approve: bool
    reason: str | None


def answers_of(value: str | list[dict[str, Any]]) -> list[ApprovalResponseItem]:
    """The ``mcp_approval_response`` items of ``input``, which come last (the items
    before them, like earlier messages, are not replayed); none for any other input."""
    if isinstance(value, str):
        return []
    kinds = [item.get("type") for item in value]
    if "mcp_approval_response" not in kinds:
        return []
    first = kinds.index("mcp_approval_response")
    answers = []
    for n in range(first, len(value)):
        item = value[n]
        if kinds[n] != "mcp_approval_response":
            raise OpenAIError(
                400,
                f"input[{n}] follows an mcp_approval_response: answers to approval requests "
                "come last, and alone (a steer for the response goes through the native API)",
                param=f"input[{n}]",
            )
        approval_id, approve, reason = (
            item.get("approval_request_id"),
            item.get("approve"),
            item.get("reason"),
        )
        if not isinstance(approval_id, str) or not approval_id or len(approval_id) > 36:
            raise OpenAIError(
                400, "approval_request_id must be an id", param=f"input[{n}].approval_request_id"
            )
        if not isinstance(approve, bool):
            raise OpenAIError(400, "approve must be true or false", param=f"input[{n}].approve")
        if reason is not None and (
            not isinstance(reason, str)
            or not echoable(reason)
            or len(reason.encode("utf-8")) > MAX_STEER_BYTES
        ):
            raise OpenAIError(
                400,
                f"reason must be text of at most {MAX_STEER_BYTES} bytes",
                param=f"input[{n}].reason",
            )
        reason = reason if reason and reason.strip() else None
        answers.append(
            ApprovalResponseItem(
                position=n, approval_id=approval_id, approve=approve, reason=reason
            )
        )
    return answers


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(400, f"{where} must be a string or a list of parts", param=where)
    texts = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "text") or not isinstance(part.get("text"), str):
            raise OpenAIError(
                400,
                f"{where}[{n}] is {kind or 'not a part'}: parley takes text input only",
                param=f"{where}[{n}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def check_supported(body: ResponseCreate) -> None:
    """Refuse what parley cannot do as asked, before anything is written."""
    if body.tools:
        raise OpenAIError(
            400,
            "tools are the host's: parley runs its host's tools itself and calls none of "
            "the client's; leave tools out",
            param="tools",
        )
    if body.store is False:
        raise OpenAIError(400, "parley stores every response (a response is a turn)", param="store")
    if body.prompt is not None:
        raise OpenAIError(400, "prompt templates are not served; send input", param="prompt")
    text_format = (body.text or {}).get("format")
    if isinstance(text_format, dict) and text_format.get("type", "text") != "text":
        raise OpenAIError(400, "only text output is served", param="text.format")
    if body.model is not None and not echoable(body.model):
        raise OpenAIError(400, "model must be text (UTF-8, no NUL)", param="model")
    if body.previous_response_id is not None and body.conversation is not None:
        raise OpenAIError(
            400,
            "previous_response_id and conversation cannot be used together",
            param="previous_response_id",
        )


def echoable(text: str) -> bool:
    """Whether ``text`` can be sent back in a JSON answer (UTF-8 has no lone surrogate,
    and no NUL)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def conversation_id(value: str | dict[str, Any]) -> str:
    given = value.get("id") if isinstance(value, dict) else value
    if not isinstance(given, str) or not given:
        raise OpenAIError(400, "conversation must be an id or {'id': …}", param="conversation")
    return given
