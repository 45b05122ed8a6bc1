"""The one walker over config type hints (flowrl._config_hints) that --config parsing and checkpoint data share."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from flowrl._cli_config import _settable, parse_overrides
from flowrl._config_hints import config_field_types, field_hints
from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.config import PolicySpec, RolloutConfig, config_to_data


@dataclass(frozen=True)
class _Unresolvable:
    hook: NotImportedAnywhere | None = None  # type: ignore[name-defined]  # noqa: F821


def test_an_annotation_naming_an_unknown_name_is_an_error_naming_it() -> None:
    with pytest.raises(NameError, match=r"'NotImportedAnywhere'.*HINT_NAMES"):
        config_field_types(_Unresolvable)


def test_a_type_checking_only_class_is_not_data() -> None:
    hint = field_hints(PolicySpec)["policy_class"]
    assert (hint.kind, hint.optional) == ("opaque", True)
    assert field_hints(RolloutConfig)["env"].kind == "str"  # str | env callables: only the str is data


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_settable_field_given_as_its_checkpoint_data_parses_to_the_configs_value(name: str) -> None:
    """--config KEY=VALUE and checkpoint data read a field through the same hint, so they agree on its value."""
    config_class = get_algorithm(name).config_class
    config = config_class(num_workers=2)
    data = config_to_data(config)["fields"]
    checked = 0
    for field, hint in field_hints(config_class).items():
        if not _settable(hint) or field not in data:
            continue
        value = data[field]
        text = "none" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        [(_, parsed)] = parse_overrides(config_class, [f"{field}={text}"])
        assert parsed == getattr(config, field), (field, text, parsed)
        checked += 1
    assert checked >= 20
