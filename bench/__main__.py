"""Run the benchmark suite and write its JSON: ``python -m bench [--profile cpu] [--only ...]``.

Every benchmark times both sides in this one process and reports the ratio against its target;
see :mod:`modnets.benchmarks`. Results go to ``_build/results/bench_<profile>.json`` (the
performance chapter reads them) unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from modnets.benchmarks import BENCHMARKS, run_all
from modnets.profiles import PROFILES, get_profile


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=PROFILES, default=None)
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    start = time.perf_counter()
    results = run_all(profile, args.only)
    results["seconds"] = time.perf_counter() - start
    out = args.out or Path("_build") / "results" / f"bench_{profile}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out)
    print(f"\n{len(results['results'])} benchmarks in {results['seconds']:.0f} s; results: {out}")
    print(f"{'benchmark':<18} {'ratio':>8}  target")
    for name, r in results["results"].items():
        verdict = {True: "met", False: "MISSED", None: "n/a"}[r["met"]]
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3g}"
        print(f"{name:<18} {ratio:>8}  {r['target']} ({verdict})")


if __name__ == "__main__":
    main()
