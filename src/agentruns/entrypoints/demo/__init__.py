"""``agentruns demo``: a mixed workload, worker processes, a reaper and injected faults."""
