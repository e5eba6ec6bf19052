"""The tokenizer of a Hugging Face model directory, through the `tokenizers` library only.

Special tokens come from `tokenizer_config.json` and `generation_config.json` when present: the
generation config's `eos_token_id` (one id or a list, e.g. Qwen's <|im_end|> and <|endoftext|>)
is what a sampler should stop on; the pad id falls back to the first end-of-sequence id.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence


class TokenizerError(ValueError):
    """A tokenizer directory that cannot be used (one clear line for the user)."""


def _token_text(entry: Any) -> str | None:
    """tokenizer_config.json writes a special token either as text or as {"content": text, ...}."""
    if isinstance(entry, dict):
        return entry.get("content")
    return entry


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


@dataclasses.dataclass
class Tokenizer:
    """encode/decode plus the ids a sampler and a trainer need."""

    backend: Any  # tokenizers.Tokenizer
    eos_ids: tuple[int, ...]
    pad_id: int | None
    bos_id: int | None
    special_tokens: dict[str, int]
    chat_template: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Read `tokenizer.json` (required) and the optional tokenizer/generation configs in `directory`."""
    from tokenizers import Tokenizer as Backend

    directory = Path(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"no tokenizer.json in {directory}")
    try:
        backend = Backend.from_file(str(path))
    except Exception as e:  # the tokenizers library raises its own exception types
        raise TokenizerError(f"{path} could not be read: {e}") from None
    tok_cfg = _read_json(directory / "tokenizer_config.json")
    gen_cfg = _read_json(directory / "generation_config.json")

    def id_of(entry: Any) -> int | None:
        text = _token_text(entry)
        return backend.token_to_id(text) if text else None

    special = {t.content: backend.token_to_id(t.content)
               for t in _added_tokens(backend) if getattr(t, "special", False)}
    eos_ids = _as_id_list(gen_cfg.get("eos_token_id"))
    eos_from_tok = id_of(tok_cfg.get("eos_token"))
    if eos_from_tok is not None and eos_from_tok not in eos_ids:
        eos_ids.append(eos_from_tok)
    pad_id = id_of(tok_cfg.get("pad_token"))
    if pad_id is None and gen_cfg.get("pad_token_id") is not None:
        pad_id = _as_id_list(gen_cfg["pad_token_id"])[0]
    if pad_id is None and eos_ids:
        pad_id = eos_ids[0]
    bos_id = id_of(tok_cfg.get("bos_token"))
    if bos_id is None and gen_cfg.get("bos_token_id") is not None:
        bos_id = _as_id_list(gen_cfg["bos_token_id"])[0]
    return Tokenizer(backend=backend, eos_ids=tuple(eos_ids), pad_id=pad_id, bos_id=bos_id,
                     special_tokens=special, chat_template=tok_cfg.get("chat_template"))


def _added_tokens(backend) -> list:
    decoder = getattr(backend, "get_added_tokens_decoder", None)
    return list(decoder().values()) if decoder else []


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path} is not valid JSON: {e}") from None
