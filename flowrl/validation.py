"""Declared bounds for numbers: one check for every config field and operator argument that is an int or a
real number with limits.

A config dataclass declares a field's limits where it declares the field, with :func:`bounded`, and
:func:`check_bounds` (which :class:`flowrl.config.PolicyConfig` runs first in ``__post_init__``, so every
config that extends it is covered) checks them all. Whether a field is an int or a real number comes from its
annotation (``int``, ``float``, either with ``| None``); ``bool`` is never a number here. Operators check
their constructor arguments with :func:`check_int` and :func:`check_number`. Every error names the field, the
value, what is allowed and what the field means. Checks that relate two fields stay explicit in the config's
``__post_init__``.

Examples:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class Settings:
    ...     batch: int = bounded(32, ge=1, meaning="rows per batch")
    ...     lr: float = bounded(1e-3, gt=0)
    ...     clip: float | None = bounded(None, gt=0, meaning="None: no clipping")
    ...     def __post_init__(self) -> None:
    ...         check_bounds(self)
    >>> Settings(batch=0)
    Traceback (most recent call last):
    ...
    ValueError: batch=0 must be an int >= 1 (rows per batch)
    >>> Settings(batch=True)
    Traceback (most recent call last):
    ...
    ValueError: batch=True must be an int >= 1 (rows per batch)
    >>> Settings(lr=float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: lr=nan must be a number > 0
    >>> Settings(clip=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: clip=-1.0 must be a number > 0, or None (None: no clipping)
    >>> Settings(batch=8, clip=0.5).clip
    0.5

    A subclass that redeclares a field only to change its default keeps the limits:

    >>> @dataclass(frozen=True, kw_only=True)
    ... class Larger(Settings):
    ...     batch: int = 256
    >>> Larger(batch=-1)
    Traceback (most recent call last):
    ...
    ValueError: batch=-1 must be an int >= 1 (rows per batch)
"""

from __future__ import annotations

import dataclasses
import numbers
import types
from dataclasses import dataclass
from typing import Any, Callable, Union, get_args, get_origin

__all__ = ["Bounds", "bounded", "check_bounds", "check_int", "check_number", "describe_bounds"]

_METADATA_KEY = "flowrl.bounds"


@dataclass(frozen=True)
class Bounds:
    """The limits of one number: any of ``ge`` (>=), ``gt`` (>), ``le`` (<=), ``lt`` (<); ``integer``: an int
    (a bool is never accepted); ``none_ok``: ``None`` is allowed too; ``meaning``: what the value means, said in
    the error."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    integer: bool = False
    none_ok: bool = False
    meaning: str = ""

    def allows(self, value: object) -> bool:
        """Whether ``value`` is within these bounds (NaN never is)."""
        if value is None:
            return self.none_ok
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if self.integer else numbers.Real):
            return False
        number = float(value)
        return ((self.ge is None or number >= self.ge) and (self.gt is None or number > self.gt)
                and (self.le is None or number <= self.le) and (self.lt is None or number < self.lt)
                and number == number)

    def describe(self) -> str:
        """What is allowed, in words: ``"an int >= 1"``, ``"a number in [0, 1]"``, ``"a number > 0, or None"``."""
        kind = "an int" if self.integer else "a number"
        low = (self.ge, True) if self.ge is not None else (self.gt, False) if self.gt is not None else None
        high = (self.le, True) if self.le is not None else (self.lt, False) if self.lt is not None else None
        if low is not None and high is not None:
            text = f"{kind} in {'[' if low[1] else '('}{_num(low[0])}, {_num(high[0])}{']' if high[1] else ')'}"
        elif low is not None:
            text = f"{kind} {'>=' if low[1] else '>'} {_num(low[0])}"
        elif high is not None:
            text = f"{kind} {'<=' if high[1] else '<'} {_num(high[0])}"
        else:
            text = kind
        return text + (", or None" if self.none_ok else "")


def _num(bound: float | None) -> str:
    return str(int(bound)) if bound is not None and float(bound).is_integer() else str(bound)


def describe_bounds(name: str, value: object, bounds: Bounds) -> str:
    """The error text for ``name=value`` outside ``bounds``.

    Examples:
        >>> describe_bounds("gamma", 1.5, Bounds(ge=0, le=1, meaning="discount"))
        'gamma=1.5 must be a number in [0, 1] (discount)'
    """
    return f"{name}={value!r} must be {bounds.describe()}" + (f" ({bounds.meaning})" if bounds.meaning else "")


def bounded(default: Any = dataclasses.MISSING, *, default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
            ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
            meaning: str = "") -> Any:
    """A dataclass field with declared bounds that :func:`check_bounds` checks; whether it must be an int and
    whether ``None`` is allowed come from the field's annotation (``int``, ``float``, ``... | None``).

    ``bounded(200, ge=1, meaning="steps per train batch")`` is ``field(default=200, metadata=...)``;
    ``default_factory`` works as in :func:`dataclasses.field`.
    """
    limits = {"ge": ge, "gt": gt, "le": le, "lt": lt, "meaning": meaning}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={_METADATA_KEY: limits})
    return dataclasses.field(default=default, metadata={_METADATA_KEY: limits})


_ANNOTATIONS = {"int": (True, False), "float": (False, False), "int|None": (True, True),
                "float|None": (False, True), "None|int": (True, True), "None|float": (False, True),
                "Optional[int]": (True, True), "Optional[float]": (False, True)}


def _kind(owner: type, name: str, annotation: Any) -> tuple[bool, bool]:
    """(integer, none_ok) from a field's annotation: a string under ``from __future__ import annotations``."""
    if isinstance(annotation, str):
        known = _ANNOTATIONS.get(annotation.replace(" ", ""))
        if known is not None:
            return known
    else:
        args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
        members = [a for a in args if a is not type(None)]
        if len(members) == 1 and members[0] in (int, float):
            return members[0] is int, len(args) > 1
    raise TypeError(f"{owner.__name__}.{name} is declared with bounded(...) but annotated {annotation!r}; "
                    f"bounds apply to int, float, int | None and float | None fields")


_CLASS_BOUNDS: dict[type, tuple[tuple[str, Bounds], ...]] = {}


def _class_bounds(cls: type) -> tuple[tuple[str, Bounds], ...]:
    if cls not in _CLASS_BOUNDS:
        entries = []
        for f in dataclasses.fields(cls):
            # A subclass that redeclares a field to change its default keeps the limits declared above it.
            declared = (vars(klass).get("__dataclass_fields__", {}).get(f.name) for klass in cls.__mro__)
            limits = next((d.metadata[_METADATA_KEY] for d in declared
                           if d is not None and _METADATA_KEY in d.metadata), None)
            if limits is not None:
                integer, none_ok = _kind(cls, f.name, f.type)
                entries.append((f.name, Bounds(integer=integer, none_ok=none_ok, **limits)))
        _CLASS_BOUNDS[cls] = tuple(entries)
    return _CLASS_BOUNDS[cls]


def check_bounds(config: Any) -> None:
    """Checks every field of the dataclass instance ``config`` that was declared with :func:`bounded`, in
    declaration order.

    Raises:
        ValueError: the first field outside its bounds, naming the field, the value, what is allowed and what
            it means.
    """
    for name, bounds in _class_bounds(type(config)):
        value = getattr(config, name)
        if not bounds.allows(value):
            raise ValueError(describe_bounds(name, value, bounds))


def check_int(what: str, value: object, ge: int, meaning: str = "", *, le: int | None = None) -> None:
    """A ValueError unless ``value`` is an int (not a bool) >= ``ge`` (and <= ``le``); ``what`` names it,
    ``meaning`` explains it.

    Examples:
        >>> check_int("ConcatBatches min_batch_size", 0, 1, "steps per train batch")
        Traceback (most recent call last):
        ...
        ValueError: ConcatBatches min_batch_size=0 must be an int >= 1 (steps per train batch)
    """
    bounds = Bounds(ge=ge, le=le, integer=True, meaning=meaning)
    if not bounds.allows(value):
        raise ValueError(describe_bounds(what, value, bounds))


def check_number(what: str, value: object, *, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, lt: float | None = None, none_ok: bool = False, meaning: str = "") -> None:
    """A ValueError unless ``value`` is a real number (not a bool, not NaN) within the given bounds, or ``None``
    where ``none_ok``.

    Examples:
        >>> check_number("OncePerTimeInterval delay", -1, ge=0, meaning="seconds")
        Traceback (most recent call last):
        ...
        ValueError: OncePerTimeInterval delay=-1 must be a number >= 0 (seconds)
    """
    bounds = Bounds(ge=ge, gt=gt, le=le, lt=lt, none_ok=none_ok, meaning=meaning)
    if not bounds.allows(value):
        raise ValueError(describe_bounds(what, value, bounds))
