"""Ray start-up with flowrl's defaults, and actor options.

Ray 2.60 keeps a local instance on 127.0.0.1 only when ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is in
the environment when ``ray`` is first imported, so this module sets it (unless the user already set
it) before importing Ray, and warns when Ray was imported earlier without it.

Examples:
    >>> actor_options(num_cpus=0)
    {'num_cpus': 0, 'max_restarts': 0}
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import warnings
from typing import Any, Iterator

_LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_RAY_PREIMPORTED = "ray" in sys.modules and _LOOPBACK_VAR not in os.environ
os.environ.setdefault(_LOOPBACK_VAR, "0")

import ray  # noqa: E402  (must follow the environment variable above)

from flowrl.validation import check_number  # noqa: E402

__all__ = ["init", "ensure_initialized", "actor_options", "parse_address", "check_reachable", "local_executor",
           "current_executor"]

#: Seconds :func:`init` waits for a TCP connection to a cluster's address before it gives up (Ray's own
#: connect retries for minutes when nothing listens).
CONNECT_TIMEOUT_S = 10.0

#: Ray's logger for token authentication. A new local instance turns token authentication on when
#: ``RAY_AUTH_MODE`` is unset, and says so in a WARNING ("Token authentication is enabled ... Set
#: RAY_AUTH_MODE=disabled to opt out") on every start. That is Ray's secure default, not a problem, so
#: :func:`init` holds this logger to ERROR while it starts a local instance. (Setting ``RAY_AUTH_MODE=token``
#: instead would silence it too, but Ray reads the variable when ``ray`` is imported, so set after that import
#: it leaves the instance half-configured and the start fails.) Joining a cluster keeps every message.
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def parse_address(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` of a cluster address, or ``None`` for ``"auto"`` and ``"local"`` (Ray finds or starts
    the instance itself).

    Accepted forms: ``host:port``, ``[ipv6]:port`` and ``ray://`` followed by either.

    Raises:
        ValueError: any other form, or a port outside 1..65535 (the message names the address and the forms).

    Examples:
        >>> parse_address("127.0.0.1:6379"), parse_address("ray://head.example:10001"), parse_address("auto")
        (('127.0.0.1', 6379), ('head.example', 10001), None)
        >>> parse_address("foo:bar:baz")
        Traceback (most recent call last):
        ...
        ValueError: address 'foo:bar:baz' is not 'auto', 'host:port' or 'ray://host:port' (port an int in 1..65535)
    """
    if address in ("auto", "local"):
        return None
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port_text = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # a bracketed IPv6 literal
    elif ":" in host:
        host = ""
    port = int(port_text) if port_text.isascii() and port_text.isdigit() else 0
    if not sep or not host or any(c.isspace() or c in "/@" for c in host) or not 1 <= port <= 65535:
        raise ValueError(f"address {address!r} is not 'auto', 'host:port' or 'ray://host:port' (port an int in "
                         f"1..65535)")
    return host, port


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Opens (and closes) a TCP connection to a cluster's address, so that an address where nothing listens fails
    within ``timeout_s`` instead of in Ray's minutes of retries. ``"auto"`` and ``"local"`` are not checked.

    A ``host:port`` on loopback is checked where Ray will connect: Ray replaces a loopback host by this node's
    address, unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it on loopback (as flowrl sets it).

    Raises:
        ValueError: a malformed address (:func:`parse_address`).
        ConnectionError: nothing accepted a connection at the address within ``timeout_s`` (the message names
            the address and the reason).
    """
    parsed = parse_address(address)
    if parsed is None:
        return
    host, port = parsed
    if not address.startswith("ray://"):
        from ray._private.services import resolve_ip_for_localhost  # Ray's own rewrite of a loopback host

        host = resolve_ip_for_localhost(host)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as err:
        reason = f"no answer within {timeout_s:g} s" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise ConnectionError(f"nothing accepts connections at {host}:{port} ({reason})") from err


def init(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
         **ray_kwargs: Any) -> None:
    """Starts an embedded Ray instance on loopback, or joins a cluster; no-op if Ray is running.

    Args:
        address: ``None`` starts a local instance bound to 127.0.0.1 with no dashboard, quietly (Ray's
            driver logs at WARNING, so its INFO start line is not printed, and the note that token
            authentication is on is dropped; pass ``logging_level=logging.INFO`` to see the start line);
            ``"auto"`` or ``"ray://host:port"`` (or ``"host:port"``) joins an existing cluster; the address is
            checked first (:func:`check_reachable`), so one where nothing listens fails within seconds.
        num_cpus: logical CPUs of the local instance (``None``: what Ray detects). Ignored when joining.
        num_gpus: GPUs of the local instance. Ignored when joining.
        **ray_kwargs: passed to ``ray.init`` unchanged.

    Raises:
        ValueError: ``num_cpus``/``num_gpus`` given together with ``address``, or a malformed address.
        ConnectionError: nothing listens at ``address``.
    """
    if address is not None and (num_cpus is not None or num_gpus is not None):
        raise ValueError(f"init(address={address!r}) joins a cluster whose resources are already "
                         f"set; drop num_cpus/num_gpus or pass address=None for a local instance")
    if ray.is_initialized():
        return
    if address is not None:
        check_reachable(address)
        ray.init(address=address, **ray_kwargs)
        return
    if _RAY_PREIMPORTED:
        warnings.warn(f"ray was imported before flowrl without {_LOOPBACK_VAR}=0, so the local Ray "
                      f"instance may listen on this machine's network address; set the variable "
                      f"before importing ray", RuntimeWarning, stacklevel=2)
    ray_kwargs.setdefault("include_dashboard", False)
    ray_kwargs.setdefault("logging_level", logging.WARNING)  # no "Started a local Ray instance." INFO line
    auth_logger = logging.getLogger(_AUTH_LOGGER)
    level = auth_logger.level
    auth_logger.setLevel(logging.ERROR)  # see _AUTH_LOGGER
    try:
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, **ray_kwargs)
    finally:
        auth_logger.setLevel(level)


def ensure_initialized() -> None:
    """Starts the local default instance (:func:`init`) unless Ray is already running."""
    if not ray.is_initialized():
        init()


def actor_options(*, num_cpus: float = 1, num_gpus: float = 0, **extra: Any) -> dict[str, Any]:
    """Options for a flowrl actor: the given resources and ``max_restarts=0``.

    flowrl never lets Ray restart its actors: a restarted shard would come back without its
    transforms (and a rollout worker without its current weights); flowrl replaces them itself.
    """
    check_number("actor num_cpus", num_cpus, ge=0, meaning="CPUs the actor asks Ray for")
    check_number("actor num_gpus", num_gpus, ge=0, meaning="GPUs the actor asks Ray for")
    options: dict[str, Any] = {"num_cpus": num_cpus, **({"num_gpus": num_gpus} if num_gpus else {})}
    options.update(extra)
    options["max_restarts"] = 0
    return options


@contextlib.contextmanager
def local_executor() -> Iterator[None]:
    """Runs every actor started inside the block (remote workers, replay shards, aggregators, shards of a parallel
    iterator) in this process, with no Ray started, and makes learner threads steps of the driver: the local
    executor of :mod:`flowrl.executor`. A :class:`~flowrl.trainer.Trainer` built inside runs on it for its whole
    life, as with ``executor="local"`` in its config.

    Examples:
        >>> from flowrl.iter import from_range
        >>> with local_executor():
        ...     print(current_executor(), from_range(4, num_shards=2).gather_sync().take(4))
        local [0, 2, 1, 3]
    """
    from flowrl import executor

    with executor.using("local"):
        yield


def current_executor() -> str:
    """``"local"`` inside :func:`local_executor` (or a local Trainer's calls), else ``"ray"``."""
    from flowrl import executor

    return executor.current()
