"""``MemorySandboxClaims``: the cluster's claims as a dict, for hosts' tests.

It keeps the very bodies the Kubernetes adapter sends (see
:mod:`agentruns.adapters.kubernetes.manifest`), and has two test knobs a real cluster also shows:
claims that are not agentruns' (:meth:`add_foreign`), and an API that refuses to delete a claim
(:attr:`refused_deletes`).
"""

from __future__ import annotations

import copy

from agentruns.adapters.kubernetes.manifest import claim_manifest
from agentruns.app.sandbox_ports import (
    SANDBOX_ID_LABEL,
    SandboxClaimRef,
    SandboxClaims,
    SandboxClaimSpec,
)
from agentruns.domain.errors import SandboxError
from agentruns.domain.payload import JsonObject


def _labels(body: JsonObject) -> dict[str, str]:
    metadata = body.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    if not isinstance(labels, dict):
        return {}
    return {key: value for key, value in labels.items() if isinstance(value, str)}


class MemorySandboxClaims(SandboxClaims):
    """Claims by name, as bodies."""

    def __init__(self) -> None:
        self.bodies: dict[str, JsonObject] = {}
        self.refused_deletes: set[str] = set()

    async def create(self, spec: SandboxClaimSpec) -> None:
        body = claim_manifest(spec)
        if spec.name in self.bodies:
            raise SandboxError(f"the cluster refused to create sandbox claim {spec.name!r}: exists")
        self.bodies[spec.name] = body

    async def delete(self, name: str) -> None:
        if name in self.refused_deletes:
            raise SandboxError(f"the cluster refused to delete sandbox claim {name!r}")
        self.bodies.pop(name, None)

    async def list_labelled(self) -> list[SandboxClaimRef]:
        refs = []
        for name, body in self.bodies.items():
            sandbox_id = _labels(body).get(SANDBOX_ID_LABEL)
            if sandbox_id:
                refs.append(SandboxClaimRef(name=name, sandbox_id=sandbox_id))
        return refs

    def add_foreign(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A claim someone else wrote (without agentruns' label unless given)."""
        self.bodies[name] = {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"warmPoolRef": {"name": "elsewhere"}},
        }

    def body(self, name: str) -> JsonObject | None:
        body = self.bodies.get(name)
        return copy.deepcopy(body) if body is not None else None
