"""Observation filters: a running mean/std normalization of what a policy sees (``RolloutConfig.observation_filter``).

:class:`RunningStat` keeps the count, mean and sum of squared deviations of a stream of vectors and merges two
such summaries exactly (Chan et al.'s parallel update), so statistics gathered on several workers combine into
those of all their observations, in any order. :class:`MeanStdFilter` normalizes observations with the running
statistics, ``clip((x - mean) / (std + 1e-8), -10, 10)`` (RLlib's filter, which clips at 10), and keeps apart
what it saw since the last :meth:`MeanStdFilter.take_delta`: the new statistics a rollout worker hands to the
driver, which merges them into its own filter and sends the result back with the weights
(:meth:`MeanStdFilter.sync`). Every state is plain numpy data.

Examples:
    >>> f = MeanStdFilter((2,))
    >>> out = f(np.array([[1.0, 10.0], [3.0, 10.0]], np.float32))
    >>> out.astype(float).round(4).tolist(), f.running.count
    ([[-0.7071, 0.0], [0.7071, 0.0]], 2)
    >>> f(np.array([[5.0, 10.0]]), update=False).astype(float).round(3).tolist()  # frozen: the statistics stay
    [[2.121, 0.0]]
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

import numpy as np

__all__ = ["ObservationFilterName", "OBSERVATION_FILTERS", "CLIP", "RunningStat", "MeanStdFilter", "make_filter"]

ObservationFilterName = Literal["NoFilter", "MeanStdFilter"]

#: the names ``RolloutConfig.observation_filter`` takes (RLlib's)
OBSERVATION_FILTERS: tuple[str, ...] = ("NoFilter", "MeanStdFilter")

#: normalized observations are clipped to ``[-CLIP, CLIP]`` (RLlib's value)
CLIP = 10.0

_EPS = 1e-8


class RunningStat:
    """Count, mean and sum of squared deviations (``m2``) of vectors of one shape, in float64.

    Args:
        shape: one observation's shape.

    Examples:
        >>> a, b = RunningStat((1,)), RunningStat((1,))
        >>> a.push(np.array([[1.0], [2.0]])); b.push(np.array([[3.0], [4.0], [5.0]]))
        >>> a.merge(b)
        >>> a.count, a.mean.tolist(), a.var.tolist()
        (5, [3.0], [2.5])
    """

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.count = 0
        self.mean = np.zeros(self.shape, np.float64)
        self.m2 = np.zeros(self.shape, np.float64)

    def push(self, batch: np.ndarray) -> None:
        """Adds the rows of ``batch`` ``[B, *shape]``."""
        rows = np.asarray(batch, np.float64).reshape(-1, *self.shape)
        if len(rows):
            self._combine(len(rows), rows.mean(axis=0), ((rows - rows.mean(axis=0)) ** 2).sum(axis=0))

    def merge(self, other: RunningStat) -> None:
        """Adds ``other``'s observations: afterwards this holds the statistics of both streams together."""
        if other.shape != self.shape:
            raise ValueError(f"cannot merge running statistics of shape {other.shape} into shape {self.shape}; "
                             f"both must summarize the same observation space")
        if other.count:
            self._combine(other.count, other.mean, other.m2)

    def _combine(self, count: int, mean: np.ndarray, m2: np.ndarray) -> None:
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.m2 = self.m2 + m2 + delta ** 2 * (self.count * count / total)
        self.count = total

    @property
    def var(self) -> np.ndarray:
        """The sample variance (``m2 / (count - 1)``); ones while there are fewer than two observations."""
        return self.m2 / (self.count - 1) if self.count > 1 else np.ones(self.shape)

    @property
    def std(self) -> np.ndarray:
        std: np.ndarray = np.sqrt(self.var)
        return std

    def copy(self) -> RunningStat:
        out = RunningStat(self.shape)
        out.count, out.mean, out.m2 = self.count, self.mean.copy(), self.m2.copy()
        return out

    def to_array(self) -> np.ndarray:
        """``[count, *mean, *m2]`` as one flat float64 array (how the statistics travel with the weights)."""
        return np.concatenate([[float(self.count)], self.mean.ravel(), self.m2.ravel()])

    @classmethod
    def from_array(cls, shape: Sequence[int], data: np.ndarray) -> RunningStat:
        """The statistics :meth:`to_array` wrote, for observations of ``shape``.

        Raises:
            ValueError: an array of another length than ``shape`` needs.
        """
        out = cls(shape)
        size = int(np.prod(out.shape))
        flat = np.asarray(data, np.float64).ravel()
        if flat.shape != (1 + 2 * size,):
            raise ValueError(f"running statistics of {flat.size} numbers do not fit observations of shape "
                             f"{out.shape} (which need {1 + 2 * size}); they come from another observation space")
        out.count = int(flat[0])
        out.mean, out.m2 = flat[1:1 + size].reshape(out.shape), flat[1 + size:].reshape(out.shape)
        return out


class MeanStdFilter:
    """Normalizes observations by the running mean and std of those it saw, clipped to ``[-clip, clip]``.

    Attributes:
        running: the statistics normalization uses: all observations seen here and merged in.
        buffer: the statistics of the observations seen here since the last :meth:`take_delta`.

    Args:
        shape: one observation's shape.
        clip: the bound of the normalized values (:data:`CLIP`).
    """

    def __init__(self, shape: Sequence[int], clip: float = CLIP) -> None:
        self.shape, self.clip = tuple(int(s) for s in shape), float(clip)
        self.running, self.buffer = RunningStat(self.shape), RunningStat(self.shape)

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """``obs`` ``[B, *shape]`` normalized as float32, after adding them to the statistics unless ``update``
        is False (a frozen filter, as evaluation and inference use it)."""
        if update:
            self.running.push(obs)
            self.buffer.push(obs)
        normalized = (np.asarray(obs, np.float64) - self.running.mean) / (self.running.std + _EPS)
        return np.clip(normalized, -self.clip, self.clip).astype(np.float32)

    def take_delta(self) -> np.ndarray:
        """The buffered statistics (:meth:`RunningStat.to_array`), which are cleared."""
        delta, self.buffer = self.buffer.to_array(), RunningStat(self.shape)
        return delta

    def apply_delta(self, delta: np.ndarray) -> None:
        """Merges another filter's :meth:`take_delta` into :attr:`running` (the driver's side of a sync)."""
        self.running.merge(RunningStat.from_array(self.shape, delta))

    def sync(self, merged: np.ndarray) -> None:
        """Adopts the driver's merged statistics (:meth:`RunningStat.to_array`) plus what this filter saw since
        its last :meth:`take_delta`, which the driver has not merged yet."""
        running = RunningStat.from_array(self.shape, merged)
        running.merge(self.buffer)
        self.running = running

    def get_state(self) -> dict[str, Any]:
        """The filter as plain data: its name, shape, clip and both statistics."""
        return {"type": "MeanStdFilter", "shape": list(self.shape), "clip": self.clip,
                "running": self.running.to_array(), "buffer": self.buffer.to_array()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` output (of a filter of the same observation shape)."""
        if state.get("type") != "MeanStdFilter" or tuple(state.get("shape", ())) != self.shape:
            raise ValueError(f"a filter state of type {state.get('type')!r} and shape {state.get('shape')} does not "
                             f"fit a MeanStdFilter of shape {self.shape}; restore a state of the same "
                             f"observation_filter and observation space")
        self.clip = float(state["clip"])
        self.running = RunningStat.from_array(self.shape, state["running"])
        self.buffer = RunningStat.from_array(self.shape, state["buffer"])


def make_filter(name: str, shape: Sequence[int]) -> MeanStdFilter | None:
    """The filter ``name`` (one of :data:`OBSERVATION_FILTERS`) for observations of ``shape``; ``None`` for
    ``"NoFilter"`` (observations go through untouched).

    Raises:
        ValueError: another name.

    Examples:
        >>> make_filter("NoFilter", (3,)) is None, type(make_filter("MeanStdFilter", (3,))).__name__
        (True, 'MeanStdFilter')
    """
    if name == "NoFilter":
        return None
    if name == "MeanStdFilter":
        return MeanStdFilter(shape)
    raise ValueError(f"observation_filter={name!r} is not a filter; use one of {list(OBSERVATION_FILTERS)}")
