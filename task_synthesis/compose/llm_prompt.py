"""The request to an LLM composer: the task file format, the drawn operators and their shapes.

The operators, their arguments and every shape come from a plan of the programmatic composer
(the same draw of category and operators), so the kept set follows the same target composition;
the model writes the fused module. The filter later holds the task to the input and output
shapes stated here.
"""

from __future__ import annotations

from ..catalogue.blocks import block_source
from .composer import Plan, Step

SYSTEM = """You write PyTorch benchmark tasks for a CUDA kernel-writing agent. A task is one \
self-contained Python file in this format:

```python
\"\"\"One line on what the module computes.\"\"\"
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH_SIZE = 16          # input sizes and constructor arguments as module-level constants
FEATURES = 64
OUT_FEATURES = 32


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH_SIZE, FEATURES)]


def get_init_inputs():
    return [FEATURES, OUT_FEATURES]
```

Rules: `Model(*get_init_inputs())` builds the module and `Model(...)(*get_inputs())` returns one \
float32 tensor. Import only torch, torch.nn, torch.nn.functional and math. The forward is \
deterministic and depends on its input; no randomness, files, network, processes, printing, \
while loops or try/except. Keep lines within 120 columns. Reply with the whole file in one \
```python block and nothing else."""


def _shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _arguments(step: Step) -> str:
    if not step.args:
        return "default arguments"
    return ", ".join(f"{k}={v!r}" for k, v in step.args.items())


def _what(step: Step) -> str:
    op = step.op
    if op["family"] == "binary":
        operand = step.args["operand_size"]
        return f"`{op['name']}` (function) of the tensor and a learned nn.Parameter of shape ({operand},)"
    kind = {"block": "block, its class is below"}.get(op["call"], op["call"])
    return f"`{op['name']}` ({kind}) with {_arguments(step)}"


def _step_line(number: int, step: Step) -> str:
    before = []
    if step.reshape is not None:
        before.append(f"reshape {_shape(step.in_shape)} to {_shape(step.reshape)}")
    if step.domain == "positive":
        before.append("map the values into x > 0, e.g. torch.abs(x) + 1.0")
    elif step.domain == "unit":
        before.append("map the values into -1 < x < 1, e.g. torch.tanh(x)")
    line = f"{number}. {_what(step)}; {_shape(step.reshape or step.in_shape)} -> {_shape(step.out_shape)}"
    return line + (f"; first {' and '.join(before)}" if before else "")


def user_prompt(plan: Plan) -> str:
    count = len(plan.steps)
    head = "Write a task around this operator:" if count == 1 else (
        f"Write a task that fuses these {count} operators, in this order:")
    lines = [head, ""] + [_step_line(i, step) for i, step in enumerate(plan.steps, 1)]
    lines += ["", f"`get_inputs()` returns one tensor of shape {_shape(plan.input_shape)}; the forward returns "
              f"one tensor of shape {_shape(plan.output_shape)}.",
              "Use every operator above, in order, with these arguments (modules built in __init__ from the "
              "arguments get_init_inputs returns). A residual connection or a second use of an operator is welcome "
              "when the shapes stay as stated."]
    for name in dict.fromkeys(s.op["name"] for s in plan.steps if s.op["call"] == "block"):
        lines += ["", f"Copy this class of {name} into the task unchanged:", "```python", block_source(name).rstrip(),
                  "```"]
    return "\n".join(lines)


def messages(plan: Plan) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user_prompt(plan)}]
