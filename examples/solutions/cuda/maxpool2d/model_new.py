"""2-D max pooling as one CUDA kernel with the 3x3 window unrolled."""
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.maxpool2d_forward(x, self.kernel_size, self.stride, self.padding)
