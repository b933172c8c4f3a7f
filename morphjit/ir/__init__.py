"""The IRs every stage speaks: types (dtypes, ``TensorType`` and the batch-size polynomials
``Sym``), the SSA program (values, bindings, text form, parser, verifier), the op record and its
registry ``OPS`` with the shape and dtype rules op families share, affine index maps, and the loop
IR of replay plans (its node and instruction types, walks and printer).
"""
from .index import (IndexMap as IndexMap, broadcast_map as broadcast_map, element as element,
                    is_unit_reshape as is_unit_reshape, loop_vars as loop_vars, slice_map as slice_map,
                    transpose_map as transpose_map, unit_reshape_map as unit_reshape_map)
from .literals import Constants as Constants, literal as literal
from .loops import (DEPTH_LIMIT as DEPTH_LIMIT, Acc as Acc, Accumulate as Accumulate, Alias as Alias, Apply as Apply,
                    Const as Const, depth as depth,
                    Gather as Gather, Gemm as Gemm, Instruction as Instruction, Lapack as Lapack, Load as Load,
                    Nest as Nest, OneHot as OneHot, Position as Position, Random as Random,
                    RangeCheck as RangeCheck, RowNest as RowNest, Scatter as Scatter, Store as Store,
                    batched_input as batched_input, gather_indices as gather_indices, gathers as gathers,
                    internal_shape as internal_shape, loads as loads, loop as loop, loop_axes as loop_axes,
                    replace_loads as replace_loads, same_row as same_row)
from .looptext import describe_instructions as describe_instructions
from .op import (COMPOSITE as COMPOSITE, ELEMENTWISE as ELEMENTWISE, EXPENSIVE as EXPENSIVE, LINALG as LINALG,
                 MATMUL as MATMUL, OPS as OPS, REDUCE as REDUCE, SOURCE as SOURCE, STRUCTURAL as STRUCTURAL,
                 VIEW as VIEW, NoDerivative as NoDerivative, defop as defop)
from .parser import parse as parse
from .program import (Binding as Binding, Lit as Lit, Namer as Namer, Program as Program, Var as Var,
                      format_binding as format_binding, params_of as params_of)
from .rules import (ANY as ANY, FLOAT as FLOAT, NUMERIC as NUMERIC, broadcast_shapes as broadcast_shapes,
                    check_axes as check_axes, elementwise_rule as elementwise_rule,
                    empty_reduction_error as empty_reduction_error, keepdims_shape as keepdims_shape,
                    reduced_shape as reduced_shape, require_float as require_float, same_dtype as same_dtype,
                    slice_index as slice_index, slice_shape as slice_shape)
from .types import (BATCH as BATCH, BATCH_SIZE as BATCH_SIZE, DTYPE_NAMES as DTYPE_NAMES,
                    DTYPES_BY_NAME as DTYPES_BY_NAME, Specialize as Specialize, Sym as Sym,
                    TensorType as TensorType, batch_size as batch_size, degree as degree, dtype_name as dtype_name,
                    evaluate as evaluate, is_float as is_float, is_symbolic as is_symbolic, magnitude as magnitude,
                    upper_bound as upper_bound)
