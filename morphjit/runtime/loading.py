"""Loading a step's generated module: through the disk cache, its kernels held by it, and the
`RECENT_KERNELS` steps loaded last kept in this process (a re-run notebook cell starts at once)."""
from __future__ import annotations

import threading
from collections import OrderedDict

from ..backend import ENTRY
from ..cache import load_module
from . import kernels

RECENT_KERNELS = 16   # disk-cached kernels kept in memory after the last step calling them is gone
_recent_kernels: OrderedDict = OrderedDict()   # (source, hint) -> dispatcher, the last used at the end
_recent_lock = threading.Lock()


def load_kernel(source: str, hint: str, cache: bool):
    """The entry dispatcher of the module ``source``. With ``cache``, one of the `RECENT_KERNELS`
    loaded last is reused with its machine code (a re-run notebook cell starts at once); the others
    are released with the last step that calls them, and come back from the disk cache."""
    key = (source, hint)
    if cache:
        with _recent_lock:
            kernel = _recent_kernels.get(key)
            if kernel is not None:
                _recent_kernels.move_to_end(key)
                return kernel
    with kernels.loading(cache) as taken:   # the loop-nest kernels the module loads as it runs
        module = load_module(source, name_hint=hint, cache=cache)
    kernels.hold(vars(module), taken)
    kernel = getattr(module, ENTRY)
    if cache:
        with _recent_lock:
            _recent_kernels[key] = kernel
            while len(_recent_kernels) > RECENT_KERNELS:
                _recent_kernels.popitem(last=False)
    return kernel
