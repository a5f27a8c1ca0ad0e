"""Each side of an A/B comparison in its own environment: `inputs.detect`, then `plan.prepare` (docs/environments.md).
This file imports nothing: the options read records.py at plugin load."""
