"""An operator of the catalogue as a callable on one tensor, for probing it in the crawl."""

from __future__ import annotations

import importlib

from .blocks import block_source


def resolve(path: str):
    """`torch.nn.functional.gelu` -> the function (the longest importable module prefix, then attributes)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {path}")


def block_class(name: str):
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    namespace = {"torch": torch, "nn": nn, "F": F, "math": math}
    exec(compile(block_source(name), f"<block {name}>", "exec"), namespace)
    return namespace[name]


def build_callable(op: dict, args: dict):
    """f(x) running the operator with these arguments (a module is built once, in eval mode)."""
    import torch

    if op["call"] in ("module", "block"):
        cls = block_class(op["name"]) if op["call"] == "block" else resolve(op["name"])
        module = cls(**args).eval()
        return module
    fn = resolve(op["name"])
    if op["family"] == "binary":
        operand = torch.randn(args["operand_size"])
        return lambda x: fn(x, operand)
    return lambda x: fn(x, **args)
