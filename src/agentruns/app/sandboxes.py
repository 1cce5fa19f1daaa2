"""``AgentSandboxes``: a subject's sandbox, from its row to its claim, and the calls it makes.

A sandbox's row is the single owner of its claim. :meth:`AgentSandboxes.ensure` commits the row
in its own transaction before it creates the claim, outside any transaction, so a claim never
exists without its row (a claim left behind by a failed step is an orphan the reaper deletes). A
subject has at most one live sandbox: ``ensure`` returns the live one when there is one.

A sandbox calls the gateway with the token its claim carries. :meth:`AgentSandboxes.hold` checks
the token's signature, then locks the sandbox's row if it is live and before its shutdown (so a
token stops at once when its sandbox is taken back), and marks it READY on its first call.
:meth:`AgentSandboxes.next_run` leases the subject's next run in that same transaction, so the
reaper cannot take the sandbox back between the check and the lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from agentruns.app.ports import Transaction, TransactionScope
from agentruns.app.runs import AgentRuns
from agentruns.app.sandbox_ports import (
    SandboxClaims,
    SandboxClaimSpec,
    SandboxIdentity,
    SandboxStore,
    SandboxTokens,
)
from agentruns.domain import limits
from agentruns.domain.errors import (
    InvalidRequest,
    InvalidToken,
    LeaseLost,
    SandboxError,
    SandboxNotLive,
    StaleEpoch,
)
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.sandbox import (
    AgentSandbox,
    SandboxLeaseRefused,
    SandboxState,
    lease_refusal,
    usable,
)
from agentruns.domain.termination import TerminationReason

SHUTDOWN_POLICIES = frozenset({"Delete", "DeleteForeground", "Retain"})


@dataclass(frozen=True, slots=True)
class AgentSandboxKind:
    """A kind of sandbox: the run kinds it drives, the zero-replica warm pool its claims name,
    whether it serves a conversation (which idles 15 minutes, not 1), and how long it may live."""

    name: str
    runs: tuple[str, ...]
    warm_pool: str
    conversation: bool = False
    lifetime: timedelta = timedelta(hours=1)
    shutdown_policy: str = "Delete"

    def __post_init__(self) -> None:
        if not self.name or not self.warm_pool:
            raise ValueError("a sandbox kind needs a name and a warm pool")
        # Shutdown times are whole seconds (the claim's and the token's), rounded down: a
        # shorter life could round to a shutdown before the request.
        if self.lifetime < timedelta(seconds=1):
            raise ValueError("a sandbox kind's lifetime is at least one second")
        if self.shutdown_policy not in SHUTDOWN_POLICIES:
            raise ValueError(f"unknown shutdown policy {self.shutdown_policy!r}")


def claim_name_of(sandbox_id: UUID) -> str:
    """The claim's (and so the Sandbox's and Pod's) name: a DNS-1035 label of 36 characters."""
    return f"sbx-{sandbox_id.hex}"


def holder_of(sandbox: AgentSandbox) -> str:
    """The holder name a sandbox's leases carry."""
    return f"sandbox:{sandbox.id}"


class AgentSandboxes:
    """Writes the sandbox rows; asks the cluster for claims; answers the gateway's checks."""

    def __init__(
        self,
        scope: TransactionScope,
        store: SandboxStore,
        claims: SandboxClaims,
        tokens: SandboxTokens,
        kinds: Iterable[AgentSandboxKind],
        *,
        gateway_url: str,
        new_id: Callable[[], UUID] = uuid.uuid4,
    ) -> None:
        self._scope = scope
        self._store = store
        self._claims = claims
        self._tokens = tokens
        self._kinds: dict[str, AgentSandboxKind] = {}
        for kind in kinds:
            if kind.name in self._kinds:
                raise ValueError(f"sandbox kind {kind.name!r} is given twice")
            self._kinds[kind.name] = kind
        self._gateway_url = gateway_url
        self._new_id = new_id

    @property
    def store(self) -> SandboxStore:
        return self._store

    def kind(self, name: str) -> AgentSandboxKind:
        try:
            return self._kinds[name]
        except KeyError:
            raise InvalidRequest(f"unknown sandbox kind {name!r}") from None

    async def ensure(self, kind: str, *, workspace: str, subject: str) -> AgentSandbox:
        """The subject's live sandbox, or a new one: its row committed first, then its claim.

        A live sandbox past its shutdown that the reaper has not reached yet is taken back in the
        same transaction, and a new one replaces it.

        If the cluster refuses the claim, the new row is taken back at once (the reaper deletes
        it) and :class:`~agentruns.domain.errors.SandboxError` is raised; a later ``ensure``
        starts afresh.
        """
        sandbox_kind = self.kind(kind)
        limits.name(workspace, "workspace")
        limits.name(subject, "subject")
        if not self._gateway_url:
            # A process that only serves the gateway or reaps is built without one.
            raise SandboxError("no gateway URL to hand a new sandbox: this process creates none")
        async with self._scope.transaction() as tx:
            now = await self._store.now(tx)
            live = await self._store.live_of_subject(tx, workspace, subject)
            if live is not None and usable(live, now):
                return live
            if live is not None:  # past its shutdown, not reaped yet: make way for a new one
                await self._store.take_back(tx, live.id)
            # Whole seconds: the claim's RFC 3339 time and the token's exp agree with it.
            shutdown = min(now + sandbox_kind.lifetime, self._tokens.signable_until())
            shutdown = shutdown.replace(microsecond=0)
            if shutdown <= now:
                raise SandboxError("no signing key lives past the next whole second: add a key")
            sandbox_id = self._new_id()
            row = AgentSandbox(
                id=sandbox_id,
                kind=sandbox_kind.name,
                workspace=workspace,
                subject=subject,
                state=SandboxState.REQUESTED,
                requested_at=now,
                shutdown_at=shutdown,
                claim_name=claim_name_of(sandbox_id),
                conversation=sandbox_kind.conversation,
            )
            inserted = await self._store.insert(tx, row)
            if inserted is None:  # another ensure won the subject meanwhile
                winner = await self._store.live_of_subject(tx, workspace, subject)
                if winner is None:
                    raise SandboxError(f"subject {subject!r} has no live sandbox after a conflict")
                return winner
        try:
            await self._claims.create(
                SandboxClaimSpec(
                    name=row.claim_name,
                    sandbox_id=row.id,
                    warm_pool=sandbox_kind.warm_pool,
                    shutdown_at=row.shutdown_at,
                    token=self._tokens.issue(row),
                    gateway_url=self._gateway_url,
                    shutdown_policy=sandbox_kind.shutdown_policy,
                )
            )
        except SandboxError:
            await self.take_back(row.id)
            raise
        return row

    async def take_back(self, sandbox_id: UUID) -> AgentSandbox | None:
        """Move a live sandbox to DELETING: its token stops now, the reaper deletes its claim."""
        async with self._scope.transaction() as tx:
            return await self._store.take_back(tx, sandbox_id)

    async def get(self, sandbox_id: UUID) -> AgentSandbox | None:
        async with self._scope.transaction() as tx:
            return await self._store.get(tx, sandbox_id)

    def identify(self, token: str | None) -> SandboxIdentity:
        """The signature check alone (raises InvalidToken)."""
        return self._tokens.verify(token)

    async def hold(self, tx: Transaction, token: str | None) -> AgentSandbox:
        """Check the token, then lock its live sandbox for ``tx`` and mark it READY on its first
        call. A token whose sandbox is taken back, gone or past shutdown raises
        :class:`~agentruns.domain.errors.SandboxNotLive`."""
        identity = self._tokens.verify(token)
        sandbox = await self._store.lock_live(tx, identity.sandbox_id)
        if sandbox is None:
            raise SandboxNotLive(f"sandbox {identity.sandbox_id} is not live")
        if sandbox.workspace != identity.workspace or sandbox.subject != identity.subject:
            raise InvalidToken("the token does not name this sandbox")
        return await self._store.mark_ready(tx, sandbox.id)

    async def call(self, token: str | None) -> AgentSandbox:
        """A gateway call that leases nothing: checks the token and marks READY, no more (a
        sandbox that only polls still goes idle)."""
        async with self._scope.transaction() as tx:
            return await self.hold(tx, token)

    async def next_run(self, token: str | None, runs: AgentRuns) -> AgentRun | None:
        """Lease the subject's next due run of the kinds the sandbox's kind drives, holding the
        sandbox's row in the same transaction; a lease moves ``last_used_at``."""
        async with self._scope.transaction() as tx:
            sandbox = await self.hold(tx, token)
            drives = self._kinds[sandbox.kind].runs if sandbox.kind in self._kinds else ()
            if not drives:
                return None
            run = await runs.claim_subject(
                holder_of(sandbox),
                sandbox.workspace,
                sandbox.subject,
                kinds=list(drives),
                tx=tx,
            )
            if run is not None:
                await self._store.touch(tx, sandbox.id)
            return run

    async def renew(self, token: str | None, run_id: UUID, epoch: int, runs: AgentRuns) -> AgentRun:
        """The heartbeat of a run this sandbox holds, fenced by its epoch. A fence that does not
        hold raises :class:`~agentruns.domain.sandbox.SandboxLeaseRefused`, saying whether the
        run was lost, cancelled or ended at that epoch."""
        sandbox: AgentSandbox | None = None
        try:
            async with self._scope.transaction() as tx:
                sandbox = await self.hold(tx, token)
                fence = await _own_fence(tx, sandbox, run_id, epoch, runs)
                return await runs.renew(fence, tx=tx)
        except LeaseLost as lost:
            if sandbox is None:
                raise
            raise await self._refused(sandbox, run_id, epoch, runs) from lost

    async def end(
        self,
        token: str | None,
        run_id: UUID,
        epoch: int,
        reason: TerminationReason,
        runs: AgentRuns,
        *,
        result: object = None,
    ) -> AgentRun:
        """Settle a run this sandbox holds, fenced by its epoch (refused as :meth:`renew` is),
        with its ``result`` if it gives one (ADRs/0026)."""
        sandbox: AgentSandbox | None = None
        try:
            async with self._scope.transaction() as tx:
                sandbox = await self.hold(tx, token)
                fence = await _own_fence(tx, sandbox, run_id, epoch, runs)
                return await runs.end(fence, reason, tx=tx, result=result)
        except LeaseLost as lost:
            if sandbox is None:
                raise
            raise await self._refused(sandbox, run_id, epoch, runs) from lost

    async def _refused(
        self, sandbox: AgentSandbox, run_id: UUID, epoch: int, runs: AgentRuns
    ) -> SandboxLeaseRefused:
        """Why the fence did not hold, read in a transaction of its own once the refused one
        has rolled back (so the refused call still writes nothing)."""
        async with self._scope.transaction() as tx:
            run = await runs.stores.runs.get(tx, run_id)
        return SandboxLeaseRefused(run_id, lease_refusal(run, sandbox, epoch))


async def _own_fence(
    tx: Transaction, sandbox: AgentSandbox, run_id: UUID, epoch: int, runs: AgentRuns
) -> AgentRunFence:
    """The fence of a run this sandbox leased; a run it does not hold is a lost lease to it."""
    run = await runs.stores.runs.get(tx, run_id)
    if (
        run is None
        or run.workspace != sandbox.workspace
        or run.subject != sandbox.subject
        or run.holder != holder_of(sandbox)
    ):
        raise StaleEpoch(f"run {run_id} is not held by sandbox {sandbox.id}")
    return AgentRunFence(run_id, sandbox.workspace, epoch)
