"""``AgentSandboxReaper``: takes sandboxes back and deletes their claims, then their rows.

It runs where the sandbox namespace's Kubernetes client is, on every replica, every
``lease_renewal``, without a leader: each step is a guarded write or an idempotent delete, so two
replicas ticking at once do the same work twice at worst.

A tick (1) moves to DELETING, in one statement on the store's clock, every live sandbox whose
shutdown passed, that did not call within ``start`` of its request, or whose subject has no
queued or leased run and that leased none for its idle limit; (2) deletes the claim of each
DELETING row and then the row (a claim the API refuses stays, with its row, for the next pass);
(3) deletes each labelled claim that no row names, as after a workspace purge. Claims without the
label are never touched.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from agentruns.app.ports import TransactionScope
from agentruns.app.sandbox_ports import SandboxClaims, SandboxStore
from agentruns.domain.errors import SandboxError
from agentruns.domain.sandbox import AgentSandbox, SandboxTimings

log = logging.getLogger("agentruns.sandbox_reaper")


@dataclass(slots=True)
class SandboxReap:
    """What one tick did."""

    taken_back: list[AgentSandbox] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)


class AgentSandboxReaper:
    def __init__(
        self,
        scope: TransactionScope,
        store: SandboxStore,
        claims: SandboxClaims,
        timings: SandboxTimings | None = None,
        *,
        batch: int = 100,
    ) -> None:
        self._scope = scope
        self._store = store
        self._claims = claims
        self._timings = timings or SandboxTimings()
        self._batch = batch

    async def tick(self) -> SandboxReap:
        reap = SandboxReap()
        async with self._scope.transaction() as tx:
            reap.taken_back = await self._store.take_back_due(tx, self._timings, self._batch)
        for sandbox in reap.taken_back:
            log.info(
                "sandbox taken back",
                extra={
                    "sandbox_id": str(sandbox.id),
                    "kind": sandbox.kind,
                    "workspace": sandbox.workspace,
                    "subject": sandbox.subject,
                },
            )
        await self._delete_taken_back(reap)
        await self._sweep_orphans(reap)
        return reap

    async def run(self, stop: asyncio.Event, *, every: float) -> None:
        """Tick every ``every`` seconds (``lease_renewal``) until ``stop`` is set; a failing tick
        is logged and the next one tries again."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("sandbox reaper tick failed")
            try:
                async with asyncio.timeout(every):
                    await stop.wait()
            except TimeoutError:
                pass

    async def _delete_taken_back(self, reap: SandboxReap) -> None:
        async with self._scope.transaction() as tx:
            deleting = await self._store.deleting(tx, self._batch)
        for sandbox in deleting:
            try:
                await self._claims.delete(sandbox.claim_name)
            except SandboxError as exc:
                log.warning("sandbox claim %s stays for the next pass: %s", sandbox.claim_name, exc)
                reap.refused.append(sandbox.claim_name)
                continue
            async with self._scope.transaction() as tx:
                await self._store.delete(tx, sandbox.id)
            reap.deleted.append(sandbox.claim_name)

    async def _sweep_orphans(self, reap: SandboxReap) -> None:
        try:
            labelled = await self._claims.list_labelled()
        except SandboxError as exc:
            log.warning("sandbox claims could not be listed; no orphan sweep this tick: %s", exc)
            return
        if not labelled:
            return
        names = [ref.name for ref in labelled]
        async with self._scope.transaction() as tx:
            named = await self._store.claim_names(tx, names)
        for name in names:
            if name in named:
                continue
            try:
                await self._claims.delete(name)
            except SandboxError as exc:
                log.warning("orphan sandbox claim %s stays for the next pass: %s", name, exc)
                reap.refused.append(name)
                continue
            reap.orphans_deleted.append(name)
