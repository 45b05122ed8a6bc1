"""Acting with a trained policy (flowrl.load, flowrl.inference): only the policy is built, from any checkpoint a
trainer writes (single- and multi-agent, a callable env, one written before checkpoints held the spaces), it acts
as the trainer's policy did, and loading starts no Ray. Also: restoring a state whose arrays are read-only (as
Ray delivers them) warns of nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import flowrl
from flowrl._checkpoint import read_checkpoint, write_checkpoint
from flowrl.algorithms.dqn import DQNConfig, DQNPolicy
from flowrl.algorithms.multiagent import DQN_POLICY, PPO_POLICY, MultiAgentConfig
from flowrl.algorithms.pg import PGConfig
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.config import ModelConfig, PolicySpec
from flowrl.envs import EnvContext, MultiAgentCartPole
from flowrl.inference import TrainedPolicy, load, load_policies
from flowrl.trainer import Trainer

OBS = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)


def make_cartpole(ctx: EnvContext) -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def trained(algorithm: str, config: Any, directory: Path, *, iterations: int = 1) -> tuple[Trainer, Path]:
    """A trainer after ``iterations`` and its checkpoint in ``directory``."""
    trainer = Trainer(algorithm, config)
    for _ in range(iterations):
        trainer.train()
    return trainer, trainer.save(directory)


@pytest.fixture(scope="module")
def pg_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """A run dir with two PG checkpoints (iterations 1 and 2, in the driver), the later one's greedy actions on OBS."""
    run = tmp_path_factory.mktemp("inference") / "run"
    trainer = Trainer("pg", PGConfig(num_workers=0, train_batch_size=100, seed=0))
    trainer.train()
    trainer.save(run / "checkpoints")
    trainer.train()
    latest = trainer.save(run / "checkpoints")
    actions = trainer.get_policy().compute_actions(OBS, explore=False)[0]
    trainer.stop()
    return run, latest, actions


def test_load_acts_greedily_as_the_trained_policy_did(pg_run: tuple[Path, Path, np.ndarray]) -> None:
    run, latest, expected = pg_run
    for path in (latest, run, run / "checkpoints", str(run)):  # a run dir and its checkpoints/ mean the latest
        policy = flowrl.load(path)
        assert isinstance(policy, TrainedPolicy) and policy.checkpoint == latest
        np.testing.assert_array_equal(policy.compute_actions(OBS), expected)
    assert (policy.policy_id, policy.algorithm) == ("default_policy", "pg")
    assert policy.observation_space == gym.make("CartPole-v1").observation_space
    singles = [policy.compute_single_action(obs) for obs in OBS]
    assert all(type(a) is int for a in singles) and singles == expected.tolist()
    assert policy.compute_single_action(OBS[0].tolist()) == expected[0]  # any array-like observation
    assert policy.policy.device == torch.device("cpu")


def test_load_restores_the_saved_sampling_state(pg_run: tuple[Path, Path, np.ndarray]) -> None:
    first, second = flowrl.load(pg_run[1]), flowrl.load(pg_run[1])
    sampled = first.compute_actions(OBS, explore=True)
    np.testing.assert_array_equal(sampled, second.compute_actions(OBS, explore=True))
    assert not np.array_equal(sampled, first.compute_actions(OBS, explore=False))  # it does sample


def test_wrong_observation_shapes_and_paths_without_a_checkpoint_are_refused(
        pg_run: tuple[Path, Path, np.ndarray], tmp_path: Path) -> None:
    policy = load(pg_run[1])
    with pytest.raises(ValueError, match=r"observations of shape \(4,\); policy 'default_policy' takes a batch "
                                         r"\[B, 4\].*use compute_single_action"):
        policy.compute_actions(OBS[0])
    with pytest.raises(ValueError, match=r"an observation of shape \(2, 4\).*for a batch use compute_actions"):
        policy.compute_single_action(OBS[:2])
    with pytest.raises(ValueError, match="is not a checkpoint .* holds no checkpoint_\\* directory"):
        load(tmp_path)


def test_a_multi_agent_checkpoint_loads_the_policy_asked_for(tmp_path: Path) -> None:
    config = MultiAgentConfig(seed=0, min_iter_time_s=0, dqn=DQNConfig(learning_starts=100))
    trainer, path = trained("multiagent", config, tmp_path, iterations=0)  # the policies' initial weights do
    expected = {pid: trainer.get_policy(pid).compute_actions(OBS, explore=False)[0] for pid in (PPO_POLICY, DQN_POLICY)}
    trainer.stop()
    for pid, actions in expected.items():
        policy = load(path, pid)
        assert policy.policy_id == pid
        np.testing.assert_array_equal(policy.compute_actions(OBS), actions)
    both = load_policies(path)
    assert sorted(both) == [DQN_POLICY, PPO_POLICY] and type(both[DQN_POLICY].policy) is DQNPolicy
    assert type(both[PPO_POLICY].policy) is PPOPolicy
    with pytest.raises(ValueError, match=r"holds the policies \['dqn_policy', 'ppo_policy'\]; no policy_id names "
                                         r"one of them: pass policy_id='dqn_policy'"):
        load(path)
    with pytest.raises(ValueError, match=r"holds the policies \['dqn_policy', 'ppo_policy'\]; policy_id='ppo' names"):
        load(path, "ppo")


def test_a_checkpoint_whose_env_was_a_callable_loads(tmp_path: Path) -> None:
    trainer, path = trained("pg", PGConfig(env=make_cartpole, num_workers=0, train_batch_size=100, seed=0), tmp_path)
    expected = trainer.get_policy().compute_actions(OBS, explore=False)[0]
    trainer.stop()
    np.testing.assert_array_equal(load(path).compute_actions(OBS), expected)


def test_a_policies_map_that_data_cannot_rebuild_is_refused_clearly(tmp_path: Path) -> None:
    small = PPOConfig(model=ModelConfig(hidden_sizes=(16,)))  # p1's own network: lost if rebuilt from defaults
    config = PPOConfig(env=MultiAgentCartPole, env_config={"num_agents": 2}, num_workers=0, seed=0,
                       policies={"p0": PolicySpec(), "p1": PolicySpec(config=small)},
                       policy_mapping_fn={"agent_0": "p0", "agent_1": "p1"})
    trainer, path = trained("ppo", config, tmp_path, iterations=0)
    trainer.stop()
    with pytest.raises(ValueError, match=r"checkpoint .*: this config holds .*a non-data field policies .*restore it "
                                         r"from Python with Trainer"):
        load(path, "p1")


def test_a_checkpoint_written_before_the_spaces_were_stored_loads_from_its_env(tmp_path: Path) -> None:
    trainer, path = trained("pg", PGConfig(num_workers=0, train_batch_size=100, seed=0), tmp_path / "new")
    expected = trainer.get_policy().compute_actions(OBS, explore=False)[0]
    trainer.stop()
    tree = read_checkpoint(path, algorithm="pg")
    for state in [tree["local_worker"], *tree["remote_workers"]]:
        for policy_state in state["policies"].values():
            del policy_state["spaces"]
    old = write_checkpoint(tmp_path / "old", path.name, tree, algorithm="pg")
    np.testing.assert_array_equal(load(old).compute_actions(OBS), expected)


def test_a_box_action_is_one_array_the_env_takes(tmp_path: Path) -> None:
    trainer, path = trained("ppo", PPOConfig(env="Pendulum-v1", num_workers=0, train_batch_size=200,
                                             sgd_minibatch_size=100, num_sgd_iter=1, seed=0), tmp_path)
    trainer.stop()
    policy = load(path)
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=0)
    action = policy.compute_single_action(obs)
    assert isinstance(action, np.ndarray) and action.shape == (1,) and action.dtype == np.float32
    env.step(action)
    assert policy.compute_actions(np.stack([obs, obs])).shape == (2, 1)


def test_loading_starts_no_ray(pg_run: tuple[Path, Path, np.ndarray], tmp_path: Path) -> None:
    # as `flowrl train` writes it: the config has remote workers (Trainer.from_checkpoint would start Ray for them)
    tree = read_checkpoint(pg_run[1], algorithm="pg")
    tree["config"]["fields"]["num_workers"] = 2
    path = write_checkpoint(tmp_path, pg_run[1].name, tree, algorithm="pg")
    script = ("import sys, ray, flowrl\n"
              "policy = flowrl.load(sys.argv[1])\n"
              "print(policy.compute_single_action([0.0, 0.0, 0.0, 0.0]), ray.is_initialized())\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    action, initialized = done.stdout.split()
    assert action in ("0", "1") and initialized == "False", done.stdout


READ_ONLY_RESTORE = """
import gymnasium as gym, numpy as np, torch
from flowrl.algorithms.appo import APPOConfig, APPOPolicy
from flowrl.algorithms.dqn import DQNConfig, DQNPolicy
from flowrl.algorithms.ppo import PPOConfig, PPOPolicy
from flowrl.policy import Policy, PolicyConfig

def read_only(tree):  # every array a read-only copy, as a state sent through Ray's object store arrives
    if isinstance(tree, np.ndarray):
        frozen = tree.copy()
        frozen.flags.writeable = False
        return frozen
    if isinstance(tree, dict):
        return {k: read_only(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(read_only(v) for v in tree)
    return tree

spaces = gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2)
for policy_class, config in [(Policy, PolicyConfig(seed=0)), (PPOPolicy, PPOConfig(seed=0)),
                             (DQNPolicy, DQNConfig(seed=0)), (APPOPolicy, APPOConfig(seed=0))]:
    source = policy_class(*spaces, config)
    source.model(torch.zeros(8, 4))[0].sum().backward()  # one step, so the optimizer has state to restore
    source.optimizer_step()
    target = policy_class(*spaces, config)
    target.set_state(read_only(source.get_state()))
    for name, value in source.get_weights().items():
        np.testing.assert_array_equal(target.get_weights()[name], value)
print("restored", flush=True)
"""


def test_restoring_a_read_only_state_warns_of_nothing() -> None:
    # torch warns "The given NumPy array is not writable" once per process: a fresh one, every warning an error
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", READ_ONLY_RESTORE], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "restored\n", done.stderr


def test_a_recurrent_policy_remembers_each_episodes_state_and_reset_starts_new_ones(tmp_path: Path) -> None:
    """flowrl.load of a PPO+LSTM checkpoint acts as the trained policy does from a carried state: the same greedy
    actions as explicit compute_actions_with_state calls on the trainer's own policy, over a whole episode."""
    import gymnasium

    from flowrl.algorithms.ppo import PPOConfig
    from flowrl.config import ModelConfig
    from flowrl.envs import STATELESS_CARTPOLE

    config = PPOConfig(env=STATELESS_CARTPOLE, seed=2, num_workers=0, num_envs_per_worker=2,
                       rollout_fragment_length=50, train_batch_size=100, sgd_minibatch_size=50, num_sgd_iter=1,
                       model=ModelConfig(hidden_sizes=(16,), use_lstm=True, lstm_cell_size=8, max_seq_len=10))
    trainer = Trainer("ppo", config)
    trainer.train()
    trainer.save(tmp_path)
    trained = trainer.get_policy()
    loaded = load(tmp_path)
    assert loaded.is_recurrent
    env = gymnasium.make(STATELESS_CARTPOLE)
    obs, _ = env.reset(seed=4)
    state = trained.initial_state(1)
    loaded.reset()
    actions_loaded, actions_explicit = [], []
    for _ in range(60):
        action = loaded.compute_single_action(obs)
        expected, _, state = trained.compute_actions_with_state(obs[None], state, explore=False)
        actions_loaded.append(action)
        actions_explicit.append(int(expected[0]))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    assert actions_loaded == actions_explicit
    assert any(np.abs(s).sum() > 0 for s in loaded._state or ())  # it carried a state along
    with pytest.raises(ValueError, match=r"a batch of 3 observations, but this recurrent policy remembers the "
                                         r"state of 1 episodes; call reset\(batch_size=3\)"):
        loaded.compute_actions(np.zeros((3, 2), np.float32))
    loaded.reset(batch_size=3)
    assert loaded.compute_actions(np.zeros((3, 2), np.float32)).shape == (3,)
    actions, new_state = loaded.compute_actions_with_state(np.zeros((2, 2), np.float32), loaded.initial_state(2))
    assert actions.shape == (2,) and [s.shape for s in new_state] == [(2, 8), (2, 8)]
    trainer.stop()


def test_a_feed_forward_policy_has_no_state_to_carry(tmp_path: Path) -> None:
    from flowrl.algorithms.pg import PGConfig

    trainer = Trainer("pg", PGConfig(num_workers=0, train_batch_size=50, rollout_fragment_length=50, seed=0))
    trainer.train()
    trainer.save(tmp_path)
    trainer.stop()
    policy = load(tmp_path)
    assert not policy.is_recurrent and policy.initial_state(2) == ()
    with pytest.raises(TypeError, match="carries no state; use compute_actions"):
        policy.compute_actions_with_state(np.zeros((1, 4), np.float32), ())
    policy.reset()  # nothing to reset: no error
    assert policy.compute_actions(np.zeros((5, 4), np.float32)).shape == (5,)
