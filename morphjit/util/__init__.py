"""What every layer uses: the ``MORPHJIT_*`` variables (``config``, the one place they are read),
errors that point at the user's code and the tracebacks that show it, nested containers as flat
leaf lists (``pytree``), the indented source builder and the sections Ctrl-C does not cut short.
"""
from . import config as config, pytree as pytree
from .config import vecmath_enabled as vecmath_enabled
from .errors import (ArgumentError as ArgumentError, ArgumentOverflowError as ArgumentOverflowError,
                     ArgumentWriteError as ArgumentWriteError, DtypeError as DtypeError,
                     IndexingError as IndexingError, LayoutError as LayoutError, MorphjitError as MorphjitError,
                     RecompileWarning as RecompileWarning,
                     ShapeError as ShapeError, SourceLoc as SourceLoc, TracingError as TracingError,
                     UnsupportedError as UnsupportedError, describe_location as describe_location,
                     inside_package as inside_package,
                     user_location as user_location)
from .interrupts import guarded as guarded
from .pytree import TreeDef as TreeDef, ravel_pytree as ravel_pytree
from .source import Source as Source
from .tracebacks import trimmed as trimmed
from .version import VERSION as VERSION
