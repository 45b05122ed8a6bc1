"""Long runs survive dead rollout workers: real workers' processes are SIGKILLed while the
Trainer trains, the Trainer recreates them with the current weights, and training reaches its goal."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
import ray

from flowrl.algorithms.impala import IMPALAConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.cli import build_config
from flowrl.config import TrainerConfig
from flowrl.presets import find_preset
from flowrl.trainer import Trainer


def worker_pid(actor: Any) -> int:
    return int(ray.get(actor.apply.remote(lambda w: os.getpid())))


def train_while_killing(trainer: Trainer, *, kill_at: tuple[int, ...], delay_s: float, target: float,
                        max_steps: int) -> tuple[list[dict[str, Any]], list[int]]:
    """Trains until every kill happened and ``episode_reward_mean >= target`` (or ``max_steps``). During each
    iteration listed in ``kill_at`` a timer SIGKILLs one remote worker's process (alternating workers)
    ``delay_s`` into the iteration; returns the results and the killed PIDs."""
    results: list[dict[str, Any]] = []
    killed: list[int] = []

    def done() -> bool:
        last = results[-1]
        return len(killed) == len(kill_at) and (last["episode_reward_mean"] >= target or
                                                last["timesteps_total"] >= max_steps)

    while not results or not done():
        timer = None
        if len(results) in kill_at:
            victim = worker_pid(trainer.workers.remote_workers()[len(killed) % 2])
            killed.append(victim)
            timer = threading.Timer(delay_s, os.kill, (victim, signal.SIGKILL))
            timer.start()
        results.append(trainer.train())
        if timer is not None:
            timer.join()
    return results, killed


def check_run(trainer: Trainer, results: list[dict[str, Any]], killed: list[int], target: float) -> None:
    totals = [r["timesteps_total"] for r in results]
    print(f"{type(trainer.config).__name__}: return {results[-1]['episode_reward_mean']:.1f} after {totals[-1]} "
          f"steps and {len(results)} iterations; killed {killed}")
    assert len(set(killed)) == 3  # three distinct processes: each replacement is a new one
    assert all(b >= a for a, b in zip(totals, totals[1:])), totals  # counters carried over every rebuild
    assert results[-1]["episode_reward_mean"] >= target
    assert results[-1]["num_healthy_workers"] == 2
    alive = {worker_pid(w) for w in trainer.workers.remote_workers()}
    assert not alive & set(killed)


def _config(cls: type[TrainerConfig], **settings: Any) -> Any:
    return cls(env="CartPole-v1", seed=0, num_workers=2, num_cpus_per_worker=0.5, recreate_failed_workers=True,
               **settings)


@pytest.mark.slow  # ~30 s; the default tier has IMPALA's case here and fake-worker recoveries in test_trainer.py
def test_ppo_keeps_training_through_three_killed_workers() -> None:
    """A sync plan: a worker killed mid-sample fails the gather; the Trainer recreates it and retries."""
    preset = find_preset("ppo", "CartPole-v1")  # the tuned preset: 2 workers x 4 envs, lr 3e-4, 6 epochs
    assert preset is not None
    config = build_config(PPOConfig, preset.items(["env=CartPole-v1", "seed=0", "num_cpus_per_worker=0.5",
                                                   "recreate_failed_workers=true"]))
    trainer = Trainer("ppo", config)
    try:
        results, killed = train_while_killing(trainer, kill_at=(1, 2, 3), delay_s=0.1, target=150,
                                              max_steps=200_000)
        check_run(trainer, results, killed, target=150)
    finally:
        trainer.stop()


def test_impala_keeps_training_through_three_killed_workers() -> None:
    """An async plan with a learner thread: the rebuild stops the old learner and starts a new one."""
    config = _config(IMPALAConfig, min_iter_time_s=0, timesteps_per_iteration=10_000)
    trainer = Trainer("impala", config)
    try:
        results, killed = train_while_killing(trainer, kill_at=(1, 2, 3), delay_s=0.2, target=100,
                                              max_steps=300_000)
        check_run(trainer, results, killed, target=100)
    finally:
        trainer.stop()
