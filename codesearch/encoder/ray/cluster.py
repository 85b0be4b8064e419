"""Connecting to a Ray cluster, and noticing when it is lost.

`connect` joins a cluster (``RAY_ADDRESS``, one ``ray start``ed on this machine, an address)
or starts a local one; a TCP check of the head comes first, so that an address nobody
listens on fails in seconds with one line instead of Ray's minutes of retries. While batches
run, `HeadWatch` checks that the head (its GCS) still answers: the actors may go on
returning batches without it, and Ray's own driver would end the process a minute later
with a line of its own. Every failure is a one-line `ClusterError`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from codesearch.errors import ClusterError, MissingDependencyError, install_line


def require_ray() -> ModuleType:
    """Import and return ``ray``, or raise the one-line error naming the extra.

    Raises
    ------
    MissingDependencyError
        Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            f"embedding on a Ray cluster (--ray) needs Ray, which is not installed ({install_line('ray')})"
        ) from None
    return ray


# --------------------------------------------------------------------------------------------
# Connecting
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cluster:
    """The Ray cluster this process is connected to.

    Attributes
    ----------
    address : str
        What was connected to: an address, or ``"local"`` for a cluster started here.
    started_here : bool
        True when :func:`connect` started the cluster (it then shuts it down on close).
    cpus, gpus : float
        The cluster's total CPUs and GPUs.
    """

    address: str
    started_here: bool
    cpus: float
    gpus: float


def connect(address: str = "auto", *, num_cpus: int | None = None, **init_kwargs: object) -> Cluster:
    """Connect to a Ray cluster, or start a local one.

    Parameters
    ----------
    address
        ``"auto"``: the cluster at ``RAY_ADDRESS`` when that is set, else one already running
        on this machine (``ray start``, found as ``ray.init()`` finds it), else a new local
        cluster (this process's Ray connection is reused when there is one). Anything else is
        an address to connect to (``"10.0.0.5:6379"``, ``"ray://head:10001"``).
    num_cpus
        CPUs of a local cluster started here (default: every core).
    **init_kwargs
        Passed to ``ray.init`` (for example ``object_store_memory``).

    Raises
    ------
    MissingDependencyError
        Ray is not installed.
    ClusterError
        The address cannot be reached.
    """
    ray = require_ray()
    started = False
    if ray.is_initialized():
        where = address if address != "auto" else os.environ.get("RAY_ADDRESS") or "local"
    else:
        target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
        running = None if target else _local_head()
        # Workers' logs stay in the cluster's log folder: the CLI's stderr is for progress.
        opts: dict[str, object] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
        opts.update(init_kwargs)
        if target:
            # ray.init retries an address nobody listens on for minutes, printing a warning
            # every few seconds: a TCP connect answers in milliseconds, or at most a few seconds
            reason = _unreachable(target)
            if reason:
                raise ClusterError(
                    f"cannot connect to the Ray cluster at {target!r} ({reason}) "
                    "(check the address and that the cluster is up, or use --ray alone for a local cluster)"
                )
            _check_head(target)
        try:
            if target:
                ray.init(address=target, **opts)
            elif running:
                # "auto", not the address: Ray then uses the token of a cluster found on this
                # machine (it never sends it to an address given), and picks the same cluster
                # _local_head found (the last `ray start`, alive)
                ray.init(address="auto", **opts)
            else:
                # Ray nices its workers (15) to keep a shared node's daemons responsive; on a
                # cluster of this one machine the actors are the work, and a niced actor loses
                # its core to every other process, so it runs at the driver's priority.
                opts.setdefault("_system_config", {"worker_niceness": 0})
                ray.init(address="local", num_cpus=num_cpus, **opts)  # "local": never a stale one
                started = True
        except (ConnectionError, TimeoutError, ValueError, RuntimeError) as exc:
            raise ClusterError(
                f"cannot connect to the Ray cluster at {target or 'a new local cluster'!r} "
                f"({first_line(exc)}) (check the address and that the cluster is up, "
                "or use --ray alone for a local cluster)"
            ) from None
        where = target or running or "local"
    res = ray.cluster_resources()
    return Cluster(where, started, float(res.get("CPU", 0)), float(res.get("GPU", 0)))


#: Seconds a reachability check of a cluster address waits for the TCP connection.
CONNECT_TIMEOUT_S = 5.0


def _local_head() -> str | None:
    """The head of a cluster already running on this machine (the last ``ray start``), when
    it answers; None when there is none or it is gone (``ray.init()`` would wait minutes on a
    stale record of one)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        address = canonicalize_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - Ray's lookup moved or failed: start a cluster of our own
        return None
    return address if address and _unreachable(address, timeout=1.0) is None else None


def _unreachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why nothing answers at ``address`` (``host:port``, ``ray://host:port``), or None when a
    TCP connection opens within ``timeout`` (or the address has no port to try: Ray then
    decides)."""
    import socket

    where = _host_port(address.split("://", 1)[-1])
    if where is None:
        return None
    host, port = where
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout):
            return None
    except OSError as exc:
        return f"no answer at {host}:{port}: {exc.strerror or exc or type(exc).__name__}"


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` (IPv6 as ``[::1]:6379``); None for a name without a
    port, such as ``auto`` or ``local``."""
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


#: Seconds between two checks, while batches run, that the cluster's head still answers.
HEAD_CHECK_S = 2.0
#: Seconds between two calls of an ``encode_batches`` caller's ``idle`` while no batch is done.
IDLE_S = 0.5
#: Seconds the head may stay silent before the run ends with a ClusterError. Ray's own driver
#: waits 60 s (``gcs_rpc_server_reconnect_timeout_s``) and then ends the whole process with a
#: line of its own; a head that Ray's GCS fault tolerance restarts is back well within this.
HEAD_LOST_AFTER_S = 15.0


class HeadWatch:
    """Whether the cluster's head (its GCS) still opens a TCP connection.

    The actors may go on returning batches for a while after the head is gone, so Ray's
    calls alone do not tell the driver; its C++ core kills the process after a minute
    without the head. :meth:`check` (rate-limited to one connect per :data:`HEAD_CHECK_S`)
    ends the run first, with a one-line error, once every batch finished so far is written.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.checked = 0.0
        self.silent_since: float | None = None

    @classmethod
    def of(cls, ray: ModuleType) -> HeadWatch | None:
        """The watch of the cluster this process is connected to; None under Ray Client,
        whose own connection reports a loss."""
        try:
            address = ray.get_runtime_context().gcs_address
        except Exception:  # noqa: BLE001 - no address to watch: no watch
            return None
        return cls(address) if isinstance(address, str) and ":" in address else None

    def check(self, where: str) -> None:
        """Raise the one-line ClusterError once the head has been silent too long."""
        now = time.monotonic()
        if now - self.checked < HEAD_CHECK_S:
            return
        self.checked = now
        reason = _unreachable(self.address, timeout=HEAD_CHECK_S)
        if reason is None:
            self.silent_since = None
        elif self.silent_since is None:
            self.silent_since = now
        elif now - self.silent_since >= HEAD_LOST_AFTER_S:
            raise lost(where, f"its head stopped answering for {now - self.silent_since:.0f}s: {reason}")


def _check_head(address: str) -> None:
    """Ask the head at ``address`` (a GCS ``host:port``; anything else, such as ``auto`` or
    Ray Client's ``ray://``, is left to Ray) for its cluster id, as ``ray.init`` would, but
    once.

    A cluster with token authentication (what ``ray start`` sets up when a token exists)
    rejects a driver without its token in milliseconds; ``ray.init`` retried that for 20 s
    with a warning a second and then said only "Failed to connect". A port where something
    other than a Ray head listens answers nothing within Ray's 40 s, after which ``ray.init``
    would try again.

    Raises
    ------
    ClusterError
        The head rejects this process's token, or does not answer as a Ray head.
    """
    if "://" in address or _host_port(address) is None:  # Ray Client, "auto", "local"
        return
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError, RpcError
    except ImportError:  # a Ray without token authentication: ray.init decides
        return
    try:
        GcsClient(address=address)
    except AuthenticationError:
        raise ClusterError(
            f"the Ray cluster at {address!r} requires its authentication token "
            "(set RAY_AUTH_MODE=token, with the token in RAY_AUTH_TOKEN or ~/.ray/auth_token; "
            "'ray get-auth-token' on the head prints it)"
        ) from None
    except RpcError as exc:
        raise ClusterError(
            f"nothing at {address!r} answers as a Ray cluster's head ({first_line(exc)}) "
            "(check the address: the head's GCS port, 6379 unless 'ray start --port' says otherwise)"
        ) from None


#: Characters of an exception's first line that a one-line error quotes (Ray's run to 300+).
_QUOTE_CHARS = 160


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= _QUOTE_CHARS else line[: _QUOTE_CHARS - 3].rstrip() + "..."


def lost(where: str, why: str) -> ClusterError:
    return ClusterError(
        f"lost the Ray cluster at {where!r} ({why}); the vectors finished so far are kept "
        "(run 'codesearch index' again to resume, or index without --ray)"
    )


def ray_get(ray: Any, refs: Any, *, where: str, timeout: float | None = None) -> Any:
    """``ray.get`` with a lost cluster turned into a one-line ClusterError; task and actor
    errors (handled by the caller) and timeouts pass through."""
    try:
        return ray.get(refs, timeout=timeout)
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        raise
    except (ray.exceptions.RayError, ConnectionError, OSError) as exc:
        raise lost(where, first_line(exc)) from None


def ray_wait(ray: Any, refs: list[Any], *, where: str, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
    try:
        return ray.wait(refs, num_returns=1, timeout=timeout)
    except (ray.exceptions.RayError, ConnectionError, OSError) as exc:
        raise lost(where, first_line(exc)) from None
