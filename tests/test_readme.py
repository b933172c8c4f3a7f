"""Every Python code block of the README runs as written."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index):
    namespace = {}
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), namespace)
    if "value" in namespace:
        assert set(namespace["grads"]) == set(namespace["params"])
