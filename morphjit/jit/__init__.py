"""What a user compiles: the pipeline of stages (``pipeline``), the forward program traced and checked
(``traced``), the argument checks (``checks``), the steps by call signature (``callsite``), the
compiled objects (``compiled``: ``compile_loss``, ``grad``, ``value_and_grad``, ``compile``),
transformations inside a traced function (``nest``), forward mode and Jacobians (``forward``), static
arguments, the training step and its optimisers, second derivatives, the reports (``explain``),
what a compilation tells its user (``feedback``) and what the process compiles with (``environment``).
"""
from . import optim as optim
from .checks import (check_differentiable as check_differentiable, check_plain as check_plain,
                     is_plain_array as is_plain_array)
from .compiled import (CompiledFunction as CompiledFunction, CompiledGrad as CompiledGrad,
                       CompiledLoss as CompiledLoss, compile as compile, compile_loss as compile_loss,
                       grad as grad, grad_program as grad_program, value_and_grad as value_and_grad)
from .environment import config_report as config_report, show_config as show_config
from .forward import jacfwd as jacfwd, jacobian as jacobian, jacrev as jacrev, jvp as jvp, vjp as vjp
from .optim import Optimizer as Optimizer
from .second import (HVP as HVP, MAX_HESSIAN_PARAMETERS as MAX_HESSIAN_PARAMETERS, Hessian as Hessian,
                     hessian as hessian, hvp as hvp)
from .train import TrainStep as TrainStep, train_step as train_step
