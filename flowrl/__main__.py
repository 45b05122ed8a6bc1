"""``python -m flowrl``: a small demo plan until the algorithms land (R1-4 replaces it with PPO).

Four shard actors each "sample" fragments with ~5 ms of simulated work; the driver gathers them
asynchronously, counts steps in the plan's shared metrics context, and reports every 1,000 steps.
"""

from __future__ import annotations

import time

from flowrl import runtime
from flowrl.iter import LocalIterator, from_range
from flowrl.metrics import STEPS_SAMPLED_COUNTER


def simulate_fragment(x: int) -> list[int]:
    """Runs inside a shard actor: stands in for ~5 ms of environment stepping."""
    time.sleep(0.005)
    return [x] * 10


def count_steps(fragment: list[int]) -> int:
    """Runs on the driver: adds the fragment's steps to the plan's counter and returns the total."""
    counters = LocalIterator.get_metrics().counters
    counters[STEPS_SAMPLED_COUNTER] += len(fragment)
    return counters[STEPS_SAMPLED_COUNTER]


def main() -> None:
    runtime.init(num_cpus=4)
    plan = (from_range(400, num_shards=4)
            .for_each(simulate_fragment)
            .gather_async(num_async=2)
            .for_each(count_steps)
            .batch(100))
    print(f"plan: {plan!r}")
    start = time.monotonic()
    for i, totals in enumerate(plan):
        rate = totals[-1] / (time.monotonic() - start)
        print(f"report {i}: {totals[-1]} steps sampled, {rate:,.0f} steps/s")
    print(f"counters: {dict(plan.metrics.counters)}")


if __name__ == "__main__":
    main()
