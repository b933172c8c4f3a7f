"""The package's structure: layers in one stated order, each folder's ``__init__`` its interface,
modules that keep their private names to themselves and stay short unless listed with a reason.

Read from the source with ``ast`` (imports inside functions count), plus fresh interpreters to
check that each module imports on its own. The layer order is the one the package states, in the
docstring of ``morphjit/__init__.py``.
"""
import ast
import multiprocessing
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

PACKAGE = ROOT / "morphjit"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(module_name(p) for p in PACKAGE.rglob("*.py"))


def path_of(module: str) -> Path:
    base = PACKAGE.parent.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def source_of(module: str) -> ast.Module:
    path = path_of(module)
    return ast.parse(path.read_text(), str(path))


def stated_layers() -> list[str]:
    """The folders in the order the package states (the line ``util < ir < ...``)."""
    doc = ast.get_docstring(source_of("morphjit"))
    line = next(line for line in doc.splitlines() if line.count(" < ") > 2)
    return [name.strip() for name in line.split("<")]


LAYERS = stated_layers()


def layer_of(module: str) -> str | None:
    """The folder (layer) a module belongs to; None for the facade and ``__main__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def is_package(module: str) -> bool:
    return path_of(module).name == "__init__.py"


def imports(module: str) -> list[tuple[str, list[str], int]]:
    """``(morphjit module imported from, names taken from it, line)`` for each import of the package."""
    package = module if is_package(module) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(source_of(module)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "morphjit" or target.startswith("morphjit."):
                found.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("morphjit.")]
    return found


def imported_modules(module: str) -> set[str]:
    """The package's modules that ``module`` imports (a name taken from a package may be a module)."""
    found = set()
    for target, names, _ in imports(module):
        found |= {f"{target}.{n}" if f"{target}.{n}" in MODULES else target for n in names} or {target}
    return found - {module}


def fake_module(tmp_path, monkeypatch, text: str) -> None:
    """``morphjit.m`` of ``text``, in a package of its own that the checks read instead."""
    (tmp_path / "morphjit").mkdir()
    (tmp_path / "morphjit" / "m.py").write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "morphjit")


def test_the_layer_order_names_every_folder_once():
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert sorted(LAYERS) == folders and len(set(LAYERS)) == len(LAYERS), (LAYERS, folders)


def test_each_folder_imports_only_itself_and_the_folders_before_it():
    offences = [f"{m} ({layer_of(m)}) imports {target} (line {line})"
                for m in MODULES if layer_of(m) for target, _, line in imports(m)
                if layer_of(target) and LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(m))]
    assert not offences, "imports against the layer order " + " < ".join(LAYERS) + ":\n" + "\n".join(offences)


def interface(folder: str) -> set[str]:
    """The names a folder's ``__init__`` binds: what other folders may import from it."""
    names = set()
    for node in source_of(f"morphjit.{folder}").body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def interface_breaches(module: str) -> list[str]:
    """Imports by ``module`` of another folder's modules that do not go through its ``__init__``."""
    own = layer_of(module)
    found = []
    for target, names, line in imports(module):
        folder = layer_of(target)
        if folder is None or folder == own:
            continue
        if target != f"morphjit.{folder}":
            found.append(f"{module} imports {target} (line {line}), past morphjit.{folder}'s __init__")
        else:
            found += [f"{module} imports {n} from morphjit.{folder} (line {line}), which its __init__ does not export"
                      for n in names if n not in interface(folder)]
    return found


def test_other_folders_are_reached_through_their_init_only():
    offences = [o for m in MODULES for o in interface_breaches(m)]
    assert not offences, "\n".join(offences)


def test_the_interface_check_sees_an_import_past_an_init(tmp_path, monkeypatch):
    (tmp_path / "morphjit" / "jit").mkdir(parents=True)
    (tmp_path / "morphjit" / "ir").mkdir()
    (tmp_path / "morphjit" / "ir" / "__init__.py").write_text("from .types import Sym as Sym\n")
    (tmp_path / "morphjit" / "jit" / "m.py").write_text("from ..ir.types import Sym\nfrom ..ir import Var\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "morphjit")
    assert interface_breaches("morphjit.jit.m") == [
        "morphjit.jit.m imports morphjit.ir.types (line 1), past morphjit.ir's __init__",
        "morphjit.jit.m imports Var from morphjit.ir (line 2), which its __init__ does not export"]


def cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from ``start`` back to itself, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for dep in sorted(graph.get(node, ())):
            if dep == start:
                return path + [start]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, path + [dep]))
    return None


def test_the_modules_of_a_folder_import_each_other_without_a_cycle():
    graph = {m: {d for d in imported_modules(m) if layer_of(d) == layer_of(m) and not is_package(d)}
             for m in MODULES if layer_of(m) and not is_package(m)}
    cycles = [" -> ".join(c) for m in graph if (c := cycle_from(graph, m))]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
    assert cycle_from({"a": {"b"}, "b": set()}, "a") is None


def test_no_module_imports_another_modules_private_names():
    offences = [f"{m} imports {name} from {target}" for m in MODULES for target, names, _ in imports(m)
                for name in names if name.startswith("_") and not name.startswith("__")]
    assert not offences, "\n".join(offences)


@pytest.mark.slow
def test_each_module_imports_on_its_own_in_a_fresh_interpreter():
    # ``import morphjit.x.m`` runs the package's __init__ first, so for the modules it loads that is
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
    assert {"morphjit.integrations.dask", "morphjit.api.scipy.stats", "morphjit.api.scipy.signal"} <= set(on_first_use)
    assert not {"dask", "distributed", "scipy.stats", "scipy.signal"} & set(loaded)


def test_every_module_says_what_it_holds():
    missing = [m for m in MODULES if not ast.get_docstring(source_of(m))]
    assert not missing, "modules without a docstring:\n" + "\n".join(missing)


# Modules whose top level changes what another module holds (its globals, a table, a class), each
# with why: elsewhere, what one module installs in another is installed by an explicit call
# (``morphjit.api.methods.install``, called once by ``morphjit.api``).
INSTALLS_ON_IMPORT = {
    "morphjit.api": "installs the tracer's methods, once (methods.install)",
    "morphjit.api.scipy.stats": "a provider: the first trace after scipy.stats is imported imports it, to register "
                                "its substitutes (tracing.substitutes)",
    "morphjit.api.scipy.linalg": "a provider, as morphjit.api.scipy.stats is, for scipy.linalg",
}
MUTATORS = {"update", "register", "append", "extend", "setdefault", "pop", "clear", "provided_by"}


def imported_names(tree: ast.Module) -> set[str]:
    return {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}


def root_name(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def import_time_changes(module: str) -> list[str]:
    """Top-level statements of ``module`` that assign into, or call a mutating method of, a name it
    imported (another module's global, table or class)."""
    tree = source_of(module)
    names = imported_names(tree)
    found = []
    for node in tree.body:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                break
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
                sub, (ast.AugAssign, ast.AnnAssign)) else []
            changed = [t for t in targets if isinstance(t, (ast.Attribute, ast.Subscript)) and root_name(t) in names]
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in MUTATORS \
                    and root_name(sub.func.value) in names:
                changed.append(sub)
            found += [ast.unparse(c).splitlines()[0] for c in changed]
    return found


def test_no_module_changes_another_as_it_is_imported():
    offences = [f"{m}: {change}" for m in MODULES if m not in INSTALLS_ON_IMPORT for change in import_time_changes(m)]
    assert not offences, ("install into another module by an explicit call, or list the module in "
                          "INSTALLS_ON_IMPORT with why:\n" + "\n".join(offences))


def test_the_import_time_check_sees_a_change(tmp_path, monkeypatch):
    fake_module(tmp_path, monkeypatch, '"""m"""\nfrom . import core as A, trace\nA.UFUNCS.update({1: 2})\n'
                                       'trace.getitem = None\n\ndef later():\n    A.UFUNCS.update({})\n')
    assert import_time_changes("morphjit.m") == ["A.UFUNCS.update({1: 2})", "trace.getitem"]


def test_ops_are_declared_by_the_op_families_only():
    """``defop`` at the top level of a module (a declaration as it loads) is the op table's: the
    families ``morphjit.ops`` imports in one list."""
    offences = []
    for m in MODULES:
        if layer_of(m) == "ops":
            continue
        for node in source_of(m).body:
            calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "defop"]
            if calls and not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                offences.append(f"{m}: {ast.unparse(calls[0])[:80]}")
    assert not offences, "\n".join(offences)


def test_the_op_table_imports_every_family():
    families = {p.stem for p in (PACKAGE / "ops").glob("*.py") if p.stem != "__init__"}
    listed = {a.name for node in source_of("morphjit.ops").body if isinstance(node, ast.ImportFrom)
              and node.level == 1 and node.module is None for a in node.names}
    assert families == listed, f"families not in the list: {families - listed}"


def loop_ir_kinds() -> set[str]:
    from morphjit.ir import loops
    return {name for name, c in vars(loops).items() if isinstance(c, type) and c.__module__ == loops.__name__}


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
                for m in MODULES if m != "morphjit.ir.loops"
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
    offences = [f"{m}: {read}" for m in MODULES if m != "morphjit.util.config" for read in environment_reads(m)]
    assert not offences, "read MORPHJIT_* variables through morphjit.util.config:\n" + "\n".join(offences)


def test_the_environment_check_sees_a_read(tmp_path, monkeypatch):
    fake_module(tmp_path, monkeypatch, "import os\nx = os.environ.get('MORPHJIT_CACHE', '1')\n")
    assert environment_reads("morphjit.m") == ["os.environ.get('MORPHJIT_CACHE', '1')"]


def private_reach_ins(module: str) -> list[str]:
    """``alias._name`` in ``module`` where ``alias`` names a module of the package it imported."""
    tree = source_of(module)
    aliases = {a.asname or a.name for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.level for a in node.names}
    return [ast.unparse(node) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
            and node.attr.startswith("_") and not node.attr.startswith("__")]


def test_no_module_reaches_into_another_modules_private_names():
    offences = [f"{m}: {use}" for m in MODULES for use in private_reach_ins(m)]
    assert not offences, "\n".join(offences)


def test_the_reach_in_check_sees_one(tmp_path, monkeypatch):
    fake_module(tmp_path, monkeypatch, "from .cache import policy as disk_cache\nx = disk_cache._caching()\n"
                                       "y = disk_cache.__name__\n")
    assert private_reach_ins("morphjit.m") == ["disk_cache._caching"]


LINE_LIMIT = 450
# The modules allowed over LINE_LIMIT, each with why it must be one module (its docstring says so too).
ONE_MODULE_BY_DESIGN = {
    "morphjit.api.core": "the core array functions the other families, the tracer's operators and the op table's "
                         "rules are written with",
}


def line_count(module: str) -> int:
    return len(path_of(module).read_text().splitlines())


def test_no_module_is_long_without_a_reason():
    long = [f"{m}: {n} lines" for m in MODULES if (n := line_count(m)) > LINE_LIMIT and m not in ONE_MODULE_BY_DESIGN]
    assert not long, (f"modules over {LINE_LIMIT} lines: split them by concern, or add them to ONE_MODULE_BY_DESIGN "
                      "with the reason (and say it in the docstring):\n" + "\n".join(long))


@pytest.mark.parametrize("module", sorted(ONE_MODULE_BY_DESIGN))
def test_a_long_module_is_long_and_says_why(module):
    assert line_count(module) > LINE_LIMIT, f"{module} is short now: take it off ONE_MODULE_BY_DESIGN"
    assert "One module by design" in ast.get_docstring(source_of(module))


def test_the_readme_maps_the_folders_in_the_layer_order():
    readme = (PACKAGE.parent / "README.md").read_text()
    built = readme[readme.index("## How it is built"):]
    found = [m.group(1) for m in re.finditer(r"^- `(\w+)/`", built, re.MULTILINE)]
    assert found == LAYERS, f"the README's map (How it is built) lists {found}, the layer order is {LAYERS}"


def test_the_tests_mirror_the_folders():
    """One folder of tests per layer (and none for a folder that does not exist), ``system`` for
    the package as a whole and ``support`` for what they share; no test module at the top."""
    tests = PACKAGE.parent / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders - {"system", "support"} <= set(LAYERS), sorted(folders - {"system", "support"} - set(LAYERS))
    assert not sorted(p.name for p in tests.glob("test_*.py"))
    assert not sorted(p.name for p in (tests / "support").glob("test_*.py"))


def test_a_test_not_marked_slow_cannot_start_a_process():
    """``tests/conftest.py`` stops an unmarked test that starts an interpreter or a process."""
    with pytest.raises(AssertionError, match="starts a process: mark it @pytest.mark.slow"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(AssertionError, match="starts a process: mark it @pytest.mark.slow"):
        multiprocessing.get_context("spawn").Process(target=print).start()
