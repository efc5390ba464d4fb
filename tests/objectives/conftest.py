"""Make ``obj_helpers`` importable under any pytest import mode (prepend, append or importlib)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
