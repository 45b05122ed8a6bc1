"""What each field of a config dataclass holds, read once from its type hint: the one walker over config
annotations. The command line's ``--config KEY=VALUE`` parsing (:mod:`flowrl._cli_config`) and checkpoint data
(:func:`flowrl.config.config_from_data`) both work from its :class:`Hint`, never from ``typing`` objects.

Annotations are strings (``from __future__ import annotations``); :func:`config_field_types` resolves them with
:func:`typing.get_type_hints`. A config module may import a name only under ``TYPE_CHECKING`` (``Policy``
imports torch, which configs must not): :data:`HINT_NAMES` maps each such name, explicitly, and any other name
that does not resolve is an error naming it.

Examples:
    >>> from flowrl.config import ModelConfig, PolicySpec
    >>> hints = field_hints(ModelConfig)
    >>> hints["hidden_sizes"].kind, hints["hidden_sizes"].items[0].kind, hints["hidden_sizes"].variadic
    ('tuple', 'int', True)
    >>> hints["activation"].choices
    ('tanh', 'relu', 'elu')
    >>> field_hints(PolicySpec)["policy_class"]  # type[Policy] | None: a class, never data
    Hint(kind='opaque', optional=True)
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Union, get_args, get_origin

import gymnasium

from flowrl.envs.multi_agent import MultiAgentEnv

__all__ = ["Hint", "HINT_NAMES", "TypeCheckingOnly", "config_field_types", "field_hints", "read_hint"]


class TypeCheckingOnly:
    """Stands for a class that a config module imports only under ``TYPE_CHECKING`` and that cannot be imported
    where configs are (``flowrl.policy.Policy`` imports torch): a field typed with it holds a class or an object,
    never plain data."""


#: names that config annotations use but their modules import only under ``TYPE_CHECKING``, and what each stands
#: for when the annotations are resolved (the real object where importing it is free, else
#: :class:`TypeCheckingOnly`). A config annotation naming another such name is an error that says to add it here.
HINT_NAMES: dict[str, Any] = {
    "gymnasium": gymnasium,  # EnvSpec's "gymnasium.Env[Any, Any]", resolved in config.py's namespace
    "MultiAgentEnv": MultiAgentEnv,  # EnvSpec's, from flowrl.envs.base
    "Policy": TypeCheckingOnly,  # PolicySpec.policy_class: type[Policy] | None
}

Kind = Literal["bool", "int", "float", "str", "any", "choice", "tuple", "mapping", "config", "union", "opaque"]


@dataclass(frozen=True)
class Hint:
    """What a field (or an item of one) holds.

    Attributes:
        kind: ``"bool"``, ``"int"``, ``"float"``, ``"str"``, ``"any"``; ``"choice"`` (a ``Literal``);
            ``"tuple"``; ``"mapping"`` (string keys); ``"config"`` (a nested config dataclass); ``"union"`` (of
            several data kinds); ``"opaque"``: a callable, a class or anything else that is not data.
        optional: ``None`` is a value too (``... | None``).
        choices: a ``"choice"``'s values.
        items: a ``"tuple"``'s item hints (one when ``variadic``), a ``"mapping"``'s value hint, a ``"union"``'s
            members.
        variadic: ``tuple[X, ...]``.
        config_class: a ``"config"``'s dataclass.
    """

    kind: Kind
    optional: bool = False
    choices: tuple[Any, ...] = ()
    items: tuple[Hint, ...] = ()
    variadic: bool = False
    config_class: type | None = None

    def __repr__(self) -> str:
        shown = [f"kind={self.kind!r}"] + [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)[1:]
                                             if getattr(self, f.name) != f.default]
        return f"Hint({', '.join(shown)})"


_SCALARS: dict[Any, Kind] = {bool: "bool", int: "int", float: "float", str: "str", Any: "any"}


def read_hint(tp: Any) -> Hint:
    """The :class:`Hint` of a resolved type hint.

    A union keeps its data members (callables and classes dropped): one member is that member's hint (made
    optional by ``| None``); none is ``"opaque"``.

    Examples:
        >>> read_hint(int | None)
        Hint(kind='int', optional=True)
        >>> read_hint(tuple[tuple[int, int], ...]).items[0].items
        (Hint(kind='int'), Hint(kind='int'))
        >>> read_hint(typing.Callable[[str], str] | typing.Mapping[str, str] | None)
        Hint(kind='mapping', optional=True, items=(Hint(kind='str'),))
    """
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        optional = type(None) in args
        members = [h for h in (read_hint(a) for a in args if a is not type(None)) if h.kind != "opaque"]
        if len(members) == 1:
            return dataclasses.replace(members[0], optional=optional or members[0].optional)
        return Hint("union" if members else "opaque", optional=optional, items=tuple(members))
    if tp in _SCALARS:
        return Hint(_SCALARS[tp])
    if origin is Literal:
        return Hint("choice", choices=args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return Hint("tuple", items=(read_hint(args[0]),), variadic=True)
        return Hint("tuple", items=tuple(read_hint(a) for a in args))
    if origin in (dict, collections.abc.Mapping):
        return Hint("mapping", items=(read_hint(args[1]) if args else Hint("any"),))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return Hint("config", config_class=tp)
    return Hint("opaque")  # type[...], Callable[...], TypeCheckingOnly, any other class


_TYPES: dict[type, dict[str, Any]] = {}
_HINTS: dict[type, dict[str, Hint]] = {}


def config_field_types(config_class: type) -> dict[str, Any]:
    """The resolved type of each field of a config dataclass (:func:`typing.get_type_hints`, with
    :data:`HINT_NAMES` for the names its module imports only under ``TYPE_CHECKING``).

    Raises:
        NameError: an annotation names something that is neither importable from its module nor in
            :data:`HINT_NAMES`.

    Examples:
        >>> from flowrl.config import ModelConfig, PolicySpec
        >>> types_ = config_field_types(ModelConfig)
        >>> types_["hidden_sizes"], types_["free_log_std"]
        (tuple[int, ...], <class 'bool'>)
        >>> config_field_types(PolicySpec)["policy_class"]
        type[flowrl._config_hints.TypeCheckingOnly] | None
    """
    if config_class not in _TYPES:
        try:
            hints = typing.get_type_hints(config_class, localns=HINT_NAMES)
        except NameError as e:
            raise NameError(f"{config_class.__qualname__}'s field annotations name {e.name!r}, which its module "
                            f"does not define at run time (an import under TYPE_CHECKING?); add it to "
                            f"flowrl._config_hints.HINT_NAMES") from e
        _TYPES[config_class] = {f.name: hints[f.name] for f in dataclasses.fields(config_class)}
    return dict(_TYPES[config_class])


def field_hints(config_class: type) -> Mapping[str, Hint]:
    """The :class:`Hint` of each field of a config dataclass, by name."""
    if config_class not in _HINTS:
        _HINTS[config_class] = {name: read_hint(tp) for name, tp in config_field_types(config_class).items()}
    return _HINTS[config_class]
