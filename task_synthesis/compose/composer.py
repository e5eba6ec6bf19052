"""Plans: up to five seed operators chained so that each output feeds the next.

A plan starts from an input shape that fits its first operator, then for each later operator
chooses its arguments for the current shape and infers the output shape (families.py). Where an
operator takes a different rank, an adapter reshapes first (flatten the trailing dimensions, or
split the trailing ones into channels and a square or cubic extent); where it is defined only
on part of the real line, an adapter maps the values into its domain. Adapters are not counted
as operators. A plan is drawn from its own seed, so the same (seed, category, index) gives the
same task. A batch factor draws the same plan with its batch multiplied (every size pool's batch
and the size bound scaled alike, so every choice falls the same way): each shape is re-inferred
by the family rules, so an operator whose sizes follow the batch (a flattened batch, a reduction
down to it) stays right.
"""

from __future__ import annotations

import dataclasses
import math
import random

from ..catalogue.families import ShapeError, choose_args, output_shape
from .sizes import SIZES, start_shape

TRIES_PER_STEP = 40
TRIES_PER_PLAN = 20


@dataclasses.dataclass
class Step:
    op: dict
    args: dict
    in_shape: list
    out_shape: list
    reshape: list | None = None  # the shape an adapter reshapes to before the operator (None: no reshape)
    domain: str = "real"  # "positive" / "unit": the values are mapped into the operator's domain first


@dataclasses.dataclass
class Plan:
    category: str  # "1".."5" or "transformers"
    input_shape: list
    steps: list

    @property
    def output_shape(self) -> list:
        return self.steps[-1].out_shape

    @property
    def ops(self) -> list[str]:
        return [s.op["name"] for s in self.steps]

    def shapes(self) -> list[list]:
        """Every tensor shape of the forward: the input, each reshape, each output."""
        out = [self.input_shape]
        for step in self.steps:
            out += [s for s in (step.reshape, step.out_shape) if s is not None]
        return out


def usable(operators: list[dict]) -> dict[str, list[dict]]:
    """The catalogue's operators by family (blocks apart); a family is drawn first, then one of its operators."""
    by_family: dict[str, list[dict]] = {}
    for op in operators:
        if any(r >= 2 for r in op.get("ranks", [])):
            by_family.setdefault(op["family"], []).append(op)
    return by_family


def reshape_to(shape: list, rank: int) -> list | None:
    """The shape an adapter gives `shape` at `rank` (None when no sensible reshape exists)."""
    if rank == len(shape):
        return list(shape)
    if rank < len(shape):
        return [*shape[: rank - 1], math.prod(shape[rank - 1:])] if rank >= 1 else None
    if len(shape) < 2 or rank < 3:
        return None
    batch, rest = shape[0], math.prod(shape[1:])
    spatial = rank - 2
    for side in range(int(round(rest ** (1 / spatial))) + 1, 1, -1):
        if rest % side**spatial == 0 and rest // side**spatial >= 1 and side >= 2:
            return [batch, rest // side**spatial, *[side] * spatial]
    return None


# Families worth splitting a tensor's trailing dimensions into channels and an extent for
RAISES_RANK = {"conv", "conv_transpose", "pool", "adaptive_pool", "channel_norm", "group_norm"}


def _target_rank(op: dict, shape: list, rng: random.Random) -> int:
    """The rank the operator runs at: the current one when it takes it; otherwise a lower one (a
    flatten), or a higher one for the channel families; never a reshape just to flatten again."""
    ranks = [r for r in op["ranks"] if r >= 1]
    if len(shape) in ranks:
        return len(shape)
    allowed = [r for r in ranks if r < len(shape) or op["family"] in RAISES_RANK]
    if not allowed or op["family"] in ("flatten", "reduce"):
        raise ShapeError(f"{op['name']} would need a pointless reshape of {shape}")
    return rng.choice(allowed)


def _step(op: dict, shape: list, rng: random.Random, sizes: dict) -> Step:
    target = _target_rank(op, shape, rng)
    reshaped = reshape_to(shape, target)
    if reshaped is None:
        raise ShapeError(f"no reshape of {shape} to rank {target}")
    args = choose_args(op, reshaped, rng, sizes)
    out = output_shape(op, reshaped, args)
    if math.prod(out) > sizes["max_numel"] or math.prod(out) < 1:
        raise ShapeError(f"output {out} outside the size bound")
    return Step(op, args, list(shape), out, None if reshaped == list(shape) else reshaped, op.get("domain", "real"))


def _pick(by_family: dict, rng: random.Random) -> dict:
    family = rng.choice(sorted(by_family))
    return rng.choice(by_family[family])


def _plan_once(category: str, by_family: dict, blocks: list, rng: random.Random, sizes: dict) -> Plan:
    if category == "transformers":
        op = rng.choice(blocks)
        shape = start_shape(3, sizes, rng, transformer=True)
        steps = [_step(op, shape, rng, sizes)]
        if rng.random() < 0.5:  # a block alone, or followed by one seed operator (an output head)
            try:
                steps.append(_step(_pick(by_family, rng), steps[-1].out_shape, rng, sizes))
            except ShapeError:
                pass
        return Plan(category, shape, steps)
    first = _pick(by_family, rng)
    shape = start_shape(rng.choice([r for r in first["ranks"] if r >= 2]), sizes, rng)
    if math.prod(shape) > sizes["max_numel"]:
        raise ShapeError("input outside the size bound")
    steps = [_step(first, shape, rng, sizes)]
    while len(steps) < int(category):
        for _ in range(TRIES_PER_STEP):
            try:
                steps.append(_step(_pick(by_family, rng), steps[-1].out_shape, rng, sizes))
                break
            except ShapeError:
                continue
        else:
            raise ShapeError(f"no operator fits after {steps[-1].op['name']}")
    return Plan(category, shape, steps)


def scaled_sizes(sizes: dict, batch_factor: int) -> dict:
    """The size pools with every batch size and the size bound multiplied by `batch_factor`."""
    if batch_factor == 1:
        return sizes
    return {**sizes, "batch": [b * batch_factor for b in sizes["batch"]],
            "max_numel": sizes["max_numel"] * batch_factor}


def compose(category: str, operators: list[dict], seed: int, scale: str = "small", batch_factor: int = 1) -> Plan:
    """A plan of `category` operators (or one transformers block), drawn from `seed`; with `batch_factor`, the
    same plan with its batch multiplied."""
    if batch_factor < 1:
        raise ValueError(f"batch_factor must be at least 1, got {batch_factor}")
    rng = random.Random(seed)
    sizes = scaled_sizes(SIZES[scale], batch_factor)
    by_family = usable([op for op in operators if op["family"] != "block"])
    blocks = [op for op in operators if op["family"] == "block"]
    last = None
    for _ in range(TRIES_PER_PLAN):
        try:
            return _plan_once(category, by_family, blocks, rng, sizes)
        except (ShapeError, IndexError) as exc:
            last = exc
    raise ShapeError(f"no {category} plan from seed {seed}: {last}")
