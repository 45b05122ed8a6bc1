"""Hand-written PPO on Ray actors: the reference for flowrl's PPO plan in the lines-of-code benchmark.

The same algorithm and numerics as ``flowrl.algorithms.ppo.plan`` over the same
``WorkerSet``, ``PPOPolicy`` and ``PPOConfig``, written without flowrl's iterators, operators or trainer.
Each round gets one fragment from every remote worker (``ray.get`` of one ``sample`` each; with no remote
workers the local worker samples) until ``train_batch_size`` steps of the trained policies are held. The
advantages are standardized, the learner runs ``num_sgd_iter`` epochs of minibatch SGD (the multi-device
learner when ``config.use_simple_optimizer`` is off), one ``ray.put`` of the new weights goes to every
worker before the next round is sampled (so PPO stays on-policy), and the KL coefficient adapts.

Run: ``train(WorkerSet(policy_class=PPOPolicy, config=config), config)`` yields one result dict per report.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from typing import Any, Iterator, Sequence

import numpy as np

from benchmarks.handwritten import EpisodeStats, ReportSchedule, make_result
from flowrl.algorithms.ppo import PPOConfig
from flowrl.metrics import (AGENT_STEPS_SAMPLED_COUNTER, AGENT_STEPS_TRAINED_COUNTER, LEARN_ON_BATCH_TIMER,
                            LEARNER_INFO, LEARNER_STATS_KEY, SAMPLE_TIMER, STEPS_SAMPLED_COUNTER,
                            STEPS_TRAINED_COUNTER, STEPS_TRAINED_THIS_ITER_COUNTER, WORKER_UPDATE_TIMER, Timer)
from flowrl.policy import Policy
from flowrl.sample_batch import ADVANTAGES, DEFAULT_POLICY_ID, AnyBatch, MultiAgentBatch, SampleBatch
from flowrl.workers import WorkerSet

import ray  # noqa: E402,I001  (after flowrl, which keeps Ray on loopback)


logger = logging.getLogger(__name__)


def train(workers: WorkerSet, config: PPOConfig) -> Iterator[dict[str, Any]]:
    """PPO over ``workers``; yields a result dict whenever ``timesteps_per_iteration`` and ``min_iter_time_s``
    allow (by default after every train batch)."""
    local, remote = workers.local_worker(), workers.remote_workers()
    to_train = list(local.policies_to_train)
    learn = sgd if config.use_simple_optimizer else multi_device_sgd
    min_rows = 1 if config.use_simple_optimizer else max(1, int(config.num_gpus))
    counters: Counter[str] = Counter()
    info: dict[str, Any] = {}
    timers: defaultdict[str, Timer] = defaultdict(Timer)
    episodes = EpisodeStats(workers, config)
    schedule = ReportSchedule(config.timesteps_per_iteration, config.min_iter_time_s)
    if remote:  # every worker starts from the learner's weights
        weights = ray.put(local.get_weights())
        for w in remote:
            w.set_weights.remote(weights)
    while True:
        with timers[SAMPLE_TIMER] as timer:
            fragments, size = [], 0
            while size < config.train_batch_size:
                batch = concat(ray.get([w.sample.remote() for w in remote])) if remote else local.sample()
                counters[STEPS_SAMPLED_COUNTER] += batch.count
                counters[AGENT_STEPS_SAMPLED_COUNTER] += batch.agent_steps()
                if isinstance(batch, MultiAgentBatch):  # keep only the experiences of the trained policies
                    batch = MultiAgentBatch({p: b for p, b in batch.policy_batches.items() if p in to_train},
                                            batch.count)
                steps = batch.agent_steps() if config.count_steps_by == "agent_steps" else batch.count
                if steps:
                    fragments.append(batch)
                    size += steps
            train_batch = concat(fragments)
            timer.push_units_processed(size)
        parts = train_batch.as_multi_agent().policy_batches
        for part in parts.values():
            adv = part[ADVANTAGES]
            part[ADVANTAGES] = (adv - adv.mean()) / max(1e-4, float(np.std(adv)))
        with timers[LEARN_ON_BATCH_TIMER] as timer:
            info[LEARNER_INFO] = {pid: {LEARNER_STATS_KEY: learn(local.get_policy(pid), part, config)}
                                  for pid, part in parts.items() if pid in to_train and part.count >= min_rows}
            timer.push_units_processed(train_batch.count)
        counters[STEPS_TRAINED_COUNTER] += train_batch.count
        counters[AGENT_STEPS_TRAINED_COUNTER] += train_batch.agent_steps()
        counters[STEPS_TRAINED_THIS_ITER_COUNTER] += train_batch.count
        global_vars = {"timestep": counters[STEPS_SAMPLED_COUNTER]}
        if remote:  # one put, sent to every worker before its next sample request
            with timers[WORKER_UPDATE_TIMER]:
                weights = ray.put(local.get_weights(to_train))
                for w in remote:
                    w.set_weights.remote(weights, global_vars)
        local.set_global_vars(global_vars)
        for pid, policy_info in info[LEARNER_INFO].items():
            local.get_policy(pid).update_kl(policy_info[LEARNER_STATS_KEY]["kl"])
        if schedule.due(counters[STEPS_SAMPLED_COUNTER]):
            result = make_result(counters, info, timers, episodes.collect(), workers)
            warn_about_bad_reward_scales(result, config)
            yield result


def concat(batches: Sequence[AnyBatch]) -> AnyBatch:
    if isinstance(batches[0], MultiAgentBatch):
        return MultiAgentBatch.concat(batches)  # type: ignore[arg-type]  # all of one kind
    return SampleBatch.concat(batches)  # type: ignore[arg-type]  # all of one kind


def mean_stats(stats: Sequence[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([s[key] for s in stats])) for key in stats[0]}


def sgd(policy: Policy, part: SampleBatch, config: PPOConfig) -> dict[str, float]:
    """``num_sgd_iter`` epochs over shuffled minibatches, one optimizer step each; the last epoch's mean stats."""
    size = min(config.sgd_minibatch_size, part.count)
    stats: list[dict[str, float]] = []
    for _ in range(config.num_sgd_iter):
        stats = [policy.learn_on_batch(mb)[LEARNER_STATS_KEY]
                 for mb in part.minibatches(size, seed=policy.np_random, shuffle=True)]
    return mean_stats(stats)


def multi_device_sgd(policy: Policy, part: SampleBatch, config: PPOConfig) -> dict[str, float]:
    """The rows split evenly over ``max(1, num_gpus)`` towers; each epoch visits the minibatch offsets in a random
    order. One tower learns on tensors loaded once; several (fake CPU ones) average their gradients per step."""
    num_devices = max(1, int(config.num_gpus))
    if config.shuffle_sequences:
        part = part.shuffle(policy.np_random)
    rows, size = part.count // num_devices, config.sgd_minibatch_size // num_devices
    towers = [part[d * rows:(d + 1) * rows] for d in range(num_devices)]
    loaded = policy.to_tensors(towers[0]) if num_devices == 1 else None
    stats: list[dict[str, float]] = []
    for _ in range(config.num_sgd_iter):
        stats = []
        for i in policy.np_random.permutation(max(1, rows // size)):
            minibatch = slice(i * size, (i + 1) * size)
            if loaded is not None:
                stats.append(policy.learn_on_tensors({k: v[minibatch] for k, v in loaded.items()})[LEARNER_STATS_KEY])
                continue
            results = [policy.compute_gradients(tower[minibatch]) for tower in towers]
            policy.apply_gradients([np.mean(g, axis=0) for g in zip(*(grads for grads, _ in results))])
            stats.append(mean_stats([tower_info[LEARNER_STATS_KEY] for _, tower_info in results]))
    return mean_stats(stats)


def warn_about_bad_reward_scales(result: dict[str, Any], config: PPOConfig) -> None:
    """Warns when rewards are so large that value clipping, or the value loss in a shared trunk, stalls learning."""
    stats = result["info"][LEARNER_INFO].get(DEFAULT_POLICY_ID, {}).get(LEARNER_STATS_KEY, {})
    scaled_vf_loss = config.vf_loss_coeff * float(stats.get("vf_loss", 0.0))
    if config.model.vf_share_layers and scaled_vf_loss > 100:
        logger.warning("The value loss (%.1f, scaled by vf_loss_coeff) dwarfs the policy loss in a shared trunk; "
                       "lower vf_loss_coeff or set ModelConfig(vf_share_layers=False)", scaled_vf_loss)
    reward = result["episode_reward_mean"]
    if math.isfinite(reward) and abs(reward) / config.vf_clip_param > 200:
        logger.warning("The mean episode return (%.1f) is over 200x vf_clip_param=%s; raise vf_clip_param or scale "
                       "the rewards down", reward, config.vf_clip_param)
