"""The read API on every backend: runs filtered by workspace, subject, kind, state and reason,
newest first, a page at a time."""

from __future__ import annotations

import pytest

from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import InvalidRequest
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason


async def _population(runs: AgentRuns) -> dict[str, AgentRun]:
    """Six runs over two workspaces, subjects and kinds; one leased, two ended."""
    made = {
        "a1": await runs.enqueue("chat", workspace="acme", subject="doc:1"),
        "a2": await runs.enqueue("sweep", workspace="acme", subject="doc:2"),
        "g1": await runs.enqueue("chat", workspace="globex", subject="doc:1"),
        "a3": await runs.enqueue("chat", workspace="acme", subject="doc:1"),
        "g2": await runs.enqueue("sweep", workspace="globex", subject="doc:3"),
        "a4": await runs.enqueue("chat", workspace="acme", subject="doc:4"),
    }
    await runs.cancel(made["g2"].id)
    leased = await runs.claim_subject("w", "acme", "doc:2", kinds=["sweep"])
    assert leased is not None
    assert leased.id == made["a2"].id
    failed = await runs.claim_subject("w", "acme", "doc:4", kinds=["chat"])
    assert failed is not None
    assert failed.id == made["a4"].id
    await runs.end(failed.fence, TerminationReason.NOT_RETRYABLE)
    return made


def _ids(found: list[AgentRun]) -> list[object]:
    return [run.id for run in found]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, ["a4", "g2", "a3", "g1", "a2", "a1"]),
        ({"workspace": "acme"}, ["a4", "a3", "a2", "a1"]),
        ({"subject": "doc:1"}, ["a3", "g1", "a1"]),
        ({"workspace": "acme", "subject": "doc:1"}, ["a3", "a1"]),
        ({"kind": "sweep"}, ["g2", "a2"]),
        ({"state": AgentRunState.ENDED}, ["a4", "g2"]),
        ({"state": "leased"}, ["a2"]),
        ({"reason": TerminationReason.CANCELLED}, ["g2"]),
        ({"state": "ended", "reason": "not_retryable", "workspace": "acme"}, ["a4"]),
        ({"state": "queued", "reason": "completed"}, []),
        ({"kind": "a-kind-nobody-registered"}, []),
    ],
)
async def test_runs_are_listed_by_every_filter_newest_first(
    runs: AgentRuns, filters: dict[str, object], expected: list[str]
) -> None:
    made = await _population(runs)
    page = await runs.list_runs(**filters)  # type: ignore[arg-type]
    assert _ids(page.runs) == [made[name].id for name in expected]
    assert page.next_cursor is None


async def test_the_listed_runs_read_as_get_reads_them(runs: AgentRuns) -> None:
    made = await _population(runs)
    page = await runs.list_runs(state="leased")
    assert page.runs == [await runs.get(made["a2"].id)]
    assert page.runs[0].holder == "w"


async def test_pages_follow_each_other_by_keyset_whatever_is_enqueued_meanwhile(
    runs: AgentRuns,
) -> None:
    queued = [await runs.enqueue("chat", workspace="acme", subject=f"s:{n}") for n in range(5)]
    first = await runs.list_runs(workspace="acme", limit=2)
    assert _ids(first.runs) == [queued[4].id, queued[3].id]
    assert first.next_cursor is not None
    newer = await runs.enqueue("chat", workspace="acme", subject="s:new")
    second = await runs.list_runs(workspace="acme", limit=2, cursor=first.next_cursor)
    assert _ids(second.runs) == [queued[2].id, queued[1].id]
    assert second.next_cursor is not None
    last = await runs.list_runs(workspace="acme", limit=2, cursor=second.next_cursor)
    assert _ids(last.runs) == [queued[0].id]
    assert last.next_cursor is None
    assert _ids((await runs.list_runs(workspace="acme", limit=1)).runs) == [newer.id]


async def test_a_page_that_ends_exactly_at_the_last_run_says_there_is_no_next_page(
    runs: AgentRuns,
) -> None:
    for n in range(4):
        await runs.enqueue("chat", workspace="acme", subject=f"s:{n}")
    first = await runs.list_runs(limit=2)
    second = await runs.list_runs(limit=2, cursor=first.next_cursor)
    assert (len(second.runs), second.next_cursor) == (2, None)


@pytest.mark.parametrize(
    "filters",
    [
        {"limit": 0},
        {"limit": 1001},
        {"limit": True},
        {"state": "running"},
        {"reason": "bored"},
        {"workspace": ""},
        {"subject": "  "},
        {"kind": ""},
        {"cursor": "not-a-cursor"},
        {"cursor": "r-1"},
        {"cursor": ""},
    ],
)
async def test_a_bad_filter_or_cursor_is_refused_clearly(
    runs: AgentRuns, filters: dict[str, object]
) -> None:
    await runs.enqueue("chat", workspace="acme", subject="s")
    with pytest.raises(InvalidRequest):
        await runs.list_runs(**filters)  # type: ignore[arg-type]
