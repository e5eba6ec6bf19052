"""LayerNorm over the last dimension with a learnable weight and bias.

y = (x - mean) / sqrt(var + EPS) * weight + bias, statistics per row (biased variance),
x: (ROWS, HIDDEN) fp32. Weight and bias are drawn at random (not the 1/0 defaults), so a
candidate must load the reference's state_dict and use both.

Sizes: 16 M elements (64 MiB in, 64 MiB out): about 30 us at H200 bandwidth; the naive host
backend verifies in a few seconds.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 4096
HIDDEN = 4096
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.5 * torch.randn(hidden))
        self.bias = nn.Parameter(0.5 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def get_inputs():
    # An offset mean makes a kernel that skips centring visibly wrong.
    return [0.5 + 2.0 * torch.randn(ROWS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, EPS]
