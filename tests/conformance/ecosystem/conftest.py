from __future__ import annotations

import os
import sys

# The model builders are a plain module next to the tests (bench/ecosystem.py uses it too).
sys.path.insert(0, os.path.dirname(__file__))
