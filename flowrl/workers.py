"""Rollout workers and the WorkerSet.

A :class:`RolloutWorker` owns a vector of envs and the policy replicas that act in them; ``sample()``
returns one fragment of ``rollout_fragment_length`` steps per env, postprocessed per trajectory. It
runs in the driver as the *local worker* (the learner's replica) or as a Ray actor, and it is a shard
source: its stream is ``sample()`` forever. A :class:`WorkerSet` is one local worker plus N remote ones.

Examples:
    >>> from flowrl.testing import TinyPGPolicy
    >>> cfg = RolloutConfig(env="CartPole-v1", num_envs_per_worker=2, rollout_fragment_length=8, seed=0)
    >>> worker = RolloutWorker(policy_class=TinyPGPolicy, config=cfg)
    >>> batch = worker.sample()
    >>> batch.count, batch["obs"].shape
    (16, (16, 4))
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeVar

import gymnasium as gym
import numpy as np
import torch

from flowrl import executor, runtime
from flowrl.collective import Collective, CollectiveMember
from flowrl.callbacks import Callbacks, EpisodeTracker, add_learner_stats, before_learning, make_callbacks
from flowrl.config import PolicyConfig, PolicySpec, RolloutConfig
from flowrl.compression import mark_for_wire
from flowrl.contracts import WorkerLike
from flowrl.envs import (EpisodeRecord, MultiAgentVectorEnv, PolicyMapping, VectorEnv,
                         make_policy_mapping)
from flowrl.filters import MeanStdFilter, RunningStat, make_filter
from flowrl.learner_group import LearnerGroup
from flowrl.iter import ParallelIteratorWorker
from flowrl.offline import OutputWriter
from flowrl.policy import AgentStates, Policy, PrevInputs, flush_denormals, next_prev_inputs, restart_states
from flowrl.sample_batch import (ACTIONS, AGENT_INDEX, DEFAULT_POLICY_ID, ENV_ID, EPS_ID, NEXT_OBS, OBS, REWARDS,
                                 TERMINATEDS, TRUNCATEDS, WEIGHTS_VERSION, AnyBatch, MultiAgentBatch, SampleBatch, T)

__all__ = ["RolloutConfig", "PolicySpec", "RolloutWorker", "WorkerSet", "unresponsive_actors",
           "check_finite_env_output", "OBS_FILTER_KEY"]

#: the entry of a policy's weights (:meth:`RolloutWorker.get_weights`) that carries the worker's observation filter
#: statistics (:meth:`flowrl.filters.RunningStat.to_array`) while ``observation_filter`` is not ``"NoFilter"``
OBS_FILTER_KEY = "__obs_filter__"

#: seconds a :class:`WorkerSet` waits for Ray to place its placement group (``placement_strategy``)
PLACEMENT_TIMEOUT_S = 60.0

R = TypeVar("R")


logger = logging.getLogger(__name__)


def unresponsive_actors(actors: Sequence[Any], timeout_s: float) -> list[int]:
    """Positions in ``actors`` of those that died or did not answer ``ping()`` within ``timeout_s`` seconds (in
    all: the pings run in parallel)."""
    pings = [actor.ping.remote() for actor in actors]
    deadline, failed = time.monotonic() + timeout_s, []
    for i, ref in enumerate(pings):
        try:
            executor.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except (executor.ActorDiedError, executor.GetTimeoutError):
            failed.append(i)
    return failed


def _policy_seed(seed: int | None, worker_index: int) -> int | None:
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, worker_index, 7919]).generate_state(1)[0])


def _env_major(steps: list[np.ndarray]) -> np.ndarray:
    """``T`` per-step arrays ``[N, ...]`` as one contiguous ``[N, T, ...]`` array (``np.stack(steps, 1)``,
    without its per-array overhead)."""
    joined = np.concatenate(steps).reshape(len(steps), *steps[0].shape)
    return np.ascontiguousarray(joined.swapaxes(0, 1))


def _env_label(env: Any) -> str:
    return repr(env) if isinstance(env, str) else getattr(env, "__qualname__", repr(env))


def check_finite_env_output(columns: Mapping[str, np.ndarray], eps_ids: np.ndarray, ts: np.ndarray,
                            env_index: np.ndarray, *, env: Any, worker_index: int) -> None:
    """Refuses sampled rows whose reward or observation is NaN or infinite, naming the first one (in time order).

    Called once per fragment on its columns, so a NaN from the env never reaches a learner (where it would turn
    the weights into NaN while training carries on). ``eps_ids``, ``ts`` and ``env_index`` have the leading shape
    of the columns (``[N, T]`` for a single-agent fragment, ``[rows]`` for one agent's rows).

    Raises:
        ValueError: naming the env, the worker and env index, the episode, the step in it and the field.

    Examples:
        >>> cols = {REWARDS: np.array([1.0, np.nan]), OBS: np.zeros((2, 3)), NEXT_OBS: np.zeros((2, 3))}
        >>> check_finite_env_output(cols, np.array([7, 7]), np.array([4, 5]), np.array([0, 0]),
        ...                         env="CartPole-v1", worker_index=1)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        ValueError: env 'CartPole-v1' returned a non-finite reward (nan) at step 5 of episode 7 (worker 1,
        env 0); fix the env, or wrap it to replace such values, as flowrl does not train on NaN or inf
    """
    first: tuple[tuple[int, int], int, str, tuple[int, ...], Any] | None = None
    for order, key in enumerate((OBS, REWARDS, NEXT_OBS)):
        column = columns.get(key)
        if column is None or column.dtype.kind != "f" or np.isfinite(column).all():
            continue
        bad = ~np.isfinite(column.reshape(*ts.shape, -1)).all(axis=-1)
        position = min(map(tuple, np.argwhere(bad)), key=lambda p: p[-1])  # the last axis is time (rows)
        # an OBS row is the env's output of the step before, or of its reset at step 0
        reset = key == OBS and ts[position] == 0
        step = int(ts[position]) - (1 if key == OBS and not reset else 0)
        name = {REWARDS: "reward", NEXT_OBS: "observation"}.get(key, "observation from reset" if reset else
                                                                 "observation")
        when = (int(position[-1]), order)
        if first is None or when < first[0]:
            first = (when, step, name, position, column[position])
    if first is None:
        return
    _, step, name, position, value = first
    shown = np.array2string(np.asarray(value), threshold=8, separator=", ")
    raise ValueError(f"env {_env_label(env)} returned a non-finite {name} ({shown}) at step {step} of episode "
                     f"{int(eps_ids[position])} (worker {worker_index}, env {int(env_index[position])}); fix the "
                     f"env, or wrap it to replace such values, as flowrl does not train on NaN or inf")


class RolloutWorker(ParallelIteratorWorker, CollectiveMember):
    """Envs plus policy replicas; ``sample()`` one fragment per call. Usable in-process or as an actor.

    Args:
        policy_class: the :class:`~flowrl.policy.Policy` subclass to act (and, locally, learn) with.
        config: a :class:`RolloutConfig` (or an algorithm config extending it).
        worker_index: 0 for the local worker, 1..N for remote ones; seeds derive from it.

    Attributes:
        learn_lock: held by learner threads while they train this worker's policies (it is their
            ``weights_lock``) and by :meth:`get_state` / :meth:`set_state`, so a checkpoint taken in the
            driver while a learner thread trains never reads weights or optimizer state halfway through a step.
    """

    def __init__(self, *, policy_class: type[Policy], config: RolloutConfig, worker_index: int = 0) -> None:
        self.config, self.worker_index = config, worker_index
        self.learn_lock = threading.RLock()
        if worker_index > 0:  # a remote worker: one intra-op thread per reserved CPU
            torch.set_num_threads(max(1, int(config.num_cpus_per_worker)))
        policy_config = dataclasses.replace(config, seed=_policy_seed(config.seed, worker_index))
        self.env: VectorEnv | MultiAgentVectorEnv
        self.mapping: PolicyMapping | None = None
        n = config.num_envs_per_worker
        if config.policies is None:
            self.env = VectorEnv(config.env, n, seed=config.seed, worker_index=worker_index,
                                 config=config.env_config, backend=config.vector_backend)
            self.policy_map: dict[str, Policy] = {
                DEFAULT_POLICY_ID: policy_class(self.env.observation_space, self.env.action_space, policy_config)}
        else:
            self.env, self.policy_map = self._make_multi_agent(policy_class, config, policy_config)
        self.policies_to_train = list(config.policies_to_train or self.policy_map)
        self._versioned = config.profile  # stamp sampled rows with, and send, the weights' versions
        self.obs_filter = self._make_filter(config)
        self._obs: Any = self.env.reset()
        self._obs = self._filtered(self._obs)
        # a recurrent policy's state per env (``()`` for a feed-forward one), and the state an episode starts from
        # and the previous actions and rewards it reads, when its model reads them (zeros at each episode start)
        self._initial_state: tuple[np.ndarray, ...] = ()
        self._initial_prev: PrevInputs = None
        if isinstance(self.env, VectorEnv):
            self._initial_state = self.policy_map[DEFAULT_POLICY_ID].initial_state(n)
            self._initial_prev = self.policy_map[DEFAULT_POLICY_ID].initial_prev_inputs(n)
        elif any(p.uses_prev_inputs for p in self.policy_map.values()):
            raise ValueError("model.lstm_use_prev_action / lstm_use_prev_reward: multi-agent workers do not feed the "
                             "previous action or reward yet; set both to False for multi-agent policies")
        self._agent_states = AgentStates()  # multi-agent: each recurrent agent's state, per env and agent
        self._policy_state = tuple(s.copy() for s in self._initial_state)
        self._prev = self._initial_prev  # replaced, never written in place
        self._eps_id = np.arange(n, dtype=np.int64) + worker_index * 10**9  # unique per worker
        self._next_eps = int(self._eps_id[-1]) + 1
        self._ep_t = np.zeros(n, dtype=np.int64)
        self._pending: list[list[SampleBatch]] = [[] for _ in range(n)]  # complete_episodes carry-over
        self._episodes: list[EpisodeRecord] = []
        super().__init__(self._shard_items)
        self.callbacks: Callbacks = make_callbacks(config.callbacks)
        self._tracker = None if type(self.callbacks) is Callbacks else \
            EpisodeTracker(self.callbacks, self, self._eps_id.tolist(), self._next_eps)  # no hooks: no cost

    #: the learner group this (local) worker hands its learning to (``num_learners > 1``), or ``None``
    learner_group: LearnerGroup | None = None
    #: whether this worker agreed with its process group's state since it joined (:meth:`agree_with_group`)
    _group_agreed = False
    #: the group's observation-filter statistics as of the last :meth:`sync_filter_with_group`
    _group_filter: np.ndarray | None = None

    def _shard_items(self) -> Iterator[Any]:
        """This worker's stream as a shard (what ``from_actors`` gathers): ``sample()`` forever."""
        while True:
            yield self.sample()

    def _filtered(self, obs: Any) -> Any:
        """``obs`` through this worker's observation filter (which learns from it), or as it is without one."""
        return obs if self.obs_filter is None else self.obs_filter(np.asarray(obs))

    def _make_filter(self, config: RolloutConfig) -> MeanStdFilter | None:
        """The observation filter ``config.observation_filter`` names, for this worker's observation space."""
        if config.observation_filter == "NoFilter":
            return None
        assert isinstance(self.env, VectorEnv)  # a multi-agent config refuses filters (RolloutConfig)
        space = self.env.observation_space
        if not isinstance(space, gym.spaces.Box) or space.dtype.kind != "f":
            raise ValueError(f"observation_filter={config.observation_filter!r} normalizes float Box observations; "
                             f"env {_env_label(config.env)} observes {space}; use observation_filter='NoFilter'")
        return make_filter(config.observation_filter, space.shape)

    # -- sampling --------------------------------------------------------------------------------
    def _step_chunk(self, steps: int) -> list[SampleBatch]:
        """Steps every env ``steps`` times; returns one time-ordered raw trajectory per env."""
        policy, env = self.policy_map[DEFAULT_POLICY_ID], self.env
        assert isinstance(env, VectorEnv)  # single-agent config, checked in __init__
        obs, actions, rewards, terms, truncs, next_obs = [], [], [], [], [], []
        extras: dict[str, list[np.ndarray]] = {}
        episodes, obs_filter, state, prev = self._episodes, self.obs_filter, self._policy_state, self._prev
        tracker, clip = self._tracker, self.config.clip_rewards
        for _ in range(steps):  # the hot loop: one batched forward pass and one vector step per turn
            if state:  # a recurrent policy: it acts from each env's state and returns the next
                acts, extra, state = policy.sample_actions_with_state(self._obs, state, prev)
            else:
                acts, extra = policy.sample_actions(self._obs)
            env_acts = policy.env_actions(acts)
            step = env.step(env_acts)
            if tracker is not None:
                tracker.after_step(step.rewards, step.final_obs, env_acts, step.episodes)
            step_rewards = step.rewards if clip is None else np.clip(step.rewards, -clip, clip)  # episode stats: raw
            if state:  # the next episode of an env that ended starts from the initial state
                ended = step.terminateds | step.truncateds
                state = restart_states(state, ended, self._initial_state)
                prev = next_prev_inputs(acts, step_rewards, ended, self._initial_prev)  # (and no previous a, r)
            obs.append(self._obs)
            actions.append(acts)
            rewards.append(step_rewards)
            terms.append(step.terminateds)
            truncs.append(step.truncateds)
            for key, value in extra.items():
                extras.setdefault(key, []).append(value)
            if step.episodes:
                episodes.extend(step.episodes)
            if obs_filter is None:
                next_obs.append(step.final_obs)
                self._obs = step.obs
            else:  # every observation the env returned goes through the filter once
                next_obs.append(final := obs_filter(step.final_obs))
                reset = step.terminateds | step.truncateds
                self._obs = final.copy()
                if reset.any():
                    self._obs[reset] = obs_filter(step.obs[reset])
        self._policy_state, self._prev = state, prev
        columns = {OBS: obs, ACTIONS: actions, REWARDS: rewards, TERMINATEDS: terms, TRUNCATEDS: truncs,
                   NEXT_OBS: next_obs, **extras}
        stacked = {k: _env_major(v) for k, v in columns.items()}
        policy.complete_fragment(stacked)
        eps_ids, ts = self._number_episodes(stacked[TERMINATEDS] | stacked[TRUNCATEDS])
        check_finite_env_output(stacked, eps_ids, ts, np.broadcast_to(np.arange(env.num_envs)[:, None], ts.shape),
                                env=self.config.env, worker_index=self.worker_index)
        return [SampleBatch._of_checked({**{k: v[i] for k, v in stacked.items()}, EPS_ID: eps_ids[i], T: ts[i],
                                         ENV_ID: np.full(steps, i, dtype=np.int64)}) for i in range(env.num_envs)]

    def _number_episodes(self, done_NT: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Episode ids and in-episode step indices ``[N, T]`` for a chunk whose episode ends are ``done_NT``.

        An env's rows continue its current episode until its first end; each end opens a new episode
        whose id is allocated in time order (envs in index order within a step), so ids are unique per
        worker. Updates the worker's running ids, step counts and next free id."""
        num_envs, steps = done_NT.shape
        rank_NT = np.cumsum(done_NT.T.ravel()).reshape(steps, num_envs).T  # 1-based allocation order of ends
        eps_ids, ts = np.empty((num_envs, steps), np.int64), np.empty((num_envs, steps), np.int64)
        rows = np.arange(steps)
        for i in range(num_envs):
            ends = np.flatnonzero(done_NT[i])
            starts = np.concatenate([[0], ends + 1])
            seg = np.zeros(steps + 1, np.int64)
            seg[ends + 1] = 1
            seg = np.cumsum(seg[:steps])  # the episode (0 = the running one) of each row
            ids = np.concatenate([[self._eps_id[i]], self._next_eps + rank_NT[i, ends] - 1])
            eps_ids[i] = ids[seg]
            ts[i] = rows - starts[seg] + np.where(seg == 0, self._ep_t[i], 0)
            self._eps_id[i] = ids[-1]
            self._ep_t[i] = steps - starts[-1] + (self._ep_t[i] if len(ends) == 0 else 0)
        self._next_eps += int(done_NT.sum())
        return eps_ids, ts

    def _postprocess(self, trajectories: Sequence[SampleBatch]) -> SampleBatch:
        """One env's rows at a time, each ending on an episode boundary or the fragment's cut; per episode
        unless the policy's hook spans episodes (or is the identity), then per trajectory as a whole."""
        policy = self.policy_map[DEFAULT_POLICY_ID]
        if type(policy).postprocess_trajectory is Policy.postprocess_trajectory:
            return SampleBatch.concat(trajectories)
        if not policy.postprocess_spans_episodes:
            trajectories = [piece for traj in trajectories for piece in traj.split_by_episode()]
        return SampleBatch.concat([policy.postprocess_trajectory(traj) for traj in trajectories])

    def _make_multi_agent(self, policy_class: type[Policy], config: RolloutConfig,
                          policy_config: PolicyConfig) -> tuple[MultiAgentVectorEnv, dict[str, Policy]]:
        assert config.policies is not None and callable(config.env)  # checked by RolloutConfig
        env = MultiAgentVectorEnv(config.env, config.num_envs_per_worker, seed=config.seed,  # type: ignore[arg-type]
                                  worker_index=self.worker_index, config=config.env_config)
        probe = env.envs[0]
        self.mapping = make_policy_mapping(config.policy_mapping_fn, list(config.policies), agent_ids=probe.agent_ids)
        policies: dict[str, Policy] = {}
        for pid, spec in config.policies.items():
            agents = [a for a in probe.agent_ids if self.mapping(a) == pid]
            if not agents:
                raise ValueError(f"policy {pid!r} has no agent mapped to it (agents {list(probe.agent_ids)}); fix "
                                 f"policy_mapping_fn or drop the policy")
            own = spec.config or policy_config
            if spec.config is not None and own.seed is not None:
                own = dataclasses.replace(own, seed=_policy_seed(own.seed, self.worker_index))
            policies[pid] = (spec.policy_class or policy_class)(
                probe.observation_space(agents[0]), probe.action_space(agents[0]), own)
        return env, policies

    def _sample_multi_agent(self) -> MultiAgentBatch:
        """One fragment of ``rollout_fragment_length`` env steps per env, split per policy."""
        assert isinstance(self.env, MultiAgentVectorEnv) and self.mapping is not None
        rows: dict[tuple[int, str], dict[str, list[Any]]] = {}
        agent_index = {aid: k for k, aid in enumerate(self.env.envs[0].agent_ids)}
        for _ in range(self.config.rollout_fragment_length):
            by_policy: dict[str, list[tuple[int, str]]] = {}
            for i, obs in enumerate(self._obs):
                for aid in obs:
                    by_policy.setdefault(self.mapping(aid), []).append((i, aid))
            actions: list[dict[str, Any]] = [{} for _ in self._obs]  # as the policies chose them (sampled)
            env_actions: list[dict[str, Any]] = [{} for _ in self._obs]  # as the env takes them
            extras: dict[tuple[int, str], dict[str, Any]] = {}
            for pid, keys in by_policy.items():
                policy, agent_obs = self.policy_map[pid], np.stack([self._obs[i][a] for i, a in keys])
                if policy.is_recurrent:  # each agent acts from its own state
                    state = self._agent_states.gather(keys, policy.initial_state(1))
                    acts, extra, new_state = policy.compute_actions_with_state(agent_obs, state)
                    self._agent_states.scatter(keys, new_state)
                else:
                    acts, extra = policy.compute_actions(agent_obs)
                env_acts = policy.env_actions(acts)
                for row, (i, aid) in enumerate(keys):
                    actions[i][aid] = acts[row]
                    env_actions[i][aid] = env_acts[row]
                    extras[(i, aid)] = {k: v[row] for k, v in extra.items()}
            step = self.env.step(env_actions)
            if self._tracker is not None:
                self._tracker.after_step(step.rewards, [{**o, **f} for o, f in zip(step.obs, step.final_obs)],
                                         env_actions, step.episodes)
            for i in range(self.env.num_envs):
                ended = step.terminateds[i]["__all__"] or step.truncateds[i]["__all__"]
                for aid, reward in step.rewards[i].items():
                    if aid not in actions[i]:
                        continue  # a reward for an agent that did not act this step has no transition
                    term = bool(step.terminateds[i].get(aid, False) or step.terminateds[i]["__all__"])
                    trunc = not term and bool(step.truncateds[i].get(aid, False) or step.truncateds[i]["__all__"])
                    if self.config.clip_rewards is not None:  # the batch's; the episode statistics keep the env's
                        reward = min(max(reward, -self.config.clip_rewards), self.config.clip_rewards)
                    cols = rows.setdefault((i, aid), {})
                    for key, value in ((OBS, self._obs[i][aid]), (ACTIONS, actions[i][aid]), (REWARDS, reward),
                                       (TERMINATEDS, term), (TRUNCATEDS, trunc),
                                       (NEXT_OBS, step.final_obs[i].get(aid, self._obs[i][aid])),
                                       (EPS_ID, self._eps_id[i]), (T, self._ep_t[i]), (ENV_ID, i),
                                       (AGENT_INDEX, agent_index.get(aid, -1)), *extras[(i, aid)].items()):
                        cols.setdefault(key, []).append(value)
                self._ep_t[i] += 1
                if ended:
                    self._eps_id[i], self._ep_t[i] = self._next_eps, 0
                    self._next_eps += 1
            self._agent_states.after_step(step.terminateds, step.truncateds)
            self._episodes.extend(step.episodes)
            self._obs = [obs if step.terminateds[i]["__all__"] or step.truncateds[i]["__all__"] else
                         {a: o for a, o in obs.items()  # an agent that just finished acts no more
                          if not (step.terminateds[i].get(a, False) or step.truncateds[i].get(a, False))}
                         for i, obs in enumerate(step.obs)]
        per_policy: dict[str, list[SampleBatch]] = {}
        for (_, aid), cols in rows.items():
            policy_id = self.mapping(aid)
            batch = SampleBatch({k: np.asarray(v) for k, v in cols.items()})
            check_finite_env_output(batch, batch[EPS_ID], batch[T], batch[ENV_ID], env=self.config.env,
                                    worker_index=self.worker_index)
            for piece in batch.split_by_episode():
                per_policy.setdefault(policy_id, []).append(self.policy_map[policy_id].postprocess_trajectory(piece))
        return MultiAgentBatch({pid: SampleBatch.concat(b) for pid, b in per_policy.items()},
                               self.config.sample_size)

    def sample(self) -> AnyBatch:
        """One fragment: ``rollout_fragment_length`` steps per env (truncate_episodes), or at least
        that many ending on episode boundaries (complete_episodes), postprocessed per trajectory.
        A multi-agent worker returns a MultiAgentBatch with one SampleBatch per policy that acted.
        With the config's ``profile`` set, every row carries its policy's ``weights_version``."""
        batch = self._sample_multi_agent() if self.config.policies is not None else self._sample_single_agent()
        if self._versioned:
            for pid, part in batch.as_multi_agent().policy_batches.items():
                part[WEIGHTS_VERSION] = np.full(part.count, self.policy_map[pid].weights_version, np.int64)
        self.callbacks.on_sample_end(worker=self, samples=batch)
        if self.config.compress_batches:  # image columns cross Ray LZ4-compressed
            mark_for_wire(batch)
        return batch

    def _sample_single_agent(self) -> SampleBatch:
        length = self.config.rollout_fragment_length
        if self.config.batch_mode == "truncate_episodes":
            return self._postprocess(self._record(self._step_chunk(length)))
        done: list[SampleBatch] = []
        while sum(b.count for b in done) < self.config.sample_size:
            for i, traj in enumerate(self._step_chunk(length)):
                self._pending[i].append(traj)
                joined = SampleBatch.concat(self._pending[i])
                ends = np.flatnonzero(joined[TERMINATEDS] | joined[TRUNCATEDS])
                if len(ends):
                    cut = int(ends[-1]) + 1
                    done.append(joined[:cut])
                    self._pending[i] = [joined[cut:]] if cut < joined.count else []
                else:
                    self._pending[i] = [joined]
        return self._postprocess(self._record(done))

    #: the writer of ``config.output``, made by the first sample (:mod:`flowrl.offline`)
    output_writer: OutputWriter | None = None

    def _record(self, trajectories: list[SampleBatch]) -> list[SampleBatch]:
        """Hands a sample's raw trajectories to the output writer when the config sets ``output``; returns them."""
        if self.config.output is not None:
            if self.output_writer is None:
                env = self.env
                assert isinstance(env, VectorEnv)  # output is single-agent (RolloutConfig refuses it otherwise)
                self.output_writer = OutputWriter(
                    self.config.output, worker_index=self.worker_index, observation_space=env.observation_space,
                    action_space=env.action_space, compress_columns=self.config.output_compress_columns,
                    max_file_bytes=self.config.output_max_file_bytes)
            self.output_writer.add(trajectories)
        return trajectories

    def close_output(self) -> dict[str, Any]:
        """Writes every recorded episode (the running ones cut) and closes the output files; what was written:
        ``{"rows": ..., "files": [...], "add_seconds": ...}`` (empty when nothing was recorded)."""
        writer, self.output_writer = self.output_writer, None
        if writer is None:
            return {}
        writer.close()
        return {"rows": writer.rows_written, "files": [str(f) for f in writer.files],
                "add_seconds": writer.add_seconds}

    def get_metrics(self) -> list[EpisodeRecord]:
        """The episodes finished since the last call, with ``policy_returns`` filled in."""
        episodes, self._episodes = self._episodes, []
        return [dataclasses.replace(ep, policy_returns=self._policy_returns(ep)) for ep in episodes]

    def _policy_returns(self, ep: EpisodeRecord) -> dict[str, float]:
        if self.mapping is None:
            return {DEFAULT_POLICY_ID: ep.episode_return}
        by_policy: dict[str, list[float]] = {}
        for aid, ret in ep.agent_returns.items():
            by_policy.setdefault(self.mapping(aid), []).append(ret)
        return {pid: sum(rets) / len(rets) for pid, rets in by_policy.items()}  # a policy's mean agent return

    # -- learning (the local worker) -------------------------------------------------------------
    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Policy:
        if policy_id not in self.policy_map:
            raise ValueError(f"no policy {policy_id!r}; this worker has {sorted(self.policy_map)}")
        return self.policy_map[policy_id]

    def _policy_batches(self, batch: AnyBatch) -> dict[str, SampleBatch]:
        return batch.as_multi_agent().policy_batches

    def learn_on_batch(self, batch: AnyBatch) -> dict[str, dict[str, Any]]:
        """Trains each policy to train on its part of ``batch``; ``{pid: {"learner_stats": ...}}``. Learning runs
        with denormal floats flushed to zero when ``config.flush_denormal`` (:func:`~flowrl.policy.flush_denormals`),
        as do :meth:`compute_gradients` and :meth:`apply_gradients`."""
        if self.learner_group is not None:
            return self.learn_minibatches(batch, self.policies_to_train, [[None]])
        out = {}
        with flush_denormals(self.config.flush_denormal):
            for pid, b in self._policy_batches(batch).items():
                if pid in self.policies_to_train:
                    added = before_learning(self.callbacks, self.policy_map[pid], b)
                    out[pid] = add_learner_stats(self.policy_map[pid].learn_on_batch(b), added)
        return out

    def learn_minibatches(self, batch: AnyBatch, policies: Sequence[str],
                          epochs: Sequence[Sequence[np.ndarray | None]]) -> dict[str, dict[str, Any]]:
        """Hands a whole step to the learner group: per listed trained policy in ``batch``, one group step per
        minibatch of ``epochs`` (row indices into its part; ``None``: all of its rows); the policy then holds the
        group's weights. Returns each policy's learner info (the final epoch's mean stats)."""
        if self.learner_group is None:
            raise RuntimeError("learn_minibatches hands learning to a learner group, and this worker has none "
                               "(num_learners=1); call learn_on_batch")
        out = {}
        for pid, part in self._policy_batches(batch).items():
            if pid in policies and pid in self.policies_to_train and part.count:
                rows = [[np.arange(part.count) if idx is None else idx for idx in epoch] for epoch in epochs]
                out[pid] = self.learner_group.learn(self.policy_map[pid], part, rows, self.callbacks)
        return out

    def compute_gradients(self, batch: AnyBatch) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
        grads, infos = {}, {}
        with flush_denormals(self.config.flush_denormal):
            for pid, b in self._policy_batches(batch).items():
                if pid in self.policies_to_train:
                    added = before_learning(self.callbacks, self.policy_map[pid], b)
                    grads[pid], infos[pid] = self.policy_map[pid].compute_gradients(b)
                    add_learner_stats(infos[pid], added)
        return grads, infos

    def apply_gradients(self, grads: Mapping[str, list[np.ndarray]]) -> None:
        with flush_denormals(self.config.flush_denormal):
            for pid, g in grads.items():
                self.get_policy(pid).apply_gradients(g)

    # -- weights and state -----------------------------------------------------------------------
    def weights_version(self, policy_id: str = DEFAULT_POLICY_ID) -> int:
        """The version of a policy's weights (:attr:`Policy.weights_version <flowrl.policy.Policy>`)."""
        return self.get_policy(policy_id).weights_version

    def get_weights(self, policies: Sequence[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
        """Each policy's weights by name; with the config's ``profile``, plus their version under
        ``weights_version``; with an observation filter, plus its statistics under :data:`OBS_FILTER_KEY`."""
        weights = {pid: self.get_policy(pid).get_weights() for pid in (policies or list(self.policy_map))}
        if self._versioned:
            for pid, w in weights.items():
                w[WEIGHTS_VERSION] = np.array(self.get_policy(pid).weights_version)
        if self.obs_filter is not None and DEFAULT_POLICY_ID in weights:
            weights[DEFAULT_POLICY_ID][OBS_FILTER_KEY] = self.obs_filter.running.to_array()
        return weights

    def set_weights(self, weights: Mapping[str, Mapping[str, np.ndarray]],
                    global_vars: Mapping[str, Any] | None = None) -> None:
        """Loads the weights of the policies present in ``weights`` (others keep theirs), adopting the
        version they carry, if any, and the observation filter statistics (:meth:`MeanStdFilter.sync`)."""
        for pid, w in weights.items():
            policy = self.get_policy(pid)
            if OBS_FILTER_KEY in w:
                if self.obs_filter is not None:
                    self.obs_filter.sync(w[OBS_FILTER_KEY])
                w = {name: value for name, value in w.items() if name != OBS_FILTER_KEY}
            if WEIGHTS_VERSION in w:
                w = {name: value for name, value in w.items() if name != WEIGHTS_VERSION}
                policy.weights_version = int(weights[pid][WEIGHTS_VERSION])
            policy.set_weights(w)
        if global_vars is not None:
            self.set_global_vars(global_vars)

    def take_filter_delta(self) -> np.ndarray | None:
        """The statistics of the observations this worker filtered since the last call (cleared), for the driver
        to merge (:meth:`WorkerSet.put_weights`); ``None`` without an observation filter."""
        return None if self.obs_filter is None else self.obs_filter.take_delta()

    def apply_filter_deltas(self, deltas: Sequence[np.ndarray | None]) -> None:
        """Merges other workers' :meth:`take_filter_delta` into this worker's observation filter."""
        if self.obs_filter is not None:
            for delta in deltas:
                if delta is not None:
                    self.obs_filter.apply_delta(delta)

    def set_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        for policy in self.policy_map.values():
            policy.on_global_var_update(global_vars)

    def get_state(self) -> dict[str, Any]:
        """Policies' state, the envs' state and RNG, and the episode bookkeeping (ids, steps, the
        complete_episodes carry-over) and the observation filter (under ``obs_filter`` when there is one), as
        numpy and plain data: a restored worker samples on exactly as this one would. Read under :attr:`learn_lock`."""
        with self.learn_lock:
            if self.learner_group is not None:  # the optimizer and extras the learners hold
                self.learner_group.pull_state(self.get_policy(self.policies_to_train[0]))
            state = {"policies": {pid: p.get_state() for pid, p in self.policy_map.items()},
                     "env": self.env.get_state(), "next_eps": self._next_eps, "eps_id": self._eps_id.copy(),
                     "ep_t": self._ep_t.copy(), "pending": [[dict(b) for b in per_env] for per_env in self._pending],
                     "policy_state": [s.copy() for s in self._policy_state]}
            if self._prev is not None:
                state["prev_inputs"] = [p.copy() for p in self._prev]
            if self._agent_states.states:
                state["agent_states"] = self._agent_states.get_state()
            if self.obs_filter is not None:
                state["obs_filter"] = self.obs_filter.get_state()
            return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        with self.learn_lock:
            for pid, s in state["policies"].items():
                self.get_policy(pid).set_state(s)
            if self.learner_group is not None:
                self.learner_group.push_state(self.get_policy(self.policies_to_train[0]))
            self._group_agreed = False  # in a process group, the members agree again before their next update
            self.env.set_state(state["env"])
            self._obs = self.env.current_obs
            if self.obs_filter is not None:
                if "obs_filter" not in state:
                    raise ValueError(f"this worker filters observations ({self.config.observation_filter}) but the "
                                     f"state has no 'obs_filter' (keys {sorted(state)}); restore a state saved with "
                                     f"the same observation_filter")
                self.obs_filter.set_state(state["obs_filter"])
                self._obs = self.obs_filter(self._obs, update=False)  # pushed when it was first observed
            self._next_eps = int(state["next_eps"])
            self._eps_id, self._ep_t = np.array(state["eps_id"]), np.array(state["ep_t"])
            self._pending = [[SampleBatch(b) for b in per_env] for per_env in state["pending"]]
            carried = state.get("policy_state", [])
            if len(carried) != len(self._initial_state) or any(
                    np.shape(c) != s.shape for c, s in zip(carried, self._initial_state)):
                raise ValueError(f"the state carries a recurrent policy state of shapes "
                                 f"{[np.shape(c) for c in carried]}, but this worker's policy needs "
                                 f"{[s.shape for s in self._initial_state]}; restore a state saved with the same model "
                                 f"and num_envs_per_worker")
            self._policy_state = tuple(np.array(c, np.float32) for c in carried)
            self._agent_states.set_state(state.get("agent_states", []))
            if self._initial_prev is not None:
                if "prev_inputs" not in state:
                    raise ValueError(f"this worker's model reads the previous action and reward, but the state has "
                                     f"no 'prev_inputs' (keys {sorted(state)}); restore a state saved with the same "
                                     f"model")
                actions, rewards = state["prev_inputs"]
                self._prev = (np.array(actions, self._initial_prev[0].dtype), np.array(rewards, np.float32))
            if self._tracker is not None:  # the hooks see the restored envs' episodes start afresh
                self._tracker.restart(self._eps_id.tolist(), self._next_eps)

    # -- process groups (DD-PPO) -----------------------------------------------------------------
    def on_collective_joined(self, collective: Collective) -> None:
        """Hooks the trained policies into the group (their gradients are averaged over it from now on) and
        marks the group's state as not yet agreed: :meth:`agree_with_group` runs before the next update."""
        for pid in self.policies_to_train:
            self.get_policy(pid).collective = collective
        self._group_agreed = False

    def agree_with_group(self) -> int:
        """Makes every member's learner state (weights, optimizer, the policy's own learned state such as PPO's
        KL coefficient) and observation filter those of the member whose weights are furthest along (the lowest
        rank among equals): a member that replaced a failed one, or that was restored from a checkpoint holding
        fewer workers, catches up. A collective call, once per group; returns the source's rank.

        Raises:
            RuntimeError: the worker is in no group (form one with :func:`flowrl.collective.form_group`).
        """
        group = self._group()
        versions = group.gather([self.get_policy(pid).weights_version for pid in self.policies_to_train])
        source = max(range(len(versions)), key=lambda rank: (versions[rank], -rank))
        mine = ({pid: self.get_policy(pid).get_learner_state() for pid in self.policies_to_train},
                None if self.obs_filter is None else self.obs_filter.running.to_array())
        states, running = group.gather(mine if group.rank == source else None)[source]
        if group.rank != source:
            for pid, state in states.items():
                self.get_policy(pid).set_learner_state(state)
        if self.obs_filter is not None:  # the group's filter: the source's, plus every member's news from now on
            self.obs_filter.take_delta()  # already in the source's statistics, or left out of the group's
            self.obs_filter.sync(running)
            self._group_filter = np.array(running)
        self._group_agreed = True
        return source

    def sync_filter_with_group(self) -> None:
        """Merges every member's observation-filter news since the last call into the group's statistics, in rank
        order, and adopts the result (bit-identical on every member); a no-op without a filter. A collective."""
        if self.obs_filter is None:
            return
        group = self._group()
        if self._group_filter is None:
            raise RuntimeError(f"rollout worker {self.worker_index}: agree_with_group() must run once in a new "
                               f"process group before its filters sync")
        deltas = group.gather(self.obs_filter.take_delta())
        shape = self.obs_filter.shape
        merged = RunningStat.from_array(shape, self._group_filter)
        for delta in deltas:
            merged.merge(RunningStat.from_array(shape, delta))
        self._group_filter = merged.to_array()
        self.obs_filter.sync(self._group_filter)  # its news since take_delta: none

    def _group(self) -> Collective:
        if self.collective is None:
            raise RuntimeError(f"rollout worker {self.worker_index} is in no process group; form one over the "
                               f"remote workers first (flowrl.collective.form_group)")
        return self.collective

    # -- tasks (meta-learning) ---------------------------------------------------------------------
    def sample_tasks(self, n: int) -> list[Any]:
        """``n`` tasks drawn by this worker's first env (``sample_tasks``, :mod:`flowrl.envs.tasks`)."""
        assert isinstance(self.env, VectorEnv)  # MAML's config refuses multi-agent policies
        return list(self.env.call("sample_tasks", n)[0])

    def set_task(self, task: Any) -> None:
        """Every env of this worker plays ``task`` (``set_task``) from now on: the episodes in progress are dropped
        unrecorded and every env restarts, so the next sample holds only episodes of ``task``."""
        assert isinstance(self.env, VectorEnv)
        self.env.call("set_task", task)
        obs = self.env.reset()
        self._obs = self._filtered(obs)
        n = self.env.num_envs
        self._eps_id = np.arange(self._next_eps, self._next_eps + n, dtype=np.int64)
        self._next_eps += n
        self._ep_t = np.zeros(n, dtype=np.int64)
        self._pending = [[] for _ in range(n)]
        self._policy_state = tuple(s.copy() for s in self._initial_state)
        self._prev = self._initial_prev
        if self._tracker is not None:
            self._tracker.restart(self._eps_id.tolist(), self._next_eps)

    def apply(self, fn: Callable[[RolloutWorker], R]) -> R:
        """Calls ``fn(self)``: what ``WorkerSet.foreach_worker`` runs on each worker."""
        return fn(self)

    def ping(self) -> str:
        return "ok"


class WorkerSet:
    """One local worker (the learner's replica, in the driver) plus ``config.num_workers`` remote ones.

    Args:
        policy_class: the policy every worker runs.
        config: the rollout (and policy) config; remote workers ask Ray for ``num_cpus_per_worker``
            and ``num_gpus_per_worker`` and are never restarted by Ray (``max_restarts=0``).
        worker_class: the worker to run (tests pass :class:`flowrl.testing.FakeWorker`); it is built as
            ``worker_class(policy_class=..., config=..., worker_index=...)``.
    """

    def __init__(self, *, policy_class: type[Policy] | None, config: RolloutConfig,
                 worker_class: type[Any] = RolloutWorker) -> None:
        self.config, self.policy_class, self.worker_class = config, policy_class, worker_class
        self._local: WorkerLike = worker_class(policy_class=policy_class, config=config, worker_index=0)
        self._remote: list[Any] = []
        self._outstanding: list[Any] = []
        self._filter_deltas: list[Any] = []  # remote workers' take_filter_delta calls not merged yet
        self._executor = "local" if config.executor == "local" else executor.current()
        #: the Ray placement group of the remote workers and learners (``config.placement_strategy``), or ``None``
        self.placement_group: Any = None
        learners = self._num_learners()
        if self._executor == "ray" and (config.num_workers or learners):
            runtime.ensure_initialized()
            self._check_resources()
            if config.placement_strategy is not None:
                self.placement_group = executor.placement_group(self._bundles(), config.placement_strategy,
                                                                timeout_s=PLACEMENT_TIMEOUT_S)
        try:
            if learners and isinstance(self._local, RolloutWorker):
                with executor.using(self._executor):
                    policy = self._local.get_policy(self._local.policies_to_train[0])
                    self._local.learner_group = LearnerGroup(policy, config, options_for=self._learner_options)
            if config.num_workers:
                with executor.using(self._executor):
                    self._remote = [self._make_remote(i + 1) for i in range(config.num_workers)]
                    self.sync_weights()
        except BaseException:
            self.stop()
            raise

    @property
    def learner_group(self) -> LearnerGroup | None:
        """The learner group the local worker hands its learning to (``num_learners > 1``), or ``None``."""
        return getattr(self._local, "learner_group", None)

    def _num_learners(self) -> int:
        """The learner actors to start: ``num_learners`` when above 1 (one learner is the driver)."""
        learners = int(getattr(self.config, "num_learners", 1))
        return learners if learners > 1 else 0

    def _worker_bundle(self) -> dict[str, float]:
        config = self.config
        return {k: float(v) for k, v in (("CPU", config.num_cpus_per_worker), ("GPU", config.num_gpus_per_worker),
                                        *(config.custom_resources_per_worker or {}).items()) if v}

    def _learner_bundle(self) -> dict[str, float]:
        config = self.config
        return {k: float(v) for k, v in (("CPU", getattr(config, "num_cpus_per_learner", 0)),
                                        ("GPU", getattr(config, "num_gpus_per_learner", 0))) if v}

    def _bundles(self) -> list[dict[str, float]]:
        """One placement bundle per remote worker, then one per learner: the resources each asks for."""
        bundles = [self._worker_bundle()] * self.config.num_workers + [self._learner_bundle()] * self._num_learners()
        if any(not b for b in bundles):
            raise ValueError(f"placement_strategy={self.config.placement_strategy!r} reserves a bundle of the "
                             f"resources each remote worker and learner asks for, and num_cpus_per_worker="
                             f"{self.config.num_cpus_per_worker:g} (or num_cpus_per_learner) asks for none; give "
                             f"each some CPU, or set placement_strategy=None")
        return bundles

    def _learner_options(self, rank: int) -> dict[str, Any]:
        config = self.config
        return runtime.actor_options(num_cpus=getattr(config, "num_cpus_per_learner", 1),
                                     num_gpus=getattr(config, "num_gpus_per_learner", 0),
                                     **executor.in_bundle(self.placement_group, config.num_workers + rank))

    def _check_resources(self) -> None:
        """The remote workers and learners fit in the Ray cluster's CPUs, GPUs and custom resources; a ValueError
        naming the resource otherwise."""
        total, config = executor.cluster_resources(), self.config
        learners = self._num_learners()
        custom = [(name, amount, 0) for name, amount in (config.custom_resources_per_worker or {}).items()]
        for name, per_worker, per_learner in (
                ("CPU", config.num_cpus_per_worker, getattr(config, "num_cpus_per_learner", 0)),
                ("GPU", config.num_gpus_per_worker, getattr(config, "num_gpus_per_learner", 0)), *custom):
            need = per_worker * config.num_workers + per_learner * learners
            if need > total.get(name, 0):
                parts = [f"num_workers={config.num_workers} x {per_worker:g} {name} per worker"]
                if learners:
                    parts.append(f"num_learners={learners} x {per_learner:g} {name} per learner")
                per = f"num_{name.lower()}s_per_worker" if name in ("CPU", "GPU") else \
                    f"custom_resources_per_worker[{name!r}]"
                fixes = [f"num_workers or {per}"] + \
                    ([f"num_learners or num_{name.lower()}s_per_learner"] if learners and per_learner else [])
                raise ValueError(f"{' + '.join(parts)} needs {need:g} {name} but the Ray cluster has "
                                 f"{total.get(name, 0):g}; lower {' or '.join(fixes)}")

    def _make_remote(self, worker_index: int) -> Any:
        custom = self.config.custom_resources_per_worker
        options = runtime.actor_options(num_cpus=self.config.num_cpus_per_worker,
                                        num_gpus=self.config.num_gpus_per_worker,
                                        **({"resources": dict(custom)} if custom else {}),
                                        **executor.in_bundle(self.placement_group, worker_index - 1))
        with executor.using(self._executor):
            return executor.create_actor(self.worker_class, options=options, policy_class=self.policy_class,
                                         config=self.config, worker_index=worker_index)

    def local_worker(self) -> WorkerLike:
        """The learner's replica in the driver (a :class:`RolloutWorker` unless ``worker_class`` says otherwise)."""
        return self._local

    def remote_workers(self) -> list[Any]:
        return list(self._remote)

    def put_weights(self, policies: Sequence[str] | None = None) -> Any:
        """One ``ray.put`` of the local worker's weights (of ``policies``; ``None``: all).

        With an observation filter, the remote workers' new filter statistics that have arrived (without
        waiting: each :meth:`send_weights` asks its recipients for theirs) are merged into the local worker's
        filter first, so the weights carry the merged statistics to every worker they reach."""
        if self._filter_deltas:
            ready, self._filter_deltas = executor.wait(self._filter_deltas, num_returns=len(self._filter_deltas),
                                                       timeout=0)
            if ready and isinstance(self._local, RolloutWorker):
                self._local.apply_filter_deltas(executor.get(ready))
        with executor.using(self._executor):
            return executor.put(self._local.get_weights(policies))

    def send_weights(self, ref: Any, to: Sequence[Any] | None = None,
                     global_vars: Mapping[str, Any] | None = None) -> None:
        """Sends the weights ``ref`` (from :meth:`put_weights`) to the actors ``to`` (``None``: every remote
        worker) with ``global_vars``, fire and forget; the local worker gets the global vars.

        Earlier sends are checked without blocking first, so a recipient that died raises its actor
        error here, within one round."""
        if global_vars is not None:
            self._local.set_global_vars(global_vars)
        ready, self._outstanding = executor.wait(self._outstanding, num_returns=len(self._outstanding), timeout=0)
        executor.get(ready)  # raises the actor error of a recipient that died
        recipients = self._remote if to is None else to
        self._outstanding += [w.set_weights.remote(ref, global_vars) for w in recipients]
        if self.config.observation_filter != "NoFilter":  # each recipient's statistics since its last send
            self._filter_deltas += [w.take_filter_delta.remote() for w in recipients]

    def sync_weights(self, policies: Sequence[str] | None = None,
                     global_vars: Mapping[str, Any] | None = None) -> None:
        """One ``ray.put`` of the local weights, that reference sent to every remote worker (fire and
        forget); ``global_vars`` also reach the local worker."""
        if not self._remote:
            if global_vars is not None:
                self._local.set_global_vars(global_vars)
            return
        self.send_weights(self.put_weights(policies), global_vars=global_vars)

    def foreach_worker(self, fn: Callable[[Any], R]) -> list[R]:
        """``fn`` on the local worker, then on each remote worker, in order (each an instance of the set's
        ``worker_class``: a :class:`RolloutWorker` unless a test passed a fake)."""
        return [fn(self._local), *executor.get([w.apply.remote(fn) for w in self._remote])]

    def check_health(self, timeout_s: float = 30.0) -> list[int]:
        """Positions in :meth:`remote_workers` of the workers that died or did not answer in time."""
        return unresponsive_actors(self._remote, timeout_s)

    def recover_learners(self, timeout_s: float = 30.0) -> int:
        """Replaces the learner group's learners that died or did not answer ``ping()`` within ``timeout_s``
        (:meth:`LearnerGroup.replace`); how many (0 without a group)."""
        group = self.learner_group
        if group is None or not isinstance(self._local, RolloutWorker):
            return 0
        dead = unresponsive_actors(group.learners, timeout_s)
        if dead:
            group.replace(dead, self._local.get_policy(self._local.policies_to_train[0]))
        return len(dead)

    def recreate_workers(self, indices: Sequence[int]) -> None:
        """Replaces those workers (same index, seeds and resources) and sends them the current weights."""
        for i in indices:
            executor.kill(self._remote[i])
            self._remote[i] = self._make_remote(i + 1)
        if indices:
            with executor.using(self._executor):
                ref = executor.put(self._local.get_weights())
            executor.get([self._remote[i].set_weights.remote(ref) for i in indices])
            self._outstanding, self._filter_deltas = [], []

    #: whether a plan built over this set reads ``config.input`` (set by :func:`flowrl.ops.offline.ReadInput`; the
    #: trainer refuses a plan that never does)
    reads_input = False
    #: the last episodes that plan read (:class:`flowrl.ops.offline.RecentEpisodes`), when their data lets the trainer
    #: estimate the policy off-policy; ``None`` otherwise
    input_episodes: Any = None

    def close_output(self, timeout_s: float = 60.0) -> None:
        """Has every worker write out and close what it recorded (``config.output``); a worker that cannot (it died)
        is logged, naming it, and the others still close."""
        if self.config.output is None:
            return
        self._local.close_output()
        for i, worker in enumerate(self._remote):
            try:
                executor.get(worker.close_output.remote(), timeout=timeout_s)
            except Exception as error:  # a dead or hung worker: the others' files still close
                logger.error("remote worker %d could not close its output files in %s (its last file may be "
                             "unreadable; delete it before reading the directory): %r", i + 1, self.config.output, error)

    def remove_workers(self, indices: Sequence[int]) -> None:
        """Terminates those workers and drops them from the set."""
        for i in sorted(set(indices), reverse=True):
            executor.kill(self._remote.pop(i))
        self._outstanding, self._filter_deltas = [], []

    def reset(self, new_remote_workers: list[Any]) -> None:
        """Replaces the remote workers with ``new_remote_workers`` (the old ones are not killed)."""
        self._remote, self._outstanding, self._filter_deltas = list(new_remote_workers), [], []

    def stop(self) -> None:
        """Closes the workers' output files (``config.output``), then terminates every remote worker and learner."""
        self.close_output()
        for w in self._remote:
            executor.kill(w)
        self._remote, self._outstanding, self._filter_deltas = [], [], []
        if (group := self.learner_group) is not None:
            group.stop()
        executor.remove_placement_group(self.placement_group)
        self.placement_group = None


if TYPE_CHECKING:
    def _conforms(worker: RolloutWorker) -> WorkerLike:
        return worker  # mypy checks here that RolloutWorker has every method of the worker contract
