"""The tool-calling tests share their tools through tests/tool_calling/tool_fixtures.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
