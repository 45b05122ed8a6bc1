"""The local executor keeps Ray's semantics for what flowrl relies on: per-caller order, copies across the actor
boundary, errors kept in the reference, dead actors, waits, puts, remote functions and scheduled learners."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import traceback
from typing import Any

import numpy as np
import pytest
import torch

from flowrl import executor, runtime
from flowrl.ops.learner import ApexLearnerThread, LearnerThread, MultiGPULearnerThread
from flowrl.testing import FakeConfig, FakeWorker, fake_batch


class Box:
    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.calls: list[str] = []

    def append(self, x: int) -> list[int]:
        self.calls.append(f"append({x})")
        self.items.append(x)
        return self.items

    def fail(self, message: str) -> None:
        raise KeyError(message)

    def takes(self, value: Any) -> Any:
        return value

    def threads(self, n: int) -> int:
        torch.set_num_threads(n)
        return int(torch.get_num_threads())


def local(cls: type, *args: Any) -> Any:
    with runtime.local_executor():
        return executor.create_actor(cls, *args)


def test_calls_run_in_submission_order_and_every_reference_is_ready() -> None:
    box = local(Box, [])
    refs = [box.append.remote(i) for i in range(4)]
    ready, rest = executor.wait(refs, num_returns=2, timeout=0)
    assert (ready, rest) == (refs[:2], refs[2:])
    assert [r for r in executor.get(refs)] == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]
    assert executor.wait(refs, num_returns=4, timeout=0) == (refs, [])


def test_arguments_and_answers_are_copies_as_on_ray() -> None:
    given = [1, 2]
    box = local(Box, given)
    answer = executor.get(box.append.remote(3))
    given.append(99)  # the actor got a copy at construction
    answer.append(100)  # and the caller gets a copy of the answer
    assert executor.get(box.append.remote(4)) == [1, 2, 3, 4]
    array = np.zeros(3)
    ref = box.takes.remote(array)
    array[0] = 5.0  # changed after the call was submitted: the actor saw the value at submission
    assert executor.get(ref).tolist() == [0.0, 0.0, 0.0]


def test_a_put_resolves_as_a_top_level_argument_and_a_handle_comes_back_as_itself() -> None:
    box = local(Box, [])
    with runtime.local_executor():
        ref = executor.put({"w": np.arange(3)})
    assert isinstance(ref, executor.LocalRef)
    assert executor.get(box.takes.remote(ref))["w"].tolist() == [0, 1, 2]
    assert executor.get(box.takes.remote([box]))[0] is box  # a handle inside an argument is the same actor
    nested = executor.get(box.takes.remote([ref]))[0]  # a nested reference stays a reference, as on Ray
    assert isinstance(nested, executor.LocalRef) and executor.get(nested)["w"].tolist() == [0, 1, 2]


def test_an_error_is_kept_in_the_reference_and_raised_as_itself_with_the_actor_frame_last() -> None:
    box = local(Box, [])
    ref = box.fail.remote("boom")  # submitting does not raise
    with pytest.raises(KeyError, match="boom") as info:
        executor.get(ref)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].name == "fail" and frames[-1].filename == __file__
    assert executor.get(box.append.remote(1)) == [1]  # the actor lives on after a failed call, as on Ray


def test_a_killed_actor_answers_with_the_actor_died_error_ray_code_catches() -> None:
    box = local(Box, [])
    executor.kill(box)
    ref = box.append.remote(1)
    with pytest.raises(executor.ActorDiedError, match="was killed"):
        executor.get(ref)
    assert isinstance(pickle.loads(pickle.dumps(ref)), executor.LocalRef)
    with pytest.raises(AttributeError, match="no method 'nope'"):
        box.nope  # noqa: B018


def test_an_actor_keeps_its_own_torch_threads_and_the_driver_keeps_its_own() -> None:
    before = torch.get_num_threads()
    box = local(Box, [])
    assert executor.get(box.threads.remote(1)) == 1
    assert torch.get_num_threads() == before


def test_remote_functions_run_at_once_on_copies() -> None:
    with runtime.local_executor():
        double = executor.remote_function(lambda xs: [2 * x for x in xs])
    refs = [double.remote([i]) for i in range(3)]
    assert executor.get(refs) == [[0], [2], [4]]


def test_the_executor_name_is_checked() -> None:
    with pytest.raises(ValueError, match="executor='dask' is not one of"):
        with executor.using("dask"):
            pass
    with pytest.raises(ValueError, match="executor='thread'; use 'ray'"):
        FakeConfig(executor="thread")  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [
    lambda w: LearnerThread(w, num_sgd_iter=2, learner_queue_size=2),
    lambda w: MultiGPULearnerThread(w, num_gpus=0, train_batch_size=4, num_sgd_iter=2, learner_queue_size=2,
                                    num_data_load_threads=2),
], ids=["learner", "multi_gpu"])
def test_a_scheduled_learner_trains_each_put_in_the_putting_thread(make: Any) -> None:
    with runtime.local_executor():
        learner = make(FakeWorker(config=FakeConfig()))
    learner.start()
    assert learner.scheduled and learner.is_alive() and learner.ident is None  # no OS thread
    for _ in range(3):  # a bounded queue of 2 never fills: each put trains at once
        learner.inqueue.put(fake_batch(4))
    assert [learner.outqueue.get_nowait()[0] for _ in range(6)] == [4] * 6  # num_sgd_iter=2 passes each
    assert learner.outqueue.empty() and learner.num_steps == 6
    learner.stop()
    learner.join()
    assert not learner.is_alive()


def test_a_scheduled_learner_keeps_its_error_and_ends() -> None:
    with runtime.local_executor():
        learner = ApexLearnerThread(FakeWorker(config=FakeConfig()))
    learner.start()
    learner.inqueue.put("not a pair")  # the put itself does not raise: the learner keeps the error
    assert isinstance(learner.error, ValueError) and not learner.is_alive()


def test_a_local_trainer_starts_no_ray() -> None:
    code = textwrap.dedent("""
        import ray
        from flowrl.algorithms.ppo import PPOConfig
        from flowrl.trainer import Trainer
        trainer = Trainer("ppo", PPOConfig(num_workers=2, executor="local", rollout_fragment_length=50,
                                          train_batch_size=100, sgd_minibatch_size=50, num_sgd_iter=1, seed=0))
        result = trainer.train()
        print(result["timesteps_total"], ray.is_initialized(), [type(w).__name__ for w in
              trainer.workers.remote_workers()])
        trainer.stop()
    """)
    env = {**os.environ, "RAY_ADDRESS": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "100 False ['LocalActor', 'LocalActor']"
