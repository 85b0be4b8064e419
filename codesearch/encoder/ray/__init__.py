"""The encoder on a Ray cluster: a backend of the `codesearch.encoder.base.Encoder` protocol.

An index run's texts go to a pool of Ray actors, each holding the models once; everything
else (walking, chunking, the store, the indexes) stays in the driver. ``ray`` itself is
imported only when a cluster is used (``pip install "codesearch-local[ray]"``).

Modules: `cluster` (connect, notice a lost head), `pool` (the actors), `backend`
(`RayEncoder`, the protocol on the pool; `RayEncoders`, what an API object keeps).
"""

from codesearch.encoder.ray.backend import RayEncoder, RayEncoders
from codesearch.encoder.ray.cluster import Cluster, connect, require_ray
from codesearch.encoder.ray.pool import ClusterProgress, WorkerPool, WorkerStats

__all__ = [
    "Cluster",
    "ClusterProgress",
    "RayEncoder",
    "RayEncoders",
    "WorkerPool",
    "WorkerStats",
    "connect",
    "require_ray",
]
