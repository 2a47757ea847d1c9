"""A check of masa-plan on instances it was not tuned on (issue 5).

masa.runtime.planning's annealing parameters were chosen on the random instances of
benchmarks/bench_solver.py (seeds 1000-1049). This script draws tight
(tightness 1.2) instances of the same shapes with other seeds, solves them
(20 s each, as the benchmark) and prints masa-plan's and masa's ratio to the
proven optimum, per instance and as median / worst. It prints only.

    python benchmarks/check_plan_fresh_seeds.py [COUNT] [FIRST_SEED]   # 24 5000
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

from bench_solver import _evaluate_both, _random_specs

from solver.instance import random_instance


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 24
    first_seed = int(argv[1]) if len(argv) > 1 else 5000
    proven: list[tuple[float, float]] = []
    for index, spec in enumerate(_random_specs(count)):
        instance = random_instance(replace(spec, seed=first_seed + index, tightness=1.2))
        row = _evaluate_both(instance, 20.0)
        print(f"{row['instance']}: {row['status']} masa-plan {row['plan_ratio']} "
              f"masa {row['ratio']}", flush=True)
        if row["status"] == "OPTIMAL":
            proven.append((row["plan_ratio"], row["ratio"]))
    if proven:
        planned, greedy = zip(*proven, strict=True)
        print(f"proven {len(proven)} of {count}: masa-plan median "
              f"{statistics.median(planned):.3f} worst {max(planned):.3f}; masa median "
              f"{statistics.median(greedy):.3f} worst {max(greedy):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
