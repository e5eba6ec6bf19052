"""Linear layer with a fused bias + GELU epilogue.

y = gelu(x @ W^T + b) (exact erf GELU), x: (TOKENS, IN_FEATURES), W: (OUT_FEATURES, IN_FEATURES),
b: (OUT_FEATURES,), all fp32. PyTorch's eager and compiled baselines use full-fp32 GEMMs here
(TF32 is off by default for matmul), so a candidate must not drop to TF32 either.

Sizes: 1024 x 1024 x 1024 (2.1 GFLOP): about 50-100 us of FP32 work on an H200, while the naive
host backend still verifies in a few seconds on a 2-core CPU.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 1024
IN_FEATURES = 1024
OUT_FEATURES = 1024


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(TOKENS, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
