"""A checkpoint read in the driver never races a learner thread: RolloutWorker.learn_lock is the learner
threads' weights_lock, and the worker's get_state/set_state hold it."""

from __future__ import annotations

import threading

from flowrl.config import RolloutConfig
from flowrl.ops.concurrency import LearnerThread
from flowrl.testing import TinyPGPolicy
from flowrl.workers import RolloutWorker


def make_worker() -> RolloutWorker:
    return RolloutWorker(policy_class=TinyPGPolicy, config=RolloutConfig(rollout_fragment_length=10, seed=0))


def test_learner_threads_train_under_the_workers_learn_lock() -> None:
    worker = make_worker()
    learner = LearnerThread(worker, learner_queue_size=2)
    assert learner.weights_lock is worker.learn_lock


def test_get_state_and_set_state_wait_for_the_step_in_progress() -> None:
    worker = make_worker()
    state = worker.get_state()
    for call in (worker.get_state, lambda: worker.set_state(state)):
        done = threading.Event()
        with worker.learn_lock:  # a learner thread's step in progress
            reader = threading.Thread(target=lambda: (call(), done.set()))
            reader.start()
            assert not done.wait(0.5), "read the worker's state while a learner step held its lock"
        reader.join(timeout=60)
        assert done.is_set()
