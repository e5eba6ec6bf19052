"""A plan as a task source in the standard layout: `Model`, `get_inputs`, `get_init_inputs`.

The input sizes and the constructor arguments are module-level constants; modules are built in
`__init__` from the arguments `get_init_inputs` returns, functions are called in `forward` with
their literal keyword arguments, a broadcast operand is a learned parameter, and each adapter is
one readable line.
"""

from __future__ import annotations

import re

from ..catalogue.blocks import block_source
from .composer import Plan, Step

INPUT_NAMES = {1: ["SIZE"], 2: ["BATCH_SIZE", "FEATURES"], 3: ["BATCH_SIZE", "CHANNELS", "LENGTH"],
               4: ["BATCH_SIZE", "CHANNELS", "HEIGHT", "WIDTH"],
               5: ["BATCH_SIZE", "CHANNELS", "DEPTH", "HEIGHT", "WIDTH"]}
TRANSFORMER_INPUT = ["BATCH_SIZE", "SEQ_LEN", "HIDDEN_SIZE"]
DOMAIN_ADAPTERS = {"positive": "x = torch.abs(x) + 1.0  # into the operator's domain (x > 0)",
                   "unit": "x = torch.tanh(x)  # into the operator's domain (-1 < x < 1)"}


def short_name(path: str) -> str:
    """`torch.nn.functional.gelu` -> `F.gelu`, `torch.nn.Conv2d` -> `nn.Conv2d`; others as they are."""
    for prefix, short in (("torch.nn.functional.", "F."), ("torch.nn.", "nn.")):
        if path.startswith(prefix):
            return short + path[len(prefix):]
    return path


def _snake(name: str) -> str:
    name = name.rsplit(".", 1)[-1]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


class _Names:
    """Unique Python names: the first `conv2d`, then `conv2d_2`, ..."""

    def __init__(self):
        self.seen: dict[str, int] = {}

    def __call__(self, base: str) -> str:
        self.seen[base] = self.seen.get(base, 0) + 1
        return base if self.seen[base] == 1 else f"{base}_{self.seen[base]}"


def _init_args(step: Step, params: list, names: _Names) -> list[str]:
    """The step's constructor arguments as parameters of Model.__init__ (their values go to get_init_inputs)."""
    keywords = []
    for key, value in step.args.items():
        name = names(key)
        params.append((name, value))
        keywords.append(f"{key}={name}")
    return keywords


def _call_line(head: str, arguments: list[str], width: int = 100) -> str:
    """`head` + the arguments + `)`, one argument per line when one line would be too long."""
    line = head + ", ".join(arguments) + ")"
    if len(line) <= width:
        return line
    return head + "\n" + "".join(f"    {a},\n" for a in arguments) + ")"


def _forward_line(step: Step, attr: str | None) -> str:
    if attr is not None:
        return f"x = self.{attr}(x)"
    call = short_name(step.op["name"])
    if step.op["family"] == "binary":
        return f"x = {call}(x, self.{_snake(call)}_operand)"
    kwargs = "".join(f", {k}={v!r}" for k, v in step.args.items())
    return f"x = {call}(x{kwargs})"


def _step_lines(step: Step, params: list, names: _Names, attrs: _Names) -> tuple[list[str], list[str]]:
    """(lines of __init__, lines of forward) for one step."""
    init, forward = [], []
    if step.reshape is not None:
        rank = len(step.in_shape)
        if len(step.reshape) < rank:
            forward.append(f"x = torch.flatten(x, start_dim={len(step.reshape) - 1})")
        else:
            dims = ", ".join(str(d) for d in step.reshape[1:])
            forward.append(f"x = x.reshape(x.shape[0], {dims})")
    if step.domain in DOMAIN_ADAPTERS:
        forward.append(DOMAIN_ADAPTERS[step.domain])
    op, attr = step.op, None
    if op["call"] in ("module", "block"):
        attr = attrs(_snake(op["name"]))
        cls = op["name"] if op["call"] == "block" else short_name(op["name"])
        init.append(_call_line(f"self.{attr} = {cls}(", _init_args(step, params, names)))
    elif op["family"] == "binary":
        size = names("operand_size")
        params.append((size, step.args["operand_size"]))
        init.append(f"self.{_snake(short_name(op['name']))}_operand = nn.Parameter(torch.randn({size}))")
    forward.append(_forward_line(step, attr))
    return init, forward


def _docstring(plan: Plan) -> str:
    count = "one transformers-style block" if plan.category == "transformers" else (
        f"{len(plan.steps)} operator{'s' if len(plan.steps) > 1 else ''}")
    chain = " -> ".join(short_name(s.op["name"]) for s in plan.steps)
    if len(chain) > 70:
        chain = "\n-> ".join(short_name(s.op["name"]) for s in plan.steps)
    return (f'"""{chain}\n({count}), composed from seed operators.\n\n'
            f"Input {tuple(plan.input_shape)} -> output {tuple(plan.output_shape)}, float32.\n\"\"\"")


def _indent(lines: list[str]) -> list[str]:
    """The signature's argument lines one level deeper than its `def` line."""
    return [lines[0], *("    " + line for line in lines[1:-1]), *(["    " + lines[-1]] if len(lines) > 1 else [])]


def render(plan: Plan) -> str:
    """The task source of a plan."""
    params: list[tuple[str, object]] = []
    dims = TRANSFORMER_INPUT if plan.category == "transformers" else INPUT_NAMES[len(plan.input_shape)]
    names, attrs = _Names(), _Names()
    for dim in dims:  # a constructor argument never takes an input size's name
        names(dim.lower())
    init, forward = [], []
    for step in plan.steps:
        more_init, more_forward = _step_lines(step, params, names, attrs)
        init += more_init
        forward += more_forward
    blocks = [block_source(s.op["name"]) for s in plan.steps if s.op["call"] == "block"]
    uses_math = any("math." in b for b in blocks)
    out = [_docstring(plan), *(["import math"] if uses_math else []), "import torch", "import torch.nn as nn",
           "import torch.nn.functional as F", ""]
    out += [f"{d} = {v}" for d, v in zip(dims, plan.input_shape)]
    out += [f"{n.upper()} = {v!r}" for n, v in params]
    for block in blocks:
        out += ["", "", block.rstrip("\n")]
    signature = _call_line("    def __init__(", ["self", *(n for n, _ in params)]).replace("\n)", "\n):")
    signature = signature if signature.endswith("):") else signature + ":"
    out += ["", "", "class Model(nn.Module):", *_indent(signature.split("\n")), "        super().__init__()"]
    out += [f"        {part}" for line in init for part in line.split("\n")]
    out += ["", "    def forward(self, x):"] + [f"        {line}" for line in forward] + ["        return x"]
    out += ["", "", "def get_inputs():", f"    return [torch.randn({', '.join(dims)})]"]
    returned = _call_line("    return [", [n.upper() for n, _ in params]).replace("\n)", "\n]")
    returned = returned[:-1] + "]" if returned.endswith(")") else returned
    lines = returned.split("\n")
    out += ["", "", "def get_init_inputs():", lines[0], *("    " + line for line in lines[1:]), ""]
    return "\n".join(out)
