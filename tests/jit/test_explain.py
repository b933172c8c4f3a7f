"""``loss.explain(...)`` reports, the one-line ``repr`` of a compiled loss, and the status line."""
from __future__ import annotations

import html.parser
import io
import re
import threading
import time

import numpy as np
import pytest

import morphjit as mj
from morphjit.jit import explain as explain_module, feedback, pipeline
from support.models import MODELS

STAGES = ["trace", "vjp", "passes", "lower", "plan", "codegen", "load", "numba"]


@pytest.fixture(scope="module")
def mlp():
    fn, args = MODELS["mlp2"](np.float64)
    loss = mj.compile_loss(fn)
    return loss, args, loss.explain(*args)


# ---------------------------------------------------------------------------------------------
# The report's content


def test_report_holds_every_stage(mlp):
    loss, args, report = mlp
    assert list(report.timings.stages) == STAGES
    assert all(seconds >= 0 for seconds in report.timings.stages.values())
    assert report.origin in (feedback.COMPILED, feedback.DISK, feedback.MEMORY)
    traced = mj.trace(loss.fn, *args)   # the report's is traced with a symbolic batch size
    assert [b.op for b in report.forward.bindings] == [b.op for b in traced.bindings if b.op != "mul"] + [
        "fill", "div", "mul"]
    assert report.batch == args[1].shape[0] and "B = " in report.headline()
    assert str(report.joint) == str(loss.program(*args))
    assert report.source == loss.source(*args)
    assert 0 < report.workspace_bytes <= report.naive_bytes
    assert report.naive_buffers >= len(report.plan.slots)


def test_fusion_groups_cover_the_lowered_program(mlp):
    _, _, report = mlp
    plan = report.plan
    assert len(report.groups) == len(plan.instructions)
    covered = {id(b) for g in report.groups for b in g.bindings}
    assert covered == {id(b) for b in plan.program.bindings}, "a binding of the lowered program is in no group"
    kinds = [g.kind for g in report.groups]
    assert kinds.count("gemm") == plan.counts()["gemm"] == 5
    # The bias add and the relu run in one loop over the GEMM output.
    relu = next(g for g in report.groups if any(b.op == "relu" for b in g.bindings))
    assert {b.op for b in relu.bindings} == {"add", "relu"} and relu.kind == "loop"


def test_text_rendering(mlp):
    loss, _, report = mlp
    text = str(report)
    assert repr(report) == text
    assert text.startswith("morphjit step for 'loss' at (f64[12,20], ")
    titles = re.findall(r"^== (.*) ==$", text, re.M)
    assert [t.split(" (")[0] for t in titles] == ["timings", "forward program", "joint program after the passes",
                                                  "fusion groups", "buffer plan", "generated source"]
    for stage in ("trace (forward program)", "vjp (reverse mode)", "codegen (source)", "total"):
        assert re.search(rf"^  {re.escape(stage)} +\d+\.\d ms", text, re.M), stage
    assert re.search(r"^  numba (compile|disk-cache load|\(already in memory\)) +\d+\.\d ms", text, re.M)
    assert "naive plan: one buffer per computed value, 28 buffers" in text
    assert "#2 loop over [B, 20] -> v8  (2 bindings fused)" in text
    assert "def step(" in text and report.source in text


class _Tags(html.parser.HTMLParser):
    """Checks that tags nest and close, and collects the text of each <summary>."""
    VOID = {"br", "hr", "img", "meta"}

    def __init__(self):
        super().__init__()
        self.stack, self.summaries, self.counts = [], [], {}
        self._in_summary = False

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "summary":
            self._in_summary = True
            self.summaries.append("")

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
        self.stack.pop()
        self._in_summary = self._in_summary and tag != "summary"

    def handle_data(self, data):
        if self._in_summary:
            self.summaries[-1] += data


def parse_html(text: str) -> _Tags:
    tags = _Tags()
    tags.feed(text)
    tags.close()
    assert not tags.stack, f"unclosed tags {tags.stack}"
    return tags


def test_html_rendering_is_well_formed_and_escaped(mlp):
    _, _, report = mlp
    page = report._repr_html_()
    tags = parse_html(page)
    assert tags.counts["details"] == len(report.sections()) == 6
    assert [s.split(" (")[0] for s in tags.summaries] == ["timings", "forward program", "joint program after the passes",
                                                          "fusion groups", "buffer plan", "generated source"]
    assert "label < 0" not in page and "&#x27;loss&#x27;" in page
    assert "<script" not in page


def test_html_source_is_highlighted_with_pygments_and_plain_without(mlp, monkeypatch):
    pytest.importorskip("pygments")
    _, _, report = mlp
    assert "<span style=" in report._repr_html_()
    monkeypatch.setattr(explain_module, "highlight_python", lambda source: None)
    page = report._repr_html_()
    assert "<span style=" not in page
    source_block = page.split("generated source")[1]
    assert "<pre>" in source_block and "value &lt; 0 or value &gt;= 5" in source_block
    parse_html(page)


def test_html_escapes_everything(monkeypatch):
    """Text that looks like markup (here smuggled in through a function name) stays text."""
    def f(p):
        return mj.sum(p * p)
    f.__name__ = "<b>x</b>"
    f.__qualname__ = f.__name__
    loss = mj.compile_loss(f, backend="interp")
    page = loss.explain(np.ones(3))._repr_html_()
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    parse_html(page)


def test_interp_backend_report():
    loss = mj.compile_loss(lambda p, x: mj.mean((x @ p) ** 2), backend="interp")
    report = loss.explain(np.ones(3), np.ones((2, 3)))
    assert report.plan is None and report.origin is None
    assert list(report.timings.stages) == ["trace", "vjp", "passes"]
    assert "fusion groups" not in str(report) and "joint program" in str(report)
    parse_html(report._repr_html_())


def test_explain_takes_keywords_and_runs_the_step_once(mlp):
    loss, (params, x, y), _ = mlp
    hits = loss.cache_info().hits
    report = loss.explain(params, x=x, y=y)
    assert report.origin is not None and loss.cache_info().hits == hits  # explain is not a call


def test_explain_compiles_an_uncalled_signature():
    fn, args = MODELS["mlp2"](np.float32)
    loss = mj.compile_loss(fn)
    report = loss.explain(*args)
    assert "numba" in report.timings.stages and report.origin is not None
    value, _ = loss(*args)
    assert np.isfinite(value)


# ---------------------------------------------------------------------------------------------
# repr


def test_repr_summarises_the_compiled_function(mlp):
    loss, args, _ = mlp
    assert repr(loss) == "<compiled loss 'loss': 1 signature, 14 instructions, cached on disk>"
    fresh = mj.compile_loss(loss.fn)
    assert repr(fresh) == "<compiled loss 'loss': not called yet>"
    off = mj.compile_loss(loss.fn, cache=False)
    assert repr(off) == "<compiled loss 'loss': not called yet, disk cache off>"
    interp = mj.compile_loss(loss.fn, backend="interp")
    interp(*args)
    assert repr(interp) == "<compiled loss 'loss': 1 signature, 27 bindings, interp backend>"


def test_repr_with_two_signatures(mlp):
    loss, (params, x, y), _ = mlp
    two = mj.compile_loss(loss.fn, backend="interp")
    two(params, x, y)
    two(params, x[:4], y[:4])   # another batch size: the same step
    two({k: v[:2] if k == "W1" else v for k, v in params.items()}, x[:, :2], y)
    assert repr(two).startswith("<compiled loss 'loss': 2 signatures, 27 bindings")


# ---------------------------------------------------------------------------------------------
# The status line


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def fast_status(monkeypatch):
    monkeypatch.setattr(feedback, "STATUS_DELAY", 0.05)
    monkeypatch.setattr(feedback, "STATUS_PERIOD", 0.05)


def slow_compile(monkeypatch, seconds=0.4, stage="vjp"):
    """Make one stage of every compilation (``vjp`` or ``traced_loss``) take ``seconds`` longer."""
    real = getattr(pipeline, stage)

    def slow(*args):
        time.sleep(seconds)
        return real(*args)
    monkeypatch.setattr(pipeline, stage, slow)


def test_output_is_not_interactive_under_pytest():
    assert feedback.output_mode() is None


def test_status_line_on_a_terminal(monkeypatch, fast_status):
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    monkeypatch.delenv("MORPHJIT_QUIET", raising=False)
    slow_compile(monkeypatch)
    loss = mj.compile_loss(lambda p: mj.sum(p * p), backend="interp")
    loss(np.ones(3))
    text = tty.getvalue()
    assert "morphjit: compiling '<lambda>' (reverse mode, 0 s) ..." in text
    assert text.endswith("\n") and re.search(r"morphjit: compiled '<lambda>' in 0\.\d s\n$", text)
    assert not [t for t in threading.enumerate() if t.name == "morphjit-status"]


def test_quick_compilations_say_nothing(monkeypatch):
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    monkeypatch.delenv("MORPHJIT_QUIET", raising=False)
    mj.compile_loss(lambda p: mj.sum(p * p), backend="interp")(np.ones(3))
    assert tty.getvalue() == ""


@pytest.mark.parametrize("quiet", ["1", "yes"])
def test_quiet_environment_silences_the_status(monkeypatch, fast_status, quiet):
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    monkeypatch.setenv("MORPHJIT_QUIET", quiet)
    slow_compile(monkeypatch, 0.2)
    mj.compile_loss(lambda p: mj.sum(p * p), backend="interp")(np.ones(3))
    assert tty.getvalue() == ""


def test_not_a_terminal_says_nothing(monkeypatch, fast_status, capfd):
    monkeypatch.delenv("MORPHJIT_QUIET", raising=False)
    slow_compile(monkeypatch, 0.2)
    mj.compile_loss(lambda p: mj.sum(p * p), backend="interp")(np.ones(3))
    assert capfd.readouterr() == ("", "")


def test_status_covers_the_numba_compile_and_names_its_origin(monkeypatch, fast_status):
    """The slow part of a numba step is its first call: the status resumes there and ends with
    where the machine code came from."""
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    monkeypatch.delenv("MORPHJIT_QUIET", raising=False)

    def tiny(p, x):
        return mj.sum(mj.tanh(x * p) ** 2)
    loss = mj.compile_loss(tiny)
    monkeypatch.setattr(feedback, "STATUS_DELAY", 0.0)  # shown whatever the speed of this machine
    loss(np.ones(3), np.ones(3))
    origin = loss.explain(np.ones(3), np.ones(3)).origin
    text = tty.getvalue()
    expected = {feedback.COMPILED: "compiled 'tiny' in", feedback.DISK: "loaded 'tiny' from the disk cache in",
                feedback.MEMORY: "prepared 'tiny' in"}[origin]
    assert f"morphjit: {expected}" in text and text.count("\n") == 1


@pytest.mark.parametrize("origin, words", [(feedback.DISK, "loaded 'f' from the disk cache in"),
                                           (feedback.COMPILED, "compiled 'f' in"),
                                           (feedback.MEMORY, "prepared 'f' in")])
def test_status_final_line(monkeypatch, fast_status, origin, words):
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    status = feedback.Status("f", mode="stderr")
    status.start()
    time.sleep(0.15)
    status.pause()
    status.start()
    status.finish(origin)
    status.finish(origin)  # idempotent
    assert tty.getvalue().count(words) == 1 and "compiling 'f'" in tty.getvalue()


def test_a_failed_compilation_ends_its_status(monkeypatch, fast_status):
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    monkeypatch.delenv("MORPHJIT_QUIET", raising=False)
    slow_compile(monkeypatch, 0.2, stage="traced_loss")
    loss = mj.compile_loss(lambda p: p * p, backend="interp")  # not a scalar
    with pytest.raises(mj.ShapeError):
        loss(np.ones(3))
    assert "morphjit: compiling '<lambda>' failed after" in tty.getvalue()
    assert not [t for t in threading.enumerate() if t.name == "morphjit-status"]


@pytest.mark.parametrize("make", [np.random.default_rng, np.random.RandomState])
def test_inspecting_a_step_draws_nothing_from_the_users_generator(make):
    """explain (which runs a step not yet run), the programs, the source, the reports and the
    traces of a loss taking a generator leave the generator as it was: a run with them in the
    middle gives the values of a run without them."""
    def noisy(w, x, rng):
        return mj.sum((w * x + rng.standard_normal(x.shape)) ** 2)
    w, x = np.ones(3), np.ones((5, 3))
    plain, rng = mj.compile_loss(noisy), make(0)
    want = [plain(w, x, rng)[0] for _ in range(3)]
    inspected, rng = mj.compile_loss(noisy), make(0)

    def inspect():
        inspected.explain(w, x, rng)
        inspected.program(w, x, rng), inspected.source(w, x, rng), inspected.step_for(w, x, rng)
        inspected.cache_info(), repr(inspected), mj.grad_program(noisy, w, x, rng), mj.trace(noisy, w, x, rng)
        mj.hvp(noisy).explain(w, np.ones(3), x, rng), mj.hessian(noisy).explain(w, x, rng)
        mj.compile_loss(noisy, backend="interp").explain(w, x, rng)
    inspect()    # before the first call, which explain compiles and runs
    got = [inspected(w, x, rng)[0]]
    inspect()
    got += [inspected(w, x, rng)[0], inspected(w, x, rng)[0]]
    assert got == want
    generator, unchanged = make(1), make(1)
    mj.compile_loss(noisy).explain(w, x, generator)
    assert generator.standard_normal() == unchanged.standard_normal()
