"""Models a host can run: the offline scripted model, function-backed models, and the
streaming network providers (OpenAI-compatible chat completions, Anthropic Messages) with
retry and fallover (a 429 is raised as :class:`RateLimited`, for admission to wait out).

Any object with a ``name`` and ``stream(request, on_delta) -> ModelReply`` is a model.

The network providers load on first use: their client libraries take seconds to import,
which every ``import parley`` (the CLI, each worker) would otherwise pay."""

from __future__ import annotations

from typing import TYPE_CHECKING

from parley.lazy import lazy_exports
from parley.models.completion import CompletionModel
from parley.models.errors import ProviderError, RateLimited
from parley.models.fallover import Backoff, Fallover
from parley.models.function import FunctionModel
from parley.models.scripted import ScriptedModel
from parley.ports.host import ModelReply, ModelRequest, StreamAborted

if TYPE_CHECKING:
    from parley.models.anthropic_messages import AnthropicModel
    from parley.models.openai_chat import OpenAIChatModel
    from parley.models.openai_chat import OpenAIChatModel as OpenAICompatible
    from parley.models.selection import model_from_spec

_LAZY = {
    "AnthropicModel": "parley.models.anthropic_messages",
    "OpenAIChatModel": "parley.models.openai_chat",
    "OpenAICompatible": "parley.models.openai_chat",  # OpenAIChatModel, for any compatible server
    "model_from_spec": "parley.models.selection",
}

__all__ = [
    "AnthropicModel",
    "Backoff",
    "CompletionModel",
    "Fallover",
    "FunctionModel",
    "ModelReply",
    "ModelRequest",
    "OpenAIChatModel",
    "OpenAICompatible",
    "ProviderError",
    "RateLimited",
    "ScriptedModel",
    "StreamAborted",
    "model_from_spec",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
