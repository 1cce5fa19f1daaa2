"""The Kubernetes adapter: agent-sandbox SandboxClaim objects."""
