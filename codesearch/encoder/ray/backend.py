"""The encode stage on a Ray cluster: a pool of actors, each holding the models once.

Walking, chunking, the store diff, the lexical index and the vector writer stay in this
process; only the texts that need vectors travel. :class:`RayEncoder` wraps a locally loaded
:class:`~codesearch.encoder.runtime.Encoder` (whose name, identity, dim, max length and token
counter the pipeline reads as before) and sends its document batches to the actors of a
:class:`WorkerPool`:

- one actor per GPU when the cluster has GPUs (``num_gpus=1``), else one per
  ``cpus_per_worker`` CPUs. The encoders of a run (dense and ColBERT) share the pool: each
  actor loads a checkpoint by name on first use and checks that its identity (a hash of
  the weights) equals the local one, so a worker with another copy of the model can never
  mix its vectors into the index, and two models never wait for each other's GPUs;
- at most ``depth`` batches in flight per actor (one running, one queued, so an actor never
  waits for the driver) and a bounded window overall, so memory stays bounded whatever the
  size of the run; results come back in input order;
- actors restart (``max_restarts``) and their calls are retried (``max_task_retries``): a
  worker killed mid-run costs a retry of its batches, not the run. A batch whose actor is
  gone for good goes to another one. When the cluster itself is lost, a one-line
  :class:`~codesearch.errors.ClusterError` ends the run; the pipeline has committed every
  finished batch to the vector cache, so the next run resumes from there. A lost head is
  noticed by a TCP check of its GCS while batches run (the actors may go on answering
  without it, and Ray's own driver would end the process a minute later with a line of its
  own).

Queries are encoded locally (a round trip to the cluster per query would cost more than the
query's own forward pass).

Examples
--------
>>> from codesearch.encoder import load
>>> from codesearch.encoder.ray import RayEncoder
>>> enc = RayEncoder(load("lightonai/LateOn-Code-edge"), address="auto")     # doctest: +SKIP
>>> for vectors in enc.encode_batches([["def f(): ..."], ["class A: ..."]]):  # doctest: +SKIP
...     print(len(vectors))
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codesearch.errors import ClusterError, CodeSearchError, MissingDependencyError

if TYPE_CHECKING:  # pragma: no cover
    from codesearch.encoder.runtime import Encoder

log = logging.getLogger(__name__)

__all__ = [
    "Cluster",
    "ClusterProgress",
    "RayEncoder",
    "WorkerPool",
    "WorkerStats",
    "close_made",
    "connect",
    "require_ray",
    "with_worker_rates",
    "wrap_encoders",
]

#: Batches in flight per actor: one running and one waiting in its queue, so an actor starts
#: its next batch without a round trip to the driver.
DEFAULT_DEPTH = 2
#: How long actors may take to start and load the model (a cold hub download on a worker).
START_TIMEOUT_S = 600.0
#: Token counts (from the workers) of this many recent batches are kept, so that the
#: pipeline's own ``count_tokens`` on a batch just yielded costs a lookup, not a tokenisation.
_COUNT_MEMO = 64


def require_ray() -> Any:
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
            'embedding on a Ray cluster (--ray) needs Ray, which is not installed '
            '(pip install "codesearch[ray]")'
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


def connect(address: str = "auto", *, num_cpus: int | None = None, **init_kwargs: Any) -> Cluster:
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
        opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
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
                f"({_first_line(exc)}) (check the address and that the cluster is up, "
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


class _HeadWatch:
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
    def of(cls, ray: Any) -> _HeadWatch | None:
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
            raise _lost(where, f"its head stopped answering for {now - self.silent_since:.0f}s: {reason}")


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
            f"nothing at {address!r} answers as a Ray cluster's head ({_first_line(exc)}) "
            "(check the address: the head's GCS port, 6379 unless 'ray start --port' says otherwise)"
        ) from None


#: Characters of an exception's first line that a one-line error quotes (Ray's run to 300+).
_QUOTE_CHARS = 160


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= _QUOTE_CHARS else line[: _QUOTE_CHARS - 3].rstrip() + "..."


# --------------------------------------------------------------------------------------------
# Progress records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What one actor did so far.

    Attributes
    ----------
    worker : int
        Index of the actor in the pool.
    node : str
        IP of the node it runs on.
    device : str
        ``"cpu"`` or ``"cuda"``.
    batches, texts, tokens : int
        Work it returned (tokens capped at the model's max length, as the pipeline counts).
    busy_s : float
        Seconds it spent encoding (measured inside the actor).
    restarts : int
        Batches of it that failed and were sent again.
    """

    worker: int
    node: str
    device: str
    batches: int = 0
    texts: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    restarts: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second while busy."""
        return self.tokens / self.busy_s if self.busy_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ClusterProgress:
    """Progress of the cluster since the first batch of this encoder.

    Attributes
    ----------
    batches, texts, tokens : int
        Work returned by every actor together.
    seconds : float
        Wall time since the first batch was sent.
    workers : tuple of WorkerStats
        Per actor.
    """

    batches: int
    texts: int
    tokens: int
    seconds: float
    workers: tuple[WorkerStats, ...]

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of wall time, across the cluster."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        """One line for a progress bar: ``ray 2 workers: 1.2k tok/s (610, 590)``."""
        per = ", ".join(_rate(w.tokens_per_s) for w in self.workers)
        return f"ray {len(self.workers)} workers: {_rate(self.tokens_per_s)} tok/s ({per})"


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


# --------------------------------------------------------------------------------------------
# The actor
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ModelSpec:
    """What an actor loads: a checkpoint by name, checked against the driver's identity."""

    name: str
    identity: str
    dtype: str | None  # None: the device's default ("auto")

    @property
    def key(self) -> str:
        return f"{self.identity}/{self.dtype}"


class _Worker:
    """The models of one Ray worker process (made a Ray actor class by :class:`WorkerPool`).

    Models load on first use. Ray restarts a crashed actor by running the constructor again,
    so the models reload on the next call.
    """

    def __init__(self, threads: int | None):
        import torch

        if threads:
            torch.set_num_threads(threads)  # the CPUs Ray gave this actor, not the node's
        self.device = "cuda" if torch.cuda.is_available() and _gpu_ids() else "cpu"
        self.models: dict[str, Any] = {}

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node": _node_ip(), "device": self.device}

    def memory(self) -> dict[str, float]:
        """Resident and peak resident memory of this process, MB (Linux; 0 elsewhere)."""
        out = {"rss_mb": 0.0, "peak_rss_mb": 0.0}
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith(("VmRSS:", "VmHWM:")):
                        key = "rss_mb" if line.startswith("VmRSS") else "peak_rss_mb"
                        out[key] = int(line.split()[1]) / 1024
        except OSError:
            pass
        return out

    def load(self, spec: _ModelSpec) -> str:
        """Load ``spec`` (once); returns the dtype it runs in."""
        enc = self.models.get(spec.key)
        if enc is None:
            from codesearch.encoder import load
            from codesearch.errors import ModelMismatchError

            enc = load(spec.name, device=self.device, dtype=spec.dtype or "auto")
            if enc.identity != spec.identity:
                raise ModelMismatchError(
                    f"the Ray worker on {_node_ip()} loads {spec.name} as {enc.identity}, the local copy is "
                    f"{spec.identity} (give every node the same checkpoint)"
                )
            self.models[spec.key] = enc
        return str(enc.dtype).removeprefix("torch.")

    def encode(self, spec: _ModelSpec, texts: list[str], kind: str) -> tuple[Any, float, list[int]]:
        """``encode`` of the model ``spec``, the seconds it took (not counting a load), and the
        tokens each text took (from the same tokenization: the driver need not count them)."""
        self.load(spec)
        t0 = time.perf_counter()
        out, counts = self.models[spec.key].encode_counted(texts, kind=kind)
        return out, time.perf_counter() - t0, counts


def _gpu_ids() -> list:
    import ray

    return ray.get_gpu_ids()


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


# --------------------------------------------------------------------------------------------
# The pool
# --------------------------------------------------------------------------------------------


class WorkerPool:
    """Ray actors that encode for every :class:`RayEncoder` given this pool.

    Parameters
    ----------
    address : str
        ``"auto"`` or a cluster address, see :func:`connect`.
    workers : int, optional
        Number of actors (default: one per GPU, else one per ``cpus_per_worker`` CPUs).
    cpus_per_worker : int
        CPUs (and torch threads) per CPU actor.
    depth : int
        Batches in flight per actor.
    max_restarts : int
        Restarts of each actor after a crash; its calls are retried as often.
    num_cpus : int, optional
        CPUs of a local cluster started here.
    init_kwargs : dict, optional
        Passed to ``ray.init`` when the pool connects.

    Raises
    ------
    MissingDependencyError
        Ray is not installed (raised here, before any work).
    """

    def __init__(
        self,
        address: str = "auto",
        *,
        workers: int | None = None,
        cpus_per_worker: int = 1,
        depth: int = DEFAULT_DEPTH,
        max_restarts: int = 3,
        num_cpus: int | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        require_ray()
        self.address = address
        self.workers = workers
        self.cpus_per_worker = max(1, int(cpus_per_worker))
        self.depth = max(1, int(depth))
        self.max_restarts = int(max_restarts)
        self.num_cpus = num_cpus
        self.init_kwargs = dict(init_kwargs or {})
        self.cluster: Cluster | None = None
        self.actors: list[Any] = []
        self.alive: list[bool] = []
        self.info: list[dict[str, Any]] = []
        self.stats: list[WorkerStats] = []
        self.loaded: set[str] = set()  # model keys every actor has loaded
        self.dtypes: dict[str, str] = {}  # identity -> dtype the actors last ran it in
        self.t0: float | None = None
        self.head: _HeadWatch | None = None

    def __repr__(self) -> str:
        return f"WorkerPool({self.where!r}, workers={len(self.actors) or self.workers})"

    @property
    def where(self) -> str:
        return self.cluster.address if self.cluster else self.address

    @property
    def gpus(self) -> bool:
        """True when the actors hold GPUs (known once started)."""
        return bool(self.info) and self.info[0]["device"] == "cuda"

    def start(self) -> None:
        """Connect and start the actors (done by the first batch; call it to fail early).

        Raises
        ------
        ClusterError
            The cluster cannot be reached, or has no room for the workers.
        """
        if self.actors:
            return
        ray = require_ray()
        self.cluster = connect(self.address, num_cpus=self.num_cpus, **self.init_kwargs)
        gpus = self.cluster.gpus >= 1
        if gpus:
            n = self.workers or int(self.cluster.gpus)
            opts: dict[str, Any] = {"num_gpus": 1, "num_cpus": 1}
            threads = None
        else:
            n = self.workers or max(1, int(self.cluster.cpus // self.cpus_per_worker))
            opts = {"num_cpus": self.cpus_per_worker}
            threads = self.cpus_per_worker
        # A crashed actor restarts (its constructor runs again) and the calls it held run
        # again there; past max_restarts, encode_batches moves them to another actor.
        actor_cls = ray.remote(max_restarts=self.max_restarts, max_task_retries=self.max_restarts, **opts)(_Worker)
        actors = [actor_cls.remote(threads) for _ in range(n)]
        try:
            info = _get(ray, [a.info.remote() for a in actors], timeout=START_TIMEOUT_S, where=self.where)
        except ray.exceptions.GetTimeoutError:
            for a in actors:
                ray.kill(a, no_restart=True)
            raise ClusterError(
                f"{n} Ray workers did not start within {START_TIMEOUT_S:.0f}s on {self.where!r} "
                f"(the cluster may lack free {'GPUs' if gpus else 'CPUs'}; pass fewer workers)"
            ) from None
        self.actors, self.alive, self.info = actors, [True] * n, info
        self.stats = [WorkerStats(i, d["node"], d["device"]) for i, d in enumerate(info)]
        self.head = _HeadWatch.of(ray)
        log.info("ray: %d %s workers on %s", n, info[0]["device"], self.where)

    def load(self, spec: _ModelSpec) -> None:
        """Load ``spec`` on every live actor now, so that a worker without the model (or with
        another copy of it) fails the run before any batch is sent.

        Raises
        ------
        CodeSearchError
            The error of the first actor that cannot load it (one line).
        """
        if spec.key in self.loaded:
            return
        ray = require_ray()
        self.start()
        refs = {i: a.load.remote(spec) for i, a in enumerate(self.actors) if self.alive[i]}
        dtypes = []
        for i, ref in refs.items():
            try:
                dtypes.append(_get(ray, ref, timeout=START_TIMEOUT_S, where=self.where))
            except ray.exceptions.RayTaskError as exc:
                raise _cause(exc) from None
            except ray.exceptions.RayActorError as exc:  # died for good: the others go on
                self.mark_dead(i, exc)
                if not any(self.alive):
                    raise self.all_dead(exc) from None
        self.loaded.add(spec.key)
        self.dtypes[spec.identity] = dtypes[0]

    def memory(self) -> list[dict[str, float]]:
        """Resident and peak memory (MB) of each live actor's process."""
        ray = require_ray()
        live = [a for a, ok in zip(self.actors, self.alive) if ok]
        return _get(ray, [a.memory.remote() for a in live], timeout=START_TIMEOUT_S, where=self.where)

    def worker_pids(self) -> list[int]:
        """Process ids of the live actors now (a restarted actor has a new one)."""
        ray = require_ray()
        live = [a for a, ok in zip(self.actors, self.alive) if ok]
        return [d["pid"] for d in _get(ray, [a.info.remote() for a in live], timeout=START_TIMEOUT_S, where=self.where)]

    def progress(self) -> ClusterProgress:
        """Progress since the first batch, overall and per worker."""
        seconds = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        w = tuple(self.stats)
        return ClusterProgress(sum(s.batches for s in w), sum(s.texts for s in w), sum(s.tokens for s in w), seconds, w)

    def describe(self, identity: str | None = None) -> str:
        """How this pool embeds, for ``status``: ``ray local: 2 cpu workers (float32)``."""
        if not self.info:
            return f"ray {self.where} (not started)"
        dtype = f" ({self.dtypes[identity]})" if identity in self.dtypes else ""
        return f"ray {self.where}: {len(self.info)} {self.info[0]['device']} workers{dtype}"

    def close(self) -> None:
        """Stop the actors, and the cluster when it was started here. Idempotent."""
        if not self.actors:
            return
        ray = require_ray()
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - a lost cluster: nothing left to stop
                pass
        self.actors, self.alive, self.loaded, self.dtypes = [], [], set(), {}
        self.head = None
        if self.cluster is not None and self.cluster.started_here and ray.is_initialized():
            ray.shutdown()  # ~7 s when the head is gone; Ray's exit hook would wait as long
        self.cluster = None

    def wait(self, refs: list[Any], idle: Callable[[], None] | None = None) -> list[Any]:
        """The refs of ``refs`` that are done (at least one), watching the cluster's head
        meanwhile and calling ``idle`` about every :data:`IDLE_S` while none is.

        Raises
        ------
        ClusterError
            The head stopped answering for :data:`HEAD_LOST_AFTER_S` (one line), or Ray
            reports the connection lost.
        """
        ray = require_ray()
        timeout = IDLE_S if idle is not None else None if self.head is None else HEAD_CHECK_S
        while True:
            if self.head is not None:
                self.head.check(self.where)
            done, _ = _wait(ray, refs, where=self.where, timeout=timeout)
            if done:
                return done
            if idle is not None:
                idle()

    def mark_dead(self, worker: int, exc: BaseException, what: str = "") -> None:
        """Record that actor ``worker`` is gone for good (warned once, whatever the number
        of its batches that fail)."""
        if self.alive[worker]:
            log.warning("ray worker %d died (%s)%s", worker, _first_line(exc), what)
        self.alive[worker] = False

    def pick(self, load: list[int]) -> int | None:
        """The least loaded live actor with room for another batch."""
        live = [i for i, ok in enumerate(self.alive) if ok and load[i] < self.depth]
        return min(live, key=lambda i: load[i]) if live else None

    def all_dead(self, exc: BaseException | None = None) -> ClusterError:
        why = f" (last: {_first_line(exc)})" if exc is not None else ""
        return ClusterError(
            f"every Ray worker on {self.where!r} died{why}; the vectors finished so far are kept "
            "(run 'codesearch index' again to resume, or index without --ray)"
        )


@dataclass
class _Task:
    seq: int
    texts: list[str]
    worker: int
    ref: Any


_RETRY = object()


# --------------------------------------------------------------------------------------------
# RayEncoder
# --------------------------------------------------------------------------------------------


class RayEncoder:
    """An encoder whose document batches run on a :class:`WorkerPool`.

    Reads like the local encoder it wraps (``name``, ``identity``, ``dim``, ``max_length``,
    ``multivector``, ``count_tokens``, ``token_counter``, ``encode``), and adds
    :meth:`encode_batches`, which keeps every actor busy. The cluster and the actors start on
    the first batch, so a run with nothing to embed never touches Ray.

    Parameters
    ----------
    local : Encoder
        The same checkpoint loaded here: its attributes describe the vectors, queries are
        encoded with it, and the actors load ``local.name`` and must match ``local.identity``.
    pool : WorkerPool, optional
        The actors (shared by the encoders of a run); default: a pool of its own, made from
        ``pool_kwargs`` and closed by :meth:`close`.
    dtype : str, optional
        The actors' dtype. Default: the local encoder's on CPU actors (vectors equal to a
        local run's), the device's default (bf16) on GPU actors.
    progress : callable, optional
        Called with the pool's :class:`ClusterProgress` after every batch.
    **pool_kwargs
        ``address``, ``workers``, ... of :class:`WorkerPool`, when ``pool`` is not given.
    """

    def __init__(
        self,
        local: Encoder,
        pool: WorkerPool | None = None,
        *,
        dtype: str | None = None,
        progress: Callable[[ClusterProgress], None] | None = None,
        **pool_kwargs: Any,
    ) -> None:
        self.local = local
        self.owns_pool = pool is None
        self.pool = pool if pool is not None else WorkerPool(**pool_kwargs)
        self.dtype = dtype
        self.progress = progress
        self._counts: OrderedDict[tuple[str, ...], list[int]] = OrderedDict()

    # -- the local encoder's face ----------------------------------------------------------

    @property
    def name(self) -> str:
        return self.local.name

    @property
    def identity(self) -> str:
        return self.local.identity

    @property
    def dim(self) -> int:
        return self.local.dim

    @property
    def max_length(self) -> int:
        return self.local.max_length

    @property
    def multivector(self) -> bool:
        return self.local.multivector

    def __repr__(self) -> str:
        return f"RayEncoder({self.identity!r}, {self.pool!r})"

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Document tokens per text, like the local encoder's. For a batch just encoded, what
        its worker counted as it tokenized, which is capped at ``max_length`` (all that the
        pipeline reads); the driver tokenizing every text again bounded a cluster at one
        core's tokenizer, ~750k tok/s here (BENCHMARKS.md)."""
        hit = self._counts.get(tuple(texts))
        return list(hit) if hit is not None else self.local.count_tokens(texts)

    def token_counter(self):
        """The local encoder's picklable token counter."""
        return self.local.token_counter()

    def describe(self) -> str:
        """How this encoder embeds, for ``status``: ``ray local: 2 cpu workers (float32)``."""
        return self.pool.describe(self.identity)

    def close(self) -> None:
        """Close the pool if it is this encoder's own."""
        if self.owns_pool:
            self.pool.close()

    def start(self) -> None:
        """Start the pool and load the model on every actor (the first batch does it too).

        Raises
        ------
        ClusterError
            The cluster cannot be reached or has no room for the workers.
        CodeSearchError
            An actor cannot load the model, or loads another checkpoint under its name.
        """
        self.pool.start()
        self.pool.load(self._spec())

    def _spec(self) -> _ModelSpec:
        dtype = self.dtype
        if dtype is None and not self.pool.gpus:
            dtype = str(self.local.dtype).removeprefix("torch.")  # vectors equal to a local run's
        return _ModelSpec(self.local.name, self.local.identity, dtype)

    # -- encoding ----------------------------------------------------------------------------

    def encode(self, texts: list[str], kind: str = "document", batch_tokens: int | None = None):
        """Vectors for ``texts`` in input order: documents on the cluster, queries locally.

        For many batches use :meth:`encode_batches`, which keeps every actor busy.
        """
        if kind == "query" or batch_tokens is not None:
            return self.local.encode(texts, kind=kind, batch_tokens=batch_tokens)
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, not one string; wrap it: encode([text])")
        return next(iter(self.encode_batches([list(texts)], kind=kind)))

    def encode_batches(
        self, batches: Iterable[list[str]], kind: str = "document", idle: Callable[[], None] | None = None
    ) -> Iterator[Any]:
        """One output per input batch, in input order, each as ``encode`` returns it.

        ``batches`` is consumed lazily: at most ``depth`` batches per actor are in flight and
        at most as many again wait here to be yielded in order, so memory stays bounded.
        ``idle`` is called about every :data:`IDLE_S` while no batch is done (the pipeline
        commits a waiting group of batches there).

        Raises
        ------
        ClusterError
            The connection to the cluster is lost, or every actor died for good.
        """
        if kind not in ("document", "query"):
            raise ValueError(f"kind must be 'document' or 'query', not {kind!r}")
        it = iter(batches)
        first = next(it, None)
        if first is None:
            return
        self.start()
        pool, ray = self.pool, require_ray()
        spec = self._spec()
        if pool.t0 is None:
            pool.t0 = time.perf_counter()
        it = itertools.chain([first], it)
        window = 2 * pool.depth * len(pool.actors)
        pending: dict[Any, _Task] = {}  # object ref -> its task
        ready: dict[int, Any] = {}  # finished outputs waiting for their turn
        retry: list[tuple[int, list[str]]] = []  # batches whose actor died for good
        load = [0] * len(pool.actors)
        seq = next_out = 0
        exhausted = False

        def submit(s: int, texts: list[str], worker: int) -> None:
            task = _Task(s, texts, worker, pool.actors[worker].encode.remote(spec, texts, kind))
            pending[task.ref] = task
            load[worker] += 1

        try:
            while True:
                # Retries first, whatever the window: they already count in it.
                while retry and (worker := pool.pick(load)) is not None:
                    submit(*retry.pop(0), worker)
                # New batches to the least loaded live actors while the window has room.
                while not exhausted and len(pending) + len(ready) < window and (worker := pool.pick(load)) is not None:
                    nxt = next(it, None)
                    if nxt is None:
                        exhausted = True
                        break
                    texts = list(nxt)
                    if texts:
                        submit(seq, texts, worker)
                    else:  # nothing to send: the local encoder's empty result
                        ready[seq] = self.local.encode([], kind=kind)
                    seq += 1
                while next_out in ready:
                    yield ready.pop(next_out)
                    next_out += 1
                if not pending:
                    if retry or not any(pool.alive):  # work left and no actor to take it
                        raise pool.all_dead()
                    if exhausted:
                        return
                    continue
                for ref in pool.wait(list(pending), idle):
                    task = pending.pop(ref)
                    load[task.worker] -= 1
                    out = self._collect(ray, task)
                    if out is _RETRY:
                        retry.append((task.seq, task.texts))
                    else:
                        ready[task.seq] = out
        finally:
            for ref in pending:  # a consumer that stopped early (Ctrl-C, an error)
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - best effort: the cluster may be gone
                    pass

    def _collect(self, ray: Any, task: _Task) -> Any:
        pool = self.pool
        try:
            out, busy, counts = _get(ray, task.ref, where=pool.where)
        except ray.exceptions.RayActorError as exc:
            # Ray restarted the actor and retried its calls max_restarts times already:
            # this actor is gone for good; its batch goes to another one.
            pool.mark_dead(task.worker, exc, "; its batches go to the other workers")
            s = pool.stats[task.worker]
            pool.stats[task.worker] = _replace(s, restarts=s.restarts + 1)
            if not any(pool.alive):
                raise pool.all_dead(exc) from None
            return _RETRY
        except ray.exceptions.RayTaskError as exc:
            raise _cause(exc) from None
        self._counts[tuple(task.texts)] = counts
        while len(self._counts) > _COUNT_MEMO:
            self._counts.popitem(last=False)
        s = pool.stats[task.worker]
        pool.stats[task.worker] = _replace(
            s,
            batches=s.batches + 1,
            texts=s.texts + len(task.texts),
            tokens=s.tokens + sum(counts),
            busy_s=s.busy_s + busy,
        )
        if self.progress is not None:
            self.progress(pool.progress())
        return out


def _cause(exc: BaseException) -> BaseException:
    """The user-facing error inside a Ray task error (a CodeSearchError from a worker keeps
    its one line); anything else is a bug and keeps Ray's traceback."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, CodeSearchError) else exc


def _replace(stats: WorkerStats, **changes: Any) -> WorkerStats:
    import dataclasses

    return dataclasses.replace(stats, **changes)


def _lost(where: str, why: str) -> ClusterError:
    return ClusterError(
        f"lost the Ray cluster at {where!r} ({why}); the vectors finished so far are kept "
        "(run 'codesearch index' again to resume, or index without --ray)"
    )


def _get(ray: Any, refs: Any, *, where: str, timeout: float | None = None) -> Any:
    """``ray.get`` with a lost cluster turned into a one-line ClusterError; task and actor
    errors (handled by the caller) and timeouts pass through."""
    try:
        return ray.get(refs, timeout=timeout)
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        raise
    except (ray.exceptions.RayError, ConnectionError, OSError) as exc:
        raise _lost(where, _first_line(exc)) from None


def _wait(ray: Any, refs: list[Any], *, where: str, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
    try:
        return ray.wait(refs, num_returns=1, timeout=timeout)
    except (ray.exceptions.RayError, ConnectionError, OSError) as exc:
        raise _lost(where, _first_line(exc)) from None


# --------------------------------------------------------------------------------------------
# For the API: wrapping a run's encoders
# --------------------------------------------------------------------------------------------


def wrap_encoders(encoders: Any, ray: str | WorkerPool, made: dict[str, Any]) -> Any:
    """A run's ``Encoders`` with each encoder wrapped in a :class:`RayEncoder`, all sharing
    one :class:`WorkerPool`.

    ``ray`` is an address (``"auto"``, see :func:`connect`), or a pool the caller owns (to
    share actors between several ``CodeSearch`` objects). ``made`` keeps the pool (key
    ``"pool"``) and the RayEncoders by identity between runs (a ``CodeSearch`` holds it, so
    the actors start and load each model once); :func:`close_made` stops a pool made here.
    The local encoders stay as they are, for searches.
    """
    import dataclasses

    def wrap(enc: Any) -> Any:
        if enc is None:
            return None
        if "pool" not in made:
            made["pool"] = ray if isinstance(ray, WorkerPool) else WorkerPool(ray)
            made["own"] = not isinstance(ray, WorkerPool)
        if enc.identity not in made:  # identities are "name@hash": never "pool" or "own"
            made[enc.identity] = RayEncoder(enc, made["pool"])
        return made[enc.identity]

    return dataclasses.replace(encoders, dense=wrap(encoders.dense), multi=wrap(encoders.multi))


def close_made(made: dict[str, Any]) -> None:
    """Stop the pool that :func:`wrap_encoders` made (not one the caller passed), and forget it."""
    if made.get("own"):
        made["pool"].close()
    made.clear()


def with_worker_rates(progress: Callable[[Any], None] | None, made: dict[str, Any]):
    """``progress`` with the cluster's rates, overall and per worker, as the message of each
    ``encode`` event (None stays None); the CLI's progress bar shows it."""
    if progress is None:
        return None
    import dataclasses

    def report(event: Any) -> None:
        if event.stage == "encode":
            rates = made["pool"].progress() if "pool" in made else None
            if rates is not None and rates.batches:
                extra = rates.describe()  # replaces the kinds ("dense/file"), which no renderer shows
                event = dataclasses.replace(event, message=extra)
        progress(event)

    return report
