"""The LLM composer: the programmatic composer's plan, written as a task by a model behind an
OpenAI-compatible endpoint.

The reply is text: its code goes to the filter like any other candidate's (the static screen in
this process, then the worker processes and the evaluator's children); it is never imported or
run here. A reply without code is a recorded rejection; an endpoint that cannot answer stops the run.
"""

from __future__ import annotations

from .chat_client import ChatClient, ChatSettings
from .composer import compose
from .drafts import Draft, DraftRejected
from .llm_prompt import messages
from .llm_reply import extract_code

REPLY_KEPT_CHARS = 2000  # of a reply without code, for the journal


class LLMComposer:
    name = "llm"

    def __init__(self, operators: list[dict], scale: str, settings: ChatSettings, concurrency: int = 1):
        self.operators, self.scale = operators, scale
        self.client = ChatClient(settings)
        self.concurrency = max(1, concurrency)

    def draft(self, category: str, seed: int) -> Draft:
        plan = compose(category, self.operators, seed, self.scale)
        reply = self.client.complete(messages(plan))
        code = extract_code(reply)
        if code is None:
            why = "an empty reply" if not reply.strip() else "no code defining Model in the reply"
            raise DraftRejected("reply", why, reply[:REPLY_KEPT_CHARS])
        return Draft(code, plan, self.name)
