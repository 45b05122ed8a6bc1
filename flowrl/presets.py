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
    Preset("apex", "CartPole-v1",
           ("num_replay_buffer_shards=2", "learning_starts=1000", "buffer_size=50000", "train_batch_size=64",
            "rollout_fragment_length=20", "max_weight_sync_delay=100", "target_network_update_freq=8000"),
           "Ape-X sized for a few workers instead of a 32-worker cluster (tests/algorithms/test_apex.py's "
           "learning check)"),
)


def find_preset(algorithm: str, env: str) -> Preset | None:
    """The preset for ``algorithm`` on ``env`` (ids compared exactly), or ``None``."""
    return next((p for p in PRESETS if p.algorithm == algorithm.lower() and p.env == env), None)
