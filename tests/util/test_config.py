"""The one rule for MORPHJIT_* switches, read at use time."""
import pytest

from morphjit.util import config


@pytest.mark.parametrize("value, expected", [("0", False), ("false", False), (" No ", False), ("OFF", False),
                                             ("1", True), ("yes", True), ("anything", True)])
def test_a_set_switch_is_off_only_for_the_off_words(monkeypatch, value, expected):
    for name, read in (("CACHE", config.caching), ("QUIET", config.quiet), ("VERIFY", config.verify),
                       ("VECMATH", config.vecmath_enabled)):
        monkeypatch.setenv(f"MORPHJIT_{name}", value)
        assert read() is expected, name


@pytest.mark.parametrize("value", [None, "", "  "])
def test_an_unset_or_empty_switch_takes_its_default(monkeypatch, value):
    for name in ("CACHE", "QUIET", "VERIFY", "VECMATH"):
        if value is None:
            monkeypatch.delenv(f"MORPHJIT_{name}", raising=False)
        else:
            monkeypatch.setenv(f"MORPHJIT_{name}", value)
    assert (config.caching(), config.quiet(), config.verify(), config.vecmath_enabled()) == (True, False, False, True)


def test_dump_names_stages_passes_or_all(monkeypatch):
    monkeypatch.setenv("MORPHJIT_DUMP", "cse, plan")
    assert config.dumped("cse") and config.dumped("plan") and not config.dumped("dce")
    monkeypatch.setenv("MORPHJIT_DUMP", "all")
    assert config.dumped("dce")
    monkeypatch.delenv("MORPHJIT_DUMP")
    assert not config.dumped("cse")
