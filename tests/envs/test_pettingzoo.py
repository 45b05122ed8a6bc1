"""PettingZooEnv: a PettingZoo ParallelEnv (sisl pursuit_v5, and small hand-written ones) behind flowrl's
multi-agent protocol, sampled through a RolloutWorker; its errors; flowrl without PettingZoo."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from typing import Any

import gymnasium
import numpy as np
import pytest
from pettingzoo import ParallelEnv  # the dev extra installs it: a missing PettingZoo fails, never skips
from ray import cloudpickle

from flowrl.config import ModelConfig
from flowrl.envs import EnvContext, MultiAgentVectorEnv, PettingZooEnv
from flowrl.sample_batch import AGENT_INDEX, OBS, RETURNS, TERMINATEDS, TRUNCATEDS, MultiAgentBatch
from flowrl.testing import TinyPGPolicy
from flowrl.workers import PolicySpec, RolloutConfig, RolloutWorker

with warnings.catch_warnings():
    # pursuit_v5's module path is PettingZoo's pre-registry API: it works on every supported version
    # (>= 1.25), and 1.27 warns on import. It imports pygame-ce and scipy, which the dev extra also installs;
    # a missing one fails this module's collection instead of skipping it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from pettingzoo.sisl import pursuit_v5

# Small and quick: 4 pursuers chase 2 evaders on an 8x8 grid, seeing 3x3x3 images. (PettingZoo's default
# of 30 evaders does not fit on 8x8: its reset() then searches for free cells forever.)
PURSUIT = dict(n_pursuers=4, n_evaders=2, x_size=8, y_size=8, obs_range=3)


def make_pursuit(max_cycles: int = 12) -> Any:
    return pursuit_v5.parallel_env(**PURSUIT, max_cycles=max_cycles)


def assert_same_dicts(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ---------------------------------------------------------------------------------------------- pursuit


def test_adapter_steps_exactly_like_the_raw_parallel_env() -> None:
    raw, env = make_pursuit(), PettingZooEnv(make_pursuit())
    assert env.agent_ids == ("pursuer_0", "pursuer_1", "pursuer_2", "pursuer_3")
    assert env.observation_space("pursuer_1") == raw.observation_space("pursuer_1")
    assert env.action_space("pursuer_1") == gymnasium.spaces.Discrete(5)
    raw_obs, _ = raw.reset(seed=3)
    obs, infos = env.reset(seed=3)
    assert_same_dicts(obs, raw_obs)
    assert set(infos) == set(obs)
    rng, steps = np.random.default_rng(0), 0
    while raw.agents:
        actions = {aid: int(rng.integers(5)) for aid in raw.agents}
        raw_obs, raw_rew, raw_term, raw_trunc, _ = raw.step(actions)
        obs, rewards, terminateds, truncateds, infos = env.step(actions)
        steps += 1
        assert_same_dicts(obs, raw_obs)
        assert rewards == {aid: float(r) for aid, r in raw_rew.items()}
        assert all(type(r) is float for r in rewards.values())
        over = not raw.agents
        assert terminateds == {**raw_term, "__all__": False}
        assert truncateds == {**raw_trunc, "__all__": over}
    assert steps == 12  # max_cycles: every pursuer is truncated together, so the episode is truncated
    assert all(truncateds.values()) and not any(terminateds.values())
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(actions)
    again, _ = env.reset()  # unseeded resets go on; the episode starts over
    assert sorted(again) == list(env.agent_ids)
    env.close()


def test_factory_builds_one_env_per_context_and_survives_cloudpickle() -> None:
    make = cloudpickle.loads(cloudpickle.dumps(PettingZooEnv.factory(pursuit_v5.parallel_env, **PURSUIT)))
    env = make(EnvContext(worker_index=1, env_index=0, seed=5, config={"max_cycles": 3}))
    assert isinstance(env, PettingZooEnv) and env.agent_ids[0] == "pursuer_0"
    assert make(EnvContext()).env is not env.env
    vec = MultiAgentVectorEnv(make, 2, seed=0, config={"max_cycles": 3})
    obs = vec.reset()
    for _ in range(3):
        step = vec.step([{aid: 0 for aid in o} for o in obs])
        obs = step.obs
    assert [len(s.episodes) for s in step] == [1, 1] and all(t["__all__"] for t in step.truncateds)
    assert step.episodes[0].episode_length == 3 and sorted(step.episodes[0].agent_returns) == list(env.agent_ids)


def pursuit_config(**overrides: Any) -> RolloutConfig:
    base: dict[str, Any] = dict(
        env=PettingZooEnv.factory(pursuit_v5.parallel_env, **PURSUIT), env_config={"max_cycles": 12},
        policies={"even": PolicySpec(), "odd": PolicySpec()},
        policy_mapping_fn=lambda aid: "even" if int(aid.rsplit("_", 1)[1]) % 2 == 0 else "odd",
        rollout_fragment_length=20, num_envs_per_worker=2, seed=0,
        model=ModelConfig(hidden_sizes=(16,), conv_filters=((8, 3, 1),)))  # a 3x3 image: one 3x3 kernel
    return RolloutConfig(**{**base, **overrides})


def test_rollout_worker_samples_a_full_multi_agent_batch_from_pettingzoo() -> None:
    worker = RolloutWorker(policy_class=TinyPGPolicy, config=pursuit_config())
    batch = worker.sample()
    assert isinstance(batch, MultiAgentBatch)
    assert batch.count == 20 * 2  # env steps: fragment x envs
    assert set(batch.policy_batches) == {"even", "odd"}
    for pid, agents in (("even", {0, 2}), ("odd", {1, 3})):
        pb = batch.policy_batches[pid]
        assert pb.count == 2 * 2 * 20  # every pursuer acts at every step: 2 agents x 2 envs x 20 steps
        assert set(pb[AGENT_INDEX].tolist()) == agents
        assert pb[OBS].shape == (80, 3, 3, 3) and RETURNS in pb
        # 12-step episodes (or sooner, if both evaders are caught): each agent's run ends at least once per env.
        assert (pb[TERMINATEDS] | pb[TRUNCATEDS]).sum() >= 2 * 2
    assert batch.agent_steps() == 160
    assert set(worker.learn_on_batch(batch)) == {"even", "odd"}
    again = RolloutWorker(policy_class=TinyPGPolicy, config=pursuit_config()).sample()
    for pid in ("even", "odd"):  # same seed, same batch
        a, b = batch.policy_batches[pid], again.policy_batches[pid]
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{pid}/{key}")


# -------------------------------------------------------------------- agents that leave, join or linger


class Staggered(ParallelEnv):
    """``a`` and ``b`` start; after step 1 ``a`` is terminated and ``c`` joins; after step 2 ``b`` ends
    (truncated, or terminated with ``truncate_b=False``); after step 3 ``c`` is terminated. With
    ``linger=True`` the env keeps reporting ``a`` (terminated) in every later step, as some envs do."""

    metadata = {"name": "staggered_v0"}

    def __init__(self, *, truncate_b: bool = True, linger: bool = False, possible: Any = ("a", "b", "c")) -> None:
        self.possible_agents = list(possible)
        self.agents: list[Any] = []
        self.truncate_b, self.linger, self.t = truncate_b, linger, 0

    def observation_space(self, agent: Any) -> gymnasium.Space[Any]:
        return gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: Any) -> gymnasium.Space[Any]:
        return gymnasium.spaces.Discrete(2)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, ord(agent)], np.float32)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.t, self.agents = 0, ["a", "b"]
        return {aid: self._obs(aid) for aid in self.agents}, {aid: {"t": 0} for aid in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        assert sorted(actions) == sorted(self.agents), (actions, self.agents)
        self.t += 1
        acted = list(self.agents)
        term = {aid: False for aid in acted}
        trunc = {aid: False for aid in acted}
        if self.t == 1:
            term["a"] = True
            self.agents = ["b", "c"]
        elif self.t == 2:
            (trunc if self.truncate_b else term)["b"] = True
            self.agents = ["c"]
        else:
            term["c"] = True
            self.agents = []
        reported = acted + [aid for aid in self.agents if aid not in acted]
        if self.linger and self.t > 1:
            reported.append("a")
            term["a"] = True
        obs = {aid: self._obs(aid) for aid in reported}
        rewards = {aid: float(actions.get(aid, 0)) + 0.5 for aid in reported}
        infos = {aid: {"t": self.t} for aid in reported}
        return (obs, rewards, {aid: term.get(aid, False) for aid in reported},
                {aid: trunc.get(aid, False) for aid in reported}, infos)


@pytest.mark.parametrize("linger", [False, True])
def test_agents_appear_once_more_when_they_finish_and_join_when_listed(linger: bool) -> None:
    env = PettingZooEnv(Staggered(linger=linger))
    obs, infos = env.reset(seed=0)
    assert sorted(obs) == ["a", "b"] and infos == {"a": {"t": 0}, "b": {"t": 0}}
    obs, rewards, terminateds, truncateds, infos = env.step({"a": 1, "b": 0})
    assert sorted(obs) == ["a", "b", "c"]  # a's terminal observation; c joins and acts next
    assert rewards == {"a": 1.5, "b": 0.5, "c": 0.5}
    assert terminateds == {"a": True, "b": False, "c": False, "__all__": False}
    assert truncateds == {"a": False, "b": False, "c": False, "__all__": False}
    with pytest.raises(ValueError, match=r"not acting — done or unknown: \['a'\]"):
        env.step({"a": 0, "b": 0, "c": 0})
    obs, rewards, terminateds, truncateds, infos = env.step({"b": 0, "c": 1})
    assert sorted(obs) == sorted(rewards) == sorted(infos) == ["b", "c"]  # never a again, even when lingering
    assert truncateds == {"b": True, "c": False, "__all__": False}
    obs, rewards, terminateds, truncateds, infos = env.step({"c": 0})
    assert sorted(obs) == ["c"]
    assert terminateds == {"c": True, "__all__": False}  # b was truncated: the episode was cut short
    assert truncateds == {"c": False, "__all__": True}


def test_episode_is_terminated_when_no_agent_was_truncated() -> None:
    env = PettingZooEnv(Staggered(truncate_b=False))
    obs, _ = env.reset()
    for _ in range(3):
        obs, _, terminateds, truncateds, _ = env.step({aid: 0 for aid, o in obs.items() if aid in env.env.agents})
    assert terminateds["__all__"] and not truncateds["__all__"]


def test_staggered_agents_through_the_vector_env_and_worker() -> None:
    config = RolloutConfig(env=lambda ctx: PettingZooEnv(Staggered(linger=True)), policies={"p": PolicySpec()},
                           rollout_fragment_length=6, num_envs_per_worker=2, seed=1,
                           model=ModelConfig(hidden_sizes=(8,)))
    batch = RolloutWorker(policy_class=TinyPGPolicy, config=config).sample()
    assert isinstance(batch, MultiAgentBatch) and batch.count == 12
    pb = batch.policy_batches["p"]
    # Two 3-step episodes per env: a acts once, b twice, c twice (from step 2 on) = 5 agent steps each.
    assert pb.count == 2 * 2 * 5
    assert sorted(np.bincount(pb[AGENT_INDEX]).tolist()) == [4, 8, 8]
    assert pb[TERMINATEDS].sum() == 2 * 2 * 2 and pb[TRUNCATEDS].sum() == 2 * 2


# ------------------------------------------------------------------------------------------------ errors


def test_an_aec_env_is_refused_with_the_conversion_to_use() -> None:
    with pytest.raises(ValueError, match=r"AEC env .*aec_to_parallel"):
        PettingZooEnv(pursuit_v5.env())
    make = PettingZooEnv.factory(pursuit_v5.env, **PURSUIT)
    with pytest.raises(ValueError, match=r"what .*env\(\.\.\.\) returned is a PettingZoo AEC env .*aec_to_parallel"):
        make(EnvContext())
    with pytest.raises(ValueError, match="aec_to_parallel"):  # as a worker meets it
        RolloutWorker(policy_class=TinyPGPolicy, config=pursuit_config(env=make))


def test_other_things_that_are_not_parallel_envs_are_named() -> None:
    with pytest.raises(ValueError, match="single-agent gymnasium env .*without policies"):
        PettingZooEnv(gymnasium.make("CartPole-v1"))
    with pytest.raises(ValueError, match=r"is dict .*not a PettingZoo ParallelEnv"):
        PettingZooEnv({})
    with pytest.raises(ValueError, match=r"the module pettingzoo\.sisl\.pursuit_v5; .*pursuit_v5\.parallel_env"):
        PettingZooEnv.factory(pursuit_v5)
    with pytest.raises(ValueError, match=r"an env instance .*not pursuit_v5\.parallel_env\(\)"):
        PettingZooEnv.factory(make_pursuit())
    with pytest.raises(ValueError, match="is not callable"):
        PettingZooEnv.factory("pursuit_v5")


def test_agent_ids_must_be_distinct_strings() -> None:
    with pytest.raises(ValueError, match=r"agent ids \[0, 1\] that are not strings; .*rename"):
        PettingZooEnv(Staggered(possible=(0, 1, "c")))
    with pytest.raises(ValueError, match="distinct ids other than '__all__'"):
        PettingZooEnv(Staggered(possible=("a", "__all__")))
    with pytest.raises(ValueError, match="distinct ids"):
        PettingZooEnv(Staggered(possible=()))
    env = PettingZooEnv(Staggered(possible=("a", "b")))
    env.reset()
    with pytest.raises(ValueError, match=r"not in its possible_agents \['a', 'b'\]"):
        env.step({"a": 0, "b": 0})  # c joins, but was never declared
    with pytest.raises(ValueError, match="unknown agent id 'z'"):
        env.observation_space("z")


def test_bad_steps_and_configs_are_named() -> None:
    env = PettingZooEnv(Staggered())
    with pytest.raises(RuntimeError, match=r"before reset\(\)"):
        env.step({"a": 0})
    env.reset()
    with pytest.raises(ValueError, match=r"missing: \['b'\]"):
        env.step({"a": 0})
    with pytest.raises(ValueError, match="must be None or an int >= 0"):
        env.reset(seed=-1)
    make = PettingZooEnv.factory(pursuit_v5.parallel_env, max_cycles=5, **PURSUIT)
    with pytest.raises(ValueError, match=r"keys \['max_cycles'\] are set both in the factory's keyword arguments "
                                         r"and in env_config"):
        make(EnvContext(config={"max_cycles": 7}))


class Vanishing(Staggered):
    """Drops ``a`` from ``env.agents`` after step 1 without flagging it done."""

    def step(self, actions: dict[str, Any]) -> Any:
        obs, rewards, term, trunc, infos = super().step(actions)
        term["a"] = False
        return obs, rewards, term, trunc, infos


def test_an_agent_that_leaves_without_being_done_is_named() -> None:
    env = PettingZooEnv(Vanishing())
    env.reset()
    with pytest.raises(ValueError, match=r"removed agents \['a'\] from env.agents without terminating"):
        env.step({"a": 0, "b": 0})


def test_missing_pettingzoo_raises_an_import_error_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    monkeypatch.setitem(sys.modules, "pettingzoo.utils.env", None)
    with pytest.raises(ImportError, match=r'pip install "flowrl\[pettingzoo\]"'):
        PettingZooEnv.factory(lambda: None)
    with pytest.raises(ImportError, match=r'pip install "flowrl\[pettingzoo\]"'):
        PettingZooEnv(object())


def test_flowrl_envs_imports_without_pettingzoo() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["pettingzoo"] = None  # as if it were not installed
        from flowrl.envs import MultiAgentCartPole, PettingZooEnv
        try:
            PettingZooEnv.factory(print)
        except ImportError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert 'install it with: pip install "flowrl[pettingzoo]"' in out.stdout
