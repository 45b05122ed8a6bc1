"""Keeping the traffic of a test or a benchmark on this machine."""

from __future__ import annotations

import os

__all__ = ["CLOSED_LOOPBACK_PROXY", "keep_traffic_on_loopback"]

#: a loopback port nothing listens on (discard, 9): a request sent there fails at once, without leaving the machine
CLOSED_LOOPBACK_PROXY = "http://127.0.0.1:9"


def keep_traffic_on_loopback() -> None:
    """Sends plain HTTP(S) that is not for loopback to :data:`CLOSED_LOOPBACK_PROXY`, through the proxy variables
    that this process and the processes it starts (Ray's among them) read; loopback goes direct.

    Ray's dashboard process, which Ray starts even with ``include_dashboard=False`` (to run its usage-stats module)
    and with usage stats off, asks the cloud metadata address 169.254.169.254 which cloud it runs on at every
    start. Call this before Ray starts.

    Examples:
        >>> keep_traffic_on_loopback()
        >>> os.environ["https_proxy"], os.environ["NO_PROXY"]
        ('http://127.0.0.1:9', '127.0.0.1,localhost,::1')
    """
    for name, value in (("http_proxy", CLOSED_LOOPBACK_PROXY), ("https_proxy", CLOSED_LOOPBACK_PROXY),
                        ("no_proxy", "127.0.0.1,localhost,::1")):
        os.environ[name] = os.environ[name.upper()] = value
