from __future__ import annotations

import os
import sys

# The 2.x-style test base is a plain module next to the tests.
sys.path.insert(0, os.path.dirname(__file__))
