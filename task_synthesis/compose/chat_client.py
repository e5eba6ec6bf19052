"""A minimal client of an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted model).

Standard library only. A request that fails in a way that may pass (no connection, a timeout,
HTTP 408, 429 or 5xx, a body that is not JSON) is tried again after a growing pause; any other
HTTP error, or the same failure after every retry, raises EndpointError with one line saying why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.error
import urllib.request

RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class EndpointError(RuntimeError):
    """The endpoint cannot answer (unreachable, HTTP errors after the retries); str() is one line."""


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    base_url: str  # e.g. http://host:8000/v1 (the request goes to {base_url}/chat/completions)
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable; unset: no Authorization header
    timeout_s: float = 120.0  # per request
    retries: int = 3  # further attempts after a failure that may pass
    backoff_s: float = 2.0  # pause before the first retry, doubled before each next one
    temperature: float = 1.0
    max_tokens: int = 4096

    def __post_init__(self):
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            raise ValueError("--model must name the model at the endpoint")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError("--request-timeout must be positive and --retries not negative")


class _Retry(Exception):
    """A failure worth another attempt."""


class ChatClient:
    def __init__(self, settings: ChatSettings):
        self.settings = settings
        self.url = settings.base_url.rstrip("/") + "/chat/completions"

    def complete(self, messages: list[dict]) -> str:
        """The reply text of the first choice ("" when the endpoint sent none)."""
        payload = {"model": self.settings.model, "messages": messages, "temperature": self.settings.temperature,
                   "max_tokens": self.settings.max_tokens}
        attempts = self.settings.retries + 1
        for attempt in range(attempts):
            try:
                return _reply_text(self._post(payload))
            except _Retry as failure:
                if attempt + 1 == attempts:
                    raise EndpointError(f"{failure} (after {attempts} attempt{'s' * (attempts > 1)})") from None
                time.sleep(self.settings.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _post(self, payload: dict) -> dict:
        key = os.environ.get(self.settings.api_key_env, "")
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        request = urllib.request.Request(self.url, data=json.dumps(payload).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read()[:200].decode("utf-8", "replace").replace("\n", " ")
            message = f"endpoint {self.url} answered HTTP {error.code}: {detail}"
            if error.code in RETRIED_STATUSES:
                raise _Retry(message) from None
            raise EndpointError(message) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise _Retry(f"endpoint {self.url} unreachable: {reason}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise _Retry(f"endpoint {self.url} sent a body that is not JSON") from None


def _reply_text(reply: dict) -> str:
    try:
        choice = reply["choices"][0]
    except (KeyError, IndexError, TypeError):
        return ""
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""
