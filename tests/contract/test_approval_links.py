"""Signed approval links over HTTP on every backend (ADRs/0027): the first answer of a link
wakes its waiting run with ``{"approved", "comment"}``; a used, forged or expired link, or an
ended run, gets a 4xx page and changes nothing."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from agentruns.adapters.tokens import JwtApprovalTokens, SigningKey
from agentruns.app.approvals import AgentApprovals
from agentruns.app.kinds import RunKinds
from agentruns.app.runs import AgentRuns
from agentruns.app.worker import Worker
from agentruns.domain.errors import InvalidRequest, RunAlreadyEnded
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import RunOutcome
from agentruns.entrypoints.console.approve import approvals_app
from tests.contract.conftest import START, Backend
from tests.contract.test_waits import TIMEOUT, Approver, approver, drive_one

__all__ = ["approver"]  # the fixture, shared with the waits' suite

KEY = SigningKey("k1", b"k" * 32, not_after=START + timedelta(days=30))
BASE = "http://localhost/approve"


@pytest.fixture
def approvals(runs: AgentRuns, backend: Backend) -> AgentApprovals:
    return AgentApprovals(runs, JwtApprovalTokens([KEY], backend.clock))


@pytest.fixture
async def http(approvals: AgentApprovals) -> AsyncIterator[httpx.AsyncClient]:
    # Mounted by a host alone, under its own prefix.
    host = Starlette(routes=[Mount("/approve", app=approvals_app(approvals))])
    transport = httpx.ASGITransport(app=host)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        yield client


async def waiting(runs: AgentRuns, worker: Worker) -> AgentRun:
    run = await runs.enqueue("approve", workspace="acme", subject="invoice:7")
    assert await drive_one(runs, worker) is RunOutcome.WAITING
    return run


def path(url: str) -> str:
    return urlsplit(url).path


def token_of(url: str) -> str:
    return path(url).removeprefix("/approve/")


async def test_approve_once_wakes_the_run_and_a_second_use_changes_nothing(
    runs: AgentRuns,
    worker: Worker,
    approvals: AgentApprovals,
    http: httpx.AsyncClient,
    approver: Approver,
    kinds: RunKinds,
) -> None:
    """GET shows the form and writes nothing; the first POST delivers the answer; the second
    (a reject) finds it used; the run resumes with the first answer."""
    run = await waiting(runs, worker)
    url = await approvals.link(run.id, "approval", base_url=BASE)
    shown = await http.get(path(url))
    assert shown.status_code == 200
    assert "invoice:7" in shown.text
    assert 'value="approve"' in shown.text
    assert shown.headers["x-frame-options"] == "DENY"
    assert shown.headers["referrer-policy"] == "no-referrer"
    assert await runs.signals(run.id) == []

    form = {"token": token_of(url), "decision": "approve", "comment": "looks right"}
    answered = await http.post(path(url), data=form)
    assert answered.status_code == 200, answered.text
    assert "Approved" in answered.text

    again = await http.post(path(url), data={**form, "decision": "reject", "comment": ""})
    assert again.status_code == 409
    assert "already used" in again.text
    assert "approved" in again.text
    assert (await http.get(path(url))).status_code == 409
    assert len(await runs.signals(run.id)) == 1

    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert approver.got == [{"approved": True, "comment": "looks right"}]


async def test_reject_delivers_approved_false(
    runs: AgentRuns,
    worker: Worker,
    approvals: AgentApprovals,
    http: httpx.AsyncClient,
    approver: Approver,
) -> None:
    """Reject, without a comment, is ``{"approved": false, "comment": null}``."""
    run = await waiting(runs, worker)
    url = await approvals.link(run.id, "approval", base_url=BASE)
    answered = await http.post(path(url), data={"token": token_of(url), "decision": "reject"})
    assert answered.status_code == 200
    assert "Rejected" in answered.text
    assert await drive_one(runs, worker) is RunOutcome.COMPLETED
    assert approver.got == [{"approved": False, "comment": None}]


async def test_expired_forged_and_malformed_links_change_nothing(
    runs: AgentRuns,
    worker: Worker,
    approvals: AgentApprovals,
    http: httpx.AsyncClient,
    backend: Backend,
    approver: Approver,
) -> None:
    """A link past its wait's end, a token signed elsewhere and garbage get 4xx pages."""
    run = await waiting(runs, worker)
    url = await approvals.link(run.id, "approval", base_url=BASE)
    other = JwtApprovalTokens([SigningKey("k1", b"x" * 32, not_after=KEY.not_after)], backend.clock)
    forged = await AgentApprovals(runs, other).link(run.id, "approval", base_url=BASE)
    for bad in (path(forged), "/approve/not-a-token"):
        assert (await http.get(bad)).status_code == 403
        posted = await http.post(bad, data={"token": token_of(bad), "decision": "approve"})
        assert posted.status_code == 403
    backend.clock.advance(TIMEOUT)
    expired = await http.post(path(url), data={"token": token_of(url), "decision": "approve"})
    assert expired.status_code == 410
    assert "expired" in expired.text
    assert await runs.signals(run.id) == []


async def test_an_ended_run_takes_no_answer_and_links_are_refused(
    runs: AgentRuns,
    worker: Worker,
    approvals: AgentApprovals,
    http: httpx.AsyncClient,
    approver: Approver,
) -> None:
    """A link to a run cancelled since gets a 409 page; no link is made for an ended run, a
    run that waits for nothing without an end given, or a base URL that is not http(s)."""
    run = await waiting(runs, worker)
    url = await approvals.link(run.id, "approval", base_url=BASE)
    with pytest.raises(InvalidRequest):
        await approvals.link(run.id, "approval", base_url="javascript:alert(1)")
    with pytest.raises(InvalidRequest):
        await approvals.link(run.id, "other", base_url=BASE)
    await runs.cancel(run.id)
    assert (await runs.get(run.id)).state is AgentRunState.ENDED
    assert (await http.get(path(url))).status_code == 409  # no form for an ended run
    ended = await http.post(path(url), data={"token": token_of(url), "decision": "approve"})
    assert ended.status_code == 409
    assert "ended" in ended.text
    assert await runs.signals(run.id) == []
    with pytest.raises(RunAlreadyEnded):
        await approvals.link(run.id, "approval", base_url=BASE)


async def test_bad_forms_and_large_bodies_get_4xx(
    runs: AgentRuns,
    worker: Worker,
    approvals: AgentApprovals,
    http: httpx.AsyncClient,
    approver: Approver,
) -> None:
    """A form without this link's token, without a decision, or a comment too long: 4xx."""
    run = await waiting(runs, worker)
    url = await approvals.link(run.id, "approval", base_url=BASE)
    token = token_of(url)
    assert (await http.post(path(url), data={"decision": "approve"})).status_code == 403
    assert (await http.post(path(url), data={"token": token})).status_code == 400
    long = {"token": token, "decision": "approve", "comment": "x" * 4001}
    assert (await http.post(path(url), data=long)).status_code == 400
    huge = {"token": token, "decision": "approve", "comment": "x" * 70_000}
    assert (await http.post(path(url), data=huge)).status_code == 413
    assert re.search("Approve", (await http.get(path(url))).text)
    assert await runs.signals(run.id) == []
