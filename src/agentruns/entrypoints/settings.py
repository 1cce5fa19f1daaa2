"""One typed settings object, built at the edge from ``AGENTRUNS_*`` environment variables."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PositiveInt, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentruns.domain.durations import parse_duration
from agentruns.domain.provider_limits import parse_limits

# A worker's slots share its connection pool and its event loop: past this, run more workers.
MAX_WORKER_CONCURRENCY = 10_000

# The one duration parser of the command line and the settings (its InvalidDuration is a
# ValueError, which pydantic reports as this setting's error).
Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _limits(text: str) -> str:
    """Provider limits as written (``openai/gpt-5=500rpm,2000000tpm;...``), checked here so
    that a bad one stops the process at start (ADRs/0032)."""
    parse_limits(text)
    return text


def _plain_schema(name: str | None) -> str | None:
    """A schema name that means the same in a URL, in search_path and in SQL (the rule of the
    postgres adapter's ``search_path.plain_schema``, which settings do not import)."""
    if name is not None and not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(
            f"{name!r} is not a plain schema name (lower-case letters, digits and _, not "
            "starting with a digit, at most 63 characters)"
        )
    return name


class AgentRunsSettings(BaseSettings):
    """Durations accept seconds, ``30s``/``10m``/``2h``/``7d``/``1h30m``, or ISO 8601 (``PT30S``);
    a time bound of 0 means none.

    Nothing reads the environment elsewhere; importing agentruns reads nothing. A kind's lease,
    retry budget and backoff are its own (:class:`~agentruns.domain.kinds.RunKindPolicy`, in
    the host's code next to its steps), not settings of the process."""

    model_config = SettingsConfigDict(
        env_prefix="AGENTRUNS_", extra="ignore", frozen=True, populate_by_name=True
    )

    database_url: str | None = Field(
        default=None, description="PostgreSQL URL; unset means the embedded server or memory."
    )
    # AGENTRUNS_SCHEMA (a field named `schema` would shadow pydantic's BaseModel.schema).
    database_schema: Annotated[str | None, AfterValidator(_plain_schema)] = Field(
        default=None,
        validation_alias="AGENTRUNS_SCHEMA",
        description="Schema of agentruns' tables: every connection's search_path, where "
        "`db upgrade` creates them; unset means the server's search_path (public).",
    )
    lease_renewal: Duration = timedelta(seconds=10)
    band_aging: Duration = timedelta(minutes=10)
    sandbox_start: Duration = timedelta(minutes=2)
    sandbox_idle: Duration = timedelta(minutes=1)
    conversation_sandbox_idle: Duration = timedelta(minutes=15)
    worker_concurrency: Annotated[int, Field(ge=1, le=MAX_WORKER_CONCURRENCY)] = 8
    poll_interval: Duration = timedelta(seconds=2)
    # AGENTRUNS_LIMITS: provider limits a worker declares at start (ADRs/0032).
    limits: Annotated[str, AfterValidator(_limits)] = ""
    shutdown_grace: Duration = timedelta(seconds=30)
    # How long a step stopped by a cancel or a lost lease may run its cleanup before the worker
    # cancels it again (ADRs/0023).
    cancel_grace: Duration = timedelta(seconds=5)
    reap_batch: PositiveInt = 500
    tracing: Literal["none", "otel"] = Field(
        default="none",
        description="otel: spans to the OpenTelemetry tracer provider (the otel extra).",
    )
    # `--metrics-port` leaves out counters' and histograms' *_created series (a timestamp per
    # label set, as many series again) unless this asks for them.
    metrics_created_series: bool = Field(
        default=False, description="Serve the *_created series of counters and histograms."
    )
    # Which long-running commands run the scheduler loop (every replica of them may: no
    # leader), at most how long a pass waits before it looks again, and how long claimed ticks
    # are kept for `agentruns schedules` (ADRs/0015).
    scheduler: Literal["both", "worker", "reaper", "off"] = "both"
    scheduler_interval: Duration = timedelta(seconds=5)
    schedule_tick_retention: Duration = timedelta(days=7)
    # The web console's credential (ADRs/0018): a bearer token, or a user and password for basic
    # auth. `agentruns console` serves any address but localhost only with one of them.
    console_token: SecretStr | None = None
    console_user: str | None = None
    console_password: SecretStr | None = None
    # Without a credential the console answers only requests sent to a loopback name or address
    # (DNS rebinding); these comma-separated names too (`*`: any).
    console_hosts: str = Field(
        default="",
        description="Comma-separated extra Host names a console without a credential answers to.",
    )
    # The sandbox gateway answers 408 to a client still sending its body after this (0: none).
    gateway_body_timeout: Duration = timedelta(seconds=10)
    # Connections (README, "In production"). `transaction`: a transaction-pooling PgBouncer (or
    # the like) is in front of the server, so nothing is prepared and nothing SET per session;
    # the URL may say so too (?agentruns_pooler=transaction, which overrides this). LISTEN needs
    # a session: listen_url is a direct URL for the wake-ups (without it, workers poll).
    pooler: Literal["none", "transaction"] = "none"
    listen_url: str | None = Field(
        default=None, description="Direct (non-pooled) URL the wake-up listener connects to."
    )
    # Time bounds. The console's and the command line's transactions run under a server-side
    # statement_timeout (SET LOCAL); every statement agentruns runs, in any process, under a
    # bound the client times and cancels on the server; `db upgrade` under a lock_timeout,
    # tried again after 1, 2, 4... seconds, up to migration_attempts in all.
    read_timeout: Duration = timedelta(seconds=10)
    statement_timeout: Duration = timedelta(seconds=30)
    migration_lock_timeout: Duration = timedelta(seconds=5)
    migration_attempts: PositiveInt = 5

    @property
    def console_host_names(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.console_hosts.split(",") if name.strip())
