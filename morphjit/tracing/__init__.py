"""Tracing: the user's function run on tracers records the forward SSA program (``tracer``); it is
traced twice and a value frozen at trace time refused (``twice``); Python asking a traced value
for its value is refused naming the arguments it comes from (``asked``); library functions that never
reach a tracer's dispatch are replaced while traces run (``substitutes``). The tracer's operators
and methods are the array layer's, installed from above (``morphjit.api.methods``).
"""
from . import storage as storage, tracer as tracer
from .substitutes import ANY_TRACE as ANY_TRACE, SYMBOLIC_EXTENT as SYMBOLIC_EXTENT
from .asked import concrete_value_error as concrete_value_error, static_hint as static_hint
from .tracer import (LEAF_TRACERS as LEAF_TRACERS, SUPPORTED_DTYPES as SUPPORTED_DTYPES, NotAnArray as NotAnArray,
                     Trace as Trace, Tracer as Tracer, argument_names as argument_names,
                     current_trace as current_trace)
from .function import trace as trace
from .state import StateWrites as StateWrites
from .twice import FrozenValueError as FrozenValueError, is_user_code as is_user_code, trace_twice as trace_twice
