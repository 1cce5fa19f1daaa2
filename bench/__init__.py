"""Benchmarks and the fault run: measurements anyone can rerun, never timed tests."""
