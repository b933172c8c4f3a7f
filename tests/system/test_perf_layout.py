"""The layout of ``perf/``: benchmark scripts directly in it, reaching morphjit only through its
public names (the top-level package); their results in ``perf/results/``; the tools that read
internals to derive a library constant or a figure for the docs in ``perf/tools/``. And every
``perf/...`` path and ``perf.x`` module the README, the Makefile, the package and ``perf/`` itself
mention exists. Read from the source with ``ast`` and regular expressions; nothing is run."""
import ast
import re

from support.paths import ROOT
PERF = ROOT / "perf"
RESULTS = PERF / "results"
# morphjit's own folders and modules: internals, whatever morphjit/__init__.py imports from them
INTERNAL = {p.stem for p in (ROOT / "morphjit").iterdir()
            if (p / "__init__.py").is_file() or (p.suffix == ".py" and p.stem != "__init__")}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def internal_uses(tree: ast.Module) -> list[str]:
    """What a module takes from morphjit besides its public names, as ``line: what``."""
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("morphjit."):
                    found.append((node.lineno, f"import {alias.name}"))
                elif alias.name == "morphjit":
                    aliases.add(alias.asname or "morphjit")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("morphjit."):
                found.append((node.lineno, f"from {node.module} import ..."))
            elif node.module == "morphjit":
                found += [(node.lineno, f"from morphjit import {a.name}") for a in node.names
                          if a.name in INTERNAL or is_private(a.name)]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and (node.attr in INTERNAL or is_private(node.attr))):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return [f"{line}: {what}" for line, what in sorted(found, key=lambda use: use[0])]


def test_the_checker_tells_internal_uses_from_public_ones():
    internal = ("import morphjit.runtime\nfrom morphjit.jit.checks import arg_spec\n"
                "from morphjit import runtime, _LAZY\nimport morphjit as mj\nmj.ops.OPS\nmj._LAZY\n")
    assert [use.split(": ")[1] for use in internal_uses(ast.parse(internal))] == [
        "import morphjit.runtime", "from morphjit.jit.checks import ...", "from morphjit import runtime",
        "from morphjit import _LAZY", "mj.ops", "mj._LAZY"]
    public = "import morphjit as mj\nfrom morphjit import compile_loss, dask\nmj.dask.dataset_loss\nmj.__version__\n"
    assert internal_uses(ast.parse(public)) == []


def test_benchmarks_use_only_public_names():
    scripts = sorted(PERF.glob("*.py"))
    assert scripts
    found = {p.name: uses for p in scripts if (uses := internal_uses(ast.parse(p.read_text(), str(p))))}
    assert found == {}, f"benchmarks in perf/ reach into morphjit's internals (tools go to perf/tools/): {found}"


def test_results_live_in_perf_results():
    stray = sorted(str(p.relative_to(ROOT)) for p in PERF.rglob("*")
                   if p.suffix in {".json", ".md"} and RESULTS not in p.parents)
    assert stray == []
    assert any(RESULTS.glob("*.md")) and any(RESULTS.glob("*.json"))


def test_tools_say_what_they_derive():
    tools = sorted((PERF / "tools").glob("*.py"))
    assert tools
    assert [p.name for p in tools if not ast.get_docstring(ast.parse(p.read_text()))] == []


PATH = re.compile(r"\bperf/[\w./-]*\w")
MODULE = re.compile(r"\bperf((?:\.[A-Za-z_]\w*)+)")


def missing_module(parts: list[str]) -> str | None:
    """The first part of ``perf.a.b...`` that names no module or package (after a module: attributes)."""
    here = PERF
    for part in parts:
        if (here / part / "__init__.py").is_file():
            here = here / part
        elif (here / f"{part}.py").is_file():
            return None
        else:
            return part
    return None


def mentions(text: str) -> list[str]:
    """The ``perf/...`` paths and ``perf.x`` modules of ``text`` that do not exist."""
    broken = [m.group() for m in PATH.finditer(text) if not (ROOT / m.group()).exists()]
    return broken + [m.group() for m in MODULE.finditer(text) if missing_module(m.group(1)[1:].split("."))]


def test_the_mention_checker_finds_what_is_missing():
    text = "perf/bench.py, python -m perf.bench, perf/results/, perf/no_such.md, perf.tools.no_such, time.perf_counter"
    assert mentions(text) == ["perf/no_such.md", "perf.tools.no_such"]


def test_every_perf_path_and_module_mentioned_exists():
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml",
             *sorted((ROOT / "morphjit").rglob("*.py")), *sorted(p for p in PERF.rglob("*") if p.suffix in {".py", ".md"})]
    broken = {str(p.relative_to(ROOT)): found for p in files if (found := mentions(p.read_text()))}
    assert broken == {}
