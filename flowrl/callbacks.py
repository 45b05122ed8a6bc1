"""Callbacks: user code at the points of a run that RLlib users know by name, without forking the library.

Subclass :class:`Callbacks`, override the hooks you need and name the class in a config's ``callbacks`` field (the
class itself, or its import path ``"package.module:ClassName"``; from the command line,
``--config callbacks=package.module:ClassName``). Each rollout worker and the trainer make their own instance, so
an instance's attributes are per process; a metric set in ``episode.custom_metrics`` at an episode's end reaches the
results as ``custom_metrics/<name>_mean``, ``_min`` and ``_max`` over the same episodes as ``episode_reward_mean``,
and from there ``progress.csv``, ``result.json`` and TensorBoard.

Examples:
    >>> class PoleAngle(Callbacks):
    ...     def on_episode_step(self, *, worker, episode):
    ...         episode.user_data.setdefault("angles", []).append(abs(float(episode.last_observation[2])))
    ...     def on_episode_end(self, *, worker, episode):
    ...         episode.custom_metrics["max_pole_angle"] = max(episode.user_data["angles"])
    >>> from flowrl.workers import RolloutConfig, RolloutWorker
    >>> from flowrl.testing import TinyPGPolicy
    >>> worker = RolloutWorker(policy_class=TinyPGPolicy, config=RolloutConfig(seed=0, callbacks=PoleAngle))
    >>> _ = worker.sample()
    >>> ep = worker.get_metrics()[0]
    >>> sorted(ep.custom_metrics), 0 < ep.custom_metrics["max_pole_angle"] < 0.3
    (['max_pole_angle'], True)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence, Union

import numpy.typing as npt

from flowrl.metrics import LEARNER_STATS_KEY

if TYPE_CHECKING:
    from flowrl.envs.base import EpisodeRecord

PerEnv = Union[Sequence[Any], npt.NDArray[Any]]  # one entry per env of a worker's vector

__all__ = ["Callbacks", "Episode", "EpisodeTracker", "add_learner_stats", "before_learning", "make_callbacks", "resolve_callbacks"]


@dataclass(eq=False)
class Episode:
    """One env's episode in progress, as the episode hooks see it.

    Attributes:
        env_index: the env (inside the worker's vector of envs) that runs the episode.
        episode_id: the episode's id, as in the ``eps_id`` column of the rows it sampled.
        length: env steps so far.
        total_reward: the sum of its rewards so far (all agents' rewards, for a multi-agent env).
        last_observation: what the env returned at the last step (at an episode's end: its final observation);
            ``None`` before the first step. A dict by agent id for a multi-agent env.
        last_action: the action the env took at the last step (as the env takes it); ``None`` before it.
        last_reward: the reward of the last step (summed over agents for a multi-agent env); ``None`` before it.
        custom_metrics: name -> number, set by the hooks: what ``on_episode_end`` leaves here is the episode's
            contribution to ``result["custom_metrics"]``.
        user_data: anything the hooks keep between calls for this episode (not reported).
    """

    env_index: int
    episode_id: int
    length: int = 0
    total_reward: float = 0.0
    last_observation: Any = None
    last_action: Any = None
    last_reward: float | None = None
    custom_metrics: dict[str, float] = field(default_factory=dict)
    user_data: dict[str, Any] = field(default_factory=dict)


class Callbacks:
    """The hooks of a run; each does nothing unless overridden. Hooks take keyword arguments only.

    - ``on_episode_start(worker=, episode=)``: an env starts an episode (at the worker's start, and right after
      each episode end, since envs reset within the step that ends an episode).
    - ``on_episode_step(worker=, episode=)``: after each env step of a running episode, the last one included.
      Overriding it costs a Python call per env step; the others cost nothing per step.
    - ``on_episode_end(worker=, episode=)``: the episode ended (terminated or truncated);
      ``episode.custom_metrics`` then goes into the results.
    - ``on_sample_end(worker=, samples=)``: a worker finished one ``sample()`` (a SampleBatch or MultiAgentBatch),
      before it leaves the worker.
    - ``on_learn_on_batch(policy=, train_batch=, result=)``: a policy is about to learn on ``train_batch`` (the
      local worker's ``learn_on_batch`` and ``compute_gradients``, and the multi-device learner's step); entries
      the hook puts in ``result`` join the policy's learner stats.
    - ``on_train_result(trainer=, result=)``: a ``Trainer.train()`` report is complete; the hook may add entries
      to ``result`` before it is returned and logged.
    """

    def on_episode_start(self, *, worker: Any, episode: Episode) -> None:
        """An env started ``episode``."""

    def on_episode_step(self, *, worker: Any, episode: Episode) -> None:
        """``episode`` took one env step."""

    def on_episode_end(self, *, worker: Any, episode: Episode) -> None:
        """``episode`` ended; its ``custom_metrics`` go into the results."""

    def on_sample_end(self, *, worker: Any, samples: Any) -> None:
        """``worker`` sampled ``samples``."""

    def on_learn_on_batch(self, *, policy: Any, train_batch: Any, result: dict[str, Any]) -> None:
        """``policy`` is about to learn on ``train_batch``; ``result`` joins its learner stats."""

    def on_train_result(self, *, trainer: Any, result: dict[str, Any]) -> None:
        """``trainer`` produced ``result``."""


def make_callbacks(spec: object) -> Callbacks:
    """An instance of the class ``spec`` names (:func:`resolve_callbacks`), or of :class:`Callbacks` for ``None``."""
    return (resolve_callbacks(spec) or Callbacks)()


def _overrides(callbacks: Callbacks, name: str) -> bool:
    return getattr(type(callbacks), name) is not getattr(Callbacks, name)


def before_learning(callbacks: Callbacks, policy: Any, batch: Any) -> dict[str, Any]:
    """Calls ``on_learn_on_batch`` for ``policy`` about to learn on ``batch``; returns the hook's ``result``
    (empty when the hook is not overridden), for :func:`add_learner_stats` after the step."""
    result: dict[str, Any] = {}
    if _overrides(callbacks, "on_learn_on_batch"):
        callbacks.on_learn_on_batch(policy=policy, train_batch=batch, result=result)
    return result


def add_learner_stats(info: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """``info`` (one policy's learner info) with ``added`` merged into its ``learner_stats``."""
    if added:
        info.setdefault(LEARNER_STATS_KEY, {}).update(added)
    return info


def resolve_callbacks(spec: object, field_name: str = "callbacks") -> type[Callbacks] | None:
    """The :class:`Callbacks` subclass ``spec`` names: ``None``, the class itself, or its import path
    (``"package.module:ClassName"`` or ``"package.module.ClassName"``).

    Raises:
        ValueError: naming the field, the value and the fix, for a path that does not import or a class that is
            not a :class:`Callbacks` subclass.

    Examples:
        >>> resolve_callbacks("flowrl.callbacks:Callbacks").__name__
        'Callbacks'
        >>> resolve_callbacks("flowrl.nowhere:Mine")
        Traceback (most recent call last):
        ...
        ValueError: callbacks='flowrl.nowhere:Mine': cannot import module 'flowrl.nowhere' (No module named 'flowrl.nowhere'); give the import path of a flowrl.callbacks.Callbacks subclass, as 'package.module:ClassName', whose module is importable here and on the workers
    """
    if spec is None:
        return None
    fix = ("give the import path of a flowrl.callbacks.Callbacks subclass, as 'package.module:ClassName', whose "
           "module is importable here and on the workers")
    if isinstance(spec, str):
        module_name, sep, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
        if not module_name or not attr:
            raise ValueError(f"{field_name}={spec!r} is not an import path; {fix}")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(f"{field_name}={spec!r}: cannot import module {module_name!r} ({e}); {fix}") from e
        found: object = module
        for part in attr.split("."):
            if not hasattr(found, part):
                raise ValueError(f"{field_name}={spec!r}: module {module_name!r} has no {attr!r}; {fix}")
            found = getattr(found, part)
        spec_class = found
    else:
        spec_class = spec
    if not (isinstance(spec_class, type) and issubclass(spec_class, Callbacks)):
        raise ValueError(f"{field_name}={spec!r} is {type(spec_class).__name__} {spec_class!r}, not a subclass of "
                         f"flowrl.callbacks.Callbacks; {fix} (or pass the class itself)")
    return spec_class


class EpisodeTracker:
    """Keeps an :class:`Episode` per env of a rollout worker and calls the episode hooks of ``callbacks``.

    The worker calls :meth:`after_step` once per vector step with the step's per-env rewards, observations and
    env actions and its finished episodes; an episode's ``custom_metrics`` are copied into its
    :class:`~flowrl.envs.base.EpisodeRecord`, which carries them to the results. Episode ids follow the worker's
    rule: each end opens a new episode whose id is the next free one, in time order and env index order within
    a step.
    """

    def __init__(self, callbacks: Callbacks, worker: Any, episode_ids: Sequence[int], next_id: int) -> None:
        self.callbacks, self.worker = callbacks, worker
        self._step_hook = _overrides(callbacks, "on_episode_step")
        self.episodes: list[Episode] = []
        self.next_id = next_id
        self.restart(episode_ids, next_id)

    def restart(self, episode_ids: Sequence[int], next_id: int) -> None:
        """Starts tracking a new episode in every env (the worker's start, or a restored state), calling
        ``on_episode_start`` for each."""
        self.next_id = int(next_id)
        self.episodes = [Episode(env_index=i, episode_id=int(e)) for i, e in enumerate(episode_ids)]
        for episode in self.episodes:
            self.callbacks.on_episode_start(worker=self.worker, episode=episode)

    def after_step(self, rewards: PerEnv, observations: PerEnv, actions: PerEnv,
                   finished: Sequence[EpisodeRecord]) -> None:
        """One vector step: updates every env's episode and calls ``on_episode_step``, then ends the
        ``finished`` episodes (``on_episode_end``) and starts their envs' next ones (``on_episode_start``)."""
        for i, episode in enumerate(self.episodes):
            reward = float(sum(rewards[i].values())) if isinstance(rewards[i], dict) else float(rewards[i])
            episode.length += 1
            episode.total_reward += reward
            episode.last_observation, episode.last_action, episode.last_reward = observations[i], actions[i], reward
            if self._step_hook:
                self.callbacks.on_episode_step(worker=self.worker, episode=episode)
        for record in sorted(finished, key=lambda r: r.env_index):
            episode = self.episodes[record.env_index]
            self.callbacks.on_episode_end(worker=self.worker, episode=episode)
            record.custom_metrics.update(episode.custom_metrics)
            fresh = Episode(env_index=record.env_index, episode_id=self.next_id)
            self.next_id += 1
            self.episodes[record.env_index] = fresh
            self.callbacks.on_episode_start(worker=self.worker, episode=fresh)
