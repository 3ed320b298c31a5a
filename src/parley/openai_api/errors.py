"""OpenAI's error form, ``{"error": {"message", "type", "param", "code"}}``, with
OpenAI's statuses: what the Responses, Files and Batches interfaces refuse with, over HTTP
(the gateway answers it) and in Python (a batch line's refusal is one)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class OpenAIErrorDetail(BaseModel):
    """What went wrong, as OpenAI says it."""

    message: str
    type: str = Field(description="invalid_request_error, or server_error")
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    """Every refusal of the Responses routes."""

    error: OpenAIErrorDetail


class OpenAIError(Exception):
    """A request refused in OpenAI's terms."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_name: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = OpenAIErrorBody(
            error=OpenAIErrorDetail(message=message, type=type_name, param=param, code=code)
        )
        self.headers = headers
