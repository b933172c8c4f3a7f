"""From a lowered program to the source of its step: fusion (which values get a buffer), instruction
selection (loop nests and GEMMs in the loop IR), memory (a liveness-planned pool, sizes as
polynomials in the batch size), the plan that holds them, and codegen (``codegen``: the writers of
the step, of its kernels and of table steps, and the loop bodies).
"""
from .codegen.arguments import HEADER as HEADER, RECORD as RECORD, Addresses as Addresses, Frame as Frame
from .codegen.kernel import KERNEL as KERNEL
from .codegen.step import ENTRY as ENTRY
from .codegen.tablegen import render as render
from .fusion import Fusion as Fusion
from .memory import can_write_in_place as can_write_in_place, write_in_place as write_in_place
from .plan import (Plan as Plan, check_not_empty as check_not_empty, empty_reductions as empty_reductions,
                   make_plan as make_plan, range_checks as range_checks)
