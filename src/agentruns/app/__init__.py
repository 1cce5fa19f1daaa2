"""Use cases over ports, the composition root, and the entry points."""
