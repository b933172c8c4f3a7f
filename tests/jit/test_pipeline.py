"""The pipeline as data: one list of stages, one driver that times, dumps and verifies them."""
import numpy as np

import morphjit as mj
from morphjit.jit import explain, pipeline
from morphjit.jit.checks import arg_spec
from morphjit.jit.train import training_stages


def test_a_training_step_inserts_its_stages_into_the_one_list():
    names = [s.name for s in training_stages(mj.optim.adam(), native=True)]
    assert names == ["trace", "vjp", "passes", "update", "lower", "passes", "plan", "write_in_place", "codegen", "load"]
    assert [s.name for s in training_stages(mj.optim.sgd(0.1), native=False)] == ["trace", "vjp", "passes", "update"]


def test_the_report_labels_come_from_the_stages():
    assert list(explain.STAGE_LABELS) == list(dict.fromkeys(s.name for s in pipeline.NATIVE))


def test_dump_names_a_stage(monkeypatch, capsys):
    monkeypatch.setenv("MORPHJIT_DUMP", "update,plan")
    step = mj.train_step(lambda w, x: mj.mean((x @ w) ** 2), mj.optim.sgd(0.1), cache=False)
    w = np.ones((3, 2))
    step(w, step.init(w), np.ones((4, 3)))
    err = capsys.readouterr().err
    assert "--- <lambda>: after update\n" in err and "--- <lambda>: after plan\n" in err
    assert "after trace" not in err


def test_verify_checks_each_stage_that_makes_a_program(monkeypatch):
    verified = []
    monkeypatch.setattr(mj.Program, "verify", lambda self: verified.append(self) or self)
    fn, args = (lambda w: mj.sum(w * w)), (np.ones(2),)
    build = pipeline.Build(fn, args, arg_spec(fn, args, 0)[0])
    pipeline.run((pipeline.TRACE, pipeline.VJP), build)
    assert verified == []
    monkeypatch.setenv("MORPHJIT_VERIFY", "1")
    pipeline.run((pipeline.TRACE, pipeline.VJP), build)
    assert verified == [build.forward, build.program]
