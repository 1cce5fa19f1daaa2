"""The ``SandboxClaim`` body agentruns writes (``extensions.agents.x-k8s.io/v1beta1``).

Pure data, no client: the memory adapter keeps the very bodies the Kubernetes adapter sends, so
one schema test holds both.
"""

from __future__ import annotations

import re
from datetime import UTC

from agentruns.app.sandbox_ports import (
    GATEWAY_URL_VARIABLE,
    SANDBOX_ID_LABEL,
    TOKEN_VARIABLE,
    SandboxClaimSpec,
)
from agentruns.app.sandboxes import SHUTDOWN_POLICIES
from agentruns.domain.payload import JsonObject

GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
KIND = "SandboxClaim"
PLURAL = "sandboxclaims"
API_VERSION = f"{GROUP}/{VERSION}"

# The Sandbox and its Pod take the claim's name, so it must be a DNS-1035 label.
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63


def claim_manifest(spec: SandboxClaimSpec, namespace: str | None = None) -> JsonObject:
    """The claim's body: named, labelled with its sandbox, drawing from its kind's warm pool, shut
    down by the controller at the sandbox's shutdown, with the token and the gateway's address."""
    if len(spec.name) > MAX_NAME or not DNS_1035.match(spec.name):
        raise ValueError(f"claim name {spec.name!r} is not a DNS-1035 label")
    if spec.shutdown_policy not in SHUTDOWN_POLICIES:
        raise ValueError(f"unknown shutdown policy {spec.shutdown_policy!r}")
    if spec.shutdown_at.tzinfo is None:
        raise ValueError("a claim's shutdown time needs an aware datetime")
    shutdown = spec.shutdown_at.astimezone(UTC).replace(microsecond=0)
    metadata: JsonObject = {"name": spec.name, "labels": {SANDBOX_ID_LABEL: str(spec.sandbox_id)}}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "warmPoolRef": {"name": spec.warm_pool},
            "lifecycle": {
                "shutdownTime": shutdown.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "shutdownPolicy": spec.shutdown_policy,
            },
            "env": [
                {"name": TOKEN_VARIABLE, "value": spec.token},
                {"name": GATEWAY_URL_VARIABLE, "value": spec.gateway_url},
            ],
        },
    }
