"""Tuned settings ("presets") for an algorithm on an env, kept as data in one place.

An algorithm's config defaults are its paper's (or RLlib's) general-purpose values; some envs learn much
faster, or only, with other settings. A :class:`Preset` holds those settings as ``--config key=value``
items, so ``flowrl train ALGO --env ENV --tuned`` applies them, the README's table lists them, and
Python builds the same config with :func:`flowrl.cli.build_config`. Settings given explicitly win over a
preset's. ``flowrl.cli.MAIN_JOB`` is PPO's CartPole-v1 preset with a stop criterion.

Examples:
    >>> preset = find_preset("ppo", "Pendulum-v1")
    >>> preset.settings[:3]
    ('num_workers=2', 'num_envs_per_worker=10', 'rollout_fragment_length=200')
    >>> preset.items(["lr=1e-3"])[-2:]  # the preset's own lr gives way to the one given
    ('model.hidden_sizes=256,256', 'lr=1e-3')
    >>> find_preset("pg", "Pendulum-v1") is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["Preset", "PRESETS", "find_preset"]


@dataclass(frozen=True)
class Preset:
    """Tuned settings for one algorithm on one env.

    Attributes:
        algorithm: the registry name (``"ppo"``).
        env: the gymnasium id (``"CartPole-v1"``).
        settings: ``key=value`` items, spelled as for ``--config``.
        source: where the settings come from and what they reach (one line, for the README and ``--tuned``).
    """

    algorithm: str
    env: str
    settings: tuple[str, ...]
    source: str

    def keys(self) -> list[str]:
        """The config keys the preset sets, in order."""
        return [item.partition("=")[0].strip() for item in self.settings]

    def items(self, given: Sequence[str]) -> tuple[str, ...]:
        """The preset's items whose keys ``given`` does not set, then ``given``: explicit settings win."""
        taken = {item.partition("=")[0].strip() for item in given}
        return (*(item for item in self.settings if item.partition("=")[0].strip() not in taken), *given)


PRESETS: tuple[Preset, ...] = (
    Preset("ppo", "CartPole-v1",
           ("num_workers=2", "num_envs_per_worker=4", "rollout_fragment_length=500", "train_batch_size=4000",
            "sgd_minibatch_size=128", "num_sgd_iter=6", "lr=3e-4"),
           "RLlib's tuned CartPole PPO (lr 3e-4, 6 epochs) on 2 workers x 4 envs: the main job; "
           "a return of 450 within about 85k env steps"),
    Preset("ppo", "Pendulum-v1",
           ("num_workers=2", "num_envs_per_worker=10", "rollout_fragment_length=200", "train_batch_size=4000",
            "sgd_minibatch_size=64", "num_sgd_iter=6", "lr=3e-4", "gamma=0.95", "lambda_=0.1",
            "model.hidden_sizes=256,256"),
           "RLlib's tuned Pendulum PPO (gamma 0.95, lambda 0.1, 256x256, minibatch 64, 6 epochs; its 20 envs "
           "sampled 4000-step batches); RLlib's gate is -400 within 400k env steps"),
    Preset("ppo", "flowrl/StatelessCartPole-v1",
           ("num_workers=0", "num_envs_per_worker=8", "rollout_fragment_length=250", "train_batch_size=2000",
            "sgd_minibatch_size=250", "num_sgd_iter=10", "lr=1e-3", "vf_loss_coeff=0.01", "kl_coeff=0.0",
            "clip_param=0.2", "lambda_=0.95", "observation_filter=MeanStdFilter", "model.use_lstm=true",
            "model.lstm_cell_size=64", "model.hidden_sizes=64", "model.max_seq_len=20"),
           "PPO with an LSTM (64 cells, sequences of 20) on CartPole without velocities, after RLlib's stateless "
           "CartPole examples (lr, vf_loss_coeff 0.01, MeanStdFilter); a return of 150 within about 100k env "
           "steps, where the same PPO without memory stays near 50"),
    Preset("impala", "flowrl/StatelessCartPole-v1",
           ("num_workers=1", "num_envs_per_worker=8", "rollout_fragment_length=50", "train_batch_size=400",
            "lr=5e-4", "vf_loss_coeff=0.01", "entropy_coeff=0.0", "observation_filter=MeanStdFilter",
            "model.use_lstm=true", "model.lstm_cell_size=64", "model.hidden_sizes=64", "model.max_seq_len=20"),
           "IMPALA with an LSTM on CartPole without velocities (V-trace over sequences from the stored states), "
           "the PPO preset's model and a small value-loss weight; a return of 150 within about 150k-280k env "
           "steps"),
    Preset("ppo", "MinAtar/Breakout-v1",
           ("num_workers=0", "num_envs_per_worker=8", "rollout_fragment_length=200", "train_batch_size=3200",
            "sgd_minibatch_size=250", "num_sgd_iter=4", "lr=1e-3", "entropy_coeff=0.01", "lambda_=0.95",
            "kl_coeff=0.0", "clip_param=0.2", "grad_clip=0.5", "vf_loss_coeff=0.5", "model.hidden_sizes=256"),
           "PPO on MinAtar's 10x10 Breakout with its one-layer CNN and a 256-unit layer, GAE 0.95, no KL penalty, "
           "gradients clipped to 0.5 (CleanRL's), sampling in the driver; a smoothed return of 10 within 1M env "
           "steps (random play: 0.5)"),
    Preset("appo", "MinAtar/Breakout-v1",
           ("num_workers=0", "num_envs_per_worker=16", "rollout_fragment_length=200", "train_batch_size=3200",
            "sgd_minibatch_size=250", "num_sgd_iter=4", "lr=1e-3", "clip_param=0.2", "vtrace_lambda=0.95",
            "entropy_coeff=0.01", "vf_loss_coeff=0.5", "grad_clip=0.5", "normalize_advantages=true",
            "learner_queue_size=1", "model.hidden_sizes=256"),
           "APPO given the PPO preset's update (batches of 3200 rows, 4 epochs of minibatches of 250 rows of whole "
           "trajectory pieces) with V-trace's lambda 0.95, sampling in the driver so that no batch comes from a "
           "policy more than one batch old (two async workers cost a third of the return at 500k env steps); a "
           "smoothed return of 10 within 1M env steps"),
    Preset("impala", "ALE/Pong-v5",
           ("num_workers=2", "num_envs_per_worker=16", "rollout_fragment_length=50", "train_batch_size=800",
            "clip_rewards=1.0", "lr=5e-4", "entropy_coeff=0.01", "vf_loss_coeff=0.5", "grad_clip=40",
            "model.hidden_sizes=256", "model.activation=relu", "model.vf_share_layers=true"),
           "RLlib's tuned Atari IMPALA (fragment 50, lr 5e-4, rewards clipped to 1, grad clip 40; batch 800, one "
           "worker's sample, instead of 500) on the "
           "Nature CNN with one shared 256-unit ReLU layer, on 2 workers x 16 envs instead of 32 x 5 (16 envs: a bigger "
           "forward pass per step, 6% more frames/s than 8 on 2 cores)"),
    Preset("appo", "ALE/Pong-v5",
           ("num_workers=2", "num_envs_per_worker=16", "rollout_fragment_length=50", "train_batch_size=800",
            "clip_rewards=1.0", "lr=5e-4", "num_sgd_iter=2", "minibatch_buffer_size=4", "clip_param=0.3",
            "entropy_coeff=0.01", "vf_loss_coeff=0.5", "grad_clip=10", "model.hidden_sizes=256",
            "model.activation=relu", "model.vf_share_layers=true"),
           "RLlib's tuned Pong APPO (2 passes over a buffer of 4 batches, clip 0.3, grad clip 10) on the Nature CNN "
           "with one shared 256-unit ReLU layer, on 2 workers x 16 envs instead of 32 x 8"),
    Preset("ppo", "ALE/Pong-v5",
           ("num_workers=2", "num_envs_per_worker=4", "rollout_fragment_length=128", "train_batch_size=1024",
            "sgd_minibatch_size=256", "num_sgd_iter=4", "lr=2.5e-4", "clip_param=0.1", "lambda_=0.95",
            "entropy_coeff=0.01", "vf_loss_coeff=0.5", "vf_clip_param=10", "kl_coeff=0.0", "grad_clip=0.5",
            "clip_rewards=1.0", "model.hidden_sizes=512", "model.activation=relu", "model.vf_share_layers=true"),
           "The PPO paper's Atari settings as CleanRL and SB3 run them (8 envs x 128 steps, 4 epochs of 4 "
           "minibatches, lr 2.5e-4, clip 0.1, no KL penalty) on the Nature CNN with its shared 512-unit layer"),
    Preset("dqn", "ALE/Pong-v5",
           ("buffer_size=100000", "learning_starts=20000", "train_batch_size=32", "rollout_fragment_length=4",
            "target_network_update_freq=8000", "lr=6.25e-5", "adam_epsilon=1.5e-4", "n_step=1",
            "prioritized_replay=false", "double_q=true", "dueling=false", "hiddens=512", "final_epsilon=0.01",
            "epsilon_timesteps=200000", "clip_rewards=1.0", "model.hidden_sizes=[]", "model.activation=relu",
            "timesteps_per_iteration=10000"),
           "RLlib's tuned Atari DQN (lr 6.25e-5, target every 8000 steps, epsilon to 0.01 over 200k steps, "
           "rewards clipped) with double Q and a 100k-step replay, its frame stacks LZ4-compressed (5.6 GB as arrays)"),
    Preset("apex", "CartPole-v1",
           ("num_replay_buffer_shards=2", "learning_starts=1000", "buffer_size=50000", "train_batch_size=64",
            "rollout_fragment_length=20", "max_weight_sync_delay=100", "target_network_update_freq=8000"),
           "Ape-X sized for a few workers instead of a 32-worker cluster (tests/algorithms/test_apex.py's "
           "learning check)"),
)


def find_preset(algorithm: str, env: str) -> Preset | None:
    """The preset for ``algorithm`` on ``env`` (ids compared exactly), or ``None``."""
    return next((p for p in PRESETS if p.algorithm == algorithm.lower() and p.env == env), None)
