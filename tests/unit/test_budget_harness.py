"""The host test kit turns a budget's period (ADRs/0033): a workspace whose budget was spent is
held, and its runs are claimed again once the clock passes the period's end."""

from __future__ import annotations

from datetime import timedelta

import agentruns
from agentruns.domain.kinds import RunKindPolicy
from agentruns.entrypoints.demo.kinds import scripted_steps
from agentruns.testing import harness

KIND = agentruns.RunKind(RunKindPolicy(name="chat"), scripted_steps)


async def test_a_host_test_sees_a_spent_budget_hold_its_workspace_until_the_day_turns() -> None:
    test = harness(KIND)
    await test.runs.set_budget(agentruns.Budget("acme", tokens=50))
    payload = {"steps": 1, "step_ms": 0, "tokens": 40}
    await test.runs.enqueue("chat", workspace="acme", subject="a", payload=payload)
    await test.drain()
    hold = await test.held("acme")
    assert hold is not None
    assert (hold.by_budget, hold.reason) == (True, "budget spent (50 tokens per day)")
    waiting = await test.runs.enqueue("chat", workspace="acme", subject="b", payload=payload)
    assert await test.runs.claim("host-test") == []  # held: not offered
    test.clock.set(hold.until + timedelta(seconds=1))
    assert await test.held("acme") is None
    await test.drain()
    assert (await test.runs.get(waiting.id)).state is agentruns.AgentRunState.ENDED


async def test_a_host_test_sees_a_rolling_budget_hold_until_its_spend_ages_out() -> None:
    test = harness(KIND)
    window = timedelta(hours=6)
    await test.runs.set_budget(agentruns.Budget("acme", tokens=50, period="rolling", window=window))
    payload = {"steps": 1, "step_ms": 0, "tokens": 40}
    await test.runs.enqueue("chat", workspace="acme", subject="a", payload=payload)
    spent_at = test.clock.now()
    await test.drain()
    hold = await test.held("acme")
    assert hold is not None
    assert (hold.by_budget, hold.reason) == (True, "budget spent (50 tokens per rolling 6h)")
    assert spent_at <= hold.until - window <= test.clock.now()
    waiting = await test.runs.enqueue("chat", workspace="acme", subject="b", payload=payload)
    assert await test.runs.claim("host-test") == []  # held: not offered
    # The kit's drain moves the clock to the hold's end: the spend aged out, the run is claimed.
    await test.drain()
    assert (await test.runs.get(waiting.id)).state is agentruns.AgentRunState.ENDED
    assert test.clock.now() >= hold.until
