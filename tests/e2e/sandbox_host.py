"""A host's sandboxes, as ``--sandboxes tests.e2e.sandbox_host:HOSTING`` names them.

Each process that imports this module gets its own cluster (the memory claims adapter), so a test
process creates a sandbox's claim in its own and reads the token from there; the commands share
the database and the signing key with it, which is all a token needs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agentruns.adapters.memory import MemorySandboxClaims
from agentruns.adapters.tokens import SigningKey
from agentruns.app.sandboxes import AgentSandboxKind
from agentruns.entrypoints.container import SandboxHosting
from agentruns.entrypoints.demo.kinds import REVIEW

KEY = SigningKey(
    "e2e", b"e2e-sandbox-signing-secret-32-bytes!", not_after=datetime(2100, 1, 1, tzinfo=UTC)
)
REVIEWER = AgentSandboxKind("reviewer", runs=(REVIEW,), warm_pool="reviewer-pool")


def hosting() -> SandboxHosting:
    """A fresh hosting: its own cluster in memory."""
    return SandboxHosting(kinds=[REVIEWER], keys=[KEY], claims=MemorySandboxClaims())


HOSTING = hosting()
NOT_HOSTING = 42
DRIVES_UNKNOWN = SandboxHosting(
    kinds=[AgentSandboxKind("stranger", runs=("agent.unknown",), warm_pool="pool")],
    keys=[KEY],
    claims=MemorySandboxClaims(),
)
