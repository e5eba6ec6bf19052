"""LayerNorm in one CUDA kernel: the row is read once into shared memory, statistics two-pass."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.layernorm_forward(x, self.weight, self.bias, self.eps)
