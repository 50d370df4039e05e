from __future__ import annotations

import os
import sys

# The eager-op sweep is a plain module next to the tests (also runnable as a script).
sys.path.insert(0, os.path.dirname(__file__))
