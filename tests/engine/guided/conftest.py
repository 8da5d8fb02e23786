"""The guided-decoding tests share their schemas through tests/engine/guided/schemas.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
