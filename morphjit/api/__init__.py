"""The functions users call, by family, with NumPy's (and SciPy's) semantics: on traced arrays they
bind ops by name (the registry ``morphjit.ir.OPS``), on NumPy arrays they compute. ``core`` is
the core the other families are written with; the NumPy dispatch of plain NumPy calls on tracers
is built in one place (``dispatch``) from the families' own lists; SciPy's functions are under
``scipy``. Loading this package installs the tracer's operators and methods (``methods.install``,
the one call that makes a tracer an array).
"""
from . import linalg as linalg, namespace as namespace, random as random
from .contractions import (diag as diag, diagonal as diagonal, einsum as einsum, inner as inner, kron as kron,
                           outer as outer, tensordot as tensordot, tril as tril, triu as triu, vdot as vdot)
from .conv import (avg_pool2d as avg_pool2d, conv1d as conv1d, conv2d as conv2d, conv3d as conv3d,
                   conv_transpose2d as conv_transpose2d, max_pool2d as max_pool2d)
from .core import (abs as abs, add as add, astype as astype, bind as bind, broadcast_to as broadcast_to,
                   clip as clip, concatenate as concatenate, copy as copy, cos as cos, divide as divide, dot as dot,
                   equal as equal, exp as exp, expand_dims as expand_dims, extremum as extremum, full as full,
                   full_like as full_like, gather as gather, greater as greater, greater_equal as greater_equal,
                   less as less, less_equal as less_equal, log as log, log1p as log1p, log_softmax as log_softmax,
                   logical_and as logical_and, logical_not as logical_not, logical_or as logical_or,
                   logsumexp as logsumexp, matmul as matmul, max as max, maximum as maximum, mean as mean,
                   min as min, minimum as minimum, multiply as multiply, negative as negative,
                   not_equal as not_equal, one_hot as one_hot, ones_like as ones_like, power as power,
                   ravel as ravel, relu as relu, reshape as reshape, scatter as scatter, scatter_add as scatter_add,
                   sigmoid as sigmoid, sign as sign, sin as sin, slice_array as slice_array, softmax as softmax,
                   softmax_cross_entropy as softmax_cross_entropy, sqrt as sqrt, square as square,
                   squeeze as squeeze, stack as stack, std as std, subtract as subtract, sum as sum,
                   swap_last as swap_last, swapaxes as swapaxes, tanh as tanh, trace_of as trace_of,
                   transpose as transpose, unslice as unslice, update_slice as update_slice, var as var,
                   where as where,
                   zeros_like as zeros_like)
from .custom import custom_vjp as custom_vjp, op_label as op_label, stop_gradient as stop_gradient
from .gathers import choose as choose, take as take, take_along_axis as take_along_axis
from .indexing import at as at, getitem as getitem, iota as iota
from .methods import install
from .random import GLOBAL_DRAWS as GLOBAL_DRAWS, dropout as dropout
from .reductions import (all as all, any as any, argmax as argmax, argmin as argmin, average as average,
                         cumprod as cumprod, cumsum as cumsum, nanmean as nanmean, nansum as nansum, norm as norm,
                         prod as prod, prod_op as prod_op, ptp as ptp)
from .scipy.special import (digamma as digamma, entr as entr, erf as erf, erfc as erfc, erfinv as erfinv,
                            expit as expit, gammaln as gammaln, log_expit as log_expit, log_ndtr as log_ndtr,
                            logit as logit, ndtr as ndtr, softplus as softplus, xlog1py as xlog1py, xlogy as xlogy,
                            beta as beta, betainc as betainc, betaln as betaln, gamma as gamma, gammainc as gammainc,
                            gammaincc as gammaincc, i0 as i0, i1 as i1, iv as iv, j0 as j0, j1 as j1, kv as kv,
                            polygamma as polygamma, y0 as y0, y1 as y1, betaincc as betaincc, stdtr as stdtr)
from .slices import Shortening as Shortening, shorter_slices as shorter_slices
from .shapes import (array_split as array_split, atleast_1d as atleast_1d, atleast_2d as atleast_2d,
                     atleast_3d as atleast_3d, broadcast_arrays as broadcast_arrays, column_stack as column_stack,
                     diff as diff, dstack as dstack, flip as flip, fliplr as fliplr, flipud as flipud,
                     hstack as hstack, meshgrid as meshgrid, moveaxis as moveaxis, ndim as ndim, pad as pad,
                     repeat as repeat, roll as roll, shape as shape, size as size, split as split, tile as tile,
                     vstack as vstack)
from .stride_tricks import (as_strided as as_strided, sliding_window_view as sliding_window_view,
                            unwindow as unwindow, window as window, window_values as window_values)
from .ufuncs import (arccos as arccos, arccosh as arccosh, arcsin as arcsin, arcsinh as arcsinh, arctan as arctan,
                     arctan2 as arctan2, arctanh as arctanh, cbrt as cbrt, ceil as ceil, copysign as copysign,
                     cosh as cosh, deg2rad as deg2rad, divmod as divmod, exp2 as exp2, expm1 as expm1,
                     fabs as fabs, float_power as float_power, floor as floor, floor_divide as floor_divide,
                     fmod as fmod, heaviside as heaviside, hypot as hypot, isfinite as isfinite, isinf as isinf,
                     isnan as isnan, log10 as log10, log2 as log2, logaddexp as logaddexp,
                     logaddexp2 as logaddexp2, mod as mod, nan_to_num as nan_to_num, rad2deg as rad2deg,
                     reciprocal as reciprocal, remainder as remainder, rint as rint, round as round, sinc as sinc,
                     sinh as sinh, tan as tan, trunc as trunc)

install()
