"""The agent -> policy map of a multi-agent setup: :func:`make_policy_mapping` builds a :class:`PolicyMapping`
from a dict, a callable or ``None`` and checks it against the known policies when it is built, not mid-run.
:mod:`flowrl.envs.multi_agent` and :mod:`flowrl.envs` re-export both.

Examples:
    >>> mapping = make_policy_mapping({"agent_0": "hunter", "agent_1": "prey"}, {"hunter", "prey"})
    >>> mapping("agent_1"), mapping
    ('prey', PolicyMapping({'agent_0': 'hunter', 'agent_1': 'prey'}))
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping

from flowrl.sample_batch import DEFAULT_POLICY_ID

__all__ = ["PolicyMapping", "make_policy_mapping"]


class PolicyMapping:
    """A validated agent id -> policy id function; build it with :func:`make_policy_mapping`.

    Attributes:
        policy_ids: the policies an agent may be mapped to.
    """

    def __init__(self, fn: Callable[[str], str], policy_ids: frozenset[str], label: str) -> None:
        self._fn, self.policy_ids, self._label = fn, policy_ids, label

    def __call__(self, agent_id: str) -> str:
        policy_id = self._fn(agent_id)
        if policy_id not in self.policy_ids:
            raise ValueError(f"policy mapping {self._label} sent agent {agent_id!r} to policy {policy_id!r}, which is "
                             f"not among the known policy ids {sorted(self.policy_ids)}; fix the mapping or add "
                             f"the policy")
        return policy_id

    def __repr__(self) -> str:
        return f"PolicyMapping({self._label})"


def _lookup(table: Mapping[str, str], agent_id: str) -> str:
    try:
        return table[agent_id]
    except KeyError:
        raise ValueError(f"agent {agent_id!r} is not in the policy mapping (it maps {sorted(table)}); add it, or "
                         f"pass a callable agent_id -> policy_id") from None


def make_policy_mapping(mapping: Callable[[str], str] | Mapping[str, str] | None, policy_ids: Collection[str],
                        agent_ids: Collection[str] | None = ()) -> PolicyMapping:
    """Builds the agent -> policy function and checks it against the known policies now, not mid-run.

    Args:
        mapping: a dict agent id -> policy id (every target is checked), a callable agent id -> policy id
            (checked on ``agent_ids`` when given, and on every call), or ``None``: every agent maps to the
            only policy, or to ``"default_policy"`` when that is one of several.
        policy_ids: the policies that exist.
        agent_ids: the agents the env can produce (e.g. ``env.agent_ids``); each must map to a known
            policy now (empty or ``None``: nothing to check before the first call).

    Returns:
        A :class:`PolicyMapping` (picklable when ``mapping`` is).

    Raises:
        ValueError: no policy ids; targets that are not known policy ids (the message names them and the
            known ids); an agent of ``agent_ids`` that the mapping does not cover; ``None`` with several
            policies and no ``"default_policy"``.
        TypeError: ``mapping`` is neither a mapping, a callable nor ``None``.

    Examples:
        >>> make_policy_mapping({"agent_0": "pol_a", "agent_1": "pol_c"}, ["pol_a", "pol_b"])
        Traceback (most recent call last):
        ...
        ValueError: policy mapping targets {'agent_1': 'pol_c'} are not among the known policy ids ['pol_a', 'pol_b']; ...
        >>> by_parity = make_policy_mapping(lambda aid: f"pol_{int(aid[-1]) % 2}", ["pol_0", "pol_1"],
        ...                                 agent_ids=["agent_0", "agent_1", "agent_2"])
        >>> by_parity("agent_2"), make_policy_mapping(None, ["only"])("anyone")
        ('pol_0', 'only')
    """
    known = frozenset(policy_ids)
    if not known or not all(isinstance(p, str) for p in known):
        raise ValueError(f"policy_ids={sorted(map(repr, policy_ids))} must be a non-empty collection of strings")
    if mapping is None:
        if len(known) == 1:
            (only,) = known
        elif DEFAULT_POLICY_ID in known:
            only = DEFAULT_POLICY_ID
        else:
            raise ValueError(f"policy_mapping=None, but there are several policies {sorted(known)} and none is "
                             f"{DEFAULT_POLICY_ID!r}; pass a mapping agent id -> policy id")
        result = PolicyMapping(_FixedPolicy(only), known, f"every agent -> {only!r}")
    elif isinstance(mapping, Mapping):
        table = dict(mapping)
        bad = {aid: pid for aid, pid in table.items() if pid not in known}
        if bad:
            raise ValueError(f"policy mapping targets {bad} are not among the known policy ids {sorted(known)}; map "
                             f"those agents to known policies or add the policies")
        result = PolicyMapping(_TableLookup(table), known, repr(table))
    elif callable(mapping):
        result = PolicyMapping(mapping, known, getattr(mapping, "__qualname__", repr(mapping)))
    else:
        raise TypeError(f"policy mapping {mapping!r} must be a dict agent id -> policy id, a callable, or None")
    if agent_ids:
        failures: dict[str, str] = {}
        for aid in agent_ids:
            try:
                result(aid)
            except ValueError as err:
                failures[aid] = str(err).split(";")[0]
        if failures:
            raise ValueError(f"the policy mapping fails for agents {sorted(failures)} (known policy ids "
                             f"{sorted(known)}): {'; '.join(failures.values())}")
    return result


class _FixedPolicy:
    def __init__(self, policy_id: str) -> None:
        self.policy_id = policy_id

    def __call__(self, agent_id: str) -> str:
        return self.policy_id


class _TableLookup:
    def __init__(self, table: dict[str, str]) -> None:
        self.table = table

    def __call__(self, agent_id: str) -> str:
        return _lookup(self.table, agent_id)
