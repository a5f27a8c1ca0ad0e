"""Judging: per-run values against a baseline (statistics, verdicts, baselines on disk, the fingerprint)."""
