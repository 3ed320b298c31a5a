"""Choosing a model from a ``PARLEY_MODEL`` string.

``openai:<model>``, ``anthropic:<model>``, ``scripted:<path>``, or a comma-separated list of
them meaning an ordered fallover (``openai:gpt-4o-mini,anthropic:claude-sonnet-4-5``).

Credentials and endpoints come from the environment only, never from the spec (a spec is
configuration that gets logged and shown): ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` (any
OpenAI-compatible server: OpenRouter, vLLM, Ollama, LM Studio …; such a server that needs
no key accepts any placeholder), ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``.  One
endpoint per protocol is enough for the fallovers parley needs; two OpenAI-compatible
endpoints with different keys would need their own variables, and are not supported here.
"""

from __future__ import annotations

from collections.abc import Mapping

from parley.errors import InvalidRequest
from parley.models.fallover import Fallover
from parley.models.scripted import ScriptedModel
from parley.ports.host import Model
from parley.settings import Settings

OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT_URL = "https://api.anthropic.com"

_FORMS = "openai:<model>, anthropic:<model> or scripted:<path>, or a comma-separated list"


def model_from_spec(spec: str, env: Mapping[str, str] | None = None) -> Model:
    """The model ``spec`` names, configured from ``env`` (the providers' variables; by
    default the process's environment's, read now).

    A network provider is wrapped in a :class:`Fallover` even alone, so that a stream cut
    mid-way is retried; a list becomes one fallover in the given order.  Raises
    :class:`InvalidRequest` for a malformed spec or a missing API key."""
    if env is None:
        env = Settings.from_environment().credentials
    parts = [part.strip() for part in spec.split(",")]
    if not spec.strip() or not all(parts):
        raise InvalidRequest(f"empty model spec in {spec!r}; expected {_FORMS}")
    models = [_one(part, env) for part in parts]
    if len(models) == 1 and isinstance(models[0], ScriptedModel):
        return models[0]
    return Fallover(models)


def _one(spec: str, env: Mapping[str, str]) -> Model:
    kind, sep, rest = spec.partition(":")
    kind = kind.strip().lower()
    rest = rest.strip()
    if not sep or not rest:
        raise InvalidRequest(f"model spec {spec!r}: expected {_FORMS}")
    if kind == "scripted":
        return ScriptedModel(rest)
    if kind == "openai":
        # Imported here: a scripted spec should not pay for loading the client libraries.
        from parley.models.openai_chat import OpenAIChatModel

        return OpenAIChatModel(
            rest,
            api_key=_key(env, "OPENAI_API_KEY", spec),
            # Passed explicitly so that ``env`` alone decides, not the client library's own
            # look into the environment.
            base_url=env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_URL,
        )
    if kind == "anthropic":
        from parley.models.anthropic_messages import AnthropicModel

        return AnthropicModel(
            rest,
            api_key=_key(env, "ANTHROPIC_API_KEY", spec),
            base_url=env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_DEFAULT_URL,
        )
    raise InvalidRequest(f"model spec {spec!r}: unknown provider {kind!r}; expected {_FORMS}")


def _key(env: Mapping[str, str], variable: str, spec: str) -> str:
    key = env.get(variable, "").strip()
    if not key:
        raise InvalidRequest(
            f"model {spec!r} needs {variable} in the environment "
            "(for a local server that needs no key, set it to any placeholder)"
        )
    return key
