"""flowrl/collective.py's same-machine exchange: gradients summed through shared memory equal gloo's bit for bit, a
lost member fails its peers at once, nothing is left in /dev/shm, and a group that cannot share memory uses gloo."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any, Callable

import pytest

from flowrl import collective

pytestmark = pytest.mark.skipif(not os.path.isdir(collective.SHARED_MEMORY_ROOT),
                                reason=f"no {collective.SHARED_MEMORY_ROOT} here: groups always use gloo")


def run_group(world: int, member: Callable[..., None], *args: Any, expect: int | None = None,
              timeout_s: float = 60.0) -> dict[int, Any]:
    """Runs ``member(rank, world, port, queue, *args)`` in ``world`` fresh processes; each puts ``(rank, result)``
    on the queue; returns the results by rank (``expect`` of them: fewer when a member dies)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = collective.CollectiveMember().collective_rendezvous()[1]  # a port free on this machine now
    procs = [ctx.Process(target=member, args=(rank, world, port, queue, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=timeout_s) for _ in range(world if expect is None else expect))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results


def leftovers() -> list[str]:
    return sorted(name for name in os.listdir(collective.SHARED_MEMORY_ROOT) if name.startswith("flowrl-collective-"))


def _sums(rank: int, world: int, port: int, queue: Any, no_root: bool, hide_from: int | None,
          no_space_at: int | None = None) -> None:
    import torch

    from flowrl import collective as c

    if no_root:
        c.SHARED_MEMORY_ROOT = "/nonexistent/flowrl-test"
    if hide_from == rank:  # this member cannot see rank 0's directory, as on another machine
        c.os.path.exists = lambda path: False  # type: ignore[assignment]
    if no_space_at == rank:  # this member's /dev/shm has no room for the files
        c.os.statvfs = lambda path: os.statvfs_result((4096, 4096, 100, 0, 0, 100, 0, 0, 0, 255))  # type: ignore
    group = c.Collective(rank, c.Rendezvous("127.0.0.1", port, world, "gloo", 30.0))
    generator = torch.Generator().manual_seed(rank)
    shared, gloo = [], []
    for _ in range(5):  # odd and even calls use the two halves of each member's file
        flat = torch.randn(3001, generator=generator) * 10.0 ** rank
        params = [torch.nn.Parameter(torch.zeros(1000)), torch.nn.Parameter(torch.zeros(2001))]
        params[0].grad, params[1].grad = flat[:1000].clone(), flat[1000:].clone()
        group.average_gradients(params, weight=0.25 * (rank + 1))
        shared.append(torch.cat([p.grad for p in params]))
        scaled = flat * (0.25 * (rank + 1))
        out = torch.empty(world * scaled.numel())
        c._all_gather_single(out, scaled)  # the gloo gather path, for comparison
        gloo.append(out.view(world, -1).sum(0))
    through_memory = group._shared is not None and group._shared._size == 3001  # (-1: the files found no room)
    queue.put((rank, (through_memory, all(torch.equal(a, b) for a, b in zip(shared, gloo)),
                      [float(s[0]) for s in shared])))
    group.close()


def test_shared_memory_sums_equal_the_gloo_sums_on_every_member_and_leave_nothing_behind() -> None:
    results = run_group(3, _sums, False, None)
    assert {rank: r[:2] for rank, r in results.items()} == {0: (True, True), 1: (True, True), 2: (True, True)}
    assert results[0][2] == results[1][2] == results[2][2]  # the same bits everywhere
    assert leftovers() == []


@pytest.mark.parametrize("no_root, hide_from, no_space_at", [
    pytest.param(True, None, None, marks=pytest.mark.slow), (False, 2, None), (False, None, 1)],
    ids=["no-dev-shm", "another-machine", "no-room"])
def test_a_group_that_cannot_share_memory_uses_gloo(no_root: bool, hide_from: int | None,
                                                    no_space_at: int | None) -> None:
    results = run_group(3, _sums, no_root, hide_from, no_space_at)
    assert {rank: r[:2] for rank, r in results.items()} == {0: (False, True), 1: (False, True), 2: (False, True)}
    assert leftovers() == []


def _loses_a_member(rank: int, world: int, port: int, queue: Any, how: str) -> None:
    import torch

    from flowrl import collective as c

    group = c.Collective(rank, c.Rendezvous("127.0.0.1", port, world, "gloo", 4.0))
    param = torch.nn.Parameter(torch.zeros(100))
    for step in range(20):
        if rank == 1 and step == 5:
            if how == "dies":
                os._exit(1)
            time.sleep(8)  # hangs past the group's timeout
        param.grad = torch.ones(100)
        start = time.monotonic()
        try:
            group.average_gradients([param])
        except c.PeerLostError as e:
            queue.put((rank, (step, time.monotonic() - start, str(e))))
            group.close()
            return
    queue.put((rank, "no error"))


@pytest.mark.parametrize("how", ["dies", pytest.param("hangs", marks=pytest.mark.slow)])  # a hang waits out a timeout
def test_a_lost_member_fails_every_other_member(how: str) -> None:
    """A dead member is seen at once (its pipe closes); a hung one after the group's timeout (4 s here). Rank 0
    sees it first and closes its pipes, so the others learn it at once too."""
    results = run_group(4, _loses_a_member, how, expect=3, timeout_s=90.0)
    assert sorted(results) == [0, 2, 3]
    for rank, (step, waited, message) in results.items():
        assert step == 5 and "lost" in message, (rank, message)
        assert waited < (3.0 if how == "dies" else 4.0 + 3.0), (rank, waited)
    assert leftovers() == []
