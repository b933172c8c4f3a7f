"""The parser of the SSA IR's text form: ``parse(str(program))`` reads a program back (its
constants as zeros), which lets tests state programs as text."""
from __future__ import annotations

import ast
import re

import numpy as np

from .program import Binding, Lit, Program, Var, params_of
from .types import BATCH, BATCH_SIZE, DTYPES_BY_NAME, TensorType, is_float


_DECL = re.compile(r"^(v\d+):(\w+)\[([\dB*+,]*)\]$")


def parse(text: str) -> Program:
    """Read a program back from its text form (constants become zeros)."""
    env: dict[str, Var] = {}
    inputs, consts, bindings, outputs = [], [], [], []
    for raw in text.strip().splitlines():
        line = raw.strip()
        head, _, rest = line.partition(" ")
        if head == "in":
            inputs = [_declare(tok, env) for tok in rest.split()]
        elif head == "const":
            consts = [(v, np.zeros(v.shape, v.dtype)) for v in (_declare(t, env) for t in rest.split())]
        elif head == "out":
            outputs = [env[tok] for tok in rest.split()]
        else:
            bindings.append(_parse_binding(line, env))
    return Program(tuple(inputs), tuple(bindings), tuple(outputs), tuple(consts))


def _declare(token: str, env: dict[str, Var]) -> Var:
    m = _DECL.match(token)
    if not m:
        raise ValueError(f"bad value declaration {token!r}")
    name, dt, dims = m.groups()
    shape = tuple(_parse_extent(d) for d in dims.split(",") if d)
    env[name] = Var(TensorType(shape, DTYPES_BY_NAME[dt]))
    return env[name]


_TOKEN = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")   # split at spaces outside quotes


def _parse_binding(line: str, env: dict[str, Var]) -> Binding:
    lhs, _, rhs = line.partition(" = ")
    tokens = _TOKEN.findall(rhs)
    op, args = tokens[0], tokens[1:]
    inputs, params = [], {}
    for tok in args:
        if "=" in tok:
            key, _, value = tok.partition("=")
            params[key] = _parse_param(value)
        elif tok in env:
            inputs.append(env[tok])
        else:
            inputs.append(_parse_literal(tok))
    out = _declare(lhs, env)
    return Binding(out, op, tuple(inputs), params_of(params))


_EXTENT = re.compile(r"^[\dB*+(),]*$")


def _parse_extent(text: str):
    """An extent or a tuple of them, as printed (``784*B``, ``B**2+1``, ``(B,10)``)."""
    if not _EXTENT.match(text):
        raise ValueError(f"bad extent {text!r}")
    return eval(text, {"__builtins__": {}}, {BATCH: BATCH_SIZE})


def _parse_param(text: str):
    if BATCH in text and _EXTENT.match(text):
        return _parse_extent(text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return float(text) if text in ("inf", "-inf", "nan") else text  # repr of non-finite floats


def _parse_literal(tok: str) -> Lit:
    value, _, dt = tok.partition(":")
    if value in ("True", "False"):
        return Lit(value == "True", np.bool_)
    dtype = DTYPES_BY_NAME[dt or "f64"]
    return Lit(float(value) if is_float(dtype) else int(value), dtype)
