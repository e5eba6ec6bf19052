import torch
import torch.nn as nn

BATCH, IN_CHANNELS, OUT_CHANNELS, SIDE, KERNEL = 8, 16, 32, 32, 3


class Model(nn.Module):
    """A 3x3 convolution with bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, SIDE, SIDE)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL]
