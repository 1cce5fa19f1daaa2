"""The part of agent-sandbox's ``SandboxClaim`` v1beta1 schema that agentruns writes.

Written from the API's documented facts: ``spec.warmPoolRef.name`` is required; lifecycle has an
RFC 3339 ``shutdownTime`` and a ``shutdownPolicy`` of Delete, DeleteForeground or Retain; ``env``
is a list of plain ``{name, value}`` strings; the claim's name becomes the Sandbox's and the Pod's,
so it is a DNS-1035 label of at most 63 characters. Unknown fields are refused, so a typo in the
body fails here and not in a cluster.
"""

from __future__ import annotations

from typing import Any

RFC3339 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$"

SANDBOX_CLAIM_V1BETA1: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "extensions.agents.x-k8s.io/v1beta1"},
        "kind": {"const": "SandboxClaim"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {
                    "type": "string",
                    "maxLength": 63,
                    "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
                },
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["warmPoolRef"],
            "additionalProperties": False,
            "properties": {
                "warmPoolRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {"name": {"type": "string", "minLength": 1}},
                },
                "lifecycle": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "shutdownTime": {"type": "string", "pattern": RFC3339},
                        "shutdownPolicy": {"enum": ["Delete", "DeleteForeground", "Retain"]},
                    },
                },
                "env": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "value": {"type": "string"},
                        },
                    },
                },
            },
        },
        "status": {"type": "object"},
    },
}
