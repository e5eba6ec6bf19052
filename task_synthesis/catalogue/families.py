"""Shape families: how an operator's output shape follows from its input shape and arguments.

Every catalogue entry belongs to one family. A family knows which input shapes it accepts, how
to choose the arguments the operator is built or called with for a given input shape (using the
scale's size pools), and the output shape those arguments give. The composer chains operators
with these rules alone; the crawl and the tests check them against execution.
"""

from __future__ import annotations

import math
import random


class ShapeError(ValueError):
    """The operator cannot take this input shape (or its arguments give an empty output)."""


def _spatial(shape: list[int], op: dict) -> list[int]:
    dims = op.get("dims") or len(shape) - 2
    if len(shape) != dims + 2:
        raise ShapeError(f"{op['name']} needs rank {dims + 2}, got {len(shape)}")
    return shape[2:]


def _positive(shape: list[int], op: dict) -> list[int]:
    if any(d < 1 for d in shape):
        raise ShapeError(f"{op['name']} would give the empty shape {shape}")
    return shape


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- argument choice per family: (op, input shape, rng, sizes) -> arguments --------------------


def _no_args(op, shape, rng, sizes) -> dict:
    return {}


def _linear_args(op, shape, rng, sizes) -> dict:
    return {"in_features": shape[-1], "out_features": rng.choice(sizes["features"])}


def _feature_norm_args(op, shape, rng, sizes) -> dict:
    return {"normalized_shape": shape[-1]}


def _channel_norm_args(op, shape, rng, sizes) -> dict:
    return {"num_features": shape[1]}


def _group_norm_args(op, shape, rng, sizes) -> dict:
    groups = [d for d in _divisors(shape[1]) if d > 1] or [1]
    return {"num_groups": rng.choice(groups), "num_channels": shape[1]}


def _conv_args(op, shape, rng, sizes) -> dict:
    smallest = min(_spatial(shape, op))
    kernel = rng.choice([k for k in (1, 3, 5) if k <= smallest] or [1])
    stride = rng.choice([1, 1, 2])
    padding = rng.choice([0, kernel // 2])
    return {"in_channels": shape[1], "out_channels": rng.choice(sizes["channels"]), "kernel_size": kernel,
            "stride": stride, "padding": padding}


def _pool_args(op, shape, rng, sizes) -> dict:
    smallest = min(_spatial(shape, op))
    kernel = rng.choice([k for k in (2, 3) if k <= smallest] or [1])
    return {"kernel_size": kernel, "stride": kernel}


def _adaptive_pool_args(op, shape, rng, sizes) -> dict:
    smallest = min(_spatial(shape, op))
    return {"output_size": rng.choice([s for s in (1, 2, 4) if s <= smallest] or [1])}


def _binary_args(op, shape, rng, sizes) -> dict:
    return {"operand_size": shape[-1]}


def _block_args(op, shape, rng, sizes) -> dict:
    heads = op.get("heads", 1)
    if shape[-1] % (2 * heads):
        raise ShapeError(f"{op['name']} needs a hidden size divisible by {2 * heads}, got {shape[-1]}")
    args = {"hidden_size": shape[-1]}
    if op.get("intermediate"):
        args["intermediate_size"] = 2 * shape[-1]
    return args


# --- output shape per family: (op, input shape, arguments) -> output shape ----------------------


def _same(op, shape, args) -> list[int]:
    return list(shape)


def _linear(op, shape, args) -> list[int]:
    if shape[-1] != args["in_features"]:
        raise ShapeError(f"{op['name']} expects {args['in_features']} input features, got {shape[-1]}")
    return [*shape[:-1], args["out_features"]]


def _reduce(op, shape, args) -> list[int]:
    if len(shape) < 2:
        raise ShapeError(f"{op['name']} over the last dimension needs rank 2 or more")
    return list(shape[:-1])


def _flatten(op, shape, args) -> list[int]:
    if len(shape) < 3:
        raise ShapeError(f"{op['name']} needs rank 3 or more to change the shape")
    return [shape[0], math.prod(shape[1:])]


def _conv(op, shape, args) -> list[int]:
    k, s, p = args["kernel_size"], args["stride"], args["padding"]
    out = [(n + 2 * p - k) // s + 1 for n in _spatial(shape, op)]
    return _positive([shape[0], args["out_channels"], *out], op)


def _conv_transpose(op, shape, args) -> list[int]:
    k, s, p = args["kernel_size"], args["stride"], args["padding"]
    out = [(n - 1) * s - 2 * p + k for n in _spatial(shape, op)]
    return _positive([shape[0], args["out_channels"], *out], op)


def _pool(op, shape, args) -> list[int]:
    k, s = args["kernel_size"], args["stride"]
    return _positive([*shape[:2], *[(n - k) // s + 1 for n in _spatial(shape, op)]], op)


def _adaptive_pool(op, shape, args) -> list[int]:
    _spatial(shape, op)
    return [*shape[:2], *[args["output_size"]] * (len(shape) - 2)]


def _channel_checked(op, shape, args) -> list[int]:
    if "num_features" in args and shape[1] != args["num_features"]:
        raise ShapeError(f"{op['name']} expects {args['num_features']} channels, got {shape[1]}")
    return list(shape)


FAMILIES = {
    # family: (argument chooser, output shape, minimum input rank)
    "elementwise": (_no_args, _same, 1),
    "reduce": (_no_args, _reduce, 2),
    "binary": (_binary_args, _same, 1),
    "linear": (_linear_args, _linear, 2),
    "feature_norm": (_feature_norm_args, _same, 2),
    "channel_norm": (_channel_norm_args, _channel_checked, 2),
    "group_norm": (_group_norm_args, _same, 2),
    "conv": (_conv_args, _conv, 3),
    "conv_transpose": (_conv_args, _conv_transpose, 3),
    "pool": (_pool_args, _pool, 3),
    "adaptive_pool": (_adaptive_pool_args, _adaptive_pool, 3),
    "flatten": (_no_args, _flatten, 3),
    "block": (_block_args, _same, 3),
}


def ranks_of(op: dict) -> list[int]:
    """The input ranks the operator ran with in the crawl (or was written for)."""
    return list(op.get("ranks") or [])


def choose_args(op: dict, shape: list[int], rng: random.Random, sizes: dict) -> dict:
    """The operator's constructor/call arguments for this input shape (its fixed ones included)."""
    chooser, _, min_rank = FAMILIES[op["family"]]
    if len(shape) < min_rank or (ranks_of(op) and len(shape) not in ranks_of(op)):
        raise ShapeError(f"{op['name']} does not take rank {len(shape)}")
    return {**op.get("fixed", {}), **chooser(op, list(shape), rng, sizes)}


def output_shape(op: dict, shape: list[int], args: dict) -> list[int]:
    """The output shape of the operator on `shape` with `args` (ShapeError if it cannot run)."""
    _, rule, min_rank = FAMILIES[op["family"]]
    if len(shape) < min_rank:
        raise ShapeError(f"{op['name']} does not take rank {len(shape)}")
    return rule(op, list(shape), args)
