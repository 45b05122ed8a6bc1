"""The Trainer: builds one algorithm's WorkerSet and plan once; ``train()`` is one ``next()`` of the plan.

It also owns what must outlive a plan: checkpoints (``save``/``restore``, plain data only) and the
handling of failed remote workers, which rebuilds the plan with the counters carried over (see
:meth:`Trainer.train`). A checkpoint also holds the trainer's config as data, so
:func:`load_checkpoint_config` and :meth:`Trainer.from_checkpoint` (the CLI's ``--resume`` and
``evaluate``) rebuild a registered algorithm's trainer from the path alone.

Examples:
    >>> from flowrl.algorithms import Algorithm
    >>> from flowrl.config import TrainerConfig
    >>> from flowrl.ops.metrics import StandardMetricsReporting
    >>> from flowrl.ops.rollout import ConcatBatches, ParallelRollouts
    >>> from flowrl.ops.train import TrainOneStep
    >>> from flowrl.testing import TinyPGPolicy
    >>> def plan(workers, config):
    ...     train_op = (ParallelRollouts(workers).combine(ConcatBatches(config.train_batch_size))
    ...                 .for_each(TrainOneStep(workers)))
    ...     return StandardMetricsReporting(train_op, workers, config)
    >>> trainer = Trainer(Algorithm("tiny_pg", TrainerConfig, TinyPGPolicy, plan),
    ...                   TrainerConfig(num_workers=0, rollout_fragment_length=50, train_batch_size=100, seed=0))
    >>> result = trainer.train()
    >>> result["training_iteration"], result["timesteps_total"], result["info"]["num_steps_trained"]
    (1, 100, 100)
    >>> trainer.stop()
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Literal


from flowrl import decisions, executor, profiling, runtime
from flowrl._checkpoint import (check_env_named, check_tree, checkpoint_algorithm, read_checkpoint, restoring,
                                sweep_checkpoint_dir, write_checkpoint)
from flowrl.algorithms import ALGORITHMS, Algorithm, get_algorithm
from flowrl.callbacks import Callbacks, make_callbacks
from flowrl.collective import PeerLostError
from flowrl.config import TrainerConfig, config_from_data, config_to_data
from flowrl.evaluation import evaluation_config, with_evaluation
from flowrl.iter import LocalIterator, ShardTimeoutError
from flowrl.metrics import NUM_REPLAY_SHARDS_RECREATED
from flowrl.ops.offline import EstimateOffPolicy
from flowrl.policy import Policy
from flowrl.sample_batch import DEFAULT_POLICY_ID
from flowrl.workers import WorkerSet

__all__ = ["Trainer", "load_checkpoint_config"]

logger = logging.getLogger(__name__)


#: What :meth:`Trainer.restore` needs a checkpoint's tree to hold, checked before any of it is restored.
_CHECKPOINT_TREE: dict[str, type | tuple[type, ...]] = {
    "local_worker": dict, "local_worker.policies": dict, "remote_workers": list, "metrics": dict,
    "trainer.training_iteration": int, "trainer.time_total_s": (int, float), "trainer.episodes_total": int}


def _worker_died(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is the death of an actor, or a collective call that lost
    a peer (a member of DD-PPO's process group died or hung), not a user error."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (executor.ActorDiedError, PeerLostError)):
            return True
        seen = seen.__cause__
    return False


def _shard_timeout(error: BaseException) -> ShardTimeoutError | None:
    """The :class:`~flowrl.iter.ShardTimeoutError` that ``error`` is, or was raised from; ``None`` if none."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, ShardTimeoutError):
        seen = seen.__cause__
    return seen


def load_checkpoint_config(checkpoint_path: str | Path, *,
                           env: str | None = None) -> tuple[Algorithm, TrainerConfig]:
    """The registered algorithm and the config that a :meth:`Trainer.save` checkpoint was written with.

    Args:
        checkpoint_path: the checkpoint.
        env: the checkpoint's env id, named again by the caller. Needed when that id is ``"module:Id"``:
            building the env imports ``module``, and nothing in a checkpoint alone may make flowrl import code.

    Raises:
        ValueError: not a checkpoint, a checkpoint of an unregistered algorithm, one written before
            checkpoints held their config, or one whose config holds a callable (an env callable, a
            custom hook) that data cannot rebuild (the message says how to restore it from Python); a
            ``"module:Id"`` env that ``env`` does not name, or an ``env`` other than the saved one.
    """
    path = Path(checkpoint_path)
    name = checkpoint_algorithm(path)
    if name.lower() not in ALGORITHMS:
        raise ValueError(f"{path} is a checkpoint of {name!r}, which is not a registered algorithm "
                         f"({sorted(ALGORITHMS)}); restore it from Python with Trainer(<its Algorithm>, "
                         f"config).restore(path)")
    algorithm = get_algorithm(name)
    tree = read_checkpoint(path, algorithm=algorithm.name)
    check_tree(tree, path, {})
    if tree.get("config") is None:
        raise ValueError(f"{path} holds no config (it was written before checkpoints stored theirs); restore it "
                         f"from Python with Trainer({name!r}, <its config>).restore(path)")
    check_tree(tree, path, {"config": dict})
    try:
        config = config_from_data(algorithm.config_class, tree["config"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"checkpoint {path}: {e}") from e
    except (KeyError, AttributeError) as e:  # a crafted config
        raise ValueError(f"{path}: its config is malformed ({e!r:.200}); the checkpoint was not written by "
                         f"Trainer.save") from e
    check_env_named(path, config.env, env)
    return algorithm, config


class Trainer:
    """Runs one algorithm: ``Trainer("ppo", PPOConfig(...))`` or ``Trainer(Algorithm(...), config)``.

    Args:
        algorithm: a registry name (see :data:`flowrl.algorithms.ALGORITHMS`) or an :class:`Algorithm`.
        config: the algorithm's config (``None``: its defaults); it must be an instance of the
            algorithm's ``config_class``.

    Raises:
        ValueError: an unknown algorithm, ``num_gpus`` beyond the CUDA devices torch sees, or remote
            workers the Ray cluster can never hold.
        TypeError: a config of another class.
    """

    def __init__(self, algorithm: str | Algorithm, config: TrainerConfig | None = None) -> None:
        self.algorithm = algorithm if isinstance(algorithm, Algorithm) else get_algorithm(algorithm)
        config = self.algorithm.config_class() if config is None else config
        if not isinstance(config, self.algorithm.config_class):
            wanted = self.algorithm.config_class.__name__
            raise TypeError(f"Trainer({self.algorithm.name!r}) needs a {wanted}, got {type(config).__name__}; build "
                            f"the config with {wanted}(...)")
        self.config = config
        #: where the plan's actors run: the config's executor, or "local" inside flowrl.runtime.local_executor()
        self.executor = "local" if config.executor == "local" else executor.current()
        self.callbacks: Callbacks = make_callbacks(config.callbacks)
        self._check_learner_devices()
        batch_warning = config.train_batch_size_warning()
        if batch_warning is not None:
            logger.warning("%s", batch_warning)
        self._decisions = self._decision_log(config)
        with executor.using(self.executor), self._recording():
            if config.num_workers and self.executor == "ray":
                runtime.ensure_initialized()
            self.workers = self._make_workers(config)
            #: the workers of evaluation during training (``config.evaluation_interval``), apart from training's
            self.evaluation_workers: WorkerSet | None = None
            if config.evaluation_interval:
                self.evaluation_workers = WorkerSet(policy_class=self.algorithm.policy_class,
                                                    config=evaluation_config(config))
            make_state = self.algorithm.make_owned_state
            self.owned_state: dict[str, Any] = dict(make_state(config)) if make_state is not None else {}
            self.training_iteration, self.time_total_s, self.episodes_total = 0, 0.0, 0
            try:
                self._plan = self._build_plan()
            except BaseException:
                self._release()  # a plan that cannot be built leaves no worker or owned actor behind
                raise

    def _decision_log(self, config: TrainerConfig) -> decisions.Recorder | decisions.Replayer | None:
        """The log of the run's decisions that ``record`` or ``replay`` asks for (checked against this run)."""
        if config.record is None and config.replay is None:
            return None
        fields = config_to_data(config)["fields"]
        for name in ("record", "replay", "executor"):  # how the run is driven, not what it computes
            fields.pop(name, None)
        header = {"algorithm": self.algorithm.name, "config": fields}
        if config.replay is not None:
            return decisions.Replayer(config.replay, header)
        return decisions.Recorder(str(config.record), header)

    def _recording(self) -> Any:
        return decisions.recording(self._decisions) if self._decisions is not None else contextlib.nullcontext()

    def _make_workers(self, config: TrainerConfig) -> WorkerSet:
        """The WorkerSet the plan runs over (:func:`flowrl.testing.make_fake_trainer` makes fake ones)."""
        if self.algorithm.worker_class is not None:
            return WorkerSet(policy_class=self.algorithm.policy_class, config=config,
                             worker_class=self.algorithm.worker_class)
        return WorkerSet(policy_class=self.algorithm.policy_class, config=config)

    @classmethod
    def from_checkpoint(cls, checkpoint_path: str | Path, *, env: str | None = None,
                        executor: Literal["ray", "local"] | None = None) -> Trainer:
        """A trainer of the checkpoint's registered algorithm and saved config, restored from it.

        ``env`` names the checkpoint's env again: needed for a ``"module:Id"`` env (see
        :func:`load_checkpoint_config`). ``executor`` (``"ray"`` or ``"local"``) replaces the saved config's: how
        a run executes is not part of what it learned.

        Raises:
            ValueError: as :func:`load_checkpoint_config` and :meth:`restore`.
        """
        algorithm, config = load_checkpoint_config(checkpoint_path, env=env)
        if executor is not None:
            config = dataclasses.replace(config, executor=executor)
        trainer = cls(algorithm, config)
        try:
            trainer.restore(checkpoint_path)
        except BaseException:
            trainer.stop()
            raise
        return trainer

    def _check_learner_devices(self) -> None:
        if self.config.num_gpus and not self.config.fake_gpus:
            import torch

            visible = torch.cuda.device_count()
            if self.config.num_gpus > visible:
                raise ValueError(f"num_gpus={self.config.num_gpus} but torch sees {visible} CUDA device(s); use "
                                 f"num_gpus=0, or fake_gpus=True to run the multi-device path on the CPU")

    def _build_plan(self) -> LocalIterator[dict[str, Any]]:
        self.workers.reads_input, self.workers.input_episodes = False, None
        plan = self.algorithm.plan(self.workers, self.config, **getattr(self, "owned_state", {}))
        if not isinstance(plan, LocalIterator):
            raise TypeError(f"{self.algorithm.name} plan returned {type(plan).__name__}; a plan returns the "
                            f"LocalIterator of result dicts (end it with StandardMetricsReporting)")
        if getattr(self.config, "input", None) is not None and not self.workers.reads_input:
            plan.close()
            raise ValueError(f"input={self.config.input!r}: the {self.algorithm.name} plan never reads a dataset (it "
                             f"samples without ParallelRollouts(bulk_sync), where input is read); use a plan that "
                             f"samples in lockstep (PG, A2C, PPO, DQN, SAC, MARWIL, BC, ...), or drop input")
        plan = with_evaluation(plan, self.workers, getattr(self, "evaluation_workers", None), self.config,
                               lambda: self.training_iteration + 1)
        if self.workers.input_episodes is not None:  # a dataset with the behaviour policy's logp
            plan = plan.for_each(EstimateOffPolicy(self.workers, self.config.off_policy_estimation, self.config.gamma))
        try:
            plan.validate()  # before the first pull: a malformed plan fails here, with the fix
        except ValueError:
            plan.close()  # a rejected plan leaves no learner thread or actor running
            raise
        return profiling.enable(plan) if self.config.profile else plan

    @property
    def plan(self) -> LocalIterator[dict[str, Any]]:
        """The running plan (rebuilt after a worker failure)."""
        return self._plan

    # -- training ---------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Exactly one ``next()`` of the plan, plus ``training_iteration``, ``time_this_iter_s``,
        ``time_total_s`` and ``episodes_total``; with the config's ``profile``, also ``profile``, the plan's
        per-operator profile so far (:func:`flowrl.profiling.profile_data`; a rebuilt plan starts a new one).

        A failed remote worker is handled as the config says and the step retried: with
        ``recreate_failed_workers`` it is replaced, with ``ignore_worker_failures`` dropped. So is a worker that
        delivered no sample within ``sample_timeout_s`` (it is killed first). A trainer-owned actor that died
        (Ape-X's replay shards) is recreated, empty, with ``recreate_failed_workers`` (counted in
        ``info["num_replay_shards_recreated"]``); it is never dropped.

        Raises:
            TimeoutError: a remote worker delivered no sample within ``sample_timeout_s`` and neither
                ``recreate_failed_workers`` nor ``ignore_worker_failures`` is set, or it did so again after it
                was replaced in this call; the message names the worker and the fix.
            RuntimeError: a replay shard died and ``recreate_failed_workers`` is off (the message names the
                shard); a dead actor that the trainer cannot replace failed the plan twice in this call; or no
                remote worker remains.
        """
        with executor.using(self.executor), self._recording():
            if self._decisions is not None:
                self._decisions.start_report(self.training_iteration + 1)
            return self._train()

    def _train(self) -> dict[str, Any]:
        start = time.monotonic()
        hung: set[int] = set()  # the workers replaced in this call for delivering no sample in time
        unexplained = False  # a recovery in this call found no failed worker or shard
        while True:
            try:
                result = dict(next(self._plan))
                break
            except Exception as error:
                if (timeout := _shard_timeout(error)) is not None:
                    self._replace_hung_worker(timeout, hung)
                elif _worker_died(error):
                    unexplained = self._replace_dead_actors(error, unexplained)
                else:
                    raise
        self.training_iteration += 1
        elapsed = time.monotonic() - start
        self.time_total_s += elapsed
        self.episodes_total += int(result.get("episodes_this_iter", 0))
        result.update(training_iteration=self.training_iteration, time_this_iter_s=elapsed,
                      time_total_s=self.time_total_s, episodes_total=self.episodes_total)
        if self.config.profile:
            result["profile"] = profiling.profile_data(self._plan)
        self.callbacks.on_train_result(trainer=self, result=result)
        return result

    def _owned_actors(self) -> dict[str, Any]:
        """The trainer-owned state made of actors that can be health-checked and recreated (replay shards)."""
        return {name: obj for name, obj in getattr(self, "owned_state", {}).items()
                if callable(getattr(obj, "check_health", None)) and callable(getattr(obj, "recreate", None))}

    def _replace_hung_worker(self, error: ShardTimeoutError, hung: set[int]) -> None:
        """Kills and replaces (or drops) the remote worker that ``error`` names, or raises a ``TimeoutError``
        naming it."""
        remote = self.workers.remote_workers()
        position = next((i for i, w in enumerate(remote) if w == error.actor), None)
        if position is None:
            raise error  # not a rollout worker's sample (a gather the plan made over other actors)
        what = (f"remote worker {position + 1} of {len(remote)} delivered no sample within sample_timeout_s="
                f"{error.timeout_s:g} s (its env.step or policy hangs, or is that slow)")
        fix = "raise sample_timeout_s (None waits forever)"
        if not (self.config.recreate_failed_workers or self.config.ignore_worker_failures):
            raise TimeoutError(f"{what}; {fix}, or set recreate_failed_workers=True to replace a hung worker") \
                from error
        if position in hung:
            raise TimeoutError(f"{what}, again after it was replaced in this train() call; {fix}") from error
        hung.add(position)
        logger.warning("%s; %s it and rebuilding the plan", what,
                       "killing and recreating" if self.config.recreate_failed_workers else "killing and dropping")
        self._recover([position], {})

    def _replace_dead_actors(self, error: Exception, unexplained: bool) -> bool:
        """Replaces (or drops) the remote workers and recreates the trainer-owned actors that died, or raises;
        returns whether this recovery found nothing that failed (the plan's own actors are rebuilt with it,
        once: a second such recovery in one call raises ``RuntimeError``)."""
        owned = self._owned_actors()
        dead_owned = {name: obj.check_health() for name, obj in owned.items()}
        if any(dead_owned.values()) and not self.config.recreate_failed_workers:
            name, indices = next((n, i) for n, i in dead_owned.items() if i)
            raise RuntimeError(f"replay shard(s) {indices} of {len(owned[name])} (the trainer's {name}) died; what "
                               f"they held is lost. Set recreate_failed_workers=True to recreate them empty and go "
                               f"on") from error
        if not (self.config.recreate_failed_workers or self.config.ignore_worker_failures):
            raise error
        failed = self.workers.check_health()
        if learners := self.workers.recover_learners():
            logger.warning("%d learner(s) of the learner group died; replaced, with a survivor's learner state",
                           learners)
        if not failed and not any(dead_owned.values()) and not learners:
            if unexplained:
                raise RuntimeError(f"an actor that is neither a remote worker nor a trainer-owned replay shard died "
                                   f"again after the plan was rebuilt ({error}); giving up") from error
            unexplained = True
        logger.warning("an actor died (%s); %s remote worker(s) %s, recreating trainer-owned %s and rebuilding the "
                       "plan", error, "recreating" if self.config.recreate_failed_workers else "dropping",
                       [i + 1 for i in failed], {name: i for name, i in dead_owned.items() if i} or "nothing")
        self._recover(failed, dead_owned)
        return unexplained

    def _recover(self, failed: list[int], dead_owned: dict[str, list[int]]) -> None:
        """Replaces (or drops) the ``failed`` remote workers, recreates the dead trainer-owned actors and rebuilds
        the plan with the counters, info and episode window of the old one."""
        if self.config.recreate_failed_workers:
            self.workers.recreate_workers(failed)
        else:
            self.workers.remove_workers(failed)
        if self.config.num_workers and not self.workers.remote_workers():
            raise RuntimeError(f"every remote worker failed (num_workers={self.config.num_workers}); set "
                               f"recreate_failed_workers=True to replace them")
        owned = self._owned_actors()
        for name, indices in dead_owned.items():
            owned[name].recreate(indices)
        saved = self._plan.metrics.save()  # counters, info and the episode window: the next report goes on
        self._plan.close()
        self._plan = self._build_plan()
        self._plan.metrics.restore(saved)
        if recreated := sum(map(len, dead_owned.values())):
            self._plan.metrics.counters[NUM_REPLAY_SHARDS_RECREATED] += recreated

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Policy:
        """The learner's policy (on the local worker)."""
        return self.workers.local_worker().get_policy(policy_id)  # type: ignore[return-value]  # RolloutWorker: a Policy

    def stop(self) -> None:
        """Closes the plan (its learner threads, aggregators and actors), stops every remote worker and
        closes the trainer-owned state that has a ``close()`` (e.g. Ape-X's replay shards)."""
        with executor.using(self.executor):
            try:
                self._plan.close()
            finally:
                self._release()
                if self._decisions is not None:
                    self._decisions.close()

    def _release(self) -> None:
        """Stops the workers and closes the trainer-owned state that has a ``close()``."""
        self.workers.stop()
        if getattr(self, "evaluation_workers", None) is not None:
            self.evaluation_workers.stop()  # type: ignore[union-attr]
        for obj in getattr(self, "owned_state", {}).values():
            if callable(getattr(obj, "close", None)):
                obj.close()

    # -- checkpoints ------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The driver-side part of a checkpoint as of now, as plain-data copies: the local worker's state
        (weights, optimizer, RNG), the plan's metrics context (counters, info, the episode window) and the
        trainer counters. Cheap (no Ray call); :meth:`save` can write a checkpoint from it later, e.g. the
        state after the last completed ``train()`` when the next one is abandoned (``flowrl train`` on
        Ctrl-C)."""
        return {
            "local_worker": self.workers.local_worker().get_state(),
            "metrics": self._plan.metrics.save(),
            "trainer": {"training_iteration": self.training_iteration, "time_total_s": self.time_total_s,
                        "episodes_total": self.episodes_total},
        }

    def save(self, checkpoint_dir: str | Path, *, snapshot: dict[str, Any] | None = None) -> Path:
        """Writes a checkpoint into ``checkpoint_dir`` (atomically) and returns its path.

        It holds the workers' and the plan's state and the config as data (:func:`~flowrl.config.config_to_data`;
        a field holding a callable is recorded, not stored).

        Args:
            checkpoint_dir: the directory; the checkpoint is ``checkpoint_<training_iteration>`` in it.
            snapshot: a :meth:`snapshot` taken earlier, to write instead of the current driver-side state;
                the remote workers' and trainer-owned state are read now.
        """
        remote = self.workers.remote_workers()
        state = {
            **(snapshot if snapshot is not None else self.snapshot()),
            "remote_workers": executor.get([w.get_state.remote() for w in remote]) if remote else [],
            "owned_state": {name: obj.get_state() for name, obj in self._checkpointed_state().items()},
            "config": config_to_data(self.config),
        }
        name = f"checkpoint_{int(state['trainer']['training_iteration']):06d}"
        return write_checkpoint(Path(checkpoint_dir), name, state, algorithm=self.algorithm.name)

    def _checkpointed_state(self) -> dict[str, Any]:
        """The trainer-owned objects a checkpoint holds: none unless ``store_buffer_in_checkpoints``."""
        if not self.config.store_buffer_in_checkpoints:
            return {}
        return {name: obj for name, obj in self.owned_state.items()
                if callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))}

    def restore(self, checkpoint_path: str | Path) -> None:
        """Loads a checkpoint from :meth:`save` into this live trainer: weights, optimizer and RNG states
        (local and remote workers), the plan's counters, info and episode window (so the next result's
        episode statistics go on from the saved ones), and the trainer counters.

        Raises:
            ValueError: another algorithm's checkpoint, a newer format, a truncated or altered file, or one whose
                content does not fit this trainer (a missing key, a value of the wrong type, weights of another
                model size), naming the file and the key.
        """
        path = Path(checkpoint_path)
        for line in sweep_checkpoint_dir(path.parent):  # a checkpoint a killed save left aside is put back
            logger.warning("%s", line)
        state = read_checkpoint(path, algorithm=self.algorithm.name)
        check_tree(state, path, _CHECKPOINT_TREE)
        with restoring(path, "local_worker"):
            self.workers.local_worker().set_state(state["local_worker"])
        remote, saved = self.workers.remote_workers(), state["remote_workers"]
        if remote:
            self.workers.sync_weights()  # one put of the restored weights for everyone
            if len(saved) != len(remote):
                logger.warning("the checkpoint holds %d remote worker states for %d workers; restoring the first "
                               "%d", len(saved), len(remote), min(len(saved), len(remote)))
            with restoring(path, "remote_workers"):
                executor.get([w.set_state.remote(s) for w, s in zip(remote, saved)])
        with restoring(path, "metrics"):
            self._plan.metrics.restore(state["metrics"])
        for name, obj in self._checkpointed_state().items():
            if name in state.get("owned_state", {}):
                with restoring(path, f"owned_state.{name}"):
                    obj.set_state(state["owned_state"][name])
        trainer = state["trainer"]
        self.training_iteration = int(trainer["training_iteration"])
        self.time_total_s = float(trainer["time_total_s"])
        self.episodes_total = int(trainer["episodes_total"])
