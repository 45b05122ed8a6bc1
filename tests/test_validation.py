"""Declared bounds (flowrl.validation) across every registered algorithm's config, and renamed config fields."""

from __future__ import annotations

import dataclasses

import pytest

from flowrl.algorithms import ALGORITHMS, get_algorithm
from flowrl.config import config_from_data, config_to_data
from flowrl.validation import _class_bounds


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("field, bad", [("num_workers", True), ("num_workers", -1), ("train_batch_size", 0),
                                        ("lr", 0.0), ("gamma", 1.5), ("rollout_fragment_length", 2.5)])
def test_every_algorithm_refuses_the_shared_fields_out_of_bounds(name: str, field: str, bad: object) -> None:
    config_class = get_algorithm(name).config_class
    with pytest.raises(ValueError, match=f"^{field}={bad!r} must be "):
        config_class(**{field: bad})


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_default_is_within_its_declared_bounds(name: str) -> None:
    config = get_algorithm(name).config_class()
    for field, bounds in _class_bounds(type(config)):
        assert bounds.allows(getattr(config, field)), (name, field, getattr(config, field), bounds)


def test_checkpoint_data_written_with_the_old_fake_gpus_name_still_restores() -> None:
    config_class = get_algorithm("pg").config_class
    data = config_to_data(config_class(num_workers=0, fake_gpus=True))
    fields = dict(data["fields"])
    fields["_fake_gpus"] = fields.pop("fake_gpus")
    restored = config_from_data(config_class, {**data, "fields": fields})
    assert restored.fake_gpus is True
    assert dataclasses.replace(restored) == config_class(num_workers=0, fake_gpus=True)


def test_substrate_and_core_arguments_refuse_bools_and_out_of_range_values() -> None:
    import numpy as np

    from flowrl.metrics import Timer
    from flowrl.postprocessing import compute_nstep
    from flowrl.runtime import actor_options
    from flowrl.sample_batch import MultiAgentBatch, SampleBatch

    batch = SampleBatch({"obs": np.zeros(4)})
    cases = [(lambda: Timer(window_size=True), "Timer window_size=True must be an int >= 1"),
             (lambda: list(batch.minibatches(True)), "minibatch size=True must be an int >= 1"),
             (lambda: MultiAgentBatch({}, env_steps=-1), "MultiAgentBatch env_steps=-1 must be an int >= 0"),
             (lambda: actor_options(num_cpus=-1), "actor num_cpus=-1 must be a number >= 0"),
             (lambda: compute_nstep(rewards=np.zeros(2), terminateds=np.zeros(2, bool), truncateds=np.zeros(2, bool),
                                    n=0, gamma=0.9), "n=0 must be an int >= 1 (1 is the one-step return)")]
    for call, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call()
