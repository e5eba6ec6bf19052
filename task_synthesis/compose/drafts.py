"""Drafts: a candidate task's source with the plan it was drawn from, made by one of the composers.

Both composers draw the same plan for a (category, seed): the programmatic one renders it, the
LLM composer has a model write it (llm_composer.py). A composer whose drafts wait on a server
makes them on background threads, `concurrency` at a time; the others make them at once.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import threading

from .composer import Plan, compose
from .render import render


@dataclasses.dataclass
class Draft:
    source: str
    plan: Plan
    composer: str  # "programmatic" or "llm"


class DraftRejected(Exception):
    """A draft that cannot go on (an LLM reply without code); recorded like a filter rejection."""

    def __init__(self, stage: str, reason: str, reply: str | None = None):
        super().__init__(f"{stage}: {reason}")
        self.stage, self.reason, self.reply = stage, reason, reply


class ProgrammaticComposer:
    name = "programmatic"
    concurrency = 0  # drafts are made at once, in the caller's thread

    def __init__(self, operators: list[dict], scale: str):
        self.operators, self.scale = operators, scale

    def draft(self, category: str, seed: int, batch_factor: int = 1) -> Draft:
        """The task of (category, seed); with `batch_factor`, the same task with its batch multiplied."""
        plan = compose(category, self.operators, seed, self.scale, batch_factor)
        return Draft(render(plan), plan, self.name)


def start_draft(composer, category: str, seed: int) -> futures.Future:
    """A future of composer.draft(category, seed): done already, or made on a daemon thread (a run that
    stops does not wait for a slow server)."""
    future: futures.Future = futures.Future()

    def make() -> None:
        try:
            future.set_result(composer.draft(category, seed))
        except BaseException as exc:  # handed to whoever reads the future
            future.set_exception(exc)

    if composer.concurrency:
        threading.Thread(target=make, name=f"draft-{category}-{seed}", daemon=True).start()
    else:
        make()
    return future
