"""Helpers shared by tests and doctests; no library module imports this one."""

from __future__ import annotations

from typing import Iterable, TypeVar

from flowrl.iter import LocalIterator

__all__ = ["iter_list"]

T = TypeVar("T")


def iter_list(items: Iterable[T]) -> LocalIterator[T]:
    """A local iterator over a list, named ``iter_list``.

    Examples:
        >>> iter_list([1, 2]).for_each(lambda x: x + 1).take(5)
        [2, 3]
    """
    return LocalIterator.from_iterable(list(items), name="iter_list")
