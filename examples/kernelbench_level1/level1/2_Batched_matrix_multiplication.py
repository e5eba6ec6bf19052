import torch
import torch.nn as nn

BATCH, M, K, N = 16, 64, 128, 64


class Model(nn.Module):
    """C[b] = A[b] @ B[b]."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
