"""A session's title from its first prompt (src/parley/store/session_titles.py) reads only
the prompt's head when that is enough: for any prompt it is the title the whole prompt
gives (its words on one line, cut to PROMPT_TITLE_CHARS)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from parley.store.session_titles import PROMPT_TITLE_CHARS, _unprintable, title_of_prompt


def whole_prompt_title(prompt: str) -> str | None:
    flat = " ".join("".join(" " if _unprintable(ch) else ch for ch in prompt).split())
    if not flat:
        return None
    if len(flat) <= PROMPT_TITLE_CHARS:
        return flat
    return flat[: PROMPT_TITLE_CHARS - 1].rstrip() + "…"


@given(st.text(alphabet="ab \n\t\u2028\x07é", max_size=1200))
def test_a_title_is_the_whole_prompts_whatever_its_length(prompt: str) -> None:
    assert title_of_prompt(prompt) == whole_prompt_title(prompt)


def test_a_long_prompt_with_a_short_head_is_read_on() -> None:
    prompt = " " * (PROMPT_TITLE_CHARS * 4) + "the words come late"
    assert title_of_prompt(prompt) == "the words come late"
