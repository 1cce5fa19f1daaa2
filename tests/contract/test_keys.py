"""Enqueue keys on every backend: one key, one run, while the key is held (ADRs/0024)."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import pytest

from agentruns.app.kinds import RunKind, RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import InvalidRequest, KeyConflict, UnknownKind
from agentruns.domain.keys import DEFAULT_KEY_RETENTION
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from examples.review import ReviewStatus
from tests.contract.conftest import Backend
from tests.contract.kinds import policy, scripted_steps

RETENTION = timedelta(hours=1)


@pytest.fixture
def keyed(backend: Backend, rng: random.Random) -> AgentRuns:
    """Two kinds: ``chat`` holds its keys an hour after the run ended, ``ping`` not at all."""
    kinds = RunKinds(
        [
            RunKind(policy("chat", key_retention=RETENTION), scripted_steps),
            RunKind(policy("ping", key_retention=timedelta(0)), scripted_steps),
        ]
    )
    return AgentRuns(backend.stores, kinds, rng)


async def _all_runs(runs: AgentRuns) -> list[tuple[str, str, str | None]]:
    page = await runs.list_runs(limit=1000)
    return sorted((run.workspace, run.subject, run.key) for run in page.runs)


async def test_the_same_key_finds_the_same_run_and_says_it_is_not_new(keyed: AgentRuns) -> None:
    first = await keyed.enqueue_once(
        "chat", workspace="acme", subject="c:1", key="webhook-17", payload={"steps": 1}
    )
    again = await keyed.enqueue_once(
        "chat", workspace="acme", subject="c:1", key="webhook-17", payload={"steps": 1}
    )
    plain = await keyed.enqueue(
        "chat", workspace="acme", subject="c:1", key="webhook-17", payload={"steps": 1}
    )
    assert first.created
    assert not again.created
    assert again.run.id == first.run.id == plain.id
    assert first.run.key == again.run.key == "webhook-17"
    assert (await keyed.get(first.run.id)).key == "webhook-17"
    assert await _all_runs(keyed) == [("acme", "c:1", "webhook-17")]


async def test_a_second_enqueue_leaves_the_run_as_it_was(keyed: AgentRuns) -> None:
    """Band, due time and deadline of the second enqueue are not compared, and change nothing."""
    first = await keyed.enqueue("chat", workspace="acme", subject="c:1", key="k", band="batch")
    again = await keyed.enqueue_once(
        "chat", workspace="acme", subject="c:1", key="k", band="interactive"
    )
    assert not again.created
    assert again.run.band == first.band
    assert (await keyed.get(first.id)).band == first.band


async def test_keys_are_named_within_their_workspace(keyed: AgentRuns) -> None:
    acme = await keyed.enqueue_once("chat", workspace="acme", subject="c:1", key="k")
    globex = await keyed.enqueue_once("chat", workspace="globex", subject="c:1", key="k")
    other = await keyed.enqueue_once("chat", workspace="acme", subject="c:1", key="k2")
    assert acme.created
    assert globex.created
    assert other.created
    assert len({acme.run.id, globex.run.id, other.run.id}) == 3


async def test_runs_without_a_key_are_never_merged(keyed: AgentRuns) -> None:
    one = await keyed.enqueue("chat", workspace="acme", subject="c:1")
    two = await keyed.enqueue("chat", workspace="acme", subject="c:1")
    assert one.id != two.id
    assert one.key is None
    assert (await keyed.get(one.id)).key is None


@pytest.mark.parametrize(
    ("changes", "differs"),
    [
        ({"kind": "ping"}, "kind"),
        ({"subject": "c:2"}, "subject"),
        ({"payload": {"steps": 2}}, "payload"),
        ({"kind": "ping", "payload": {}}, "kind and payload"),
    ],
)
async def test_the_same_key_for_other_work_is_refused_naming_the_run(
    keyed: AgentRuns, changes: dict[str, object], differs: str
) -> None:
    first = await keyed.enqueue(
        "chat", workspace="acme", subject="c:1", key="k", payload={"steps": 1}
    )
    request: dict[str, object] = {"workspace": "acme", "subject": "c:1", "payload": {"steps": 1}}
    request.update(changes)
    kind = str(request.pop("kind", "chat"))
    with pytest.raises(KeyConflict, match=f"names run {first.id}.*whose {differs} differ") as err:
        await keyed.enqueue_once(kind, key="k", **request)  # type: ignore[arg-type]
    assert err.value.run_id == first.id
    assert isinstance(err.value, InvalidRequest)
    assert await _all_runs(keyed) == [("acme", "c:1", "k")]


async def test_a_leased_run_and_an_ended_one_within_the_retention_are_found(
    keyed: AgentRuns, backend: Backend
) -> None:
    first = await keyed.enqueue("chat", workspace="acme", subject="c:1", key="k")
    [leased] = await keyed.claim("w")
    found = await keyed.enqueue_once("chat", workspace="acme", subject="c:1", key="k")
    assert not found.created
    assert found.run.id == first.id
    assert found.run.state is AgentRunState.LEASED
    await keyed.end(leased.fence, TerminationReason.COMPLETED)
    backend.clock.advance(RETENTION - timedelta(seconds=1))
    found = await keyed.enqueue_once("chat", workspace="acme", subject="c:1", key="k")
    assert not found.created
    assert found.run.id == first.id
    assert found.run.state is AgentRunState.ENDED


async def test_after_the_retention_the_key_makes_a_new_run(
    keyed: AgentRuns, backend: Backend
) -> None:
    first = await keyed.enqueue("chat", workspace="acme", subject="c:1", key="k")
    await keyed.cancel(first.id)
    backend.clock.advance(RETENTION)
    later = await keyed.enqueue_once(
        "chat", workspace="acme", subject="c:1", key="k", payload={"other": "work"}
    )
    assert later.created
    assert later.run.id != first.id
    # From now on the key names the new run, even though the old one is still stored.
    again = await keyed.enqueue_once(
        "chat", workspace="acme", subject="c:1", key="k", payload={"other": "work"}
    )
    assert not again.created
    assert again.run.id == later.run.id
    assert (await keyed.get(first.id)).key == "k"


async def test_a_kind_without_retention_holds_its_key_only_until_the_run_ends(
    keyed: AgentRuns,
) -> None:
    first = await keyed.enqueue_once("ping", workspace="acme", subject="p", key="k")
    assert not (await keyed.enqueue_once("ping", workspace="acme", subject="p", key="k")).created
    await keyed.cancel(first.run.id)
    later = await keyed.enqueue_once("ping", workspace="acme", subject="p", key="k")
    assert later.created
    assert later.run.id != first.run.id


async def test_a_purged_run_frees_its_key(keyed: AgentRuns, backend: Backend) -> None:
    first = await keyed.enqueue("chat", workspace="acme", subject="c:1", key="k")
    await keyed.cancel(first.id)
    backend.clock.advance(timedelta(minutes=10))
    # A purge shorter than the key's retention takes the key with the run.
    assert await keyed.purge(timedelta(minutes=5)) == 1
    later = await keyed.enqueue_once("chat", workspace="acme", subject="c:1", key="k")
    assert later.created
    assert later.run.id != first.id


async def test_a_purge_keeps_a_key_that_names_a_later_run(
    keyed: AgentRuns, backend: Backend
) -> None:
    first = await keyed.enqueue("ping", workspace="acme", subject="p", key="k")
    await keyed.cancel(first.id)
    later = await keyed.enqueue_once("ping", workspace="acme", subject="p", key="k")
    backend.clock.advance(timedelta(minutes=10))
    assert await keyed.purge(timedelta(minutes=5)) == 1
    again = await keyed.enqueue_once("ping", workspace="acme", subject="p", key="k")
    assert not again.created
    assert again.run.id == later.run.id


async def test_racing_enqueues_of_one_key_make_one_run(keyed: AgentRuns) -> None:
    done = await asyncio.gather(
        *(keyed.enqueue_once("chat", workspace="acme", subject="c:1", key="k") for _ in range(8))
    )
    assert len({found.run.id for found in done}) == 1
    assert sum(found.created for found in done) == 1


@pytest.mark.parametrize("key", ["", "   ", "x" * 513, "nul\x00", "\ud800", 17, b"bytes"], ids=repr)
async def test_bad_keys_are_refused_and_nothing_is_written(keyed: AgentRuns, key: object) -> None:
    with pytest.raises(InvalidRequest, match="enqueue key"):
        await keyed.enqueue("chat", workspace="acme", subject="c:1", key=key)  # type: ignore[arg-type]
    assert await _all_runs(keyed) == []


async def test_a_key_of_512_characters_is_kept_as_given(keyed: AgentRuns) -> None:
    key = "ü" * 512
    run = await keyed.enqueue("chat", workspace="acme", subject="c:1", key=key)
    assert (await keyed.get(run.id)).key == key


async def test_enqueue_once_needs_a_key_and_a_known_kind(keyed: AgentRuns) -> None:
    with pytest.raises(InvalidRequest, match="needs a key"):
        await keyed.enqueue_once("chat", workspace="acme", subject="c", key=None)  # type: ignore[arg-type]
    with pytest.raises(UnknownKind):
        await keyed.enqueue_once("nope", workspace="acme", subject="c", key="k")
    assert await _all_runs(keyed) == []


async def test_a_key_found_in_the_callers_transaction_rolls_back_with_it(
    keyed: AgentRuns,
) -> None:
    async def fails_after_enqueue() -> None:
        async with keyed.transaction() as tx:
            await keyed.enqueue("chat", workspace="acme", subject="c:1", key="k", tx=tx)
            raise RuntimeError("the host's own write failed")

    with pytest.raises(RuntimeError):
        await fails_after_enqueue()
    run = await keyed.enqueue_once("chat", workspace="acme", subject="c:1", key="k")
    assert run.created


def test_the_default_retention_is_a_day() -> None:
    assert policy("chat").key_retention == DEFAULT_KEY_RETENTION == timedelta(hours=24)
    with pytest.raises(InvalidRequest, match="retention"):
        policy("chat", key_retention=timedelta(seconds=-1))


async def test_a_kind_with_a_domain_row_moves_it_only_for_a_new_run(
    runs: AgentRuns, backend: Backend
) -> None:
    """The handler's ``on_moved`` runs with the insert; a duplicate enqueue writes nothing, so
    the review job of a leased run stays running."""
    first = await runs.enqueue_once("review", workspace="acme", subject="review:1", key="k")
    [leased] = await runs.claim("w")
    again = await runs.enqueue_once("review", workspace="acme", subject="review:1", key="k")
    assert not again.created
    assert again.run.id == first.run.id == leased.id
    async with backend.stores.scope.transaction() as tx:
        job = await backend.review_jobs.get(tx, first.run.id)
    assert job is not None
    assert job.status is ReviewStatus.RUNNING


async def test_the_runs_a_holder_gets_carry_no_key_and_reads_do(keyed: AgentRuns) -> None:
    """A claim, a renewal and an end hand back the run without its key on every backend (the
    worker's statements do not read it), and a read finds it again: a kind that needs the key
    passes it in its payload, and the test kit shows what production does."""
    await keyed.enqueue("chat", workspace="acme", subject="c:9", key="k-9", payload={"steps": 1})
    [claimed] = await keyed.claim("w-1", limit=1)
    renewed = await keyed.renew(claimed.fence)
    ended = await keyed.end(renewed.fence, TerminationReason.COMPLETED)
    assert (claimed.key, renewed.key, ended.key) == (None, None, None)
    assert (await keyed.get(claimed.id)).key == "k-9"
