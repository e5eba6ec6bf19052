"""Row softmax, rescaled so a row's outputs average 1.

y = softmax(x, dim=-1) * COLS, x: (ROWS, COLS) fp32.
A plain softmax over 4096 columns gives outputs near 2.4e-4, far below the verifier's
atol of 1e-2, so an all-zero kernel would pass (docs/cheats.md #4/#17); multiplying by the row
length keeps every output at the scale of the tolerance's relative term.

Sizes: 16 M elements (64 MiB in, 64 MiB out): about 30 us at H200 bandwidth for a one-read,
one-write kernel, while the naive host backend still verifies in a few seconds.
"""
import torch
import torch.nn as nn

ROWS = 4096
COLS = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1) * x.shape[-1]


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
