"""TD3: DDPG with twin critics, target policy smoothing and delayed actor updates, as a plan (RLlib Flow,
https://arxiv.org/abs/2011.12719; TD3, https://arxiv.org/abs/1802.09477).

Dataflow: DDPG's, which is DQN's two sub-flows (:mod:`flowrl.algorithms.ddpg`). (1) The workers sample in
lockstep with Gaussian exploration noise and store each fragment in the trainer-owned replay buffer. (2) Replay
feeds the learner: a critic step on the minimum of two target critics at a smoothed target action, an actor step
every ``policy_delay`` critic steps, a broadcast, and a soft (``tau``) target update after every train step.
Only the config differs from DDPG: :class:`TD3Config` turns the three tricks on.

Examples:
    >>> config = TD3Config(seed=0)
    >>> config.twin_q, config.policy_delay, config.smooth_target_policy, config.target_noise, config.target_noise_clip
    (True, 2, True, 0.2, 0.5)
    >>> TD3Config(exploration_noise=-0.1)
    Traceback (most recent call last):
    ...
    ValueError: exploration_noise=-0.1 must be a number >= 0 (std of the exploration noise, in the [-1, 1] action scale)
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.algorithms import Algorithm
from flowrl.algorithms.ddpg import DDPGConfig, DDPGPolicy, make_owned_state, plan

__all__ = ["TD3Config", "DDPGPolicy", "make_owned_state", "plan", "ALGORITHM"]


@dataclass(frozen=True, kw_only=True)
class TD3Config(DDPGConfig):
    """TD3's config: :class:`~flowrl.algorithms.ddpg.DDPGConfig` with the paper's (and RLlib's TD3) settings.

    Attributes:
        twin_q: True (the bootstrap takes the minimum of two target critics).
        policy_delay: 2 (one actor step, and the actor loss, per two critic steps).
        smooth_target_policy: True, with ``target_noise`` 0.2 clipped to ``+-target_noise_clip`` 0.5.
        exploration_noise: 0.1 (Gaussian, in the ``[-1, 1]`` action scale).
        l2_reg: 0; actor_lr = critic_lr = lr: 1e-3; tau: 0.005 (the paper's).
        The other settings (networks, batch 256, ``random_timesteps`` 1000, ``learning_starts`` 1000, uniform
        replay, one gradient step per env step) are DDPGConfig's, chosen to learn Pendulum-v1 within 30k env
        steps on a laptop.
    """

    twin_q: bool = True
    policy_delay: int = 2
    smooth_target_policy: bool = True


ALGORITHM = Algorithm("td3", TD3Config, DDPGPolicy, plan, make_owned_state=make_owned_state)
