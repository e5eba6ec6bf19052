"""Fused elementwise chain: one CUDA kernel instead of four PyTorch ops."""
import torch
import torch.nn as nn

import cuda_extension

CLAMP_MIN = -0.1
CLAMP_MAX = 2.0


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.elementwise_chain_forward(x, self.scale, self.bias, CLAMP_MIN, CLAMP_MAX)
