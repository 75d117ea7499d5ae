"""One BLAS thread for an actor's NumPy inference: OpenBLAS threads small products and spins, on cores the envs need.

NumPy's OpenBLAS splits a matrix product over every core once it exceeds about 262k multiply-adds (a batch of
17 through a 128-wide layer already does), then its idle threads spin-wait. On the 2-core machines measured
here a (64 x 128) @ (128 x 128) product took 3.2 ms with the default threads against 42 us with one. NumPy has
no API for this, so the thread count is set through the library NumPy loaded (as threadpoolctl does), unless the
user chose one with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

log = logging.getLogger("flywheel.actor")

# Symbol names by build: upstream OpenBLAS, NumPy's scipy-openblas wheels (64-bit ints, with and without suffix).
_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_")


def _loaded_openblas() -> list[str]:
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []  # not Linux
    paths = {line.split()[-1] for line in lines if "openblas" in line.rsplit("/", 1)[-1].lower()}
    return sorted(p for p in paths if p.startswith("/"))


def limit_blas_threads(threads: int = 1) -> list[str]:
    """Set the thread count of every OpenBLAS loaded in this process; returns the libraries it was set in."""
    import numpy  # noqa: F401  (loads NumPy's BLAS, so it can be found)

    if os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS"):
        return []  # the user's choice stands
    done: list[str] = []
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in _SETTERS:
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(int(threads))
                done.append(Path(path).name)
                break
    if not done:
        log.debug("no OpenBLAS found to limit to %d thread(s); NumPy's BLAS keeps its default", threads)
    return done
