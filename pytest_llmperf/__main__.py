"""`python -m pytest_llmperf report FILE... [--out DIR]` (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
