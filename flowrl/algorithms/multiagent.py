"""Two algorithms on one rollout stream: PPO and DQN train different policies of one multi-agent env
(RLlib Flow, https://arxiv.org/abs/2011.12719, Figure 8).

Dataflow: the workers sample in lockstep (``ParallelRollouts(bulk_sync)``) and the stream is
``duplicate``\\ d. Branch 1 keeps only ``dqn_policy``'s experiences, stores them in a replay buffer and, round
robin with the store, replays, trains ``dqn_policy`` (only its weights are broadcast), updates priorities and
its target network. Branch 2 keeps only ``ppo_policy``'s experiences, concatenates them, standardizes the
advantages, runs PPO's minibatch epochs on ``ppo_policy`` and adapts its KL coefficient.
``Concurrently(async)`` drives both and emits the DQN branch's outputs; each branch counts its own trained
agent steps (``agent_steps_trained_DQN`` / ``agent_steps_trained_PPO``).

Each sub-algorithm keeps its own config: ``MultiAgentConfig.ppo`` (a :class:`PPOConfig`) and
``MultiAgentConfig.dqn`` (a :class:`DQNConfig`) hold the learning settings; the rollout and reporting
settings are the ``MultiAgentConfig``'s own and are copied into both.

Examples:
    >>> config = MultiAgentConfig(seed=0)
    >>> config.env_config, config.rollout_fragment_length, sorted(config.policies)
    ({'num_agents': 4}, 50, ['dqn_policy', 'ppo_policy'])
    >>> [alternate_policies(f"agent_{i}") for i in range(4)]
    ['ppo_policy', 'dqn_policy', 'ppo_policy', 'dqn_policy']
    >>> config.dqn.rollout_fragment_length, config.ppo.seed != config.dqn.seed  # copied in; own seeds
    (50, True)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from flowrl.algorithms import Algorithm
from flowrl.algorithms.dqn import DQNConfig, DQNPolicy, make_replay_buffer
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.config import PolicySpec, TrainerConfig
from flowrl.envs import EnvSpec, MultiAgentCartPole
from flowrl.iter import LocalIterator
from flowrl.metrics import DQN_AGENT_STEPS_TRAINED_COUNTER, PPO_AGENT_STEPS_TRAINED_COUNTER
from flowrl.ops import (ConcatBatches, Concurrently, CountSteps, ParallelRollouts, Replay, SelectExperiences,
                        StandardizeFields, StandardMetricsReporting, StoreToReplayBuffer, TrainOneStep, UpdateKL,
                        UpdatePriorities, UpdateTargetNetwork)
from flowrl.replay_buffers import LocalReplayBuffer
from flowrl.sample_batch import ADVANTAGES
from flowrl.workers import WorkerSet

__all__ = ["PPO_POLICY", "DQN_POLICY", "MultiAgentConfig", "alternate_policies", "make_owned_state", "plan",
           "ALGORITHM"]

PPO_POLICY, DQN_POLICY = "ppo_policy", "dqn_policy"

# The settings that describe where and how experience is collected and reported: the composition's own,
# copied into both sub-configs so that each policy sees the run it is part of.
_SHARED_FIELDS = ("env", "env_config", "num_workers", "num_envs_per_worker", "rollout_fragment_length",
                  "batch_mode", "num_cpus_per_worker", "num_gpus_per_worker", "vector_backend")
_AGENT_INDEX = re.compile(r"(\d+)$")


def _default_ppo() -> PPOConfig:
    # learns MultiAgentCartPole's PPO agents in tens of thousands of env steps (RLlib's PPO defaults are tuned
    # for 4000-step batches: lr 5e-5 and 30 epochs)
    return PPOConfig(lr=3e-4, train_batch_size=200, sgd_minibatch_size=128, num_sgd_iter=10, vf_clip_param=10.0)


def _default_dqn() -> DQNConfig:
    # RLlib's DQN defaults with 8 trained rows per sampled env step (DQN's own is 32 per 4-step fragment)
    return DQNConfig(training_intensity=8.0)


@dataclass(frozen=True, kw_only=True)
class MultiAgentConfig(TrainerConfig):
    """The two-policy composition's config.

    Attributes:
        env: a multi-agent env callable (:class:`~flowrl.envs.MultiAgentCartPole`, 4 agents via ``env_config``).
        num_workers: remote rollout workers (0: the driver samples). rollout_fragment_length: 50.
        timesteps_per_iteration: a report waits for 1000 new env steps (no wall-time gate).
        ppo: ``ppo_policy``'s learning settings; its ``train_batch_size`` (200) is what the PPO branch
            concatenates (counted by ``count_steps_by``), ``num_sgd_iter`` (10) x ``sgd_minibatch_size``
            (128) its epochs. Defaults: lr 3e-4, as tuned for CartPole.
        dqn: ``dqn_policy``'s learning settings: replay (``buffer_size``, ``learning_starts``,
            ``prioritized_replay``), ``train_batch_size`` rows per replay, ``target_network_update_freq``,
            exploration, and ``training_intensity`` (trained rows per sampled env step, default 8).
        policies: ``None`` builds ``{"ppo_policy": PolicySpec(PPOPolicy, ppo), "dqn_policy":
            PolicySpec(DQNPolicy, dqn)}``; given, it must name exactly those two policy ids.
        policy_mapping_fn: agent id -> policy id (``None``: :func:`alternate_policies`).

    The rollout settings (``env``, ``env_config``, ``num_workers``, ``num_envs_per_worker``,
    ``rollout_fragment_length``, ``batch_mode``, per-worker resources, ``vector_backend``) are this
    config's and are copied into ``ppo`` and ``dqn``; a sub-config without a ``seed`` gets one
    derived from this config's (``seed`` for PPO, ``seed + 1`` for DQN).
    """

    env: EnvSpec = MultiAgentCartPole
    env_config: Mapping[str, Any] = field(default_factory=lambda: {"num_agents": 4})
    num_workers: int = 0
    rollout_fragment_length: int = 50
    timesteps_per_iteration: int = 1000
    ppo: PPOConfig = field(default_factory=_default_ppo)
    dqn: DQNConfig = field(default_factory=_default_dqn)

    def __post_init__(self) -> None:
        for name, cls in (("ppo", PPOConfig), ("dqn", DQNConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"MultiAgentConfig.{name}={getattr(self, name)!r:.60} must be a {cls.__name__}(...)")
        shared = {name: getattr(self, name) for name in _SHARED_FIELDS}
        for name, offset in (("ppo", 0), ("dqn", 1)):
            sub = getattr(self, name)
            seed = sub.seed if sub.seed is not None or self.seed is None else self.seed + offset
            object.__setattr__(self, name, dataclasses.replace(sub, **shared, seed=seed))  # re-validated
        if self.policies is None:
            object.__setattr__(self, "policies", {PPO_POLICY: PolicySpec(policy_class=PPOPolicy, config=self.ppo),
                                                  DQN_POLICY: PolicySpec(policy_class=DQNPolicy, config=self.dqn)})
        elif set(self.policies) != {PPO_POLICY, DQN_POLICY}:
            raise ValueError(f"MultiAgentConfig.policies has ids {sorted(self.policies)}; the composition trains "
                             f"exactly {[DQN_POLICY, PPO_POLICY]} (leave policies=None to build them from ppo and dqn)")
        if self.policy_mapping_fn is None:
            object.__setattr__(self, "policy_mapping_fn", alternate_policies)
        super().__post_init__()

    @property
    def dqn_round_robin_weights(self) -> list[float]:
        """The DQN branch's ``[store, replay]`` pulls per round-robin turn, from ``dqn.training_intensity``
        (trained rows per sampled env step; :attr:`DQNConfig.round_robin_weights` on this config's rollouts)."""
        return self.dqn.round_robin_weights


def alternate_policies(agent_id: str) -> str:
    """The default policy mapping: agents with an even trailing index play ``ppo_policy``, odd ones
    ``dqn_policy`` (``agent_0`` -> PPO, ``agent_1`` -> DQN, ...).

    Raises:
        ValueError: ``agent_id`` does not end in a number; pass your own ``policy_mapping_fn``.
    """
    match = _AGENT_INDEX.search(agent_id)
    if match is None:
        raise ValueError(f"alternate_policies: agent id {agent_id!r} does not end in an index, so it cannot be "
                         f"mapped alternately; give MultiAgentConfig a policy_mapping_fn (agent id -> "
                         f"{PPO_POLICY!r} or {DQN_POLICY!r})")
    return PPO_POLICY if int(match.group(1)) % 2 == 0 else DQN_POLICY


def plan(workers: WorkerSet, config: MultiAgentConfig, *,
         replay_buffer: LocalReplayBuffer | None = None) -> LocalIterator[dict[str, Any]]:
    """PPO + DQN on one duplicated rollout stream: the DQN branch stores and replays
    ``dqn_policy``'s experiences, the PPO branch trains ``ppo_policy`` on its own; async, emitting DQN's.

    Examples:
        >>> config = MultiAgentConfig(seed=0, dqn=DQNConfig(learning_starts=100), min_iter_time_s=0)
        >>> it = plan(WorkerSet(policy_class=PPOPolicy, config=config), config)
        >>> info = next(it)["info"]
        >>> info["agent_steps_trained_PPO"] >= 400, info["agent_steps_trained_DQN"] % 32
        (True, 0)
        >>> it.close()
    """
    ppo, dqn = config.ppo, config.dqn
    buf = replay_buffer if replay_buffer is not None else make_replay_buffer(dqn)
    r1, r2 = ParallelRollouts(workers, mode="bulk_sync").duplicate(n=2)
    # (1) DQN: store dqn_policy's experiences; replay, train and broadcast dqn_policy, priorities, target net
    dqn_store = r1.for_each(SelectExperiences([DQN_POLICY])).for_each(StoreToReplayBuffer(local_buffer=buf))
    dqn_replay: LocalIterator[Any] = (Replay(local_buffer=buf)
                                      .for_each(CountSteps(DQN_AGENT_STEPS_TRAINED_COUNTER, by="agent_steps"))
                                      .for_each(TrainOneStep(workers, policies=[DQN_POLICY])))
    if dqn.prioritized_replay:
        dqn_replay = dqn_replay.for_each(UpdatePriorities(buf))
    dqn_replay = dqn_replay.for_each(UpdateTargetNetwork(workers, dqn.target_network_update_freq,
                                                         policies=[DQN_POLICY]))
    dqn_train = Concurrently([dqn_store, dqn_replay], mode="round_robin", output_indexes=[1],
                             round_robin_weights=config.dqn_round_robin_weights)
    # (2) PPO: concat ppo_policy's experiences, standardize advantages, minibatch SGD + broadcast, adapt KL
    ppo_train = (r2.for_each(SelectExperiences([PPO_POLICY]))
                 .combine(ConcatBatches(ppo.train_batch_size, config.count_steps_by))
                 .for_each(CountSteps(PPO_AGENT_STEPS_TRAINED_COUNTER, by="agent_steps"))
                 .for_each(StandardizeFields([ADVANTAGES]))
                 .for_each(TrainOneStep(workers, policies=[PPO_POLICY], num_sgd_iter=ppo.num_sgd_iter,
                                        sgd_minibatch_size=ppo.sgd_minibatch_size))
                 .for_each(UpdateKL(workers, policies=[PPO_POLICY])))
    # (3) both branches run; the DQN branch's outputs drive the reports
    merged = Concurrently([ppo_train, dqn_train], mode="async", output_indexes=[1])
    return StandardMetricsReporting(merged, workers, config)


def make_owned_state(config: MultiAgentConfig) -> dict[str, Any]:
    """What the trainer keeps across plan rebuilds: the DQN branch's replay buffer (from ``config.dqn``)."""
    return {"replay_buffer": make_replay_buffer(config.dqn)}


ALGORITHM = Algorithm("multiagent", MultiAgentConfig, PPOPolicy, plan, make_owned_state=make_owned_state)
