"""The sandbox ports: the ``agent_sandbox`` rows, the cluster's claims, and the sandbox tokens.

A sandbox's row is the single owner of its claim: :class:`SandboxStore` writes the rows,
:class:`SandboxClaims` writes the claims (the only cluster object agentruns writes), and
:class:`SandboxTokens` signs and checks the token a sandbox calls the gateway with.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from agentruns.app.ports import Transaction
from agentruns.domain.sandbox import AgentSandbox, SandboxTimings

SANDBOX_ID_LABEL = "agentruns.io/sandbox-id"
"""The label on every claim agentruns writes; the reaper lists claims by it, and never touches a
claim without it."""

TOKEN_VARIABLE = "AGENTRUNS_SANDBOX_TOKEN"
GATEWAY_URL_VARIABLE = "AGENTRUNS_GATEWAY_URL"


@dataclass(frozen=True, slots=True)
class SandboxIdentity:
    """What a verified token names. Its signature held; whether the sandbox is still live is the
    use case's question, asked of the store."""

    sandbox_id: UUID
    workspace: str
    subject: str
    expires_at: datetime


class SandboxTokens(Protocol):
    """Signs sandbox tokens with the newest key and verifies them with any known unexpired key.

    ``verify`` raises :class:`~agentruns.domain.errors.InvalidToken` for a token that is missing,
    malformed, forged, expired, signed with an unknown or expired key, or with another algorithm.
    """

    def signable_until(self) -> datetime:
        """The latest expiry a token signed now can carry: the signing key's ``not_after``."""
        ...

    def issue(self, sandbox: AgentSandbox) -> str:
        """A token naming the sandbox, its workspace and subject, expiring at its shutdown (or the
        signing key's end of life, whichever is first)."""
        ...

    def verify(self, token: str | None) -> SandboxIdentity: ...


@dataclass(frozen=True, slots=True)
class SandboxClaimSpec:
    """A claim to create: its name, the sandbox it belongs to, the warm pool it draws from, when
    the controller shuts it down, and the two variables the sandbox starts with."""

    name: str
    sandbox_id: UUID
    warm_pool: str
    shutdown_at: datetime
    token: str
    gateway_url: str
    shutdown_policy: str = "Delete"


@dataclass(frozen=True, slots=True)
class SandboxClaimRef:
    """A labelled claim as the cluster lists it."""

    name: str
    sandbox_id: str


class SandboxClaims(Protocol):
    """The cluster's ``SandboxClaim`` objects in one namespace.

    Every failure of the cluster's API raises :class:`~agentruns.domain.errors.SandboxError`.
    """

    async def create(self, spec: SandboxClaimSpec) -> None:
        """Create the claim; a claim of that name that already exists is refused."""
        ...

    async def delete(self, name: str) -> None:
        """Delete the claim; a claim that is already gone counts as deleted."""
        ...

    async def list_labelled(self) -> list[SandboxClaimRef]:
        """Every claim that carries :data:`SANDBOX_ID_LABEL`, and none that does not."""
        ...


class SandboxStore(Protocol):
    """The ``agent_sandbox`` table: named transitions, each applied only to a row still as
    expected. Stores decide on their own clock, as the run store does."""

    async def now(self, tx: Transaction) -> datetime: ...

    async def insert(self, tx: Transaction, sandbox: AgentSandbox) -> AgentSandbox | None:
        """Insert a REQUESTED row; ``None`` (nothing written) when its subject already has a live
        sandbox (the partial unique index ``uq_agent_sandbox_live_subject``, on workspace and
        subject)."""
        ...

    async def get(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None: ...

    async def live_of_subject(
        self, tx: Transaction, workspace: str, subject: str
    ) -> AgentSandbox | None:
        """The live sandbox of ``subject`` in ``workspace`` (subjects are named per workspace)."""
        ...

    async def lock_live(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        """Read and lock the sandbox until the transaction ends, if it is live and before its
        shutdown; ``None`` otherwise. The reaper cannot take it back while it is held."""
        ...

    async def mark_ready(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox:
        """REQUESTED -> READY at ``now``; a READY sandbox is returned unchanged."""
        ...

    async def touch(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox:
        """Move ``last_used_at`` to now: the sandbox leased a run."""
        ...

    async def take_back(self, tx: Transaction, sandbox_id: UUID) -> AgentSandbox | None:
        """Move a live sandbox to DELETING; ``None`` if it was not live."""
        ...

    async def take_back_due(
        self, tx: Transaction, timings: SandboxTimings, limit: int
    ) -> list[AgentSandbox]:
        """One statement: move to DELETING every live sandbox the domain's take-back rules name
        now (its subject's queued and leased runs are read in the same statement), skipping rows
        other transactions hold locked."""
        ...

    async def deleting(self, tx: Transaction, limit: int) -> list[AgentSandbox]: ...

    async def listing(self, tx: Transaction, limit: int) -> list[AgentSandbox]:
        """Sandboxes for an operator (the console): live ones first, newest request first,
        then those being deleted; at most ``limit``."""
        ...

    async def delete(self, tx: Transaction, sandbox_id: UUID) -> None:
        """Delete a DELETING row (its claim is gone)."""
        ...

    async def claim_names(self, tx: Transaction, names: list[str]) -> set[str]:
        """Which of ``names`` a row still names."""
        ...
