"""Worked examples of host code: each lives entirely outside the agentruns package and uses only
its public surface (``agentruns`` and ``agentruns.testing``)."""
