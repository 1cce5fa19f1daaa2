"""The ``agentruns`` command line (typer and rich): an edge over the use cases.

Every command builds its settings from the environment, opens the database (the URL in
``AGENTRUNS_DATABASE_URL``, else an embedded PostgreSQL it names), and turns every error an
operator can fix into one line on stderr and a non-zero exit.
"""

from agentruns.entrypoints.cli.main import app, main

__all__ = ["app", "main"]
