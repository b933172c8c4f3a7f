"""Running a compiled step: kernels compiled once per text and shared (``kernels``), a step's module
loaded and held (``loading``), table steps run by one generic native loop (``table``), the native
call with its workspaces and argument preparation (``step``), the generated fast path per
signature (``fastpath``) and the reference executor of programs and plans (``interp``).
"""
from . import interp as interp, kernels as kernels
from .fastpath import fast_call as fast_call, fast_forward as fast_forward, fast_update as fast_update
from .interp import run as run
from .loading import load_kernel as load_kernel
from .step import NativeStep as NativeStep
