"""The pure model of agent runs: states, fences, bands, claim order, failures, backoff.

Nothing here performs I/O, reads a clock or draws randomness it was not handed.
"""
