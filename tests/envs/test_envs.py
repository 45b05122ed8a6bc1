"""flowrl.envs: making envs, seeds, same-step autoreset, plain-data state, and the multi-agent protocol."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from typing import Any

import gymnasium
import numpy as np
import pytest

from flowrl.envs import (AUTO_NATIVE_MIN_ENVS, EnvContext, EpisodeRecord, MultiAgentCartPole, MultiAgentEnv,
                         MultiAgentStep, MultiAgentVectorEnv, VectorEnv, VectorStep, derive_seed, make_env,
                         make_policy_mapping)

BACKENDS = ["loop", "gymnasium"]


def random_steps(env: VectorEnv, steps: int, seed: int) -> list[VectorStep]:
    """``steps`` steps with random valid actions drawn from ``seed`` (the same actions for the same seed)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        if isinstance(env.action_space, gymnasium.spaces.Discrete):
            actions = rng.integers(0, int(env.action_space.n), env.num_envs)
        else:
            actions = rng.uniform(-2, 2, (env.num_envs, *env.action_space.shape)).astype(np.float32)
        out.append(env.step(actions))
    return out


def same_steps(a: list[VectorStep], b: list[VectorStep]) -> bool:
    return len(a) == len(b) and all(
        (x.obs == y.obs).all() and (x.final_obs == y.final_obs).all() and (x.rewards == y.rewards).all()
        and (x.terminateds == y.terminateds).all() and (x.truncateds == y.truncateds).all()
        and x.episodes == y.episodes for x, y in zip(a, b))


# -- making envs and seeds -----------------------------------------------------------------------------------

def test_unknown_id_names_the_id_the_closest_ids_and_the_fix() -> None:
    with pytest.raises(ValueError) as err:
        make_env("CartPol-v1", EnvContext())
    message = str(err.value)
    assert "'CartPol-v1'" in message and "'CartPole-v1'" in message and "callable" in message
    with pytest.raises(ValueError, match="unknown gymnasium env id"):
        VectorEnv("NoSuchEnv-v0", 2)


def test_make_env_by_id_passes_the_config_and_by_callable_passes_the_context() -> None:
    assert make_env("CartPole-v1", EnvContext(config={"max_episode_steps": 7})).spec.max_episode_steps == 7
    seen: list[EnvContext] = []

    def build(ctx: EnvContext) -> gymnasium.Env[Any, Any]:
        seen.append(ctx)
        return gymnasium.make("CartPole-v1")

    VectorEnv(build, 3, seed=5, worker_index=2, config={"k": 1}, backend="loop")
    assert [(c.worker_index, c.env_index, c.seed, dict(c.config)) for c in seen] == [
        (2, i, derive_seed(5, 2, i), {"k": 1}) for i in range(3)]


def test_make_env_rejects_a_callable_that_returns_no_env() -> None:
    with pytest.raises(TypeError, match="not a gymnasium.Env"):
        make_env(lambda ctx: 3, EnvContext())  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError):
        VectorEnv(lambda ctx: MultiAgentCartPole(2), 1)  # type: ignore[arg-type, return-value]


def test_derive_seed_is_deterministic_distinct_and_keeps_none() -> None:
    seeds = [derive_seed(7, w, e) for w in range(5) for e in range(5)]
    assert seeds == [derive_seed(7, w, e) for w in range(5) for e in range(5)]
    assert len(set(seeds)) == 25 and 7 not in seeds
    assert derive_seed(7, 0, 0) != derive_seed(8, 0, 0)
    assert derive_seed(None, 3, 1) is None
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            derive_seed(bad, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="worker_index"):
        derive_seed(0, -1, 0)


def test_env_context_and_episode_record_defaults() -> None:
    assert EnvContext() == EnvContext(0, 0, None, {})
    assert EpisodeRecord(1, 2.0, 3) == EpisodeRecord(env_index=1, episode_return=2.0, episode_length=3,
                                                     agent_returns={}, custom_metrics={})
    with pytest.raises(ValueError, match="worker_index"):
        EnvContext(worker_index=-1)


# -- VectorEnv: construction -----------------------------------------------------------------------------

def test_vector_env_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="num_envs=0"):
        VectorEnv("CartPole-v1", 0)
    with pytest.raises(ValueError, match="backend='fast'"):
        VectorEnv("CartPole-v1", 1, backend="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed=-3"):
        VectorEnv("CartPole-v1", 1, seed=-3)

    def tuple_obs(ctx: EnvContext) -> gymnasium.Env[Any, Any]:
        env = gymnasium.make("CartPole-v1")
        space = gymnasium.spaces.Tuple([env.observation_space])
        return gymnasium.wrappers.TransformObservation(env, lambda o: (o,), space)

    for backend in BACKENDS:
        with pytest.raises(ValueError, match=r"Tuple.*not supported.*Box and Discrete"):
            VectorEnv(tuple_obs, 2, backend=backend)  # type: ignore[arg-type]


def test_backend_choice() -> None:
    assert VectorEnv("CartPole-v1", 1).backend == "loop"
    assert VectorEnv("CartPole-v1", AUTO_NATIVE_MIN_ENVS).backend == "gymnasium"
    assert "vectorised CartPole" in repr(VectorEnv("CartPole-v1", 2, backend="gymnasium"))
    # a config key the native CartPole does not take, or a callable: SyncVectorEnv
    assert "SyncVectorEnv" in repr(VectorEnv("CartPole-v1", 2, backend="gymnasium",
                                             config={"disable_env_checker": True}))
    assert VectorEnv("Pendulum-v1", 8).backend == "loop"


def test_step_checks_actions() -> None:
    env = VectorEnv("CartPole-v1", 2, seed=0, backend="loop")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(2, dtype=np.int64))
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="integer"):
        env.step(np.zeros(2, dtype=np.float32))
    with pytest.raises(ValueError, match="outside"):
        env.step(np.array([0, 2]))


# -- VectorEnv: stepping -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_envs", [1, 8])
def test_autoreset_in_the_same_step_and_episode_records(backend: str, num_envs: int) -> None:
    env = VectorEnv("CartPole-v1", num_envs, seed=1, backend=backend)
    first = env.reset()
    assert first.shape == (num_envs, 4) and (np.abs(first) <= 0.05).all()
    returns, lengths, finished = np.zeros(num_envs), np.zeros(num_envs, dtype=int), 0
    for step in random_steps(env, 150, seed=2):
        assert step.rewards.dtype == np.float32 and step.rewards.shape == (num_envs,)
        assert step.terminateds.dtype == np.bool_ and step.truncateds.dtype == np.bool_
        returns += step.rewards
        lengths += 1
        done = step.terminateds | step.truncateds
        assert (step.dones == done).all()
        assert (step.final_obs[~done] == step.obs[~done]).all()
        assert [ep.env_index for ep in step.episodes] == np.flatnonzero(done).tolist()
        for ep in step.episodes:
            i = ep.env_index
            assert (step.final_obs[i] != step.obs[i]).any()  # the terminal obs vs the new episode's first
            assert (np.abs(step.obs[i]) <= 0.05).all()  # a fresh CartPole reset state
            assert ep.episode_return == returns[i] and ep.episode_length == lengths[i] and ep.agent_returns == {}
            returns[i], lengths[i], finished = 0.0, 0, finished + 1
    assert finished >= 5 * num_envs


@pytest.mark.parametrize("backend", BACKENDS)
def test_terminated_vs_truncated(backend: str) -> None:
    env = VectorEnv("CartPole-v1", 2, seed=0, backend=backend, config={"max_episode_steps": 5})
    env.reset()
    steps = [env.step(np.array([0, 1])) for _ in range(5)]
    assert not any(s.dones.any() for s in steps[:4])
    assert steps[4].truncateds.all() and not steps[4].terminateds.any()
    assert [(ep.env_index, ep.episode_length, ep.episode_return) for ep in steps[4].episodes] == [(0, 5, 5.0),
                                                                                                 (1, 5, 5.0)]
    falling = VectorEnv("CartPole-v1", 2, seed=0, backend=backend)  # always push right: the pole falls
    falling.reset()
    ends = [s for s in (falling.step(np.ones(2, dtype=np.int64)) for _ in range(30)) if s.dones.any()]
    assert ends and all(s.terminateds[s.dones].all() and not s.truncateds.any() for s in ends)


def test_box_actions_and_time_limit_truncation() -> None:
    env = VectorEnv("Pendulum-v1", 2, seed=0, backend="loop")
    assert env.reset().shape == (2, 3)
    steps = random_steps(env, 200, seed=1)
    assert steps[-1].truncateds.all() and not any(s.terminateds.any() for s in steps)
    assert [ep.episode_length for ep in steps[-1].episodes] == [200, 200]


def test_step_arrays_are_not_reused() -> None:
    env = VectorEnv("CartPole-v1", 3, seed=0, backend="loop")
    env.reset()
    first = env.step(np.zeros(3, dtype=np.int64))
    kept = first.obs.copy(), first.final_obs.copy()
    env.step(np.ones(3, dtype=np.int64))
    assert (first.obs == kept[0]).all() and (first.final_obs == kept[1]).all()


# -- VectorEnv: seeds and state ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_seed_fixes_the_trajectory(backend: str) -> None:
    a, b, c = (VectorEnv("CartPole-v1", 4, seed=s, backend=backend) for s in (7, 7, 8))
    assert (a.reset() == b.reset()).all() and not (a.current_obs == c.reset()).all()
    assert same_steps(random_steps(a, 100, seed=3), random_steps(b, 100, seed=3))
    for i in range(4):  # each env has its own stream (the native CartPole: one generator, distinct draws)
        assert not (a.current_obs[i] == a.current_obs[(i + 1) % 4]).all()


def test_loop_and_sync_vector_env_agree_and_native_cartpole_seeds_differently() -> None:
    loop = VectorEnv("CartPole-v1", 3, seed=4, backend="loop")
    sync = VectorEnv("CartPole-v1", 3, seed=4, backend="gymnasium", config={"disable_env_checker": False})
    native = VectorEnv("CartPole-v1", 3, seed=4, backend="gymnasium")
    assert (loop.reset() == sync.reset()).all()
    assert same_steps(random_steps(loop, 100, seed=5), random_steps(sync, 100, seed=5))
    # one generator for all N envs, seeded with derive_seed(seed, worker_index, 0): other draws than N envs
    assert not (native.reset() == VectorEnv("CartPole-v1", 3, seed=4, backend="loop").reset()).all()


@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
@pytest.mark.parametrize("num_envs", [1, 8])
def test_get_state_set_state_continues_exactly(backend: str, num_envs: int) -> None:
    env = VectorEnv("CartPole-v1", num_envs, seed=3, backend=backend)
    env.reset()
    random_steps(env, 37, seed=1)  # mid-episode for most envs
    state = json.loads(json.dumps(env.get_state()))  # plain data only
    expected = random_steps(env, 150, seed=2)
    restored = VectorEnv("CartPole-v1", num_envs, seed=99, backend=backend)
    restored.set_state(state)
    assert same_steps(random_steps(restored, 150, seed=2), expected)


def test_state_of_box_envs_and_across_per_env_backends() -> None:
    env = VectorEnv("Pendulum-v1", 2, seed=0, backend="loop")
    env.reset()
    random_steps(env, 60, seed=1)
    state = json.loads(json.dumps(env.get_state()))
    expected = random_steps(env, 30, seed=2)
    sync = VectorEnv("Pendulum-v1", 2, backend="gymnasium")  # a per-env state restores into SyncVectorEnv too
    sync.set_state(state)
    assert same_steps(random_steps(sync, 30, seed=2), expected)


def test_set_state_rejects_other_states_and_restarts_episodes_it_cannot_replay() -> None:
    env = VectorEnv("CartPole-v1", 2, seed=0, backend="loop")
    env.reset()
    with pytest.raises(ValueError, match="num_envs"):
        VectorEnv("CartPole-v1", 3, backend="loop").set_state(env.get_state())
    with pytest.raises(ValueError, match="format"):
        env.set_state({"format": "something else"})

    outside = np.random.default_rng(0)  # randomness outside np_random: a replay cannot reproduce it

    class Leaky(gymnasium.Env[np.ndarray, int]):
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = gymnasium.spaces.Discrete(2)

        def reset(self, *, seed: int | None = None,
                  options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
            super().reset(seed=seed)
            return outside.uniform(-1, 1, 1).astype(np.float32), {}

        def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
            return outside.uniform(-1, 1, 1).astype(np.float32), 1.0, False, False, {}

    leaky = VectorEnv(lambda ctx: Leaky(), 1, seed=0)
    leaky.reset()
    leaky.step(np.array([1]))
    state = leaky.get_state()
    assert state["episode_lengths"] == [1]
    with pytest.warns(RuntimeWarning, match="could not replay"):
        leaky.set_state(state)
    assert leaky.get_state()["episode_lengths"] == [0]


# -- multi-agent ---------------------------------------------------------------------------------------------

def test_multi_agent_cartpole_ends_when_every_agent_is_done() -> None:
    env = MultiAgentCartPole(num_agents=2)
    assert isinstance(env, MultiAgentEnv) and env.agent_ids == ("agent_0", "agent_1")
    assert env.action_space("agent_1") == gymnasium.spaces.Discrete(2)
    obs, _ = env.reset(seed=0)
    # agent_0 always pushes right and falls within ~10 steps; agent_1 alternates and lasts longer
    actions = {"agent_0": lambda t: 1, "agent_1": lambda t: t % 2}
    done: set[str] = set()
    for t in range(500):
        obs, rewards, terminateds, truncateds, _ = env.step({aid: actions[aid](t) for aid in obs if aid not in done})
        assert "__all__" in terminateds and "__all__" in truncateds
        assert set(rewards) == set(obs) and not set(rewards) & done  # finished agents stop appearing
        done |= {aid for aid in rewards if terminateds[aid] or truncateds[aid]}
        if terminateds["__all__"] or truncateds["__all__"]:
            break
        assert len(done) < 2
    assert done == {"agent_0", "agent_1"} and terminateds["__all__"] and not truncateds["__all__"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step({})

    short = MultiAgentCartPole(EnvContext(config={"num_agents": 3, "max_episode_steps": 2}))
    obs, _ = short.reset(seed=1)
    for _ in range(2):
        obs, _, terminateds, truncateds, _ = short.step({aid: 0 for aid in short.agent_ids})
    assert truncateds["__all__"] and not terminateds["__all__"] and all(truncateds[a] for a in short.agent_ids)


def test_policy_mapping_is_validated_when_built() -> None:
    with pytest.raises(ValueError) as err:
        make_policy_mapping({"agent_0": "ppo", "agent_1": "dqm"}, ["ppo", "dqn"])
    assert "'dqm'" in str(err.value) and "['dqn', 'ppo']" in str(err.value)
    with pytest.raises(ValueError, match="agent_2"):
        make_policy_mapping({"agent_0": "ppo", "agent_1": "dqn"}, ["ppo", "dqn"], ["agent_0", "agent_1", "agent_2"])
    with pytest.raises(ValueError, match="'nope'"):
        make_policy_mapping(lambda aid: "nope", ["ppo"], agent_ids=["agent_0"])
    with pytest.raises(ValueError, match="several policies"):
        make_policy_mapping(None, ["a", "b"])
    assert make_policy_mapping(None, ["only"])("anyone") == "only"
    by_index = make_policy_mapping(lambda aid: "even" if int(aid[-1]) % 2 == 0 else "odd", ["even", "odd"],
                                   ("agent_0", "agent_1"))
    assert [by_index(f"agent_{i}") for i in range(3)] == ["even", "odd", "even"]
    unchecked = make_policy_mapping(lambda aid: "ghost", ["real"])  # no agent ids: checked on each call
    with pytest.raises(ValueError, match="'ghost'"):
        unchecked("agent_0")


def test_multi_agent_vector_env_steps_records_and_restores() -> None:
    env = MultiAgentVectorEnv(MultiAgentCartPole, 2, seed=0, config={"num_agents": 2})
    obs = env.reset()
    assert [sorted(o) for o in obs] == [["agent_0", "agent_1"]] * 2
    acting: list[dict[str, Any]] = obs
    episodes, partial_ends = [], 0
    for t in range(120):
        steps = env.step([{aid: (1 if aid == "agent_0" else t % 2) for aid in o} for o in acting])
        assert len(steps) == 2 and all(isinstance(s, MultiAgentStep) for s in steps)
        assert steps.rewards == [s.rewards for s in steps]  # the per-field view the RolloutWorker reads
        for s in steps:
            finished = {a for a in s.rewards if s.terminateds[a] or s.truncateds[a]}
            if s.episode_ended:
                assert s.terminateds["__all__"] or s.truncateds["__all__"]
                assert sorted(s.obs) == ["agent_0", "agent_1"]  # the next episode's reset observations
            else:
                assert set(s.obs) == set(s.final_obs) - finished  # only the agents that act next
                partial_ends += bool(finished)
            episodes += s.episodes
        acting = [s.obs for s in steps]
    assert episodes and partial_ends
    for ep in episodes:
        assert sorted(ep.agent_returns) == ["agent_0", "agent_1"]
        assert ep.episode_return == sum(ep.agent_returns.values())
        assert ep.agent_returns["agent_1"] >= ep.agent_returns["agent_0"]

    state = json.loads(json.dumps(env.get_state()))
    before = env.current_obs
    actions = [{aid: 1 for aid in o} for o in before]
    expected = env.step(actions)
    restored = MultiAgentVectorEnv(MultiAgentCartPole, 2, seed=123, config={"num_agents": 2})
    restored.set_state(state)
    now = restored.current_obs
    assert [o.keys() for o in now] == [o.keys() for o in before]
    assert all((o[k] == p[k]).all() for o, p in zip(now, before) for k in o)
    got = restored.step(actions)
    for a, b in zip(expected, got):
        assert a.rewards == b.rewards and a.terminateds == b.terminateds and a.episodes == b.episodes
        assert all((a.final_obs[k] == b.final_obs[k]).all() for k in a.final_obs)
        assert a.obs.keys() == b.obs.keys() and all((a.obs[k] == b.obs[k]).all() for k in a.obs)


# -- the async backend (each env in a subprocess) ------------------------------------------------------------

def test_the_async_backend_matches_the_loop_step_for_step_and_shares_its_state_layout() -> None:
    loop = VectorEnv("CartPole-v1", 3, seed=4, backend="loop")
    remote = VectorEnv("CartPole-v1", 3, seed=4, backend="async")
    try:
        assert "AsyncVectorEnv" in repr(remote) and remote.backend == "async"
        assert (loop.reset() == remote.reset()).all()
        assert same_steps(random_steps(loop, 120, seed=5), random_steps(remote, 120, seed=5))  # ends and resets too
        state = json.loads(json.dumps(remote.get_state()))  # read inside the subprocesses: plain data
        expected = random_steps(remote, 60, seed=6)
        loop.set_state(state)  # an async env's state restores into the loop ...
        assert same_steps(random_steps(loop, 60, seed=6), expected)
    finally:
        remote.close()
    box = VectorEnv("Pendulum-v1", 2, seed=0, backend="loop")
    box.reset()
    random_steps(box, 30, seed=1)
    state = json.loads(json.dumps(box.get_state()))
    expected = random_steps(box, 20, seed=2)
    restored = VectorEnv("Pendulum-v1", 2, backend="async")
    try:
        restored.set_state(state)  # ... and the loop's into an async env, Box actions replayed in each subprocess
        assert same_steps(random_steps(restored, 20, seed=2), expected)
    finally:
        restored.close()


def test_a_worker_samples_with_the_async_backend() -> None:
    from flowrl.testing import TinyPGPolicy
    from flowrl.workers import RolloutConfig, RolloutWorker

    config = RolloutConfig(seed=0, num_envs_per_worker=2, rollout_fragment_length=50, vector_backend="async")
    worker = RolloutWorker(policy_class=TinyPGPolicy, config=config)
    try:
        reference = RolloutWorker(policy_class=TinyPGPolicy, config=dataclasses.replace(config, vector_backend="loop"))
        a, b = worker.sample(), reference.sample()
        assert a.count == 100 and all(np.array_equal(a[k], b[k]) for k in b.keys() if k in a)
    finally:
        worker.env.close()


# -- the envpool backend (EnvPool's C++ envs; a stand-in where EnvPool is not installed) ------------------------

@pytest.fixture
def stub_envpool(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.testing import envpool_stub

    monkeypatch.setitem(sys.modules, "envpool", envpool_stub)


def _same_step_reference(env_id: str, seeds: list[int], actions: list[np.ndarray]) -> list[tuple[np.ndarray, ...]]:
    """What a same-step-autoreset loop over gymnasium envs seeded ``seeds`` returns for ``actions``: the rows the
    envpool backend must give, since EnvPool seeds env i with seed + i."""
    envs = [gymnasium.make(env_id) for _ in seeds]
    for env, seed in zip(envs, seeds):
        env.reset(seed=seed)
    rows = []
    for acts in actions:
        obs, final, rewards, dones = [], [], [], []
        for env, a in zip(envs, acts):
            o, r, te, tr, _ = env.step(a.item() if a.shape == () else a)
            final.append(o)
            rewards.append(r)
            dones.append(te or tr)
            obs.append(env.reset()[0] if te or tr else o)
        rows.append((np.stack(obs), np.stack(final), np.asarray(rewards, dtype=np.float32), np.asarray(dones)))
    return rows


def test_the_envpool_backend_resets_a_finished_env_within_the_ending_step(stub_envpool: None) -> None:
    env = VectorEnv("CartPole-v1", 3, seed=5, backend="envpool")
    assert "EnvPool" in repr(env) and env.backend == "envpool"
    pool_seed = env._impl.vec.seed  # type: ignore[attr-defined]  # the stub's
    assert pool_seed == derive_seed(5, 0, 0) % (2**31 - 3)
    actions = [np.ones(3, dtype=np.int64) for _ in range(40)]  # always right: episodes end every ~10 steps
    expected = _same_step_reference("CartPole-v1", [pool_seed + i for i in range(3)], actions)
    env.reset()
    ended = 0
    for acts, (obs, final, rewards, dones) in zip(actions, expected):
        step = env.step(acts)
        assert np.array_equal(step.obs, obs) and np.array_equal(step.final_obs, final)
        assert np.array_equal(step.rewards, rewards) and np.array_equal(step.terminateds | step.truncateds, dones)
        ended += len(step.episodes)
    assert ended >= 9  # every row a real transition: no reset rows with reward 0 in between
    env.close()


def test_the_envpool_backend_takes_box_actions_and_restores_by_starting_new_episodes(stub_envpool: None) -> None:
    env = VectorEnv("Pendulum-v1", 2, seed=1, backend="envpool")
    env.reset()
    env.step(np.zeros((2, 1), dtype=np.float32))
    state = json.loads(json.dumps(env.get_state()))
    with pytest.warns(RuntimeWarning, match=r"envs \[0, 1\] could not replay their saved episode \(EnvPool's "
                                            r"simulator state lives in C\+\+ and cannot be saved\); they start new"):
        env.set_state(state)
    assert env.current_obs.shape == (2, 3) and env.get_state()["episode_lengths"] == [0, 0]
    env.close()


def test_the_envpool_backend_refuses_what_it_cannot_build(stub_envpool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"EnvPool has no env 'CartPole-v9' \(it has \['CartPole-v1'\]\); "
                                         r"envpool.list_all_envs\(\) lists its ids"):
        VectorEnv("CartPole-v9", 2, backend="envpool")
    with pytest.raises(ValueError, match=r"backend='envpool' builds envs by EnvPool id; .* is a callable"):
        VectorEnv(lambda ctx: gymnasium.make("CartPole-v1"), 2, backend="envpool")
    monkeypatch.setitem(sys.modules, "envpool", None)  # not installed
    with pytest.raises(ValueError, match=r"needs EnvPool, which does not import here .*pip install 'flowrl\[envpool\]'"):
        VectorEnv("CartPole-v1", 2, backend="envpool")


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None,
                    reason="EnvPool is the optional envpool extra, not part of dev")
def test_a_worker_samples_with_real_envpool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPLBACKEND", raising=False)
    from flowrl.testing import TinyPGPolicy
    from flowrl.workers import RolloutConfig, RolloutWorker

    config = RolloutConfig(seed=0, num_envs_per_worker=4, rollout_fragment_length=100, vector_backend="envpool")
    worker = RolloutWorker(policy_class=TinyPGPolicy, config=config)
    try:
        batch = worker.sample()
        assert batch.count == 400
        assert (batch["rewards"] == 1.0).all()  # every row a real CartPole step: no reward-0 reset rows
        episodes = worker.get_metrics()
        assert len(episodes) >= 4 and all(8 <= ep.episode_length <= 500 for ep in episodes)
        assert sum(ep.episode_length for ep in episodes) <= 400
        assert "MPLBACKEND" not in os.environ  # importing EnvPool sets it for the process; the backend undoes that
    finally:
        worker.env.close()
