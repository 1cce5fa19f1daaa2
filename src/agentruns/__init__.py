"""agentruns: durable leases of long-running AI-agent work on PostgreSQL.

Importing the package opens no connection and reads no environment; compose it through
:mod:`agentruns.entrypoints.container` or, in tests, :mod:`agentruns.testing`.
"""

__version__ = "0.1.0"
