import torch
import torch.nn as nn

BATCH, DIM1, DIM2 = 16, 256, 256
REDUCE_DIM = 2


class Model(nn.Module):
    """Maximum over one dimension."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=self.dim)[0]


def get_inputs():
    return [torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [REDUCE_DIM]
