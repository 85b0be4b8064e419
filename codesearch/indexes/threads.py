"""One thread for a query's small matrix products (FAISS's OpenMP and numpy's BLAS).

A query's products are small: one query against a few thousand rows, 16k centroids x 48
dims x 32 query tokens. Split over 2 threads on a busy machine, each call waits at a barrier
for a descheduled thread: a (16384, 48) x (48, 32) product took 45 ms with OpenBLAS's 2
threads and 0.5 ms with one (load 22 on 2 cores); a FAISS flat search 5.0 ms against 0.66
ms at p90 (10k x 384, load ~4). The thread counts are process-wide, so overlapping users
are counted and the last one out restores what was there.

numpy's BLAS is limited through ``threadpoolctl`` (a dependency); without it, only FAISS is.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["one_thread"]

_lock = threading.Lock()
_users = 0
_saved_omp = 1
_blas_limit = None  # the threadpoolctl limiter in force while there are users
_controller = None  # made once: introspecting the loaded libraries costs milliseconds


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """FAISS and BLAS on one thread for the body."""
    import faiss

    global _users, _saved_omp, _blas_limit
    with _lock:
        if _users == 0:
            _saved_omp = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(1)
            controller = _blas_controller()
            _blas_limit = controller.limit(limits=1, user_api="blas") if controller is not None else None
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                faiss.omp_set_num_threads(_saved_omp)
                if _blas_limit is not None:
                    _blas_limit.restore_original_limits()
                    _blas_limit = None


def _blas_controller():
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            return None
        _controller = ThreadpoolController()
    return _controller
