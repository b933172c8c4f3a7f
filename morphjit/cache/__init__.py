"""The disk cache of generated modules and their numba machine code: its policy (``policy``: naming,
loading, bounding, pruning) over its files (``store``: the checked directory, MAC-verified numba
files, locks).
"""
from .policy import (cache_dir as cache_dir, cache_info as cache_info, cache_max_size as cache_max_size,
                     clear_cache as clear_cache, load_module as load_module, loaded_from_disk as loaded_from_disk,
                     parse_size as parse_size, prune_cache as prune_cache)
