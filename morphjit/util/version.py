"""The package's version (``mj.__version__``; ``mj.dask`` checks that its workers run the same)."""
VERSION = "0.1.0"
