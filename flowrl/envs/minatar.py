"""MinAtar (Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible Reinforcement
Learning Experiments"): five Atari-like games on 10x10 frames with one boolean channel per object kind, fast
enough to train image policies on a laptop. flowrl's quick image suite (``pip install 'flowrl[minatar]'``).

The ``minatar`` package registers its gymnasium ids (``MinAtar/Breakout-v1``, ``Asterix``, ``Freeway``,
``Seaquest``, ``SpaceInvaders``; ``-v1`` with each game's minimal action set, ``-v0`` with all 6 actions) only when
asked: importing this module asks it, and :func:`flowrl.envs.make_env` imports this module for an id in the
``MinAtar`` namespace, so ``env="MinAtar/Breakout-v1"`` works as it is. Observations are ``bool`` arrays of shape
``(10, 10, channels)`` (HWC), which workers, batches and replay keep as they are (1 byte a cell); the model's
encoder reads them as 0/1 (:func:`flowrl.models.default_conv_filters` picks MinAtar's one 3x3 conv layer).

A game draws from its own ``numpy.random.RandomState``, not gymnasium's ``np_random``: a worker's checkpointed
episodes in progress cannot be replayed, so a restored worker starts them again (with a warning).
"""

from __future__ import annotations

from typing import Any

import gymnasium
from minatar.gym import BaseEnv

__all__ = ["GAMES", "MinAtarEnv", "register"]

#: MinAtar's games, as their ids spell them (``MinAtar/<Game>-v1``).
GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")


class MinAtarEnv(BaseEnv):  # type: ignore[misc]  # minatar ships no type information
    """``minatar.gym.BaseEnv`` taking any seed gymnasium takes: MinAtar seeds a ``numpy.random.RandomState``, which
    refuses seeds of 2**32 and more (flowrl derives 64-bit seeds per env), so seeds are folded into 32 bits."""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return super().reset(seed=None if seed is None else seed % 2**32, options=options)


def register() -> None:
    """Registers MinAtar's ids over :class:`MinAtarEnv` (replacing ``minatar.gym.register_envs``'s, if it ran):
    ``-v1`` with each game's minimal action set, ``-v0`` with all 6 actions."""
    for game in GAMES:
        snake = "space_invaders" if game == "SpaceInvaders" else game.lower()
        for version, minimal in (("v0", False), ("v1", True)):
            env_id = f"MinAtar/{game}-{version}"
            spec = gymnasium.registry.get(env_id)
            if spec is not None and spec.entry_point == f"{__name__}:MinAtarEnv":
                continue
            gymnasium.registry.pop(env_id, None)
            gymnasium.register(id=env_id, entry_point=f"{__name__}:MinAtarEnv",
                               kwargs={"game": snake, "use_minimal_action_set": minimal})


register()
