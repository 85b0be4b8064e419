"""The Ray actors: each holds the models once and encodes the batches sent to it.

- one actor per GPU when the cluster has GPUs (``num_gpus=1``), else one per
  ``cpus_per_worker`` CPUs. The encoders of a run (dense and ColBERT) share the pool: each
  actor loads a checkpoint by name on first use and checks that its identity (a hash of
  the weights) equals the local one, so a worker with another copy of the model can never
  mix its vectors into the index, and two models never wait for each other's GPUs;
- actors restart (``max_restarts``) and their calls are retried (``max_task_retries``): a
  worker killed mid-run costs a retry of its batches, not the run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from codesearch.encoder.ray import cluster
from codesearch.encoder.ray.cluster import Cluster, connect, first_line, ray_get, ray_wait, require_ray
from codesearch.errors import ClusterError, CodeSearchError

log = logging.getLogger(__name__)

#: Batches in flight per actor: one running and one waiting in its queue, so an actor starts
#: its next batch without a round trip to the driver.
DEFAULT_DEPTH = 2
#: How long actors may take to start and load the model (a cold hub download on a worker).
START_TIMEOUT_S = 600.0


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
class ModelSpec:
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

    def load(self, spec: ModelSpec) -> str:
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

    def encode(
        self, spec: ModelSpec, texts: list[str], kind: str, codec: Any = None
    ) -> tuple[Any, float, list[int]] | tuple[Any, float, list[int], Any]:
        """``encode`` of the model ``spec``, the seconds it took (not counting a load), and the
        tokens each text took (from the same tokenization: the driver need not count them).

        With ``codec`` (a PLAID `ResidualCodec`: its ``fingerprint`` and
        ``compress_documents``), also each text's PLAID codes under it, and that codec's
        fingerprint: the driver of a large first index then only writes them."""
        self.load(spec)
        t0 = time.perf_counter()
        out, counts = self.models[spec.key].encode_counted(texts, kind=kind)
        if codec is None:
            return out, time.perf_counter() - t0, counts
        codes = (codec.fingerprint, codec.compress_documents(list(out)))
        return out, time.perf_counter() - t0, counts, codes


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
        init_kwargs: dict[str, object] | None = None,
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
        self.head: cluster.HeadWatch | None = None

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
            opts: dict[str, object] = {"num_gpus": 1, "num_cpus": 1}
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
            info = ray_get(ray, [a.info.remote() for a in actors], timeout=START_TIMEOUT_S, where=self.where)
        except ray.exceptions.GetTimeoutError:
            for a in actors:
                ray.kill(a, no_restart=True)
            raise ClusterError(
                f"{n} Ray workers did not start within {START_TIMEOUT_S:.0f}s on {self.where!r} "
                f"(the cluster may lack free {'GPUs' if gpus else 'CPUs'}; pass fewer workers)"
            ) from None
        self.actors, self.alive, self.info = actors, [True] * n, info
        self.stats = [WorkerStats(i, d["node"], d["device"]) for i, d in enumerate(info)]
        self.head = cluster.HeadWatch.of(ray)
        log.info("ray: %d %s workers on %s", n, info[0]["device"], self.where)

    def load(self, spec: ModelSpec) -> None:
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
                dtypes.append(ray_get(ray, ref, timeout=START_TIMEOUT_S, where=self.where))
            except ray.exceptions.RayTaskError as exc:
                raise cause(exc) from None
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
        return ray_get(ray, [a.memory.remote() for a in live], timeout=START_TIMEOUT_S, where=self.where)

    def worker_pids(self) -> list[int]:
        """Process ids of the live actors now (a restarted actor has a new one)."""
        ray = require_ray()
        live = [a for a, ok in zip(self.actors, self.alive) if ok]
        infos = ray_get(ray, [a.info.remote() for a in live], timeout=START_TIMEOUT_S, where=self.where)
        return [d["pid"] for d in infos]

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
        meanwhile and calling ``idle`` about every `cluster.IDLE_S` while none is.

        Raises
        ------
        ClusterError
            The head stopped answering for `cluster.HEAD_LOST_AFTER_S` (one line), or Ray
            reports the connection lost.
        """
        ray = require_ray()
        timeout = cluster.IDLE_S if idle is not None else None if self.head is None else cluster.HEAD_CHECK_S
        while True:
            if self.head is not None:
                self.head.check(self.where)
            done, _ = ray_wait(ray, refs, where=self.where, timeout=timeout)
            if done:
                return done
            if idle is not None:
                idle()

    def mark_dead(self, worker: int, exc: BaseException, what: str = "") -> None:
        """Record that actor ``worker`` is gone for good (warned once, whatever the number
        of its batches that fail)."""
        if self.alive[worker]:
            log.warning("ray worker %d died (%s)%s", worker, first_line(exc), what)
        self.alive[worker] = False

    def pick(self, load: list[int]) -> int | None:
        """The least loaded live actor with room for another batch."""
        live = [i for i, ok in enumerate(self.alive) if ok and load[i] < self.depth]
        return min(live, key=lambda i: load[i]) if live else None

    def all_dead(self, exc: BaseException | None = None) -> ClusterError:
        why = f" (last: {first_line(exc)})" if exc is not None else ""
        return ClusterError(
            f"every Ray worker on {self.where!r} died{why}; the vectors finished so far are kept "
            "(run 'codesearch index' again to resume, or index without --ray)"
        )


def cause(exc: BaseException) -> BaseException:
    """The user-facing error inside a Ray task error (a CodeSearchError from a worker keeps
    its one line); anything else is a bug and keeps Ray's traceback."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, CodeSearchError) else exc


def replace_stats(stats: WorkerStats, **changes: int | float) -> WorkerStats:
    return dataclasses.replace(stats, **changes)
