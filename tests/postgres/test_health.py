"""``/healthz`` of a worker or reaper on PostgreSQL: 200 with the database up, 503 with it down."""

from __future__ import annotations

import urllib.error
import urllib.request

import psycopg
from sqlalchemy import make_url

from agentruns.entrypoints import container as composition
from agentruns.entrypoints.container import AgentRunsContainer


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_healthz_answers_200_with_the_database_up_and_503_with_it_down(
    postgres_server: str, postgres_url: str
) -> None:
    built = AgentRunsContainer()
    composition.use_postgres(built, postgres_url)
    server = composition.serve_metrics(built, 0)
    try:
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/metrics")[0] == 200
        assert _get(server.port, "/nothing")[0] == 404
        name = make_url(postgres_url).database
        admin = make_url(postgres_server).set(database="postgres")
        with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as db:
            db.execute(f"DROP DATABASE {name} WITH (FORCE)")
        status, body = _get(server.port, "/healthz")
        assert status == 503
        assert body.startswith("unhealthy: PostgreSQL at ")  # it answers, and refuses
        assert "refused the connection" in body
        assert "does not exist" in body
    finally:
        server.close()


def test_healthz_of_an_unreachable_server_is_503() -> None:
    built = AgentRunsContainer()
    composition.use_postgres(built, "postgres://nobody@127.0.0.1:1/nothing")
    server = composition.serve_metrics(built, 0)
    try:
        status, body = _get(server.port, "/healthz")
        assert status == 503
        assert "127.0.0.1:1" in body
    finally:
        server.close()
