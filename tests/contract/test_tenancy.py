"""Subjects are named within their workspace: a subject string shared by two workspaces is two
subjects, which never see, lease or block each other's runs."""

from __future__ import annotations

from agentruns.app.runs import AgentRuns
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

SHARED = "pull-request:42"


async def test_a_leased_subject_does_not_block_the_same_subject_of_another_workspace(
    runs: AgentRuns,
) -> None:
    """acme's leased run on the subject leaves globex's run on the same string claimable."""
    await runs.enqueue("chat", workspace="acme", subject=SHARED)
    [acme] = await runs.claim("w1")
    assert acme.workspace == "acme"
    await runs.enqueue("chat", workspace="globex", subject=SHARED)
    [globex] = await runs.claim("w2")
    assert (globex.workspace, globex.subject, globex.state) == (
        "globex",
        SHARED,
        AgentRunState.LEASED,
    )


async def test_one_batch_leases_the_same_subject_string_of_two_workspaces(
    runs: AgentRuns,
) -> None:
    """One claim takes both heads: each workspace's subject offers its own first run."""
    for workspace in ("acme", "globex", "acme", "globex"):
        await runs.enqueue("chat", workspace=workspace, subject=SHARED)
    claimed = await runs.claim("w", limit=4)
    assert sorted(run.workspace for run in claimed) == ["acme", "globex"]


async def test_subject_fifo_is_kept_per_workspace(runs: AgentRuns) -> None:
    """Each workspace's runs on the subject go in their own queue order."""
    first_acme = await runs.enqueue("chat", workspace="acme", subject=SHARED)
    first_globex = await runs.enqueue("chat", workspace="globex", subject=SHARED)
    second_acme = await runs.enqueue("chat", workspace="acme", subject=SHARED)
    claimed = await runs.claim("w", limit=4)
    assert {run.id for run in claimed} == {first_acme.id, first_globex.id}
    [acme] = [run for run in claimed if run.workspace == "acme"]
    await runs.end(acme.fence, TerminationReason.COMPLETED)
    [after] = await runs.claim("w", limit=4)
    assert after.id == second_acme.id


async def test_claim_subject_never_leases_another_workspaces_run(runs: AgentRuns) -> None:
    """A sandbox of acme asks for its subject's next run: globex's run on that string is not it."""
    await runs.enqueue("chat", workspace="globex", subject=SHARED, payload={"secret": "globex"})
    assert await runs.claim_subject("sandbox", "acme", SHARED, kinds=["chat"]) is None
    mine = await runs.enqueue("chat", workspace="acme", subject=SHARED)
    leased = await runs.claim_subject("sandbox", "acme", SHARED, kinds=["chat"])
    assert leased is not None
    assert leased.id == mine.id
