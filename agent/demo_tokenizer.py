"""Small byte-level BPE tokenizers with the ChatML special tokens, built in code.

For tests and demos of the scripted policy when no model tokenizer is at hand (no download).
Both encode any text (byte-level) and decode it back exactly; neither is a model's tokenizer.

- `demo_tokenizer`: 523 tokens learnt from a few lines of kernel-workspace text.
- `workspace_tokenizer`: 4,096 tokens learnt from the text an episode of the example tasks is
  made of (the system prompt, SKILL.md, the example tasks and their solutions), merging across
  spaces, so that an episode is about 2,200 tokens instead of 9,000: short enough to train a tiny
  policy on a CPU in minutes (the CPU first run, README).
"""

from __future__ import annotations

import functools
from pathlib import Path

from agent.chat import IM_END, IM_START

SPECIAL_TOKENS = ("<|endoftext|>", IM_START, IM_END)

_CORPUS = [
    "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n",
    "def get_inputs():\n    return [torch.randn(16, 16)]\ndef get_init_inputs():\n    return []\n",
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls kernels"}}\n</tool_call>\n',
    "<tool_response>\ncompile: built in 1.0 s\nverify: correct\nreward: 3\n</tool_response>\n",
    '#include "binding_registry.h"\nextern "C" void launcher(const float* x, float* y, int n, int config, void* stream) {\n'
    "  for (int i = 0; i < n; ++i) { y[i] = x[i]; }\n}\n",
    "__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = x[i];\n}\n",
    "You are an expert CUDA engineer working in a kernel workspace. Read the file, write the kernels, "
    "compile, verify and profile the solution against torch.compile.\n",
]


def _train_bpe(corpus: list[str], vocab_size: int, use_regex: bool = True):
    """A byte-level BPE `tokenizers.Tokenizer` with our special tokens, trained on `corpus`.
    use_regex=False lets merges cross spaces (longer tokens on code)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


@functools.lru_cache(maxsize=4)
def demo_tokenizer(vocab_size: int = 1024):
    """A `tokenizers.Tokenizer` (byte-level BPE trained on a few lines of kernel-workspace text)."""
    return _train_bpe(_CORPUS * 4, vocab_size)


def workspace_corpus() -> list[str]:
    """The text of an example-task episode: system prompt, SKILL.md, example tasks and solutions."""
    from agent.prompts import system_prompt
    from agent.tools import default_tools

    root = Path(__file__).resolve().parent.parent
    files = [root / "cuda_agent" / "templates" / "SKILL.md", *sorted((root / "examples" / "tasks").glob("*.py"))]
    files += sorted(p for p in (root / "examples" / "solutions").rglob("*") if p.is_file() and p.suffix != ".pyc")
    return [system_prompt(default_tools()), *(p.read_text() for p in files)]


@functools.lru_cache(maxsize=2)
def workspace_tokenizer(vocab_size: int = 4096):
    """A `tokenizers.Tokenizer` learnt from `workspace_corpus()` (and the demo lines), merging across spaces."""
    return _train_bpe(_CORPUS * 4 + workspace_corpus(), vocab_size, use_regex=False)
