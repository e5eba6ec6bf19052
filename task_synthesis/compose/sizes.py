"""Size pools per scale: the dimensions the composer draws input shapes and widths from.

`small` keeps every forward in the microseconds on a CPU (tests, host smoke runs); `medium` is
for host runs of a realistic mix; `paper` aims at the paper's 1-100 ms eager window on a GPU.
`max_numel` bounds every tensor of a plan (the memory filter measures the exact bytes later).
"""

SIZES = {
    "small": {"batch": [2, 4], "features": [16, 32, 64], "channels": [3, 4, 8], "length": [16, 32],
              "spatial": [8, 12, 16], "volume": [4, 6, 8], "seq": [8, 16], "hidden": [32, 64], "max_numel": 2**16},
    "medium": {"batch": [8, 16], "features": [128, 256, 512], "channels": [8, 16, 32], "length": [128, 256],
               "spatial": [32, 64], "volume": [8, 16], "seq": [64, 128], "hidden": [128, 256], "max_numel": 2**22},
    "paper": {"batch": [16, 32, 64, 128], "features": [512, 1024, 2048, 4096], "channels": [16, 32, 64, 128],
              "length": [1024, 4096], "spatial": [64, 128, 256], "volume": [16, 32], "seq": [256, 512, 1024],
              "hidden": [512, 1024, 2048], "max_numel": 2**28},
}


def start_shape(rank: int, sizes: dict, rng, transformer: bool = False) -> list[int]:
    """An input shape of this rank: (B, F), (B, C, L), (B, C, H, W), (B, C, D, H, W); (B, T, H) for blocks."""
    batch = rng.choice(sizes["batch"])
    if transformer:
        return [batch, rng.choice(sizes["seq"]), rng.choice(sizes["hidden"])]
    if rank == 1:
        return [rng.choice(sizes["features"])]
    if rank == 2:
        return [batch, rng.choice(sizes["features"])]
    channels = rng.choice(sizes["channels"])
    if rank == 3:
        return [batch, channels, rng.choice(sizes["length"])]
    side = rng.choice(sizes["spatial"] if rank == 4 else sizes["volume"])
    return [batch, channels, *[side] * (rank - 2)]
