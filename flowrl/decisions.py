"""Record and replay the nondeterministic decisions of a run, so that an asynchronous run can be re-run exactly.

On Ray, what an asynchronous plan computes depends on timing at a handful of points, all in the driver:

- ``wait``: which requests a gather (or a reap of fire-and-forget calls) found completed;
- ``get`` / ``put`` on a learner thread's out- and in-queue: whether an item was there, or room for one;
- ``flag`` / ``lock``: how far the learner thread had trained when the driver read its ``weights_updated`` flag or
  took its ``weights_lock`` (to read its weights or update its target network).

A :class:`Recorder` (``record=PATH`` in a Trainer's config) writes each decision, in order, as one JSON line
``[kind, site, value, progress]``: the kind above, the site (the operator or function that decided), the
decision (the ready positions of a wait, 1/0 for a queue operation) and ``progress``, the learn steps each
learner thread had completed then. A :class:`Replayer` (``replay=PATH``) runs the same plan forcing those
decisions: a wait returns the recorded ready set (on Ray it blocks until exactly those requests are done), a
queue operation succeeds or fails as recorded, and learner threads become scheduled learners (no OS thread) that
are advanced, step by step, to the recorded progress before each decision. The replayed run then makes the same
calls with the same data in the same order as the recorded one: its weights and counters are bit-identical, under
the local executor and under Ray.

A replay checks as it goes: the log's header (algorithm and config) must match the run's, or it fails at start
naming the differing fields; each decision must come from the same kind and site (and a wait over as many
requests) as recorded, or it raises :class:`ReplayDivergence` naming the report, the decision and both sites.

Examples:
    >>> import io
    >>> log = io.StringIO()
    >>> with recording(Recorder(log, header={"algorithm": "demo"})) as rec:
    ...     decide("wait", "AsyncSource._wait", lambda: [0, 2])
    [0, 2]
    >>> log.getvalue().splitlines()[1]
    '["wait", "AsyncSource._wait", [0, 2], []]'
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Protocol, Sequence

__all__ = ["Recorder", "Replayer", "ReplayDivergence", "recording", "active", "replaying", "decide",
           "register_learner", "FORMAT"]

#: The log's format version (its header's ``flowrl_decisions``).
FORMAT = 1


class ReplayDivergence(RuntimeError):
    """A replayed run asked for a decision that the log does not hold at that point (a changed config, env or
    code): the message names the report, the decision's position and what the log and the run had there."""


class Learner(Protocol):
    """What the log needs of a learner thread: its completed learn steps, and a way to take one more."""

    num_steps: int

    def advance_to(self, num_steps: int) -> None: ...


class _Log:
    def __init__(self) -> None:
        self.learners: list[Learner] = []
        self.report = 0  # the Trainer's report in progress (1 for the first train() call)
        self.position = 0  # decisions so far

    def progress(self) -> list[int]:
        return [learner.num_steps for learner in self.learners]


class Recorder(_Log):
    """Writes a run's decisions to ``out`` (a path or a text stream), after a header line ``{"flowrl_decisions":
    FORMAT, **header}``. One JSON line per decision; a ``{"report": n}`` line where each report starts."""

    def __init__(self, out: str | Path | IO[str], header: dict[str, Any]) -> None:
        super().__init__()
        self._own = isinstance(out, (str, Path))
        self.out: IO[str] = open(out, "w", encoding="utf-8") if isinstance(out, (str, Path)) else out
        self.out.write(json.dumps({"flowrl_decisions": FORMAT, **header}) + "\n")
        self.lock = threading.Lock()

    def start_report(self, report: int) -> None:
        self.report = report
        self.out.write(f'{{"report": {report}}}\n')

    def decide(self, kind: str, site: str, observe: Callable[[], Any]) -> Any:
        value = observe()
        self.write(kind, site, value, self.progress())  # after: what the driver saw had happened by then
        return value

    def write(self, kind: str, site: str, value: Any, progress: list[int]) -> None:
        self.position += 1
        self.out.write(json.dumps([kind, site, value, progress], separators=(", ", ": ")) + "\n")

    def close(self) -> None:
        self.out.flush()
        if self._own:
            self.out.close()


class Replayer(_Log):
    """Reads a log that a :class:`Recorder` wrote and hands its decisions out in order.

    Raises:
        ValueError: ``path`` is not such a log, or its header differs from ``header`` (the message names the
            differing fields and both values).
    """

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        super().__init__()
        self.path = Path(path)
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            recorded = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            recorded = None
        if not isinstance(recorded, dict) or recorded.get("flowrl_decisions") != FORMAT:
            raise ValueError(f"replay={str(self.path)!r} is not a decision log that record= wrote (format "
                             f"{FORMAT}); record one with record=PATH on the run to replay")
        _check_header(self.path, recorded, header)
        self.entries: list[Any] = [json.loads(line) for line in lines[1:]]
        self.index = 0

    def start_report(self, report: int) -> None:
        self.report = report
        while self.index < len(self.entries) and isinstance(self.entries[self.index], dict):
            self.index += 1

    def next_entry(self, kind: str, site: str) -> tuple[Any, list[int]]:
        """The next recorded decision, checked to be ``kind`` at ``site``; its value and learner progress."""
        while self.index < len(self.entries) and isinstance(self.entries[self.index], dict):
            self.index += 1  # a report marker
        self.position += 1
        if self.index >= len(self.entries):
            raise ReplayDivergence(f"replay of {self.path}: report {self.report} asked for decision "
                                   f"#{self.position} ({kind} in {site}), but the log ends after "
                                   f"{self.position - 1}; the run does more than the recorded one did")
        entry = self.entries[self.index]
        self.index += 1
        if entry[0] != kind or entry[1] != site:
            raise ReplayDivergence(f"replay of {self.path} diverged at report {self.report}, decision "
                                   f"#{self.position}: the log has {entry[0]} in {entry[1]}, the run made {kind} in "
                                   f"{site}; the config, env or code differs from the recorded run's")
        return entry[2], entry[3]

    def advance(self, progress: Sequence[int]) -> None:
        """Trains each learner up to its recorded progress."""
        if len(progress) != len(self.learners):
            raise ReplayDivergence(f"replay of {self.path} diverged at report {self.report}, decision "
                                   f"#{self.position}: the log has {len(progress)} learner thread(s), the run "
                                   f"{len(self.learners)}")
        for learner, steps in zip(self.learners, progress):
            learner.advance_to(steps)

    def decide(self, kind: str, site: str, observe: Callable[[], Any]) -> Any:
        value, progress = self.next_entry(kind, site)
        self.advance(progress)
        return value

    def close(self) -> None:
        pass


def _check_header(path: Path, recorded: dict[str, Any], header: dict[str, Any]) -> None:
    if recorded.get("algorithm") != header.get("algorithm"):
        raise ValueError(f"replay={str(path)!r} was recorded by {recorded.get('algorithm')!r}, this run is "
                         f"{header.get('algorithm')!r}; replay it with the algorithm and config it was recorded with")
    old, new = recorded.get("config", {}), header.get("config", {})
    differing = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if differing:
        shown = "; ".join(f"{k}: recorded {old.get(k)!r:.60}, now {new.get(k)!r:.60}" for k in differing[:5])
        raise ValueError(f"replay={str(path)!r} was recorded with another config ({shown}"
                         f"{'; ...' if len(differing) > 5 else ''}); replay it with the recorded config")


_ACTIVE: list[Recorder | Replayer] = []


def active() -> Recorder | Replayer | None:
    """The log that decisions go to now (inside :func:`recording`), or ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


def replaying() -> bool:
    """Whether a :class:`Replayer` is active."""
    return isinstance(active(), Replayer)


@contextlib.contextmanager
def recording(log: Recorder | Replayer) -> Iterator[Recorder | Replayer]:
    """Makes ``log`` the active one for the block."""
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.pop()


def decide(kind: str, site: str, observe: Callable[[], Any]) -> Any:
    """A decision point: ``observe()`` (recorded) when recording, the recorded value when replaying (the learners
    first advanced to the recorded progress), and plain ``observe()`` when no log is active."""
    log = active()
    if log is None:
        return observe()
    return log.decide(kind, site, observe)


def register_learner(learner: Learner) -> None:
    """Counts ``learner`` among the active log's learner threads (in creation order); no-op without a log."""
    log = active()
    if log is not None:
        log.learners.append(learner)


class ObservedQueue(queue.Queue[Any]):
    """A learner thread's in-queue (``driver_op="put"``) or out-queue (``"get"``) under a log: each of the
    driver's operations on it is a decision (``1``: it succeeded, ``0``: full or empty); the learner's own side
    is not. Replaying, the in-queue holds what the replay put in it whatever its ``maxsize`` (whether a put found
    room is the log's to say)."""

    def __init__(self, maxsize: int, site: str, driver_op: str) -> None:
        super().__init__(maxsize)
        self.site, self.driver_op = site, driver_op
        self.log = active()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        log = self.log
        if log is None or self.driver_op != "put":
            return super().put(item, block, timeout)
        if isinstance(log, Replayer):
            ok, progress = log.next_entry("put", self.site)
            log.advance(progress)
            if not ok:
                raise queue.Full
            with self.mutex:  # room or not: the recorded run had room here
                self._put(item)
                self.unfinished_tasks += 1
                self.not_empty.notify()
            return None
        progress = log.progress()  # before: the learner cannot have taken an item not yet put
        try:
            super().put(item, block, timeout)
        except queue.Full:
            log.write("put", self.site, 0, progress)
            raise
        log.write("put", self.site, 1, progress)
        return None

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        log = self.log
        if log is None or self.driver_op != "get":
            return super().get(block, timeout)
        if isinstance(log, Replayer):
            got, progress = log.next_entry("get", self.site)
            log.advance(progress)
            if not got:
                raise queue.Empty
            try:
                return super().get(block=False)
            except queue.Empty:
                raise ReplayDivergence(f"replay of {log.path} diverged at report {log.report}, decision "
                                       f"#{log.position}: the log took an item from {self.site}, the replayed "
                                       f"learner had none there") from None
        try:
            item = super().get(block, timeout)
        except queue.Empty:
            log.write("get", self.site, 0, log.progress())
            raise
        log.write("get", self.site, 1, log.progress())  # after: the item's step is done by then
        return item
