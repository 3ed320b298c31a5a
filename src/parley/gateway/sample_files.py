"""The files a new workspace starts with when the gateway runs the offline scripted
agent (no model configured): something for "look around the files" to find, so that a
first try of the page shows a tool call with a result worth reading."""

from __future__ import annotations

from pathlib import Path

SAMPLE_FILES = {
    "README.md": "# A sample workspace\n\n"
    "parley made these files for the offline scripted agent to find. Ask it to look\n"
    "around the files, or for a slow story to steer and interrupt. Set PARLEY_HOST or\n"
    "PARLEY_MODEL for a real model, which can read and write here.\n",
    "retry.py": "RETRY_ON = (502, 504)\nATTEMPTS = 3\n\n\n"
    "def backoff(attempt: int) -> float:\n    return 0.2 * 2**attempt\n",
    "config.toml": "[pool]\nsize = 10\n",
    "notes/ideas.md": "- steer a turn while it runs\n- branch from an earlier turn\n",
}


def add_sample_files(root: Path) -> None:
    """Write the sample files into ``root`` (a workspace just made, so empty)."""
    for name, text in SAMPLE_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
