"""Llama 3's interruptions through dayzero's failure model (planner/failures.py).

Published (Llama Team 2024, "The Llama 3 Herd of Models", arXiv 2407.21783, sec. 3.3.4): 466 job
interruptions in a 54-day snapshot of 405B pre-training on 16,384 H100 in 2,048 servers (47
planned, 419 unexpected), and "higher than 90% effective training time"; checkpoints of 1 MB to
4 GB per GPU (sec. 3.3.1) on a 2 TB/s fabric.

The shipped rates are fitted on that same snapshot (grouped by the component each scales with),
so the count is an in-sample check of the grouping and the exposure arithmetic, not a held-out
one; the goodput is a consequence of the model (Young's interval, relaunch + reload) that the
paper states only as a bound.

    PYTHONPATH=src python benchmarks/bench_failures.py
"""

from __future__ import annotations

from dayzero.planner.failures import default_rates
from dayzero.planner.training_cost import CostOptions, failure_model

DEVICES, PER_NODE, DAYS, PUBLISHED = 16_384, 8, 54, 466


def main() -> None:
    rates = default_rates()
    by_class = {c: v * DAYS for c, v in rates.by_class_per_day(DEVICES, PER_NODE).items()}
    total = sum(by_class.values())
    print(f"interruptions in {DAYS} days on {DEVICES:,} devices: {total:.1f} predicted vs {PUBLISHED} published "
          f"({total / PUBLISHED - 1:+.1%})")
    for c, n in by_class.items():
        print(f"  {c:12s} {n:6.1f}")
    f = failure_model(step_s=6.0, ideal_s=DAYS * 86_400, devices=DEVICES, state_bytes_per_device=4e9,
                      options=CostOptions(), devices_per_node=PER_NODE)
    print(f"goodput at 4 GB a GPU: {f['goodput']:.1%} (published: > 90 % effective training time); "
          f"restart {f['restart_s']:.0f} s, checkpoint every {f['interval_s'] / 60:.0f} min: {f['interval_reason']}")


if __name__ == "__main__":
    main()
