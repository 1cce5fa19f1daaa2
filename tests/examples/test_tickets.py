"""The tickets example, a host's kind with its own domain row and budget, on both adapters:
everything it needs comes from ``agentruns`` and ``agentruns.testing``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentruns import AgentRunState, IllegalTransition, RunOutcome, TerminationReason
from agentruns.testing import AgentRunsHarness, HarnessFactory
from examples.tickets import Quota, Ticket, TicketStatus, TicketStore, tickets_for, triage_kind

START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def _desk(agentruns_harness: HarnessFactory) -> tuple[AgentRunsHarness, TicketStore]:
    """A harness with the triage kind over the ticket tables of the harness's own adapter."""
    harness = agentruns_harness(start=START)
    store = tickets_for(harness.family)
    harness.kinds.register(triage_kind(store))
    return harness, store


async def _ticket(harness: AgentRunsHarness, store: TicketStore, run_id: object) -> Ticket:
    async with harness.runs.transaction() as tx:
        found = await store.get(tx, run_id)  # type: ignore[arg-type]
    assert found is not None
    return found


async def test_a_ticket_follows_its_run_and_is_triaged(agentruns_harness: HarnessFactory) -> None:
    harness, store = _desk(agentruns_harness)
    run = await harness.runs.enqueue(
        "triage", workspace="acme", subject="ticket:7", payload={"text": "Refund my invoice"}
    )
    assert (await _ticket(harness, store, run.id)).status is TicketStatus.WAITING

    report = await harness.drain()

    assert report.outcomes == {RunOutcome.COMPLETED: 1}
    ticket = await _ticket(harness, store, run.id)
    assert (ticket.status, ticket.claims, ticket.ticket) == (TicketStatus.TRIAGED, 1, "ticket:7")
    events = [(event.type, event.data) for event in await harness.runs.events(run.id)]
    assert events == [
        ("read", {"ticket": "ticket:7", "words": 3}),
        ("labelled", {"label": "billing"}),
    ]


async def test_a_cancelled_ticket_is_abandoned_and_its_taken_back_run_waits_again(
    agentruns_harness: HarnessFactory,
) -> None:
    harness, store = _desk(agentruns_harness)
    lost = await harness.runs.enqueue("triage", workspace="acme", subject="ticket:1")
    cancelled = await harness.runs.enqueue("triage", workspace="acme", subject="ticket:2")
    await harness.runs.claim("a-worker-that-died", limit=2)
    await harness.runs.cancel(cancelled.id)
    assert (await _ticket(harness, store, cancelled.id)).status is TicketStatus.ABANDONED
    assert (await _ticket(harness, store, lost.id)).status is TicketStatus.TRIAGING

    harness.clock.advance(timedelta(minutes=1))  # the lease runs out
    await harness.reaper.tick()
    assert (await _ticket(harness, store, lost.id)).status is TicketStatus.WAITING
    await harness.drain()
    assert (await _ticket(harness, store, lost.id)).status is TicketStatus.TRIAGED


async def _spend_the_quota(harness: AgentRunsHarness, store: TicketStore) -> None:
    """acme may complete one triage before the next hour; one is done."""
    async with harness.runs.transaction() as tx:
        await store.set_quota(tx, Quota("acme", 1, START + timedelta(hours=1)))
    await harness.runs.enqueue("triage", workspace="acme", subject="ticket:1")
    await harness.drain()


async def test_a_spent_quota_holds_the_workspace_until_the_host_renews_it(
    agentruns_harness: HarnessFactory,
) -> None:
    harness, store = _desk(agentruns_harness)
    await _spend_the_quota(harness, store)
    waiting = await harness.runs.enqueue("triage", workspace="acme", subject="ticket:2")
    elsewhere = await harness.runs.enqueue("triage", workspace="globex", subject="ticket:3")

    await harness.drain(advance=False)

    assert (await _ticket(harness, store, elsewhere.id)).status is TicketStatus.TRIAGED
    held = await harness.runs.get(waiting.id)
    assert (held.state, held.epoch, held.attempt) == (AgentRunState.QUEUED, 0, 0)

    async with harness.runs.transaction() as tx:
        await store.set_quota(tx, Quota("acme", 5, START + timedelta(days=1)))
    await harness.runs.release_budget("acme")
    await harness.drain()
    assert (await harness.runs.get(waiting.id)).end_reason is TerminationReason.COMPLETED
    async with harness.runs.transaction() as tx:
        quota = await store.quota(tx, "acme")
    assert quota is not None
    assert quota.remaining == 4


async def test_a_ticket_whose_quota_never_renews_ends_at_its_deadline_unclaimed(
    agentruns_harness: HarnessFactory,
) -> None:
    """drain waits for the hold to end, finds the quota still spent, and goes on to the run's
    deadline, where the reaper ends it: all as production would, without waiting a day."""
    harness, store = _desk(agentruns_harness)
    await _spend_the_quota(harness, store)
    waiting = await harness.runs.enqueue("triage", workspace="acme", subject="ticket:2")

    report = await harness.drain()

    ended = await harness.runs.get(waiting.id)
    assert (ended.end_reason, ended.epoch) == (TerminationReason.DEADLINE_EXCEEDED, 0)
    assert ended.ended_at == START + timedelta(days=1)
    assert (report.overdue_ended, report.outcomes) == (1, {})
    assert (await _ticket(harness, store, waiting.id)).status is TicketStatus.ABANDONED


async def test_a_second_ticket_row_for_one_run_is_refused_and_nothing_is_written(
    agentruns_harness: HarnessFactory,
) -> None:
    """The host's own constraint refuses like agentruns' own: a clear error, and the
    transaction (the run with it) rolls back."""
    harness, store = _desk(agentruns_harness)
    run = await harness.runs.enqueue("triage", workspace="acme", subject="ticket:1")

    async def a_run_and_a_second_row_for_the_first() -> None:
        async with harness.runs.transaction() as tx:
            await harness.runs.enqueue("triage", workspace="acme", subject="ticket:2", tx=tx)
            await store.insert(tx, Ticket(run.id, "acme", "ticket:1", TicketStatus.WAITING, 0))

    with pytest.raises(IllegalTransition):
        await a_run_and_a_second_row_for_the_first()
    page = await harness.runs.list_runs(workspace="acme")
    assert [listed.id for listed in page.runs] == [run.id]
