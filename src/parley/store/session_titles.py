"""A session's title: what a person reads in a list of sessions.  Set from the first
prompt when the first turn is submitted (unless it was given), or given outright.

One line of printable text, at most :data:`MAX_TITLE_CHARS` characters: a title is shown
in lists and headers, where a control character (a newline, an escape) would break the
line it sits on or rewrite a terminal's."""

from __future__ import annotations

import unicodedata

MAX_TITLE_CHARS = 200
# What a title made from a prompt keeps: a list shows the first few words anyway.
PROMPT_TITLE_CHARS = 80


def title_problem(title: object) -> str | None:
    """Why ``title`` is not a title a caller may set (None: it is one)."""
    if not isinstance(title, str):
        return "title must be a string"
    if not title.strip():
        return "title must have a character that is not white space"
    if len(title) > MAX_TITLE_CHARS:
        return f"title must be at most {MAX_TITLE_CHARS} characters"
    if any(_unprintable(ch) for ch in title):
        return "title must be one line without control characters"
    return None


def title_of_prompt(prompt: str) -> str | None:
    """The title a first prompt gives its session: its words on one line, cut to
    :data:`PROMPT_TITLE_CHARS` (None if nothing printable is left)."""
    # A title is a prompt's first words: its head is enough unless that flattens to a
    # title's length or less (a head that flattens longer gives the same cut: the
    # flattened head is the start of the flattened prompt).  A batch titles thousands.
    head = prompt[: PROMPT_TITLE_CHARS * 4]
    flat = _flattened(head)
    if len(head) < len(prompt) and len(flat) <= PROMPT_TITLE_CHARS:
        flat = _flattened(prompt)
    if not flat:
        return None
    if len(flat) <= PROMPT_TITLE_CHARS:
        return flat
    return flat[: PROMPT_TITLE_CHARS - 1].rstrip() + "…"


def _flattened(text: str) -> str:
    """``text``'s words on one line, single-spaced, its unprintable characters spaces."""
    if text.isprintable():
        # (No control or separator but the space: nothing to replace, in one C loop.)
        return " ".join(text.split())
    return " ".join("".join(" " if _unprintable(ch) else ch for ch in text).split())


def _unprintable(ch: str) -> bool:
    # Cc: C0 and C1 controls (newline, tab, escape); Zl, Zp: the line and paragraph
    # separators, which end a line as a newline does; Cs: a lone surrogate.
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs")
