"""The domain's judgment of enqueue keys: which run a key still names, and what is the same work."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from agentruns.domain import keys
from agentruns.domain.bands import Band
from agentruns.domain.errors import InvalidRequest, KeyConflict
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
RUN = AgentRun(
    id=uuid4(),
    kind="chat",
    workspace="acme",
    subject="c:1",
    band=Band.BATCH,
    payload={"m": 1},
    state=AgentRunState.QUEUED,
    epoch=0,
    attempt=0,
    seq=1,
    enqueued_at=NOW,
    due_at=NOW,
    key="k",
)
ENDED = replace(
    RUN, state=AgentRunState.ENDED, end_reason=TerminationReason.COMPLETED, ended_at=NOW
)


@pytest.mark.parametrize("state", [AgentRunState.QUEUED, AgentRunState.LEASED])
def test_a_run_not_ended_holds_its_key_whatever_the_retention(state: AgentRunState) -> None:
    assert keys.held(replace(RUN, state=state), NOW + timedelta(days=400), timedelta(0))


def test_an_ended_run_holds_its_key_until_the_retention_has_passed() -> None:
    hour = timedelta(hours=1)
    assert keys.held(ENDED, NOW + hour - timedelta(microseconds=1), hour)
    assert not keys.held(ENDED, NOW + hour, hour)
    assert not keys.held(ENDED, NOW, timedelta(0))


def test_a_purged_run_holds_nothing() -> None:
    assert not keys.held(None, NOW, keys.DEFAULT_KEY_RETENTION)


def test_the_same_work_is_the_same_kind_subject_and_payload() -> None:
    same = keys.check_same(RUN, name="k", kind="chat", subject="c:1", payload={"m": 1})
    assert same is RUN
    with pytest.raises(KeyConflict, match="whose subject and payload differ") as refused:
        keys.check_same(RUN, name="k", kind="chat", subject="c:2", payload={"m": 2})
    assert refused.value.run_id == RUN.id
    assert str(RUN.id) in str(refused.value)


def test_a_key_is_a_name_and_a_retention_a_bounded_duration() -> None:
    assert keys.key("webhook-1") == "webhook-1"
    for bad in ("", " ", "x" * 513, "a\x00b", None):
        with pytest.raises(InvalidRequest, match="enqueue key"):
            keys.key(bad)
    assert keys.retention(timedelta(0)) == timedelta(0)
    with pytest.raises(InvalidRequest):
        keys.retention(keys.MAX_KEY_RETENTION + timedelta(days=1))
    with pytest.raises(InvalidRequest):
        keys.retention(3600)
