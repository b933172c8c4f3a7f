"""Tools that derive a library constant or a figure for the docs, some from morphjit's internals
(the benchmarks, directly in ``perf/``, use only its public names); each module's first line says
what it derives. Run them as ``python -m perf.tools.<name>``."""
