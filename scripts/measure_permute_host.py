"""Measure the host time per chunk of Megatron-Core's unfused token sort (efficiency.UNFUSED_CHUNK_S).

Without --moe-permute-fusion, Megatron-Core's all-to-all dispatcher reorders the tokens it receives
from (rank, local expert) order to (local expert, rank) order and back with
`moe_utils.sort_chunks_by_idxs`'s PyTorch path: `torch.split` of the tensor into num_experts x tp
chunks (one view each) and `torch.cat` of them in the new order (a list built chunk by chunk). Its
host time grows with the chunk count; the data it moves is the GPU's. This script times that pattern
on this machine's CPU with tensors of one row per chunk (so the copies cost next to nothing), forward
alone and forward with backward (autograd's SplitWithSizesBackward and CatBackward: a narrow per
chunk and one concatenation), at several chunk counts, and fits a line: its slope is the host time
per chunk. The fixed part (the calls themselves) is priced with the kernels (efficiency.UNFUSED_PERMUTE_KERNELS).

    .venv/bin/python scripts/measure_permute_host.py [--repeats 300]

Prints JSON: seconds per call at each chunk count, and the slopes (forward, backward = with backward
less forward). Needs torch (the CPU build the Makefile installs); nothing under rpeg/ imports it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

CHUNKS = (8, 64, 128, 256, 512)


def _time(chunks: int, backward: bool, repeats: int) -> float:
    import torch

    x = torch.randn(chunks, 8, requires_grad=backward)
    sizes = torch.ones(chunks, dtype=torch.long)  # on the host, as the dispatcher keeps them unfused
    order = torch.arange(chunks).reshape(-1, 8).T.ravel()  # (rank, expert) -> (expert, rank)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            parts = torch.split(x, sizes.tolist(), dim=0)
            out = torch.cat([parts[i] for i in order.tolist()], dim=0)
            if backward:
                out.sum().backward()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def _slope(xs: tuple[int, ...], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=300, help="calls per timing (best of 5 timings)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    fwd = [_time(c, False, args.repeats) for c in CHUNKS]
    both = [_time(c, True, args.repeats) for c in CHUNKS]
    f, b = _slope(CHUNKS, fwd), _slope(CHUNKS, both)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
                      "chunks": CHUNKS, "forward_s": fwd, "forward_and_backward_s": both,
                      "per_chunk_forward_s": f, "per_chunk_backward_s": b - f}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
