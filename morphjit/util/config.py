"""Every ``MORPHJIT_*`` environment variable, read here and nowhere else.

Each is read when it is used (at every call or compilation that depends on it), so a change
made while the process runs (``os.environ``, a test's ``monkeypatch.setenv``) takes effect.

One rule for the on/off switches: unset or empty means the switch's default; ``0``, ``false``,
``no`` and ``off`` (any case, surrounding spaces ignored) mean off; any other value means on.

==========================  ====================================================  ========
variable                    meaning                                               default
==========================  ====================================================  ========
``MORPHJIT_CACHE``          keep compiled steps in the disk cache                 on
``MORPHJIT_CACHE_DIR``      the disk cache's directory                            (cache/)
``MORPHJIT_CACHE_MAX_SIZE`` bound on its bytes: a number, K/M/G/T suffix          1G
``MORPHJIT_DUMP``           ``<stage or pass or rewrite>[,...]`` or ``all``:      none
                            print the program before and after them (stderr)
``MORPHJIT_QUIET``          never show the "compiling..." status line             off
``MORPHJIT_TABLE_STEP``     instructions from which a step is a table of kernel   48
                            calls (``runtime.table``) rather than unrolled code
``MORPHJIT_TRACEBACK``      ``full``: keep morphjit's frames in tracebacks        trimmed
``MORPHJIT_VECMATH``        vector math library calls in generated loops          on
``MORPHJIT_VERIFY``         verify the program after every stage and pass         off
==========================  ====================================================  ========
"""
from __future__ import annotations

import os

OFF = frozenset({"0", "false", "no", "off"})


def settings() -> dict[str, str]:
    """Every ``MORPHJIT_*`` variable set in the environment, by name."""
    return {name: value for name, value in sorted(os.environ.items()) if name.startswith("MORPHJIT_")}


def setting(name: str) -> str:
    """The value of ``MORPHJIT_<name>``, stripped ('' when unset)."""
    return os.environ.get(f"MORPHJIT_{name}", "").strip()


def switch(name: str, default: bool) -> bool:
    """The on/off switch ``MORPHJIT_<name>`` under the module's one rule."""
    value = setting(name).lower()
    return default if not value else value not in OFF


def caching() -> bool:
    return switch("CACHE", True)


def cache_dir() -> str:
    """``MORPHJIT_CACHE_DIR``, or '' (the cache module then picks the platform's directory)."""
    return setting("CACHE_DIR")


def cache_max_size() -> str:
    """``MORPHJIT_CACHE_MAX_SIZE`` as written, or '' (the cache module's default)."""
    return setting("CACHE_MAX_SIZE")


def dumped(name: str) -> bool:
    """``MORPHJIT_DUMP`` names ``name`` (a pipeline stage, a pass or a rewrite) or is ``all``."""
    names = {n.strip() for n in setting("DUMP").split(",")}
    return name in names or "all" in names


def quiet() -> bool:
    return switch("QUIET", False)


def table_step(default: int) -> int:
    """``MORPHJIT_TABLE_STEP`` as a number of instructions, else ``default``."""
    value = setting("TABLE_STEP")
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"MORPHJIT_TABLE_STEP must be a number of instructions, got {value!r}") from None


def full_tracebacks() -> bool:
    return setting("TRACEBACK").lower() == "full"


def vecmath_enabled() -> bool:
    return switch("VECMATH", True)


def verify() -> bool:
    return switch("VERIFY", False)
