from __future__ import annotations

import os
import sys

# The table and the runner are plain modules next to the tests.
sys.path.insert(0, os.path.dirname(__file__))
