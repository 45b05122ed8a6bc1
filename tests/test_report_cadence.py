"""Item 10 of issue 31: every algorithm's default reporting cadence is gated on env steps, similar across
algorithms, and independent of the machine's speed (no wall-time gate)."""

from __future__ import annotations

import pytest

from flowrl.algorithms import ALGORITHMS, get_algorithm

pytestmark = pytest.mark.usefixtures("local_executor")  # what the plans compute, not Ray: see conftest.py


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_default_reports_are_gated_on_env_steps_not_seconds(name: str) -> None:
    config = get_algorithm(name).config_class()
    assert config.min_iter_time_s == 0
    if name == "maml":  # one result per meta-update (its plan has no report gate): 2 rounds of 2 x 10 x 200 steps
        assert config.timesteps_per_iteration == 0 and config.steps_per_meta_iteration == 8000
        return
    # a report spans 1000 env steps, or one train batch where that is larger (PPO's 4000); the algorithms made to read
    # a dataset (input=DIR) report every 10,000 rows read (5 of MARWIL's and BC's train batches), each with an
    # evaluation in the env
    per_report = max(config.timesteps_per_iteration, config.actual_train_batch_size or 0)
    assert 1000 <= per_report <= (10_000 if name in ("marwil", "bc", "cql_dqn") else 4000)
