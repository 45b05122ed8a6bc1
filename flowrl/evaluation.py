"""Evaluating a policy: the returns of N complete episodes, greedy by default (``flowrl evaluate``).

:func:`evaluate_policy` steps a :class:`~flowrl.envs.VectorEnv` (the same env and observation handling
as a rollout worker) with ``policy.compute_actions(obs, explore=...)`` until every env has finished its
share of the episodes. Each env contributes its *first* episodes, so short episodes are not
over-counted (taking whichever N finish first across envs would favour them).
:func:`evaluate_multi_agent` does the same for the policies of a multi-agent env, each acting for the
agents mapped to it, and also reports each policy's returns.
:func:`evaluate_checkpoint` rebuilds a registered algorithm's policies from a checkpoint
(:func:`flowrl.inference.load_policies`: no Ray, no workers, with the trained observation filter, if any) and
evaluates them on the saved config's env, optionally rendering it on screen or recording one video per episode.

Examples:
    >>> import gymnasium as gym
    >>> from flowrl.envs import VectorEnv
    >>> from flowrl.policy import Policy, PolicyConfig
    >>> env = VectorEnv("CartPole-v1", 4, seed=0)
    >>> policy = Policy(env.observation_space, env.action_space, PolicyConfig(seed=0))
    >>> result = evaluate_policy(policy, env, episodes=6)
    >>> len(result.returns), result.min <= result.mean <= result.max
    (6, True)
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

import gymnasium as gym
import numpy as np

from flowrl import executor
from flowrl.envs import (EnvContext, EnvSpec, MultiAgentVectorEnv, PolicyMapping, VectorEnv, make_env,
                         make_policy_mapping)
from flowrl.filters import MeanStdFilter
from flowrl.policy import AgentStates, Policy, next_prev_inputs, restart_states
from flowrl.sample_batch import DEFAULT_POLICY_ID
from flowrl.validation import check_int

if TYPE_CHECKING:
    from flowrl.config import TrainerConfig
    from flowrl.workers import RolloutWorker, WorkerSet

__all__ = ["EvaluationResult", "RenderError", "evaluate_policy", "evaluate_multi_agent", "evaluate_checkpoint",
           "MAX_EVAL_ENVS"]

MAX_EVAL_ENVS = 16
"""At most this many envs are stepped together by :func:`evaluate_checkpoint` (one when it renders)."""

RenderMode = Literal["human", "rgb_array"]


class RenderError(ValueError):
    """The env cannot render as asked (a mode it does not offer, or a multi-agent env)."""


@dataclass(frozen=True)
class EvaluationResult:
    """The returns and lengths of the evaluated episodes, in order of each env's episodes.

    Attributes:
        returns: one return per episode (for a multi-agent env, the sum of all agents' rewards).
        lengths: one length (env steps) per episode.
        explore: whether actions were sampled (True) or greedy (False).
        policy_returns: multi-agent only: policy id -> its return in each episode where it acted (the mean
            return of the agents mapped to it, as training reports ``policy_reward_mean``); empty otherwise.
    """

    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    explore: bool = False
    policy_returns: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        """The mean return."""
        return float(np.mean(self.returns))

    @property
    def min(self) -> float:
        """The lowest return."""
        return float(np.min(self.returns))

    @property
    def max(self) -> float:
        """The highest return."""
        return float(np.max(self.returns))


def _check_episodes(episodes: object) -> None:
    check_int("episodes", episodes, 1, "complete episodes to evaluate")


def _quota(episodes: int, num_envs: int) -> list[int]:
    """Env ``i`` runs ``episodes // N`` episodes, plus one for the first ``episodes % N`` envs."""
    return [episodes // num_envs + (1 if i < episodes % num_envs else 0) for i in range(num_envs)]


def evaluate_policy(policy: Policy, env: VectorEnv, *, episodes: int, explore: bool = False,
                    obs_filter: MeanStdFilter | None = None) -> EvaluationResult:
    """The first episodes of each env of ``env`` (``episodes`` in all), acting with ``policy``.

    Args:
        policy: acts through ``compute_actions(obs, explore=explore)``, or a recurrent one through
            ``compute_actions_with_state`` from one state per env, restarted at each episode's end.
        env: a fresh vector env (it is reset here); env ``i`` runs ``episodes // N`` episodes, plus one for
            the first ``episodes % N`` envs. Its episodes must end (a time limit or a terminal state).
        episodes: how many complete episodes, >= 1.
        explore: sample actions (True) or take the most likely one (False, greedy).
        obs_filter: the observation filter the policy was trained with (``RolloutConfig.observation_filter``),
            applied frozen: the policy sees observations normalized as in training, and the filter stays as it is.

    Raises:
        ValueError: ``episodes < 1``.
    """
    _check_episodes(episodes)
    quota = _quota(episodes, env.num_envs)
    per_env: list[list[tuple[float, int]]] = [[] for _ in quota]
    obs = env.reset()
    start = policy.initial_state(env.num_envs)  # a recurrent policy: one state per env, restarted per episode
    prev_start = policy.initial_prev_inputs(env.num_envs)  # (and the previous action and reward, if it reads them)
    state, prev = start, prev_start
    while any(len(done) < want for done, want in zip(per_env, quota)):
        seen = obs if obs_filter is None else obs_filter(obs, update=False)
        if state:
            actions, _, state = policy.compute_actions_with_state(seen, state, explore=explore, prev=prev)
        else:
            actions, _ = policy.compute_actions(seen, explore=explore)
        step = env.step(policy.env_actions(actions))
        if state:
            ended = step.terminateds | step.truncateds
            state = restart_states(state, ended, start)
            prev = next_prev_inputs(actions, step.rewards, ended, prev_start)
        for ep in step.episodes:
            if len(per_env[ep.env_index]) < quota[ep.env_index]:
                per_env[ep.env_index].append((float(ep.episode_return), int(ep.episode_length)))
        obs = step.obs
    finished = [ep for done in per_env for ep in done]
    return EvaluationResult(returns=tuple(r for r, _ in finished), lengths=tuple(n for _, n in finished),
                            explore=explore)


def evaluate_multi_agent(policies: Mapping[str, Policy], env: MultiAgentVectorEnv, mapping: PolicyMapping, *,
                         episodes: int, explore: bool = False) -> EvaluationResult:
    """:func:`evaluate_policy` for a multi-agent env: each agent acts with ``policies[mapping(agent_id)]``
    (one batched ``compute_actions`` per policy and step); the result also holds each policy's returns.

    Args:
        policies: policy id -> policy, for every id ``mapping`` yields.
        env: a fresh multi-agent vector env (it is reset here); episodes are shared among its envs as in
            :func:`evaluate_policy`.
        mapping: agent id -> policy id (:func:`flowrl.envs.make_policy_mapping`).
        episodes: how many complete episodes, >= 1.
        explore: sample actions (True) or take the most likely one (False, greedy).

    Raises:
        ValueError: ``episodes < 1``, or an agent mapped to a policy that ``policies`` lacks.

    Examples:
        >>> from flowrl.envs import MultiAgentCartPole
        >>> from flowrl.policy import PolicyConfig
        >>> env = MultiAgentVectorEnv(MultiAgentCartPole, 2, seed=0, config={"num_agents": 2})
        >>> probe = env.envs[0]
        >>> policy = Policy(probe.observation_space("agent_0"), probe.action_space("agent_0"), PolicyConfig(seed=0))
        >>> mapping = make_policy_mapping({"agent_0": "a", "agent_1": "b"}, ["a", "b"])
        >>> result = evaluate_multi_agent({"a": policy, "b": policy}, env, mapping, episodes=3)
        >>> len(result.returns), sorted(result.policy_returns), len(result.policy_returns["a"])
        (3, ['a', 'b'], 3)
    """
    _check_episodes(episodes)
    quota = _quota(episodes, env.num_envs)
    per_env: list[list[tuple[float, int, dict[str, float]]]] = [[] for _ in quota]
    obs = env.reset()
    agent_states = AgentStates()  # each recurrent agent's state, per env and agent
    while any(len(done) < want for done, want in zip(per_env, quota)):
        by_policy: dict[str, list[tuple[int, str]]] = {}
        for i, agents in enumerate(obs):
            for aid in agents:
                by_policy.setdefault(mapping(aid), []).append((i, aid))
        actions: list[dict[str, Any]] = [{} for _ in obs]
        for pid, keys in by_policy.items():
            if pid not in policies:
                raise ValueError(f"agent {keys[0][1]!r} maps to policy {pid!r}, which is not among the policies "
                                 f"given ({sorted(policies)})")
            policy, agent_obs = policies[pid], np.stack([obs[i][aid] for i, aid in keys])
            if policy.is_recurrent:
                state = agent_states.gather(keys, policy.initial_state(1))
                acts, _, new_state = policy.compute_actions_with_state(agent_obs, state, explore=explore)
                agent_states.scatter(keys, new_state)
            else:
                acts, _ = policy.compute_actions(agent_obs, explore=explore)
            acts = policy.env_actions(acts)
            for row, (i, aid) in enumerate(keys):
                actions[i][aid] = acts[row]
        step = env.step(actions)
        agent_states.after_step(step.terminateds, step.truncateds)
        for ep in step.episodes:
            if len(per_env[ep.env_index]) < quota[ep.env_index]:
                by_pid: dict[str, list[float]] = {}
                for aid, ret in ep.agent_returns.items():
                    by_pid.setdefault(mapping(aid), []).append(ret)
                per_env[ep.env_index].append((float(ep.episode_return), int(ep.episode_length),
                                              {pid: float(np.mean(rets)) for pid, rets in by_pid.items()}))
        obs = step.obs
    finished = [ep for done in per_env for ep in done]
    policy_returns: dict[str, list[float]] = {}
    for _, _, by_policy_return in finished:
        for pid, ret in by_policy_return.items():
            policy_returns.setdefault(pid, []).append(ret)
    return EvaluationResult(returns=tuple(r for r, _, _ in finished), lengths=tuple(n for _, n, _ in finished),
                            explore=explore,
                            policy_returns={pid: tuple(r) for pid, r in sorted(policy_returns.items())})


def _env_name(env: EnvSpec) -> str:
    return env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))


def _rendering(env: EnvSpec, mode: RenderMode, video_dir: Path | None,
               episodes: int) -> Callable[[EnvContext], gym.Env[Any, Any]]:
    """An env callable building ``env`` with ``render_mode=mode`` (checked), wrapped in gymnasium's
    ``RecordVideo`` (one video per episode, the first ``episodes`` only) when ``video_dir`` is given."""

    def make(ctx: EnvContext) -> gym.Env[Any, Any]:
        with warnings.catch_warnings():  # gymnasium warns of a mode the env does not list; the check below says it
            warnings.simplefilter("ignore")
            try:
                made = make_env(env, dataclasses.replace(ctx, config={**ctx.config, "render_mode": mode}))
            except TypeError as e:
                raise RenderError(f"env {_env_name(env)} cannot be built with render_mode={mode!r} ({e})") from None
        offered = list(made.metadata.get("render_modes", []))
        if made.render_mode != mode or mode not in offered:
            made.close()
            raise RenderError(f"env {_env_name(env)} cannot render in {mode!r} mode (its render modes: {offered})")
        if video_dir is None:
            return made
        from gymnasium.wrappers import RecordVideo

        try:
            return RecordVideo(made, str(video_dir), episode_trigger=lambda episode: episode < episodes,
                               disable_logger=True)
        except gym.error.DependencyNotInstalled:
            made.close()
            raise ImportError("recording videos needs moviepy (gymnasium's RecordVideo writes them with it); "
                              'install it with: pip install "flowrl[video]"') from None

    return make


def evaluate_checkpoint(checkpoint_path: str | Path, *, episodes: int, explore: bool = False,
                        seed: int | None = 0, render: bool = False,
                        video_dir: str | Path | None = None, env: str | None = None) -> EvaluationResult:
    """Rebuilds a checkpoint's policies (:func:`flowrl.inference.load_policies`: the algorithm's policy
    classes with the saved config and state, on the CPU, without Ray) and evaluates them on the config's
    env with :func:`evaluate_policy`, or :func:`evaluate_multi_agent` for a multi-agent config.

    Args:
        checkpoint_path: a checkpoint written by :meth:`flowrl.trainer.Trainer.save` of a registered algorithm.
        episodes: complete episodes to run, >= 1.
        explore: sample actions (True; the draws go on from the policy's saved sampling state) or act
            greedily (False).
        seed: seeds the envs; ``None`` is random.
        render: show the env (``render_mode="human"``), one episode after another.
        video_dir: record each episode into this folder as an mp4 (gymnasium's ``RecordVideo`` with
            ``render_mode="rgb_array"``; needs moviepy: ``pip install "flowrl[video]"``), one episode after
            another.
        env: the checkpoint's env id, named again: needed for a ``"module:Id"`` env, as nothing in a checkpoint
            may make flowrl import code (see :func:`flowrl.trainer.load_checkpoint_config`).

    Raises:
        ValueError: as :func:`flowrl.trainer.load_checkpoint_config` (a config whose env is a callable cannot
            be rebuilt: evaluate from Python with :func:`flowrl.inference.load` and your env; a ``"module:Id"``
            env that ``env`` does not name), or ``episodes < 1``.
        RenderError: ``render`` or ``video_dir`` with an env that cannot render in that mode, or a multi-agent env.
        ImportError: ``video_dir`` without moviepy installed.
    """
    from flowrl.inference import load_policies
    from flowrl.trainer import load_checkpoint_config

    _check_episodes(episodes)
    algorithm, config = load_checkpoint_config(checkpoint_path, env=env)
    trained = load_policies(checkpoint_path, env=env)
    policies = {pid: policy.policy for pid, policy in trained.items()}
    mode: RenderMode | None = "rgb_array" if video_dir is not None else "human" if render else None
    num_envs = 1 if mode is not None else min(episodes, MAX_EVAL_ENVS)
    if config.policies is not None:
        if mode is not None:
            raise RenderError(f"{checkpoint_path} is a multi-agent checkpoint ({algorithm.name!r}); flowrl's "
                              f"multi-agent envs do not render, so evaluate it without --render and --video")
        assert callable(config.env)  # a multi-agent config's env is a callable (checked by RolloutConfig)
        ma_env = MultiAgentVectorEnv(config.env, num_envs, seed=seed,  # type: ignore[arg-type]
                                     config=config.env_config)
        try:
            mapping = make_policy_mapping(config.policy_mapping_fn, list(config.policies),
                                          agent_ids=ma_env.envs[0].agent_ids)
            return evaluate_multi_agent(policies, ma_env, mapping, episodes=episodes, explore=explore)
        finally:
            ma_env.close()
    video = Path(video_dir) if video_dir is not None else None
    env_spec: EnvSpec = config.env if mode is None else _rendering(config.env, mode, video, episodes)
    vector_env = VectorEnv(env_spec, num_envs, seed=seed, config=config.env_config,
                           backend="loop" if mode is not None else "auto")
    try:
        return evaluate_policy(policies[DEFAULT_POLICY_ID], vector_env, episodes=episodes, explore=explore,
                               obs_filter=trained[DEFAULT_POLICY_ID].obs_filter)
    finally:
        vector_env.close()


# -- evaluation during training ----------------------------------------------------------------------

#: where a report carries its evaluation (``TrainerConfig.evaluation_interval``)
EVALUATION = "evaluation"
#: evaluation workers seed their envs and policies with the run's seed plus this, so that they do not replay the
#: training workers' first episodes
EVALUATION_SEED_OFFSET = 1_000


def evaluation_config(config: TrainerConfig) -> TrainerConfig:
    """The config of a run's evaluation workers: the run's, with ``evaluation_num_workers`` remote workers,
    the seed moved by :data:`EVALUATION_SEED_OFFSET` (when the run is seeded), and neither ``output`` nor ``input``
    (evaluation episodes are not experience: nothing records them, and they step the env).

    Examples:
        >>> from flowrl.config import TrainerConfig
        >>> c = evaluation_config(TrainerConfig(seed=3, num_workers=2, evaluation_interval=1, evaluation_num_workers=1))
        >>> c.num_workers, c.seed
        (1, 1003)
    """
    seed = None if config.seed is None else config.seed + EVALUATION_SEED_OFFSET
    return dataclasses.replace(config, num_workers=config.evaluation_num_workers, seed=seed, output=None, input=None,
                               input_mix=None)


def merge_results(parts: Sequence[EvaluationResult]) -> EvaluationResult:
    """The episodes of several evaluations as one result, in order."""
    policy_returns: dict[str, tuple[float, ...]] = {}
    for part in parts:
        for pid, returns in part.policy_returns.items():
            policy_returns[pid] = policy_returns.get(pid, ()) + tuple(returns)
    return EvaluationResult(returns=tuple(r for p in parts for r in p.returns),
                            lengths=tuple(n for p in parts for n in p.lengths),
                            explore=bool(parts and parts[0].explore), policy_returns=policy_returns)


def evaluate_worker(worker: RolloutWorker, *, episodes: int, steps: int, explore: bool) -> EvaluationResult:
    """Runs on an evaluation worker: ``episodes`` complete episodes of its envs with its policies (its
    observation filter applied frozen), or, with ``steps > 0``, rounds of one episode per env until they hold at
    least ``steps`` env steps."""
    def once(n: int) -> EvaluationResult:
        if isinstance(worker.env, MultiAgentVectorEnv):
            assert worker.mapping is not None
            return evaluate_multi_agent(worker.policy_map, worker.env, worker.mapping, episodes=n, explore=explore)
        return evaluate_policy(worker.get_policy(), worker.env, episodes=n, explore=explore,
                               obs_filter=worker.obs_filter)

    if steps <= 0:
        return once(episodes)
    parts: list[EvaluationResult] = []
    while sum(sum(p.lengths) for p in parts) < steps:
        parts.append(once(worker.env.num_envs))
    return merge_results(parts)


def evaluation_metrics(result: EvaluationResult) -> dict[str, Any]:
    """What a report shows of an evaluation, under the names of the training statistics."""
    metrics: dict[str, Any] = {
        "episode_reward_mean": result.mean, "episode_reward_min": result.min, "episode_reward_max": result.max,
        "episode_len_mean": float(np.mean(result.lengths)), "episodes_this_iter": len(result.returns),
        "timesteps_this_iter": int(sum(result.lengths)), "explore": result.explore,
        "hist_stats": {"episode_reward": list(result.returns), "episode_lengths": list(result.lengths)}}
    if result.policy_returns:
        metrics["policy_reward_mean"] = {pid: float(np.mean(r)) for pid, r in result.policy_returns.items()}
    return metrics


class Evaluate:
    """Consumes the plan's result dicts and emits them; every ``interval``-th report also holds
    ``result["evaluation"]``: the learner's current weights (and observation filter) are sent to the evaluation
    workers, which run ``duration`` episodes (or env steps) among them and report their statistics
    (:func:`evaluation_metrics`). Their episodes never reach the learner, the replay buffers or the training
    counters. The report's number comes from ``report_number`` (the trainer's next ``training_iteration``), so
    the cadence goes on across a restore. An evaluation worker that died is recreated and the evaluation
    run again, once.

    With ``parallel=True`` (remote evaluation workers only), the report before an evaluation report launches the
    evaluation with its weights and returns at once, so the evaluation workers sample while the next report
    trains; that report then collects the evaluation. A report due an evaluation that none was launched for (the
    first one when ``interval`` is 1, the first after a restore) evaluates then, as without ``parallel``.

    Examples:
        >>> from flowrl.testing import make_fake_workers
        >>> op = Evaluate(make_fake_workers(0), make_fake_workers(0), interval=2, duration=4, unit="episodes",
        ...               explore=False, report_number=lambda: 1)
        >>> op
        Evaluate(every 2 reports: 4 episodes, greedy, in the driver)
    """

    def __init__(self, workers: WorkerSet, evaluation: WorkerSet, *, interval: int, duration: int,
                 unit: Literal["episodes", "timesteps"], explore: bool, report_number: Callable[[], int],
                 parallel: bool = False) -> None:
        check_int("interval", interval, 1, "reports between evaluations")
        check_int("duration", duration, 1, "episodes or env steps per evaluation")
        if parallel and not evaluation.remote_workers():
            raise ValueError("Evaluate(parallel=True) evaluates on remote evaluation workers while the driver trains; "
                             "give it an evaluation WorkerSet with num_workers >= 1")
        self.workers, self.evaluation = workers, evaluation
        self.interval, self.duration, self.unit, self.explore = interval, duration, unit, explore
        self.report_number = report_number
        self.parallel = parallel
        self._pending: list[Any] | None = None  # a parallel evaluation launched for the next report

    def __call__(self, result: dict[str, Any]) -> dict[str, Any]:
        number = self.report_number()
        if number % self.interval:
            if self.parallel and (number + 1) % self.interval == 0:
                self._pending = self._launch()  # runs while the next report trains
            return result
        return {**result, EVALUATION: evaluation_metrics(self.evaluate())}

    def evaluate(self) -> EvaluationResult:
        """One evaluation: the one launched in parallel with this report's training, if any (with the weights of
        the report before), else one now with the learner's current weights."""
        pending, self._pending = self._pending, None
        try:
            if pending is not None:
                return merge_results(executor.get(pending))
            return self._evaluate()
        except executor.ActorDiedError:
            self.evaluation.recreate_workers(self.evaluation.check_health())
            return self._evaluate()

    def _evaluate(self) -> EvaluationResult:
        remote = self.evaluation.remote_workers()
        if not remote:
            local = self.evaluation.local_worker()
            local.set_weights(self.workers.local_worker().get_weights())
            return evaluate_worker(local, episodes=self.duration,  # type: ignore[arg-type]
                                   steps=self.duration if self.unit == "timesteps" else 0, explore=self.explore)
        return merge_results(executor.get(self._launch()))

    def _launch(self) -> list[Any]:
        """Sends the learner's current weights to the remote evaluation workers and starts their shares of one
        evaluation; the references to their results."""
        ref = executor.put(self.workers.local_worker().get_weights())
        by_steps = self.unit == "timesteps"
        remote = self.evaluation.remote_workers()
        calls = []
        for worker, share in zip(remote, _quota(self.duration, len(remote))):
            if share:
                worker.set_weights.remote(ref)
                calls.append(worker.apply.remote(partial(evaluate_worker, episodes=share,
                                                         steps=share if by_steps else 0, explore=self.explore)))
        return calls

    def __repr__(self) -> str:
        amount = f"{self.duration} {'env steps' if self.unit == 'timesteps' else 'episodes'}"
        n = len(self.evaluation.remote_workers())
        where = f"on {n} worker{'s' if n > 1 else ''}" if n else "in the driver"
        when = ", in parallel with training" if self.parallel else ""
        return (f"Evaluate(every {self.interval} reports: {amount}, {'sampled' if self.explore else 'greedy'}, "
                f"{where}{when})")


def with_evaluation(plan: Any, workers: WorkerSet, evaluation: WorkerSet | None, config: TrainerConfig,
                    report_number: Callable[[], int]) -> Any:
    """``plan`` with an :class:`Evaluate` step on its reports when ``config.evaluation_interval`` asks for one
    (``evaluation`` the workers :func:`evaluation_config` describes); ``plan`` itself otherwise."""
    if not config.evaluation_interval or evaluation is None:
        return plan
    return plan.for_each(Evaluate(workers, evaluation, interval=config.evaluation_interval,
                                  duration=config.evaluation_duration, unit=config.evaluation_duration_unit,
                                  explore=config.evaluation_explore, report_number=report_number,
                                  parallel=config.evaluation_parallel_to_training))
