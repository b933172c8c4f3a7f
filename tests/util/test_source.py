"""The source builder: scoped indentation, pre-indented blocks."""
import pytest

from morphjit.util import Source


def test_indent_scopes_nest_and_close():
    src = Source()
    src.line("def f(x):")
    with src.indent():
        src.line("for i in range(3):")
        with src.indent():
            src.line("x += i")
        src.line("return x")
    src.line("")
    assert src.text() == "def f(x):\n    for i in range(3):\n        x += i\n    return x\n\n"


def test_block_keeps_relative_indentation_at_the_current_depth():
    src = Source()
    with src.indent(2):
        src.block("if a:\n    b()\n")
    assert src.lines == ["        if a:", "            b()"]


def test_an_exception_inside_a_scope_restores_the_depth():
    src = Source()
    with pytest.raises(RuntimeError), src.indent(3):
        raise RuntimeError
    src.line("x")
    assert src.lines == ["x"]
