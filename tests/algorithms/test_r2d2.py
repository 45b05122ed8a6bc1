"""R2D2: config checks, value rescaling, the learner's unroll over stored sequences, n-step double-Q targets against
a step-by-step reference, burn-in, sequence priorities, per-worker epsilons, a short run with checkpoint and resume,
and the R2D2 gate on CartPole without velocities (slow tier)."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.algorithms.apex import per_worker_epsilon
from flowrl.algorithms.r2d2 import (R2D2Config, R2D2Policy, inverse_value_rescale, make_owned_state, plan,
                                   value_rescale)
from flowrl.config import ModelConfig
from flowrl.envs import STATELESS_CARTPOLE
from flowrl.sample_batch import (ACTIONS, EPS_ID, NEXT_OBS, OBS, REWARDS, STATE_IN, STATE_OUT, T, TERMINATEDS,
                                 SampleBatch)
from flowrl.sequences import SEQ_VALID, pad_batch, sequence_lengths, sequence_starts
from flowrl.workers import WorkerSet

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py

SEQ = 6
SMALL = ModelConfig(hidden_sizes=(16,), use_lstm=True, lstm_cell_size=8, max_seq_len=SEQ)


def small_config(**overrides: Any) -> R2D2Config:
    base = R2D2Config(seed=3, model=SMALL, num_envs_per_worker=2, rollout_fragment_length=15, train_batch_size=4 * SEQ,
                      learning_starts=60, timesteps_per_iteration=60, env_config={"max_episode_steps": 30})
    return dataclasses.replace(base, **overrides)


# -- config ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    ({"model": dataclasses.replace(SMALL, use_lstm=False)}, "model.use_lstm=False: R2D2 learns a recurrent Q-network"),
    ({"burn_in": SEQ}, f"burn_in={SEQ} leaves no step to learn from in sequences of model.max_seq_len={SEQ}"),
    ({"burn_in": -1}, "burn_in=-1 must be an int >= 0"),
    ({"hiddens": (256,)}, r"hiddens=\(256,\): R2D2's Q heads are linear"),
    ({"replay_sequence_length": 4}, "replay_sequence_length=4: R2D2 stores sequences of model.max_seq_len=6 rows"),
    ({"rollout_fragment_length": 5}, "rollout_fragment_length=5 is shorter than model.max_seq_len=6"),
    ({"train_batch_size": 5}, "train_batch_size=5 timesteps holds no sequence of model.max_seq_len=6"),
    ({"priority_eta": 1.5}, "priority_eta=1.5 must be a number in"),
])
def test_bad_settings_are_clear_errors_at_config_time(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        small_config(**overrides)


def test_max_seq_len_below_one_and_a_continuous_action_space_are_refused() -> None:
    with pytest.raises(ValueError, match="ModelConfig.max_seq_len=0 must be an int >= 1"):
        ModelConfig(use_lstm=True, max_seq_len=0)
    with pytest.raises(ValueError, match="R2D2 needs a Discrete action space"):
        R2D2Policy(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(-1, 1, (1,)), small_config())


@settings(deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=20), st.sampled_from([0.0, 1e-3, 1e-2]))
def test_the_inverse_value_rescaling_undoes_it(values: list[float], eps: float) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    assert torch.allclose(inverse_value_rescale(value_rescale(x, eps), eps), x, rtol=1e-6, atol=1e-6)


# -- the learner's view of the stored sequences -----------------------------------------------------------------
def sampled(config: R2D2Config) -> tuple[WorkerSet, R2D2Policy, SampleBatch]:
    workers = WorkerSet(policy_class=R2D2Policy, config=config)
    worker = workers.local_worker()
    worker.sample()
    batch = worker.sample()  # mid-run: sequences start from carried, non-zero states
    policy = worker.get_policy()
    assert isinstance(policy, R2D2Policy) and isinstance(batch, SampleBatch)
    return workers, policy, batch


def test_the_learner_unroll_from_each_stored_initial_state_reproduces_the_workers_states() -> None:
    workers, policy, batch = sampled(small_config())
    lens = sequence_lengths(batch[EPS_ID], batch[T], SEQ)
    assert (batch[T][sequence_starts(lens)] > 0).any()  # some sequences start mid-episode
    for start, n in zip(sequence_starts(lens), lens):
        state = tuple(torch.as_tensor(batch[STATE_IN.format(k)][start:start + 1]) for k in range(2))
        obs = torch.as_tensor(batch[OBS][start:start + n])[None]
        with torch.no_grad():
            _, _, after = policy.model(obs, state)
        np.testing.assert_allclose(after[0][0].numpy(), batch[STATE_OUT.format(0)][start + n - 1], atol=1e-5)
        np.testing.assert_allclose(after[1][0].numpy(), batch[STATE_OUT.format(1)][start + n - 1], atol=1e-5)
    workers.stop()


def reference_targets(policy: R2D2Policy, padded: SampleBatch) -> np.ndarray:
    """The n-step double-Q targets, step by step: each sequence unrolled on its own from its stored state."""
    cfg = policy.config
    out = np.zeros(padded.count, np.float32)
    eps = cfg.h_function_epsilon
    for s in range(padded.count // SEQ):
        rows = slice(s * SEQ, (s + 1) * SEQ)
        n = int(padded[SEQ_VALID][rows].sum())
        obs = np.concatenate([padded[OBS][rows][:n], padded[NEXT_OBS][rows][n - 1:n]])
        state = tuple(torch.as_tensor(padded[STATE_IN.format(k)][rows][:1]) for k in range(2))
        with torch.no_grad():
            online = policy.q_values(torch.as_tensor(obs)[None], state)[0][0].numpy()
            target = policy.q_values(torch.as_tensor(obs)[None], state, policy.target_model)[0][0].numpy()
        rewards, terminated = padded[REWARDS][rows], bool(padded[TERMINATEDS][rows][n - 1])
        for t in range(n):
            m = min(cfg.n_step, n - t)
            ret = sum(cfg.gamma ** k * rewards[t + k] for k in range(m))
            boot = t + m
            value = target[boot][online[boot].argmax()]
            if boot == n and terminated:
                value = 0.0
            if cfg.use_h_function:
                value = float(inverse_value_rescale(torch.tensor(value, dtype=torch.float64), eps))
                out[s * SEQ + t] = float(value_rescale(torch.tensor(ret + cfg.gamma ** m * value,
                                                                    dtype=torch.float64), eps))
            else:
                out[s * SEQ + t] = ret + cfg.gamma ** m * value
    return out


@pytest.mark.parametrize("n_step, use_h", [(1, True), (3, True), (3, False)])
def test_nstep_double_q_targets_match_a_step_by_step_reference(n_step: int, use_h: bool) -> None:
    workers, policy, batch = sampled(small_config(n_step=n_step, use_h_function=use_h))
    with torch.no_grad():  # a target network different from the online one, so double Q matters
        for p in policy.target_model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    padded = pad_batch(batch, SEQ)
    assert padded[TERMINATEDS].any()  # some sequences end in a terminal step
    tensors = policy.to_tensors(padded)
    valid = padded[SEQ_VALID]
    got = _targets(policy, tensors)
    np.testing.assert_allclose(got[valid], reference_targets(policy, padded)[valid], rtol=1e-4, atol=1e-4)
    workers.stop()


def _targets(policy: R2D2Policy, tensors: dict[str, torch.Tensor]) -> np.ndarray:
    """The policy's own targets, read by wrapping its _targets during one loss computation."""
    seen: list[torch.Tensor] = []
    original = policy._targets
    policy._targets = lambda *a: (seen.append(original(*a)), seen[-1])[1]  # type: ignore[method-assign]
    policy.loss(tensors)
    policy._targets = original  # type: ignore[method-assign]
    return seen[0].reshape(-1).numpy()


def test_burn_in_steps_of_a_mid_episode_sequence_carry_no_loss_and_an_episode_start_needs_none() -> None:
    workers, policy, batch = sampled(small_config(burn_in=2))
    padded = pad_batch(batch, SEQ)
    t0 = padded[T].reshape(-1, SEQ)[:, 0]
    valid = padded[SEQ_VALID].reshape(-1, SEQ)
    mid, start = np.flatnonzero((t0 > 0) & valid[:, 0] & valid[:, 3]), np.flatnonzero((t0 == 0) & valid[:, 3])
    assert len(mid) and len(start)

    def loss_with_action_changed(sequence: int, step: int) -> float:
        changed = padded.copy()
        changed[ACTIONS] = changed[ACTIONS].copy()
        changed[ACTIONS][sequence * SEQ + step] = 1 - changed[ACTIONS][sequence * SEQ + step]
        return float(policy.loss(policy.to_tensors(changed))[0].detach())

    base = float(policy.loss(policy.to_tensors(padded))[0].detach())
    assert loss_with_action_changed(int(mid[0]), 0) == base  # a burn-in step: no loss term
    assert loss_with_action_changed(int(mid[0]), 2) != base  # the first trained step
    assert loss_with_action_changed(int(start[0]), 0) != base  # an episode's first step is trained
    workers.stop()


@pytest.mark.parametrize("eta", [0.0, 0.9, 1.0])
def test_each_sequence_priority_mixes_the_max_and_mean_of_its_td_errors(eta: float) -> None:
    """With Q pinned to 0 and gamma 0, each trained step's |td| is its reward: the priority formula is exact."""
    workers, policy, batch = sampled(small_config(priority_eta=eta, use_h_function=False, gamma=0.0))
    padded = pad_batch(batch, SEQ)
    for p in policy.model.parameters():
        torch.nn.init.zeros_(p)
    padded[REWARDS] = np.arange(padded.count, dtype=np.float32) % 5
    info = policy.learn_on_tensors(policy.to_tensors(padded))
    rewards = padded[REWARDS].reshape(-1, SEQ)
    valid = padded[SEQ_VALID].reshape(-1, SEQ)
    expected = [eta * r[v].max() + (1 - eta) * r[v].mean() for r, v in zip(rewards, valid)]
    np.testing.assert_allclose(info["td_error"], expected, rtol=1e-6)
    workers.stop()


# -- the plan ----------------------------------------------------------------------------------------------------
def test_with_remote_workers_each_explores_with_its_ape_x_epsilon_and_alone_the_driver_anneals() -> None:
    config = small_config(num_workers=2, num_cpus_per_worker=0)
    workers = WorkerSet(policy_class=R2D2Policy, config=config)
    try:
        it = plan(workers, config)
        got = workers.foreach_worker(lambda w: w.get_policy().epsilon)
        assert got == [0.0, per_worker_epsilon(0, 2), per_worker_epsilon(1, 2)]
        it.close()
    finally:
        workers.stop()
    alone = WorkerSet(policy_class=R2D2Policy, config=small_config())
    plan(alone, small_config()).close()
    policy = alone.local_worker().get_policy()
    assert isinstance(policy, R2D2Policy) and policy.epsilon == 1.0  # DQN's schedule at timestep 0
    alone.stop()


def test_a_short_run_trains_on_whole_replayed_sequences() -> None:
    config = small_config()
    workers = WorkerSet(policy_class=R2D2Policy, config=config)
    buf = make_owned_state(config)["replay_buffer"]
    it = plan(workers, config, replay_buffer=buf)
    seen: list[SampleBatch] = []
    policy = workers.local_worker().get_policy()
    learn = policy.learn_on_batch
    policy.learn_on_batch = lambda b: (seen.append(b), learn(b))[1]  # type: ignore[method-assign]
    results = [next(it) for _ in range(2)]
    it.close()
    workers.stop()
    stats = results[-1]["info"]["learner"]["default_policy"]["learner_stats"]
    assert results[-1]["info"]["num_steps_trained"] == len(seen) * 4 * SEQ and np.isfinite(stats["loss"])
    for replayed in seen:
        assert replayed.count == 4 * SEQ
        for block in range(4):
            rows = slice(block * SEQ, (block + 1) * SEQ)
            n = int(replayed[SEQ_VALID][rows].sum())
            assert replayed[SEQ_VALID][rows][:n].all() and len(set(replayed[EPS_ID][rows][:n].tolist())) == 1
            assert (np.diff(replayed[T][rows][:n]) == 1).all()
            assert len(set(replayed["batch_indexes"][rows].tolist())) == 1  # one item, one priority


def test_a_restored_trainer_keeps_the_weights_the_target_the_sequences_and_each_envs_carried_state(
        tmp_path: Any) -> None:
    from flowrl.trainer import Trainer

    config = small_config(store_buffer_in_checkpoints=True)
    first = Trainer("r2d2", config)
    first.train()
    checkpoint = first.save(tmp_path)
    saved_state = first.workers.local_worker().get_state()["policy_state"]
    assert any(np.abs(s).sum() > 0 for s in saved_state)
    second = Trainer.from_checkpoint(checkpoint)
    for a, b in zip(saved_state, second.workers.local_worker().get_state()["policy_state"]):
        np.testing.assert_array_equal(a, b)  # each env goes on from the state it had, not from zeros
    one, two = first.get_policy(), second.get_policy()
    assert isinstance(one, R2D2Policy) and isinstance(two, R2D2Policy)
    for module in ("model", "target_model"):
        for a, b in zip(getattr(one, module).parameters(), getattr(two, module).parameters()):
            assert torch.equal(a, b)
    buffers = [t.owned_state["replay_buffer"] for t in (first, second)]
    assert len(buffers[1]) == len(buffers[0]) > 0 and buffers[1].replay_sequence_length == SEQ
    result = second.train()
    assert result["info"]["num_steps_trained"] > 0
    first.stop()
    second.stop()


# -- learning (the defaults: `flowrl train r2d2`) ----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [101, 202, 303])
def test_r2d2_reaches_150_within_300k_steps_on_cartpole_without_velocities(seed: int) -> None:
    """The R2-4 gate with R2D2's defaults (their env is the stateless CartPole); seeds 1-4 took 40k-92k steps."""
    from .test_pg import train_until

    config = R2D2Config(env=STATELESS_CARTPOLE, seed=seed)
    result, seconds = train_until(R2D2Policy, config, plan, target=150, max_steps=300_000)
    print(f"R2D2 seed {seed}: return {result['episode_reward_mean']:.1f} after {result['timesteps_total']} steps, "
          f"{seconds:.0f} s")
    assert result["episode_reward_mean"] >= 150 and result["timesteps_total"] <= 300_000
