"""The demo's run kinds: agent work whose steps follow a script in the payload.

A payload says how many steps a run takes and how long each lasts, and which fault to inject:

``{"steps": 3, "step_ms": 80}``
    plain work.
``{"fail": 503, "fail_attempts": 1}``
    the last step fails with a provider status while ``run.attempt`` is below ``fail_attempts``
    (a 503 or 429 that a retry fixes; a 401 that no retry fixes).
``{"fail": "chain"}``
    a fallback chain whose every provider fails, every time, until the budget is spent.
``{"result": {"verdict": "approve"}}``
    the run ends with that JSON value as its result (ADRs/0026).
``{"tokens": 120}``
    each step reports what it spent (ADRs/0033): that many input tokens, a quarter as many
    output tokens, a cost of a micro-unit per token, from provider ``demo``, model ``demo-1``.
``{"stall_ms": 2500}``
    the first attempt stalls mid-run for longer than the lease: the reaper takes the run back
    while its holder still runs, and the holder's next renewal is refused (a lost lease).

Worker processes load these with
``agentruns worker --kinds agentruns.entrypoints.demo.kinds:KINDS``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal

from agentruns.app.kinds import RunKind, RunKinds, RunResult, StepEvent
from agentruns.domain.backoff import Backoff
from agentruns.domain.failures import FallbackChainExhausted, ProviderError
from agentruns.domain.kinds import RunKindPolicy
from agentruns.domain.payload import JsonObject
from agentruns.domain.run import AgentRun
from agentruns.domain.usage import Usage

LEASE = timedelta(seconds=2)
BACKOFF = Backoff(base=timedelta(milliseconds=200), cap=timedelta(seconds=1), jitter=0.2)

CHAT = "agent.chat"
REVIEW = "agent.review"
DIGEST = "agent.digest"


def _int(payload: JsonObject, key: str, default: int) -> int:
    value = payload.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


async def scripted_steps(run: AgentRun) -> AsyncIterator[StepEvent]:
    """Steps as the payload scripts them (see the module docstring)."""
    payload = run.payload
    steps = max(_int(payload, "steps", 3), 1)
    step_seconds = _int(payload, "step_ms", 60) / 1000
    stall_seconds = _int(payload, "stall_ms", 0) / 1000
    for index in range(steps):
        await asyncio.sleep(step_seconds)
        if index == 0 and stall_seconds and run.attempt == 0:
            await asyncio.sleep(stall_seconds)
        if index == steps - 1:
            _maybe_fail(run)
        yield StepEvent("step", {"index": index, "of": steps}, usage=_usage(payload))
    if "result" in payload:
        yield RunResult(payload["result"])


def _usage(payload: JsonObject) -> Usage | None:
    tokens = _int(payload, "tokens", 0)
    if tokens <= 0:
        return None
    return Usage(
        input_tokens=tokens,
        output_tokens=tokens // 4,
        cost=Decimal(tokens + tokens // 4) / 1_000_000,
        provider="demo",
        model="demo-1",
    )


def _maybe_fail(run: AgentRun) -> None:
    fail = run.payload.get("fail")
    if fail == "chain":
        raise FallbackChainExhausted(
            [
                ProviderError("primary model overloaded", status=529),
                ProviderError("fallback model unavailable", status=503),
            ]
        )
    if isinstance(fail, int) and run.attempt < _int(run.payload, "fail_attempts", 1_000):
        raise ProviderError(f"provider answered {fail}", status=fail)


def _kind(name: str, *, deadline: timedelta | None = None) -> RunKind:
    policy = RunKindPolicy(
        name=name, retry_budget=3, lease=LEASE, backoff=BACKOFF, deadline=deadline
    )
    return RunKind(policy, scripted_steps)


def demo_kinds() -> RunKinds:
    """A fresh registry of the demo kinds."""
    return RunKinds([_kind(CHAT), _kind(REVIEW), _kind(DIGEST)])


KINDS = demo_kinds()
