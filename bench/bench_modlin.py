"""ModLin / ModFC vs nn.Linear: the cost of modulation, measured as ratios in one run.

Run: ``python bench/bench_modlin.py`` (or ``make bench``). Prints median wall times and the ratio
to ``nn.Linear`` for NI-style function streams ``(batch, U, tokens, d)`` with one code per function.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import modnets


def median_time(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--functions", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=65)
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    B, U, T, d = args.batch, args.functions, args.tokens, args.dim
    x = torch.randn(B, U, T, d)
    codes = torch.randn(U, 1, d)
    linear, modlin, modfc = nn.Linear(d, d), modnets.ModLin(d, d, d), modnets.ModFC(d, d, d)
    with torch.inference_mode():
        base = median_time(lambda: linear(x), args.repeats)
        rows = [
            ("nn.Linear", base),
            ("ModLin", median_time(lambda: modlin(x, codes), args.repeats)),
            ("ModFC", median_time(lambda: modfc(x, codes), args.repeats)),
        ]
    print(f"x=(batch {B}, functions {U}, tokens {T}, dim {d}), threads={torch.get_num_threads()}")
    print(f"{'layer':<10} {'median ms':>10} {'vs nn.Linear':>13}")
    for name, t in rows:
        print(f"{name:<10} {t * 1e3:>10.3f} {t / base:>12.2f}x")


if __name__ == "__main__":
    main()
