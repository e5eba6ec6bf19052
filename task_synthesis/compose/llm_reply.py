"""The task source in an LLM's reply: a fenced block, or the reply itself when it is bare code.

Reasoning sections (`<think>...</think>`) are dropped first. Of several fenced blocks, the one
that defines `Model` wins (the longest when several do); a fence the reply never closes (cut by
the token limit) runs to the end of the reply. Nothing here runs the code.
"""

from __future__ import annotations

import re

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.DOTALL | re.MULTILINE)
_CODE_START = re.compile(r"^(import |from |class |def |\"\"\"|'''|#)", re.MULTILINE)
DEFINES_MODEL = re.compile(r"^class Model\b", re.MULTILINE)


def extract_code(reply: str) -> str | None:
    """The task source, or None when the reply holds no code that defines `Model`."""
    text = _THINK.sub("", reply or "").strip()
    blocks = [body for language, body in _FENCE.findall(text) if language.lower() in ("", "python", "py", "python3")]
    candidates = [b for b in blocks if DEFINES_MODEL.search(b)]
    if candidates:
        return _tidy(max(candidates, key=len))
    if blocks or not DEFINES_MODEL.search(text):
        return None
    start = _CODE_START.search(text)
    return _tidy(text[start.start():]) if start else None


def _tidy(code: str) -> str:
    return code.strip("\n") + "\n"
