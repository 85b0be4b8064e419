"""The encoder on a Ray cluster: a backend of the `codesearch.encoder.base.Encoder` protocol.

An index run's texts go to a pool of Ray actors, each holding the models once; everything
else (walking, chunking, the store, the indexes) stays in the driver. ``ray`` itself is
imported only when a cluster is used (``pip install "codesearch[ray]"``).
"""

from codesearch.encoder.ray.backend import (
    Cluster,
    ClusterProgress,
    RayEncoder,
    WorkerPool,
    WorkerStats,
    close_made,
    connect,
    require_ray,
    with_worker_rates,
    wrap_encoders,
)

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
