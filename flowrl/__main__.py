"""``python -m flowrl``: a small demo plan until the algorithms land (R1-4 replaces it with PPO)."""

from __future__ import annotations

import time

from flowrl import runtime
from flowrl.iter import from_range
from flowrl.metrics import MetricsContext


def _simulate_rollout(x: int) -> list[int]:
    time.sleep(0.005)  # stands in for ~5 ms of environment stepping inside the shard actor
    return [x] * 10


def main() -> None:
    runtime.init(num_cpus=4)
    rollouts = from_range(400, num_shards=4).for_each(_simulate_rollout)

    def count_steps(fragment: list[int]) -> int:
        ctx: MetricsContext = plan.metrics
        ctx.counters["num_steps_sampled"] += len(fragment)
        return ctx.counters["num_steps_sampled"]

    plan = rollouts.gather_async(num_async=2).for_each(count_steps).batch(100)
    print(f"plan: {plan!r}")
    start = time.monotonic()
    for i, steps in enumerate(plan):
        print(f"report {i}: {steps[-1]} steps sampled, {steps[-1] / (time.monotonic() - start):,.0f} steps/s")
    print(f"counters: {dict(plan.metrics.counters)}")


if __name__ == "__main__":
    main()
