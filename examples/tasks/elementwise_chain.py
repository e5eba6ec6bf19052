"""Elementwise chain: per-column affine -> GELU (tanh form) -> clamp.

y = clamp(gelu_tanh(x * scale + bias), -0.1, 2.0), x: (BATCH, FEATURES) fp32.
Neither clamp bound is redundant: GELU's minimum is about -0.17 and it is unbounded above.

Sizes: 16 M elements (64 MiB in, 64 MiB out). On an H200 (about 4.3 TB/s) a fused kernel is
memory-bound at roughly 30 us; a larger tensor would keep the naive host backend (2-core CPU)
from verifying the task in a few seconds, so this is the compromise.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4096
FEATURES = 4096
CLAMP_MIN = -0.1
CLAMP_MAX = 2.0


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(1.0 + 0.5 * torch.randn(features))
        self.bias = nn.Parameter(0.5 * torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(x * self.scale + self.bias, approximate="tanh")
        return torch.clamp(y, CLAMP_MIN, CLAMP_MAX)


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [FEATURES]
