"""One typed settings object, built at the edge from ``AGENTRUNS_*`` environment variables."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, PositiveInt
from pydantic_settings import BaseSettings, SettingsConfigDict


class AgentRunsSettings(BaseSettings):
    """Durations accept seconds or ISO 8601 (``PT30S``). Nothing reads the environment
    elsewhere; importing agentruns reads nothing."""

    model_config = SettingsConfigDict(env_prefix="AGENTRUNS_", extra="ignore", frozen=True)

    database_url: str | None = Field(
        default=None, description="PostgreSQL URL; unset means the embedded server or memory."
    )
    lease: timedelta = timedelta(seconds=30)
    lease_renewal: timedelta = timedelta(seconds=10)
    band_aging: timedelta = timedelta(minutes=10)
    sandbox_start: timedelta = timedelta(minutes=2)
    sandbox_idle: timedelta = timedelta(minutes=1)
    conversation_sandbox_idle: timedelta = timedelta(minutes=15)
    retry_budget: int = Field(default=3, ge=0)
    backoff_base: timedelta = timedelta(seconds=5)
    backoff_cap: timedelta = timedelta(minutes=10)
    worker_concurrency: PositiveInt = 8
    poll_interval: timedelta = timedelta(seconds=2)
    shutdown_grace: timedelta = timedelta(seconds=30)
    reap_batch: PositiveInt = 500
