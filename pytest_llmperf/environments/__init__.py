"""Each side of an A/B comparison in its own environment: `inputs.detect` (by bytes, nothing built), then
`plan.prepare` (an `Environments` record, or `CannotBuild` with the ways out); docs/environments.md says how an
environment is named, reused and compared. This file imports nothing: the options read records.py at plugin load."""
