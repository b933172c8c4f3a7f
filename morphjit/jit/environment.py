"""What this process compiles and runs with, for a bug report: the versions of morphjit and the
libraries it builds on, the CPU and the vector-math path generated loops take, the BLAS and the
threads, the disk cache, and the ``MORPHJIT_*`` settings in force (``mj.show_config()``,
``python -m morphjit info``).
"""
from __future__ import annotations

import os
import platform
from importlib import metadata

import llvmlite
import llvmlite.binding as llvm
import numba
import numpy as np
import scipy

from ..cache import cache_dir, cache_info, cache_max_size
from ..native import vecmath
from ..util import VERSION, config

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
VECTOR_FEATURES = ("sse2", "avx", "avx2", "fma", "avx512f")
OPTIONAL = ("dask", "distributed", "cloudpickle")


def config_report() -> dict[str, dict[str, str]]:
    """The sections of `show_config`, each ``{item: value}``."""
    return {"versions": _versions(), "cpu": _cpu(), "blas and threads": _blas_and_threads(),
            "cache": _cache(), "settings": config.settings() or {"MORPHJIT_*": "none set"}}


def show_config(file=None) -> None:
    """Print what this process compiles and runs with (`config_report`), to paste into a bug
    report.

    Parameters
    ----------
    file : file object, optional
        Where to print; standard output by default.
    """
    for section, items in config_report().items():
        print(f"{section}:", file=file)
        width = max(map(len, items))
        for item, value in items.items():
            print(f"  {item:<{width}}  {value}", file=file)


def _versions() -> dict[str, str]:
    found = {"morphjit": VERSION, "python": platform.python_version(), "numpy": np.__version__,
             "scipy": scipy.__version__, "numba": numba.__version__, "llvmlite": llvmlite.__version__,
             "llvm": ".".join(map(str, llvm.llvm_version_info)), "platform": _platform()}
    for name in OPTIONAL:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _platform() -> str:
    """The system, its release, the machine and the C library (not `platform.platform`, which
    starts ``uname -p``)."""
    libc = " ".join(platform.libc_ver())
    return f"{platform.system()} {platform.release()} {platform.machine()}" + (f", {libc}" if libc.strip() else "")


def _cpu() -> dict[str, str]:
    features = vecmath.target_features()
    own = sorted(vecmath.OWN_FORMS)
    if vecmath.ENABLED:
        path = (f"glibc's libmvec for {len(vecmath.VARIANTS)} functions"
                + (f", morphjit's own forms for {', '.join(own)}" if own else ""))
    elif not config.vecmath_enabled():
        path = "scalar calls (MORPHJIT_VECMATH is off)"
    else:
        path = "scalar calls (no libmvec here)"
    return {"name": llvm.get_host_cpu_name(), "compiled for": numba.config.CPU_NAME or "host",
            "features": " ".join(f for f in VECTOR_FEATURES if f in features) or "none of " + " ".join(VECTOR_FEATURES),
            "logical cores": str(os.cpu_count()), "vector math": path}


def _blas_and_threads() -> dict[str, str]:
    found = {"numpy's blas": _blas(np), "scipy's blas (generated code calls it)": _blas(scipy),
             "numba threading layer": str(numba.config.THREADING_LAYER),
             "numba threads": str(numba.config.NUMBA_NUM_THREADS)}
    found.update((name, os.environ[name]) for name in THREAD_VARIABLES if name in os.environ)
    return found


def _blas(module) -> str:
    try:
        blas = module.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:   # noqa: BLE001 (a build without the report: say so rather than fail)
        return "unknown"
    return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()


def _cache() -> dict[str, str]:
    if not config.caching():
        return {"disk cache": "off (MORPHJIT_CACHE)"}
    info = cache_info()
    return {"directory": str(cache_dir()), "entries": str(info.entries),
            "size": f"{info.total_bytes / 2 ** 20:.1f} MiB", "bound": f"{cache_max_size() / 2 ** 20:.0f} MiB"}
