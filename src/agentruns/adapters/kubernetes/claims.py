"""``KubernetesSandboxClaims``: agent-sandbox claims through lightkube's async client.

The claim is the only cluster object agentruns writes; the controller owns the Sandbox and its
Pod. Every API or transport failure is translated into
:class:`~agentruns.domain.errors.SandboxError` at this boundary (``raise ... from exc``), and a
delete of a claim that is already gone (404) succeeds.
"""

from __future__ import annotations

from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Service

from agentruns.adapters.kubernetes.manifest import GROUP, KIND, PLURAL, VERSION, claim_manifest
from agentruns.app.sandbox_ports import (
    SANDBOX_ID_LABEL,
    SandboxClaimRef,
    SandboxClaims,
    SandboxClaimSpec,
)
from agentruns.domain.errors import SandboxError

SandboxClaim = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

NOT_FOUND = 404


def _status(exc: httpx2.HTTPError) -> int | None:
    if isinstance(exc, ApiError) and exc.status is not None and exc.status.code is not None:
        return int(exc.status.code)
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code
    return None


def _refused(action: str, name: str, exc: httpx2.HTTPError) -> SandboxError:
    status = _status(exc)
    reason = f"status {status}" if status is not None else type(exc).__name__
    return SandboxError(f"the cluster refused to {action} sandbox claim {name!r}: {reason}")


class KubernetesSandboxClaims(SandboxClaims):
    """Claims in one namespace, through a lightkube :class:`AsyncClient` the caller owns."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self._client = client
        self._namespace = namespace

    async def create(self, spec: SandboxClaimSpec) -> None:
        claim = SandboxClaim.from_dict(claim_manifest(spec, namespace=self._namespace))
        try:
            await self._client.create(claim)
        except httpx2.HTTPError as exc:
            raise _refused("create", spec.name, exc) from exc

    async def delete(self, name: str) -> None:
        try:
            await self._client.delete(SandboxClaim, name, namespace=self._namespace)
        except httpx2.HTTPError as exc:
            if _status(exc) == NOT_FOUND:
                return
            raise _refused("delete", name, exc) from exc

    async def list_labelled(self) -> list[SandboxClaimRef]:
        refs: list[SandboxClaimRef] = []
        try:
            async for claim in self._client.list(
                SandboxClaim, namespace=self._namespace, labels={SANDBOX_ID_LABEL: None}
            ):
                metadata: Any = claim.metadata
                labels = dict(metadata.labels or {}) if metadata is not None else {}
                # The server filters by the label; checking again here keeps a claim that is not
                # ours out of the reaper's hands whatever the server answered.
                sandbox_id = labels.get(SANDBOX_ID_LABEL)
                if metadata is not None and metadata.name and sandbox_id:
                    refs.append(SandboxClaimRef(name=metadata.name, sandbox_id=sandbox_id))
        except httpx2.HTTPError as exc:
            raise _refused("list", "*", exc) from exc
        return refs


async def gateway_url_of(client: AsyncClient, service: str, namespace: str, *, port: int) -> str:
    """The gateway's address as a sandbox must be given it: a sandbox has no cluster DNS, so the
    server resolves the gateway Service to its cluster IP once and hands that on in each claim."""
    try:
        found = await client.get(Service, service, namespace=namespace)
    except httpx2.HTTPError as exc:
        raise _refused("read", f"{namespace}/{service}", exc) from exc
    spec = found.spec
    address = spec.clusterIP if spec is not None else None
    if not address or address == "None":
        raise SandboxError(f"service {namespace}/{service} has no cluster IP (headless?)")
    ports = {item.port for item in (spec.ports or [])} if spec is not None else set()
    if port not in ports:
        raise SandboxError(f"service {namespace}/{service} does not serve port {port}")
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"
