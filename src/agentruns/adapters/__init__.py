"""Implementations of the ports: PostgreSQL, memory (shipped for tests), Kubernetes, clocks."""
