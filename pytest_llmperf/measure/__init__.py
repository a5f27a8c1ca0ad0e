"""Measuring: a scenario on a backend, run by run, into records (clock, load meter, allocator, metrics)."""
