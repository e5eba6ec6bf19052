"""Linear + bias + GELU as one fp32 CUDA kernel: tiled GEMM with the epilogue fused."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        # Holds the parameters under the reference's names (linear.weight, linear.bias); never called.
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.gemm_bias_gelu_forward(x, self.linear.weight, self.linear.bias)
