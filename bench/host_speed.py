"""How fast this host multiplies matrices right now: a yardstick for wall times.

Evidence runs of the same recipe trained in 34 to 53 minutes on hosts of
one machine type, and an eval warm-start step took 11.3 s in one session of
2026-12-03 against 18 s in the next (both AVX-512 hosts; in the second, our
run used ~97% of both cores as user time and ~1% as system time: the cores
were slower, not our process). Without a measure of the host beside each
wall time a slower host cannot be told from slower code. This times fp32 GEMMs of the
embedded model's shapes (SmolLM2-135M: hidden 576, MLP 1536, a 64-row
batch of 256-token rows) with the threads the runs use, for a few seconds,
and reports GFLOP/s (median of the repeats), and the memory bandwidth of
copying a 256 MB tensor (GB/s read + written): in the second session the
blue warm start's short rows ran as fast as in the first while the eval warm
start's 470-token rows ran 1.6x slower, which a GEMM rate alone may not
show.

    OMP_NUM_THREADS=2 python bench/host_speed.py [--seconds 3] [--out FILE]

`bench/evidence.py` runs it before and after each training run and keeps
the numbers in `host-speed.json` beside the wall times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

SHAPES = [(4096, 576, 1536), (4096, 1536, 576), (4096, 576, 576)]  # (rows, in, out): MLP up/down, attention projection


def gflops(seconds: float = 3.0) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    mats = [(torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)) for m, k, n in SHAPES]
    flop = sum(2 * m * k * n for m, k, n in SHAPES)
    for a, b in mats:  # first calls pick kernels and touch memory
        torch.mm(a, b)
    rates, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 3:
        t0 = time.perf_counter()
        for a, b in mats:
            torch.mm(a, b)
        rates.append(flop / (time.perf_counter() - t0) / 1e9)
    src = torch.ones(64 * 2**20)  # 256 MB of fp32
    dst = torch.empty_like(src)
    dst.copy_(src)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(2 * src.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return {"gflops": round(statistics.median(rates), 1), "copy_gbps": round(statistics.median(copies), 1),
            "threads": torch.get_num_threads(), "repeats": len(rates)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    res = gflops(args.seconds)
    print(json.dumps(res))
    if args.out:
        from results_io import save_results

        save_results(args.out, res)


if __name__ == "__main__":
    main()
