import torch
import torch.nn as nn

BATCH, DIM = 64, 16384


class Model(nn.Module):
    """An elementwise activation: torch.nn.functional.gelu(x)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
