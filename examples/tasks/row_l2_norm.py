"""Row L2 norm: a reduction over the last dimension.

y = sqrt(sum(x * x, dim=-1)), x: (ROWS, COLS) fp32 -> y: (ROWS,).
Outputs are about sqrt(COLS) = 64, far above the tolerance, and vary with every input.

Sizes: 32 M elements (128 MiB read, 32 KiB written): about 30 us at H200 bandwidth; the host
backend's single pass stays well under a second per call.
"""
import torch
import torch.nn as nn

ROWS = 8192
COLS = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, ord=2, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
