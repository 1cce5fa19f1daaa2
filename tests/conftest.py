"""Test-wide settings: hypothesis profiles (``HYPOTHESIS_PROFILE=ci`` in CI)."""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=timedelta(seconds=2))
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
