"""The module structure: imports flow one way, modules keep their private names to themselves.

Read from the source with ``ast`` (imports inside functions count), plus fresh interpreters to
check that each module imports on its own.
"""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "morphjit"
MODULES = sorted(f"morphjit.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def source_of(module: str) -> ast.Module:
    path = PACKAGE / f"{module.split('.')[-1]}.py"
    return ast.parse(path.read_text(), str(path))


def imported(module: str) -> list[tuple[str, list[str]]]:
    """``(morphjit module, names taken from it)`` for each import of a sibling module."""
    found = []
    for node in ast.walk(source_of(module)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:  # from . import a, b
                found += [(f"morphjit.{a.name}", []) for a in node.names]
            else:
                found.append((f"morphjit.{node.module}", [a.name for a in node.names]))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [(n, []) for n in names if n.startswith("morphjit.")]
    return [(m, names) for m, names in found if m in MODULES]


def import_graph() -> dict[str, set[str]]:
    return {m: {dep for dep, _ in imported(m)} - {m} for m in MODULES}


def cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from ``start`` back to itself, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for dep in sorted(graph[node]):
            if dep == start:
                return path + [start]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, path + [dep]))
    return None


def test_the_imports_have_no_cycle():
    graph = import_graph()
    cycles = [" -> ".join(c) for m in MODULES if (c := cycle_from(graph, m))]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
    assert cycle_from({"a": {"b"}, "b": set()}, "a") is None


def test_no_module_imports_another_modules_private_names():
    offences = [f"{m} imports {name} from {dep}" for m in MODULES for dep, names in imported(m)
                for name in names if name.startswith("_")]
    assert not offences, "\n".join(offences)


def test_each_module_imports_on_its_own_in_a_fresh_interpreter():
    # ``import morphjit.m`` runs the package's __init__ first, so for the modules it loads that is
    # ``import morphjit``: one interpreter checks those, and the others (loaded on first use) get
    # one each.
    loaded = subprocess.run([sys.executable, "-c", "import sys, morphjit; print(*sys.modules)"],
                            capture_output=True, text=True, check=True).stdout.split()
    on_first_use = [m for m in MODULES if m not in loaded]
    runs = {m: subprocess.Popen([sys.executable, "-c", f"import {m}"], stderr=subprocess.PIPE, text=True)
            for m in on_first_use}
    failed = {m: run.communicate()[1] for m, run in runs.items()}
    failed = {m: err for m, err in failed.items() if runs[m].returncode != 0}
    assert not failed, "\n".join(f"{m}:\n{err}" for m, err in failed.items())
    assert {"morphjit.dask", "morphjit.stats", "morphjit.signal"} <= set(on_first_use)


def loop_ir_kinds() -> set[str]:
    from morphjit.ir import loop as loopir
    return {name for name, c in vars(loopir).items() if isinstance(c, type) and c.__module__ == loopir.__name__}


def kinds_tested(function: ast.AST, kinds: set[str]) -> set[str]:
    """The loop-IR classes that ``isinstance`` calls in ``function`` test for."""
    tested = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            tested |= {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name) and n.id in kinds}
    return tested


def test_consumers_of_the_loop_ir_dispatch_through_tables():
    """Outside the loop-IR module, no function tells loop-IR kinds apart with ``isinstance`` (a
    chain of tests over two or more kinds): a consumer keeps a table from node class to handler,
    so a new kind is added in one module plus one handler per table."""
    kinds = loop_ir_kinds()
    offences = [f"{m}.{node.name} tests for {', '.join(sorted(tested))}"
                for m in MODULES if m != "morphjit.loopir"
                for node in ast.walk(source_of(m)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                if len(tested := kinds_tested(node, kinds)) > 1]
    assert not offences, "\n".join(offences)


def test_the_isinstance_chain_check_sees_a_chain():
    chain = ast.parse("def f(e):\n    if isinstance(e, Load): pass\n    elif isinstance(e, (Apply, OneHot)): pass\n")
    assert kinds_tested(chain.body[0], loop_ir_kinds()) == {"Load", "Apply", "OneHot"}


def environment_reads(module: str) -> list[str]:
    """The ``MORPHJIT_*`` names in ``module`` that sit inside an ``os.environ``/``os.getenv`` read."""
    reads = (ast.unparse(node) for node in ast.walk(source_of(module)) if isinstance(node, (ast.Call, ast.Subscript)))
    return [text for text in reads if ("environ" in text or "getenv" in text) and "MORPHJIT_" in text]


def test_only_the_config_module_reads_morphjit_variables():
    offences = [f"{m}: {read}" for m in MODULES if m != "morphjit.config" for read in environment_reads(m)]
    assert not offences, "read MORPHJIT_* variables through morphjit.config:\n" + "\n".join(offences)


def test_the_environment_check_sees_a_read(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("import os\nx = os.environ.get('MORPHJIT_CACHE', '1')\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert environment_reads("morphjit.m") == ["os.environ.get('MORPHJIT_CACHE', '1')"]


def private_reach_ins(module: str) -> list[str]:
    """``alias._name`` in ``module`` where ``alias`` names a sibling module it imported."""
    tree = source_of(module)
    aliases = {a.asname or a.name for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None for a in node.names}
    return [ast.unparse(node) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
            and node.attr.startswith("_") and not node.attr.startswith("__")]


def test_no_module_reaches_into_another_modules_private_names():
    offences = [f"{m}: {use}" for m in MODULES for use in private_reach_ins(m)]
    assert not offences, "\n".join(offences)


def test_the_reach_in_check_sees_one(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("from . import cache as disk_cache\nx = disk_cache._caching()\ny = disk_cache.__name__\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert private_reach_ins("morphjit.m") == ["disk_cache._caching"]


LINE_LIMIT = 450
# The modules allowed over LINE_LIMIT, each with why it must be one module (its docstring says so too).
ONE_MODULE_BY_DESIGN = {
    "morphjit.ops": "the op table: every rule of an op side by side, one paragraph per op",
    "morphjit.ir": "the SSA vocabulary (types, values, bindings, text form, parser, verifier) every stage speaks",
    "morphjit.loopir": "the loop IR's node and instruction types, their walks and the plan printer, shared by "
                       "every consumer",
    "morphjit.array_api": "the core array functions the tracer's operators and the op table's rules call, and the "
                          "tables plain NumPy calls dispatch through",
    "morphjit.compiler": "the call site with the argument checks it runs (the next to move out: a checks module)",
}


def line_count(module: str) -> int:
    return len((PACKAGE / f"{module.split('.')[-1]}.py").read_text().splitlines())


def test_no_module_is_long_without_a_reason():
    long = [f"{m}: {n} lines" for m in MODULES if (n := line_count(m)) > LINE_LIMIT and m not in ONE_MODULE_BY_DESIGN]
    assert not long, (f"modules over {LINE_LIMIT} lines: split them by concern, or add them to ONE_MODULE_BY_DESIGN "
                      "with the reason (and say it in the docstring):\n" + "\n".join(long))


def test_the_readme_module_map_names_every_module():
    readme = (PACKAGE.parent / "README.md").read_text()
    built = readme[readme.index("## How it is built"):]
    unnamed = [m for m in MODULES + ["morphjit.__main__"] if f"`{m.split('.')[-1]}`" not in built]
    assert not unnamed, "add these modules to the README's module map (How it is built):\n" + "\n".join(unnamed)
