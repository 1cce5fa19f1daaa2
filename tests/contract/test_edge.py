"""The edge of AgentRuns: bad input is InvalidRequest on every adapter, and nothing is written.

Before these checks a NUL in a subject was an outage on PostgreSQL (StoreUnavailable, which
callers retry) and fine in memory; an integer of 5,000 digits escaped the error tree; a ``due_at``
string raised AttributeError. The property test drives the enqueue edge with everything hypothesis
can make: each input is either accepted and read back equal, or refused with InvalidRequest and
nothing written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from agentruns.app.ports import BudgetHold
from agentruns.app.runs import AgentRuns
from agentruns.domain.bands import Band
from agentruns.domain.errors import InvalidRequest
from agentruns.domain.limits import MAX_JSON_BYTES
from agentruns.domain.run import AgentRunFence
from agentruns.domain.termination import TerminationReason
from tests.contract.conftest import START, Backend


async def run_count(backend: Backend) -> int:
    """Every run the backend holds, whatever its state."""
    async with backend.stores.scope.transaction() as tx:
        status = await backend.family.stats.status(tx)
    return status.total()


async def _leased(runs: AgentRuns, subject: str) -> AgentRunFence:
    run = await runs.enqueue("chat", workspace="acme", subject=subject)
    leased = await runs.claim_subject("w", "acme", subject, kinds=["chat"])
    assert leased is not None
    assert leased.id == run.id
    return leased.fence


Call = Callable[[AgentRuns, AgentRunFence], Awaitable[Any]]

REFUSED: dict[str, Call] = {
    "NUL in a subject": lambda r, f: r.enqueue("chat", workspace="acme", subject="pr\x00:1"),
    "NUL in a workspace": lambda r, f: r.enqueue("chat", workspace="ac\x00me", subject="s1"),
    "lone surrogate in a subject": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="pr:\ud800"
    ),
    "subject of 513 characters": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="x" * 513
    ),
    "NUL in the payload": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", payload={"x": "a\x00b"}
    ),
    "NUL in a payload key": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", payload={"a\x00": 1}
    ),
    "lone surrogate in the payload": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", payload={"x": ["\udfff"]}
    ),
    "integer of 5,000 digits": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", payload={"x": 10**5000}
    ),
    "integer beyond 64 bits": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", payload={"x": -(2**63)}
    ),
    "float beyond 2**53": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", payload={"x": 1e23}
    ),
    "payload over the size limit": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", payload={"x": "y" * MAX_JSON_BYTES}
    ),
    "due_at as a string": lambda r, f: r.enqueue(
        "chat",
        workspace="acme",
        subject="s1",
        due_at="2026-03-01T12:00:00Z",  # type: ignore[arg-type]
    ),
    "naive due_at": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", due_at=datetime(2026, 3, 1)
    ),
    "due_at past the year 9999 in UTC": lambda r, f: r.enqueue(
        "chat",
        workspace="acme",
        subject="s1",
        due_at=datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
    ),
    "deadline before the due time": lambda r, f: r.enqueue(
        "chat", workspace="acme", subject="s1", due_at=START, deadline_at=START
    ),
    "kind that is not a string": lambda r, f: r.enqueue(
        ["chat"],  # type: ignore[arg-type]
        workspace="acme",
        subject="s1",
    ),
    "fence epoch beyond an integer": lambda r, f: r.renew(
        AgentRunFence(f.run_id, f.workspace, 2**40)
    ),
    "fence workspace with a NUL": lambda r, f: r.end(
        AgentRunFence(f.run_id, "acme\x00", f.epoch), TerminationReason.COMPLETED
    ),
    "end reason that is a string": lambda r, f: r.end(f, "completed"),  # type: ignore[arg-type]
    "event type with a NUL": lambda r, f: r.step_boundary(f, "st\x00ep", {}),
    "event data over the size limit": lambda r, f: r.append_event(
        f, "step", {"x": "y" * MAX_JSON_BYTES}
    ),
    "requeue delay of ten years": lambda r, f: r.requeue(
        f, charged=False, delay=timedelta(days=3650)
    ),
    "negative requeue delay": lambda r, f: r.requeue(f, charged=False, delay=timedelta(seconds=-1)),
    "claim by a holder with a NUL": lambda r, f: r.claim("w\x00"),
    "run id that is a string": lambda r, f: r.cancel(str(f.run_id)),  # type: ignore[arg-type]
    # Memory said RunNotFound, PostgreSQL InvalidRequest, for each of these (issue 27).
    "retry of a run id that is not a UUID": lambda r, f: r.retry("zz"),  # type: ignore[arg-type]
    "failures of a run id that is not a UUID": lambda r, f: r.failures("zz"),  # type: ignore[arg-type]
    "continue_after a run id that is a string": lambda r, f: r.continue_after(
        "zz"  # type: ignore[arg-type]
    ),
    # An OverflowError on both adapters (the cutoff before the year 1).
    "purge with a retention of 10**8 days": lambda r, f: r.purge(timedelta(days=10**8)),
    "purge with the longest timedelta": lambda r, f: r.purge(timedelta.max),
    "budget hold until a naive time": lambda r, f: r.hold_budget(
        BudgetHold("acme", datetime(2026, 3, 2))
    ),
}


async def test_bad_input_is_an_invalid_request_that_writes_nothing(
    runs: AgentRuns, backend: Backend, subtests: pytest.Subtests
) -> None:
    """Each case meets a leased run of its own; one store serves them all."""
    for number, (name, call) in enumerate(REFUSED.items()):
        with subtests.test(name):
            fence = await _leased(runs, f"s{number}")
            before = await runs.get(fence.run_id)
            count = await run_count(backend)
            with pytest.raises(InvalidRequest):
                await call(runs, fence)
            assert await run_count(backend) == count
            assert await runs.get(fence.run_id) == before
            assert await runs.events(fence.run_id) == []


# Inputs as a host might send them: each field valid, or (for a few fields of each example)
# anything at all, with NUL, lone surrogates, blanks, huge numbers, naive or far datetimes.
_plain = st.characters(exclude_characters="\x00")  # every valid character but NUL
_any = st.characters(exclude_categories=[])  # lone surrogates too
valid_texts = st.text(_plain, max_size=12)
valid_names = st.one_of(
    st.sampled_from(["acme", "globex", "pr:42"]),
    st.text(_plain, min_size=1, max_size=40).filter(str.strip),
)
wild_texts = st.one_of(
    st.text(_any, max_size=12),
    st.sampled_from(["", " ", "x" * 512, "x" * 513, "\x00", "a\x00b", "\ud800", "\udfff"]),
)
valid_numbers = st.one_of(
    st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
    st.floats(min_value=-(2.0**53), max_value=2.0**53, exclude_max=True, exclude_min=True),
)
wild_numbers = st.one_of(
    st.integers(), st.floats(), st.sampled_from([2**63, -(2**63), 10**400, 1e23, 2.0**53])
)


def _json(texts: st.SearchStrategy[str], numbers: st.SearchStrategy[Any]) -> Any:
    return st.recursive(
        st.one_of(st.none(), st.booleans(), numbers, texts),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)
        ),
        max_leaves=12,
    )


valid_payloads = st.one_of(
    st.none(), st.dictionaries(valid_texts, _json(valid_texts, valid_numbers), max_size=5)
)
wild_payloads = st.one_of(
    st.dictionaries(
        st.one_of(valid_texts, wild_texts),
        _json(st.one_of(valid_texts, wild_texts), st.one_of(valid_numbers, wild_numbers)),
        max_size=5,
    ),
    _json(wild_texts, wild_numbers),
    st.just([("a", 1)]),
)
offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
valid_moments = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(2000, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.one_of(st.just(UTC), offsets),
    ),
)
wild_moments = st.one_of(
    st.datetimes(timezones=st.one_of(st.just(UTC), offsets)),  # years 1 to 9999, any offset
    st.datetimes(),  # naive
    st.sampled_from(["2026-03-01T12:00:00Z", 1_780_000_000]),
)
FIELDS = {
    "kind": (st.sampled_from(["chat", "sweep", "review"]), st.one_of(wild_texts, st.none())),
    "workspace": (valid_names, st.one_of(wild_texts, st.none(), st.integers())),
    "subject": (valid_names, st.one_of(wild_texts, st.none(), st.integers())),
    "band": (
        st.sampled_from([*Band, "batch", "Interactive", 0, 2]),
        st.sampled_from(["URGENT", 3, -1, True, None]),
    ),
    "payload": (valid_payloads, wild_payloads),
    "due_at": (valid_moments, wild_moments),
    "deadline_at": (valid_moments, wild_moments),
}


@st.composite
def enqueue_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """Every field valid but for up to two, drawn wild."""
    wild = draw(st.sets(st.sampled_from(sorted(FIELDS)), max_size=2))
    return {
        name: draw(wild_strategy if name in wild else valid_strategy)
        for name, (valid_strategy, wild_strategy) in FIELDS.items()
    }


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    deadline=None,
)
@given(inputs=enqueue_inputs())
async def test_enqueue_accepts_and_reads_back_equal_or_refuses_and_writes_nothing(
    runs: AgentRuns, backend: Backend, inputs: dict[str, Any]
) -> None:
    kind, workspace, subject = inputs["kind"], inputs["workspace"], inputs["subject"]
    band, payload = inputs["band"], inputs["payload"]
    due_at, deadline_at = inputs["due_at"], inputs["deadline_at"]
    count = await run_count(backend)
    try:
        run = await runs.enqueue(
            kind,
            workspace=workspace,
            subject=subject,
            band=band,
            payload=payload,
            due_at=due_at,
            deadline_at=deadline_at,
        )
    except InvalidRequest:
        event("refused")
        assert await run_count(backend) == count
        return
    event("accepted")
    assert await run_count(backend) == count + 1
    read = await runs.get(run.id)
    assert read == run
    assert isinstance(read.id, UUID)
    assert (read.kind, read.workspace, read.subject) == (kind, workspace, subject)
    assert read.band is Band.parse(band)
    assert read.payload == ({} if payload is None else payload)
    assert read.due_at == (due_at or read.enqueued_at)
    if deadline_at is not None:
        assert read.deadline_at == deadline_at
