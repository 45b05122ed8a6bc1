"""The one door to Ray: every actor flowrl creates, and every remote call, get, wait, put and kill it makes, goes
through this module, so a plan runs unchanged on Ray or, under the local executor, in this process.

Two executors:

- ``"ray"`` (the default): actors are Ray actors, references Ray object refs; each function here is the Ray call
  of the same name.
- ``"local"``: actors are plain objects in the driver (:class:`LocalActor`), and no Ray instance is started. A
  remote call runs at once, when it is submitted, in submission order, and its answer (or the error it raised)
  waits in a :class:`LocalRef` until a :func:`get` collects it; so every actor sees its calls in the order its
  callers made them (Ray's per-caller order), every wait finds every request done, and a run is one
  deterministic sequence of Python calls that a debugger can step through. Arguments, answers and
  :func:`put` objects are copied through pickle as Ray serialises them, so no actor shares an object with its
  caller; an error raised in an actor is re-raised by :func:`get` as itself, its traceback ending in the
  frame that raised it.

Which executor new actors get: :func:`current` (``"ray"`` unless inside :func:`using`, or
:func:`flowrl.runtime.local_executor`); the Trainer enters ``using(config.executor)`` around everything it does.
Calls on an existing actor or reference follow the object, whichever executor is current.

Examples:
    >>> class Counter:
    ...     def __init__(self, start): self.n = start
    ...     def add(self, k): self.n += k; return self.n
    >>> with using("local"):
    ...     counter = create_actor(Counter, 10)
    >>> refs = [counter.add.remote(1), counter.add.remote(2)]
    >>> ready, rest = wait(refs, num_returns=1, timeout=0)
    >>> len(ready), len(rest), get(refs)
    (1, 1, [11, 13])
    >>> kill(counter); get(counter.add.remote(1))
    Traceback (most recent call last):
    ...
    flowrl.executor.LocalActorDiedError: LocalActor(Counter #...) was killed; ...
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import sys
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence, get_args

from flowrl import decisions, runtime

import ray  # noqa: E402,I001  (after flowrl.runtime, which sets Ray's environment first)
from ray import cloudpickle  # noqa: E402

__all__ = ["ExecutorName", "EXECUTORS", "current", "using", "is_local", "create_actor", "remote_function", "get",
           "wait", "put", "kill", "LocalActor", "LocalRef", "LocalActorDiedError", "ActorDiedError",
           "GetTimeoutError", "node_affinity_options", "cluster_resources"]

ExecutorName = Literal["ray", "local"]
EXECUTORS: tuple[str, ...] = get_args(ExecutorName)

#: What a call on a dead actor raises, on either executor (the local one raises :class:`LocalActorDiedError`, a
#: subclass), and what a timed-out :func:`get` raises.
ActorDiedError = ray.exceptions.RayActorError
GetTimeoutError = ray.exceptions.GetTimeoutError

_current: list[str] = ["ray"]


def current() -> ExecutorName:
    """The executor that new actors, remote functions and :func:`put` use now."""
    return "local" if _current[-1] == "local" else "ray"


@contextlib.contextmanager
def using(name: str) -> Iterator[None]:
    """Makes ``name`` (``"ray"`` or ``"local"``) the executor for what starts inside the block.

    Raises:
        ValueError: another name.
    """
    if name not in EXECUTORS:
        raise ValueError(f"executor={name!r} is not one of {list(EXECUTORS)}; 'ray' runs actors as Ray actors, "
                         f"'local' runs them in this process")
    _current.append(name)
    try:
        yield
    finally:
        _current.pop()


# ---------------------------------------------------------------------------------------------
# The local executor's actors and references.

_COPYABLE_AS_IS = (int, float, bool, str, bytes, type(None))


def _dumps(obj: Any) -> bytes:
    return cloudpickle.dumps(obj, protocol=5)  # type: ignore[no-any-return,no-untyped-call]  # untyped in Ray


def _copy(obj: Any) -> Any:
    """``obj`` through pickle, as Ray serialises what crosses to an actor (immutable scalars as they are)."""
    if type(obj) in _COPYABLE_AS_IS:
        return obj
    return pickle.loads(_dumps(obj))


class LocalActorDiedError(ray.exceptions.RayActorError):
    """A call on a :class:`LocalActor` that was killed (a :class:`ray.exceptions.RayActorError`, as on Ray)."""

    def __init__(self, actor_label: str) -> None:
        super().__init__()
        self.actor_label = actor_label

    def __reduce__(self) -> tuple[Any, ...]:
        return LocalActorDiedError, (self.actor_label,)

    def __str__(self) -> str:
        return f"{self.actor_label} was killed; calls on it fail as on a dead Ray actor"


class LocalRef:
    """The answer of a call on a :class:`LocalActor` (or of :func:`put`): a pickled value, or the error the call
    raised. Always ready; :func:`get` unpickles a fresh copy each time, as Ray does."""

    __slots__ = ("_payload", "_error", "_label")

    def __init__(self, payload: bytes | None = None, error: BaseException | None = None, label: str = "put") -> None:
        self._payload, self._error, self._label = payload, error, label

    @classmethod
    def of(cls, value: Any, label: str = "put") -> LocalRef:
        return cls(payload=_dumps(value), label=label)

    def value(self) -> Any:
        if self._error is not None:
            raise self._error
        assert self._payload is not None  # internal invariant: a ref holds a payload or an error
        return pickle.loads(self._payload)

    def __reduce__(self) -> tuple[Any, ...]:  # a ref nested in an argument travels with its answer
        return LocalRef, (self._payload, self._error, self._label)

    def __repr__(self) -> str:
        return f"LocalRef({self._label}{', failed' if self._error is not None else ''})"


class _LocalActorId:
    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number

    def hex(self) -> str:
        return f"local-{self.number:08x}"


_ACTOR_NUMBERS = itertools.count(1)
_LIVE_ACTORS: dict[int, LocalActor] = {}  # by number: a handle pickled into an argument comes back as itself


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())


def _set_torch_threads(n: int | None) -> None:
    if n is not None and n != _torch_threads():
        sys.modules["torch"].set_num_threads(n)


class _LocalMethod:
    __slots__ = ("actor", "name")

    def __init__(self, actor: LocalActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        return self.actor._call(self.name, args, kwargs)

    def options(self, **_: Any) -> _LocalMethod:
        return self


class LocalActor:
    """An actor of the local executor: an instance of ``cls`` in this process behind Ray's handle interface
    (``actor.method.remote(*args) -> LocalRef``). Made by :func:`create_actor` under the local executor.

    A call runs when it is submitted, with copies of its arguments (top-level :class:`LocalRef` arguments
    resolved to their values, as Ray resolves top-level object refs); an error it raises is kept in the
    returned reference. The actor keeps its own torch intra-op thread count (a rollout worker sets one per
    CPU it reserved) and the driver's is restored after each call.
    """

    def __init__(self, cls: type[Any], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self._actor_id = _LocalActorId(next(_ACTOR_NUMBERS))
        self._class_name = cls.__name__
        self._methods = frozenset(name for name in dir(cls) if not name.startswith("__"))
        self._alive = True
        driver_threads = _torch_threads()
        try:
            self._instance = cls(*_resolve(args), **_resolve_kwargs(kwargs))
            self._threads = _torch_threads()
        finally:
            _set_torch_threads(driver_threads)
        _LIVE_ACTORS[self._actor_id.number] = self

    def __getattr__(self, name: str) -> _LocalMethod:
        if name not in self.__dict__.get("_methods", ()):
            raise AttributeError(f"{self!r} has no method {name!r}")
        return _LocalMethod(self, name)

    def _call(self, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> LocalRef:
        label = f"{self._class_name}.{name}"
        if not self._alive:
            return LocalRef(error=LocalActorDiedError(repr(self)), label=label)
        driver_threads = _torch_threads()
        _set_torch_threads(self._threads)
        try:
            method = getattr(self._instance, name)
            return LocalRef.of(method(*_resolve(args), **_resolve_kwargs(kwargs)), label=label)
        except Exception as error:  # kept for get(), as Ray keeps a task's error in its reference
            return LocalRef(error=error, label=label)
        finally:
            _set_torch_threads(driver_threads)

    def _kill(self) -> None:
        self._alive = False
        self.__dict__.pop("_instance", None)
        _LIVE_ACTORS.pop(self._actor_id.number, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return _live_actor, (self._actor_id.number, repr(self))

    def __repr__(self) -> str:
        return f"LocalActor({self._class_name} #{self._actor_id.number})"


def _live_actor(number: int, label: str) -> LocalActor:
    actor = _LIVE_ACTORS.get(number)
    if actor is None:
        raise RuntimeError(f"{label} was killed before an argument holding its handle arrived")
    return actor


def _resolve(args: Sequence[Any]) -> list[Any]:
    return [a.value() if isinstance(a, LocalRef) else _copy(a) for a in args]


def _resolve_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.value() if isinstance(v, LocalRef) else _copy(v) for k, v in kwargs.items()}


class _LocalFunction:
    """A remote function of the local executor: ``.remote(*args)`` calls it at once on copies of the arguments."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        label = getattr(self.fn, "__name__", "function")
        try:
            return LocalRef.of(self.fn(*_resolve(args), **_resolve_kwargs(kwargs)), label=label)
        except Exception as error:
            return LocalRef(error=error, label=label)

    def options(self, **_: Any) -> _LocalFunction:
        return self


# ---------------------------------------------------------------------------------------------
# The calls flowrl makes.

def is_local(obj: Any) -> bool:
    """Whether ``obj`` is an actor or a reference of the local executor."""
    return isinstance(obj, (LocalActor, LocalRef))


_RAY_CLASSES: dict[type[Any], Any] = {}  # cls -> ray.remote(cls), made once per class


def _ray_class(cls: type[Any]) -> Any:
    if cls not in _RAY_CLASSES:
        _RAY_CLASSES[cls] = ray.remote(cls)
    return _RAY_CLASSES[cls]


def create_actor(cls: type[Any], *args: Any, options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """A new actor running ``cls(*args, **kwargs)``: a Ray actor with ``options`` (starting the local Ray
    instance if none runs), or a :class:`LocalActor` under the local executor (``options`` unused)."""
    if current() == "local":
        return LocalActor(cls, args, kwargs)
    runtime.ensure_initialized()
    return _ray_class(cls).options(**(options or {})).remote(*args, **kwargs)


def remote_function(fn: Callable[..., Any], **resources: Any) -> Any:
    """``fn`` as a remote function: ``.remote(*args)`` returns a reference to its result."""
    if current() == "local":
        return _LocalFunction(fn)
    return ray.remote(fn).options(**resources) if resources else ray.remote(fn)


def get(refs: Any, *, timeout: float | None = None) -> Any:
    """``ray.get``: the value of one reference, or the values of a list of them; re-raises the error of a
    call that failed (a local call's error as itself)."""
    if isinstance(refs, LocalRef):
        return refs.value()
    if isinstance(refs, list) and not refs:
        return []  # (Ray would start an instance to answer this)
    if isinstance(refs, list) and any(isinstance(r, LocalRef) for r in refs):
        return [r.value() if isinstance(r, LocalRef) else ray.get(r, timeout=timeout) for r in refs]
    return ray.get(refs, timeout=timeout)


#: The longest a replayed wait waits for the requests the log says were done (they never finish when the run
#: diverged from the recorded one).
REPLAY_WAIT_S = 600.0


def wait(refs: Sequence[Any], *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True) -> tuple[list[Any], list[Any]]:
    """``ray.wait``: ``(ready, not_ready)``, both in the order of ``refs``. Local references are always ready,
    so under the local executor the first ``num_returns`` are.

    A decision of the run (:mod:`flowrl.decisions`): recorded under ``record=``; under ``replay=`` the recorded
    ready set is returned, once those requests are done."""
    refs = list(refs)
    if not refs:
        return [], []  # (Ray would start an instance to answer this)
    log = decisions.active()
    if log is None:
        return _wait(refs, num_returns, timeout, fetch_local)
    site = sys._getframe(1).f_code.co_qualname
    if isinstance(log, decisions.Replayer):
        (count, positions), progress = log.next_entry("wait", site)
        if count != len(refs):
            raise decisions.ReplayDivergence(
                f"replay of {log.path} diverged at report {log.report}, decision #{log.position}: the log waited in "
                f"{site} on {count} requests, the run on {len(refs)}")
        log.advance(progress)
        chosen = [refs[i] for i in positions]
        pending = [r for r in chosen if not isinstance(r, LocalRef)]
        if pending and len(ray.wait(pending, num_returns=len(pending), timeout=REPLAY_WAIT_S)[0]) < len(pending):
            raise decisions.ReplayDivergence(
                f"replay of {log.path}: at report {log.report}, decision #{log.position} ({site}), requests the log "
                f"found done were not done after {REPLAY_WAIT_S:g} s; the run diverged from the recorded one")
        picked = set(positions)
        return chosen, [r for i, r in enumerate(refs) if i not in picked]
    ready, rest = _wait(refs, num_returns, timeout, fetch_local)
    index = {r: i for i, r in enumerate(refs)}
    log.write("wait", site, [len(refs), [index[r] for r in ready]], log.progress())  # in the order Ray gave
    return ready, rest


def _wait(refs: list[Any], num_returns: int, timeout: float | None,
          fetch_local: bool) -> tuple[list[Any], list[Any]]:
    local = [r for r in refs if isinstance(r, LocalRef)]
    if not local:
        return ray.wait(refs, num_returns=num_returns, timeout=timeout, fetch_local=fetch_local)
    ready = set(map(id, local[:num_returns]))
    rest = [r for r in refs if not isinstance(r, LocalRef)]
    if len(local) < num_returns and rest:
        ray_ready, _ = ray.wait(rest, num_returns=min(num_returns - len(local), len(rest)), timeout=timeout,
                                fetch_local=fetch_local)
        ready |= set(map(id, ray_ready))
    return [r for r in refs if id(r) in ready], [r for r in refs if id(r) not in ready]


def put(obj: Any) -> Any:
    """``ray.put`` (a :class:`LocalRef` under the local executor): one copy of ``obj`` that many calls can take."""
    if current() == "local":
        return LocalRef.of(obj)
    return ray.put(obj)


def kill(actor: Any) -> None:
    """Ends ``actor`` for good (Ray: ``ray.kill(actor, no_restart=True)``); later calls on it fail with
    :data:`ActorDiedError`."""
    if isinstance(actor, LocalActor):
        actor._kill()
    else:
        ray.kill(actor, no_restart=True)


def node_affinity_options() -> dict[str, Any]:
    """Actor options that place an actor on this node (Ray), or none under the local executor."""
    if current() == "local":
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    runtime.ensure_initialized()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(),
                                                                  soft=False)}


#: the placement strategies of Ray's placement groups
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def placement_group(bundles: Sequence[Mapping[str, float]], strategy: str, *, timeout_s: float) -> Any:
    """A Ray placement group of ``bundles`` placed with ``strategy``, once it is placed; ``None`` under the local
    executor (its actors all run in this process).

    Raises:
        TimeoutError: the cluster could not place it within ``timeout_s`` (it is removed again).
    """
    if current() == "local":
        return None
    from ray.util.placement_group import placement_group as make, remove_placement_group

    runtime.ensure_initialized()
    group = make([dict(b) for b in bundles], strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except GetTimeoutError:
        remove_placement_group(group)
        nodes = len(ray.nodes())  # type: ignore[no-untyped-call]  # Ray leaves it untyped
        raise TimeoutError(f"Ray could not place {len(bundles)} bundles {[dict(b) for b in bundles]} with strategy "
                           f"{strategy!r} within {timeout_s:g} s on a cluster of {nodes} node(s) with "
                           f"{cluster_resources()}") from None
    return group


def in_bundle(group: Any, index: int) -> dict[str, Any]:
    """Actor options that schedule an actor into bundle ``index`` of ``group`` (none for ``group=None``)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=group,
                                                                    placement_group_bundle_index=index)}


def remove_placement_group(group: Any) -> None:
    """Releases ``group``'s resources (nothing for ``None``)."""
    if group is not None:
        from ray.util.placement_group import remove_placement_group as remove

        remove(group)


def cluster_resources() -> dict[str, float]:
    """The running Ray cluster's resources (``ray.cluster_resources()``)."""
    return dict(ray.cluster_resources())  # type: ignore[no-untyped-call]  # Ray leaves it untyped
