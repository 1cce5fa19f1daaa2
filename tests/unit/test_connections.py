"""Connection options: the URL's agentruns_pooler= (stripped before libpq, honoured), the names
processes give their connections, and the settings that shape them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentruns.adapters.postgres import admin
from agentruns.adapters.postgres.connections import (
    ConnectionOptions,
    application_name,
    libpq_url,
    sqlalchemy_url,
    url_pooler,
)
from agentruns.domain.errors import StoreUnavailable
from agentruns.entrypoints import container as composition
from agentruns.entrypoints.settings import AgentRunsSettings

POOLED = "postgresql://app:secret@bouncer:6432/app?sslmode=require&agentruns_pooler=transaction"


def test_the_pooler_parameter_never_reaches_libpq_or_sqlalchemy() -> None:
    assert libpq_url(POOLED) == "postgresql://app:secret@bouncer:6432/app?sslmode=require"
    assert sqlalchemy_url(POOLED) == (
        "postgresql+psycopg://app:secret@bouncer:6432/app?sslmode=require"
    )
    assert admin.shown_url(POOLED) == "postgresql://app:***@bouncer:6432/app?sslmode=require"


def test_another_database_on_the_server_keeps_the_pooler_parameter() -> None:
    assert url_pooler(admin.with_database(POOLED, "agentruns_demo")) == "transaction"


def test_the_url_names_the_pooler_and_overrides_the_setting() -> None:
    assert url_pooler(POOLED) == "transaction"
    assert url_pooler("postgresql://db/app") is None
    assert ConnectionOptions().on(POOLED).pooler == "transaction"
    direct = "postgresql://db/app?agentruns_pooler=none"
    assert ConnectionOptions(pooler="transaction").on(direct).pooler == "none"
    assert ConnectionOptions(pooler="transaction").on("postgresql://db/app").pooler == (
        "transaction"
    )


def test_a_bad_pooler_in_the_url_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="choose none or transaction"):
        url_pooler("postgresql://db/app?agentruns_pooler=session")
    with pytest.raises(StoreUnavailable, match="agentruns_pooler='session'"):
        admin.shown_url("postgresql://db/app?agentruns_pooler=session")


def test_a_transaction_pooler_prepares_nothing() -> None:
    assert ConnectionOptions().connect_kwargs()["prepare_threshold"] == 0
    pooled = ConnectionOptions(pooler="transaction")
    assert not pooled.prepares
    assert pooled.connect_kwargs()["prepare_threshold"] is None


def test_names_are_cut_to_63_bytes_on_a_character_boundary() -> None:
    assert application_name("agentruns-worker:h") == "agentruns-worker:h"
    long = "agentruns-worker:" + "é" * 40  # 17 + 80 bytes
    cut = application_name(long)
    assert len(cut.encode()) <= 63
    assert long.startswith(cut)
    assert len(cut.encode()) >= 62
    assert ConnectionOptions(application_name=long).application_name == cut


@pytest.mark.parametrize(
    ("process", "holder", "name"),
    [
        ("worker", "host:1a2b3c4d", "agentruns-worker:host:1a2b3c4d"),
        ("reaper", None, "agentruns-reaper"),
        ("console", None, "agentruns-console"),
        ("gateway", None, "agentruns-gateway"),
        ("scheduler", None, "agentruns-scheduler"),
        ("cli", None, "agentruns-cli"),
        ("demo", None, "agentruns"),
        (None, None, "agentruns"),
    ],
)
def test_each_process_names_its_connections(
    process: str | None, holder: str | None, name: str
) -> None:
    assert composition.process_name(process, holder) == name


def test_the_settings_shape_the_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUNS_POOLER", "transaction")
    monkeypatch.setenv("AGENTRUNS_LISTEN_URL", "postgresql://db-direct/app")
    monkeypatch.setenv("AGENTRUNS_READ_TIMEOUT", "2s")
    monkeypatch.setenv("AGENTRUNS_STATEMENT_TIMEOUT", "45s")
    monkeypatch.setenv("AGENTRUNS_POLL_INTERVAL", "3s")
    settings = AgentRunsSettings()
    worker = composition.connection_options(settings, "agentruns-worker:w")
    assert worker == ConnectionOptions(
        application_name="agentruns-worker:w",
        pooler="transaction",
        statement_bound=45.0,
        local_statement_timeout=None,  # a worker's transactions carry no SET LOCAL
        listen_url="postgresql://db-direct/app",
        poll_interval=3.0,
    )
    reads = composition.connection_options(settings, "agentruns-cli", bounded_reads=True)
    assert reads.local_statement_timeout == 2.0


def test_the_time_bounds_default_as_designed_and_0_is_none() -> None:
    settings = AgentRunsSettings()
    assert (settings.pooler, settings.listen_url) == ("none", None)
    assert settings.read_timeout == timedelta(seconds=10)
    assert settings.statement_timeout == timedelta(seconds=30)
    assert settings.migration_lock_timeout == timedelta(seconds=5)
    assert settings.migration_attempts == 5
    unbounded = AgentRunsSettings(statement_timeout="0", read_timeout="0")  # type: ignore[arg-type]
    options = composition.connection_options(unbounded, bounded_reads=True)
    assert (options.statement_bound, options.local_statement_timeout) == (None, None)


def test_a_bad_pooler_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUNS_POOLER", "statement")
    with pytest.raises(ValueError, match="pooler"):
        AgentRunsSettings()
