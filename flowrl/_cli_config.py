"""``--config KEY=VALUE`` for the command line (:mod:`flowrl.cli`): each value parsed by its field's
:class:`~flowrl._config_hints.Hint` (the walker checkpoint data uses too), then the config built by its own
constructor, so its own validation runs. Every mistake is a ``ValueError`` naming the key and the value;
:mod:`flowrl.cli` turns it into a usage error.

Examples:
    >>> from flowrl.algorithms.ppo import PPOConfig
    >>> parse_overrides(PPOConfig, ["model.conv_filters=[[16,8,4]]", "env_config={\\"max_episode_steps\\": 9}"])
    [(('model', 'conv_filters'), ((16, 8, 4),)), (('env_config',), {'max_episode_steps': 9})]
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from typing import Any, Mapping, Sequence

from flowrl._config_hints import Hint, field_hints
from flowrl.algorithms import ALGORITHMS, get_algorithm

__all__ = ["build_config", "config_items", "parse_overrides"]

_NONE_WORDS = frozenset({"none", "null"})
_TRUE_WORDS, _FALSE_WORDS = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


class _NotSettable(Exception):
    """A field whose type holds a callable, a class or a nested config: no command-line spelling."""


def _nested(hint: Hint) -> type | None:
    """The config class of a nested config field, set through dotted keys (``model.hidden_sizes``); else None."""
    return hint.config_class if hint.kind == "config" and not hint.optional else None


def _settable(hint: Hint) -> bool:
    """Whether a field of this hint has a command-line spelling (no callable, class or nested config)."""
    if hint.kind in ("bool", "int", "float", "str", "choice"):
        return True
    if hint.kind == "tuple":
        return all(_settable(h) for h in hint.items)
    if hint.kind == "mapping":
        return hint.items[0].kind == "any" or _settable(hint.items[0])
    return False  # "any" alone, "config", "union", "opaque"


def _describe(hint: Hint) -> str:
    """What a value of this hint looks like on the command line."""
    if hint.optional:
        return f"{_describe(dataclasses.replace(hint, optional=False))} or none"
    if hint.kind == "choice":
        return f"one of {list(hint.choices)}"
    if hint.kind == "tuple":
        plural = {"int": "ints", "float": "numbers", "str": "strings"}
        if hint.variadic and hint.items[0].kind in plural and not hint.items[0].optional:
            kind = hint.items[0].kind
            return f"comma-separated {plural[kind]} (e.g. {'64,64' if kind != 'str' else 'a,b'})"
        return "a JSON list (e.g. [[16,8,4],[32,4,2]])"
    if hint.kind == "mapping":
        return 'a JSON object (e.g. {"max_episode_steps": 200})'
    return {"bool": "true or false", "int": "an int", "float": "a number", "str": "a string"}.get(hint.kind, hint.kind)


def _parse_value(text: str, hint: Hint) -> Any:
    """``text`` as a value of a field of this hint.

    Raises:
        ValueError: ``text`` does not spell such a value (the message says what would).
        _NotSettable: the hint has no command-line spelling.
    """
    if not _settable(hint):
        raise _NotSettable
    if hint.optional and text.strip().lower() in _NONE_WORDS:
        return None
    if hint.kind == "choice":
        if text not in hint.choices:
            raise ValueError
        return text
    if hint.kind == "bool":
        word = text.strip().lower()
        if word not in _TRUE_WORDS | _FALSE_WORDS:
            raise ValueError
        return word in _TRUE_WORDS
    if hint.kind == "int":
        try:
            return int(text)
        except ValueError:
            number = float(text)  # 4e3 is an int; 1.5 and "abc" are not
            if not number.is_integer():
                raise ValueError from None
            return int(number)
    if hint.kind == "float":
        return float(text)
    if hint.kind == "str":
        return text
    if hint.kind == "tuple":
        items: Any = json.loads(text) if text.lstrip().startswith("[") else (
            [] if not text.strip() else [item.strip() for item in text.split(",")])
        return _coerce(items, dataclasses.replace(hint, optional=False))
    value = json.loads(text)  # a mapping: _settable admits nothing else
    if not isinstance(value, dict):
        raise ValueError(f"expected {_describe(hint)}")
    return {k: _coerce(v, hint.items[0]) for k, v in value.items()} if hint.items[0].kind != "any" else value


def _coerce(value: Any, hint: Hint) -> Any:
    """An item of a tuple or mapping (a string from a comma list, or a JSON value) as this hint's."""
    if isinstance(value, str) and hint.kind != "any":
        return _parse_value(value, hint)
    if hint.kind == "tuple" and not hint.optional:
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {value!r}")
        if hint.variadic:
            return tuple(_coerce(v, hint.items[0]) for v in value)
        if len(value) != len(hint.items):
            raise ValueError(f"expected {len(hint.items)} items, got {value!r}")
        return tuple(_coerce(v, h) for v, h in zip(value, hint.items))
    if hint.kind == "float" and not hint.optional and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint.kind == "any" or (hint.kind == "int" and not hint.optional and isinstance(value, int)
                              and not isinstance(value, bool)):
        return value
    if hint.kind == "bool" and not hint.optional and isinstance(value, bool):
        return value
    raise ValueError(f"expected {_describe(hint)}, got {value!r}")


def _json_or_text(text: str) -> Any:
    """``text`` as the JSON value it spells, or as itself (for messages that show a value as JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _field_names(config_class: type, prefix: str = "") -> list[str]:
    """Every settable dotted key of a config class (for suggestions)."""
    names = []
    for name, hint in field_hints(config_class).items():
        names.append(prefix + name)
        nested = _nested(hint)
        if nested is not None:
            names += _field_names(nested, f"{prefix}{name}.")
    return names


def _field_default(config_class: type, name: str) -> Any:
    field = next(f for f in dataclasses.fields(config_class) if f.name == name)
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _parse_override(config_class: type, item: str) -> tuple[tuple[str, ...], Any]:
    """``"model.hidden_sizes=32,32"`` -> ``(("model", "hidden_sizes"), (32, 32))``; a nested config's field may go by
    its own name where no other field has it (``use_lstm=true`` is ``model.use_lstm=true``)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"{item!r} is not key=value; write e.g. --config lr=3e-4")
    path = tuple(key.split("."))
    if len(path) == 1 and key not in field_hints(config_class):  # a nested field by its own name, when unambiguous
        owners = [name for name in _field_names(config_class) if name.endswith("." + key)]
        if len(owners) == 1:
            path = tuple(owners[0].split("."))
    cls: type = config_class
    for depth, name in enumerate(path):
        hints = field_hints(cls)
        if name not in hints:
            close = difflib.get_close_matches(key, _field_names(config_class), n=3, cutoff=0.6)
            suggestion = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "no field is close"
            algo = next((n for n in ALGORITHMS if get_algorithm(n).config_class is config_class), None)
            listing = f"`flowrl algorithms {algo}`" if algo else f"{config_class.__name__}'s docstring"
            raise ValueError(f"{item}: {config_class.__name__} has no field {key!r}; {suggestion} ({listing} lists "
                             f"the fields)")
        hint = hints[name]
        nested = _nested(hint)
        if depth < len(path) - 1:
            if nested is None:
                head, rest = ".".join(path[:depth + 1]), ".".join(path[depth + 1:])
                if hint.kind == "mapping":
                    raise ValueError(f"{item}: {head} is a mapping, set whole as a JSON object: write --config "
                                     f"'{head}={json.dumps({rest: _json_or_text(text)})}'")
                raise ValueError(f"{item}: {head} is not a nested config, so it has no field {path[depth + 1]!r}")
            cls = nested
    if nested is not None:
        first = dataclasses.fields(nested)[0].name
        raise ValueError(f"{item}: {key} is a nested {nested.__name__}; set its fields with dotted keys, e.g. "
                         f"--config {key}.{first}=...")
    default = _field_default(cls, path[-1])
    try:
        return path, _parse_value(text, hint)
    except _NotSettable:
        shown = getattr(default, "__qualname__", None) or repr(default)
        raise ValueError(f"{item}: {key} holds a callable or a class (default {shown}), which cannot be set "
                         f"from the command line; build the config in Python and run Trainer(...) there") from None
    except ValueError as e:
        # scalar parse errors say nothing the message does not; JSON and tuple ones do
        detail = f" ({e})" if str(e) and not str(e).startswith(("could not convert", "invalid literal")) else ""
        raise ValueError(f"{item}: {key} takes {_describe(hint)}, not {text!r}{detail}; its default is "
                         f"{key}={default!r}") from None


def _construct(config_class: type, overrides: Sequence[tuple[tuple[str, ...], Any]], base: Any) -> Any:
    direct = {path[0]: value for path, value in overrides if len(path) == 1}
    nested: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
    for path, value in overrides:
        if len(path) > 1:
            nested.setdefault(path[0], []).append((path[1:], value))
    hints = field_hints(config_class)
    for name, sub in nested.items():
        sub_base = getattr(base, name) if base is not None else _field_default(config_class, name)
        direct[name] = _construct(hints[name].config_class or type(sub_base), sub, sub_base)
    return dataclasses.replace(base, **direct) if base is not None else config_class(**direct)


def parse_overrides(config_class: type, items: Sequence[str]) -> list[tuple[tuple[str, ...], Any]]:
    """Parses ``key=value`` items against a config class's field types (no config is built).

    Raises:
        ValueError: an item that is not ``key=value``, an unknown key (with the closest names), a key given
            twice, a value that does not parse as the field's type, or a field that holds a callable.
    """
    parsed, seen = [], set()
    for item in items:
        path, value = _parse_override(config_class, item)
        if path in seen:
            raise ValueError(f"{item}: {'.'.join(path)} is given twice; keep one")
        seen.add(path)
        parsed.append((path, value))
    return parsed


def build_config(config_class: type, items: Sequence[str], *, base: Any = None) -> Any:
    """A config of ``config_class`` with the ``key=value`` overrides ``items``, built by its constructor (or, given
    ``base``, by ``dataclasses.replace`` of it, which validates the same way).

    Raises:
        ValueError: as :func:`parse_overrides`, or the config's own validation (the message names the
            overrides given and the config's reason).

    Examples:
        >>> from flowrl.algorithms.ppo import PPOConfig
        >>> config = build_config(PPOConfig, ["lr=3e-4", "model.hidden_sizes=32,32", "grad_clip=none",
        ...                                   "batch_mode=complete_episodes", "use_gae=false"])
        >>> config.lr, config.model.hidden_sizes, config.grad_clip, config.batch_mode, config.use_gae
        (0.0003, (32, 32), None, 'complete_episodes', False)
        >>> build_config(PPOConfig, ["use_lstm=true", "lstm_cell_size=64"]).model.lstm_cell_size  # model.* by name
        64
        >>> build_config(PPOConfig, ["num_sgd_iter=1.5"])
        Traceback (most recent call last):
        ...
        ValueError: num_sgd_iter=1.5: num_sgd_iter takes an int, not '1.5'; its default is num_sgd_iter=30
    """
    overrides = parse_overrides(config_class, items)
    try:
        return _construct(config_class, overrides, base)
    except (ValueError, TypeError) as e:
        given = " ".join(items) if items else "the defaults"
        raise ValueError(f"{config_class.__name__} rejects {given}: {e}") from None




def _plain(value: Any) -> Any:
    """A value as JSON can hold it: numpy scalars as Python numbers, tuples as lists."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def config_items(values: Mapping[str, Any]) -> list[str]:
    """Python values for dotted config keys, spelled as ``--config`` items, so that :func:`build_config` checks them
    exactly as it checks the command line's.

    Examples:
        >>> config_items({"lr": 0.001, "model.hidden_sizes": (32, 32), "grad_clip": None, "use_gae": False})
        ['lr=0.001', 'model.hidden_sizes=[32, 32]', 'grad_clip=none', 'use_gae=false']
    """
    items = []
    for key, value in values.items():
        value = _plain(value)
        if value is None:
            text = "none"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, dict)):
            text = json.dumps(value)
        else:
            text = str(value)
        items.append(f"{key}={text}")
    return items
