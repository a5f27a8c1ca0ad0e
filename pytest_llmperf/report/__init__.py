"""Reporting: the seeds' tables in markdown, the JSON report, the terminal summary, the throughput log."""
