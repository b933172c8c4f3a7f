"""The README's text and its Python code blocks, in order."""
import re

from .paths import ROOT

README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
