"""``python -m bench.throughput``: how fast each job layer drains N pre-enqueued no-op jobs."""
