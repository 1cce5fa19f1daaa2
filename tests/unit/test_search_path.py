"""The schema setting as it reaches every connection: a startup option of the URL, which the
migrations read back; and its name, a plain one or a one-line refusal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentruns.adapters.postgres.connections import libpq_url
from agentruns.adapters.postgres.search_path import in_schema, schema_of
from agentruns.entrypoints.cli import app
from agentruns.entrypoints.settings import AgentRunsSettings

URL = "postgresql://ops@db.example:5432/app"


def test_the_schema_is_a_startup_option_of_the_url_read_back_by_the_migrations() -> None:
    assert in_schema(URL, None) == URL
    assert schema_of(URL) is None
    url = in_schema(URL, "agentruns")
    assert schema_of(url) == "agentruns"
    assert in_schema(url, "agentruns") == url
    assert libpq_url(url).endswith("/app?options=-csearch_path%3Dagentruns")
    timed = in_schema(URL + "?options=-cstatement_timeout%3D5s", "ar")
    assert schema_of(timed) == "ar"
    # libpq decodes %20, not "+": both startup options reach the server.
    assert libpq_url(timed).endswith("options=-cstatement_timeout%3D5s%20-csearch_path%3Dar")
    assert schema_of(in_schema(url, "other")) == "other"  # the last one wins, as on the server
    with pytest.raises(ValueError, match="not a plain schema name"):
        in_schema(URL, "Agent-Runs")


def test_agentruns_schema_must_be_a_plain_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUNS_SCHEMA", "agentruns")
    assert AgentRunsSettings().database_schema == "agentruns"
    assert AgentRunsSettings(database_schema="ar").database_schema == "ar"
    failed = CliRunner().invoke(app, ["db", "url"], env={"AGENTRUNS_SCHEMA": "Agent Runs"})
    assert failed.exit_code == 1
    assert failed.stderr.splitlines() == [
        "agentruns: error: invalid setting AGENTRUNS_SCHEMA: Value error, 'Agent Runs' is not a "
        "plain schema name (lower-case letters, digits and _, not starting with a digit, at most "
        "63 characters)"
    ]
