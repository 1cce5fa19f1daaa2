"""A run's Server-Sent Events over HTTP, in process on the memory adapters (ADRs/0030): the
host's ASGI app and the console's route, resuming by ``Last-Event-ID`` or ``?after=``, and
refusals that are statuses (400, 403, 404), never a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from uuid import uuid4

import httpx
import pytest
from starlette.requests import Request

import agentruns
from agentruns import AgentRun, AgentRunsClient, TerminationReason
from agentruns.testing import ManualClock, MemoryFamily

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def _chat(run: AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    yield agentruns.StepEvent("said", {})  # never driven here: the tests write the steps


KIND = agentruns.RunKind(agentruns.RunKindPolicy(name="chat"), _chat)


@pytest.fixture
async def client() -> AsyncIterator[AgentRunsClient]:
    clock = ManualClock(START)
    async with agentruns.connect(
        kinds=agentruns.RunKinds([KIND]), family=MemoryFamily(clock), clock=clock
    ) as made:
        yield made


def _http(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
        base_url="http://localhost",
    )


def _messages(body: str) -> list[dict[str, str]]:
    """The SSE messages of ``body``: each field by name (one value each here)."""
    found = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            found.append(fields)
    return found


async def _leased(client: AgentRunsClient, steps: int) -> AgentRun:
    await client.runs.enqueue("chat", workspace="acme", subject="c:1")
    (run,) = await client.runs.claim("w1")
    for n in range(1, steps + 1):
        await client.runs.step_boundary(run.fence, "said", {"n": n, "api_key": "sk-secret-1"})
    return run


async def test_a_stream_sends_each_event_with_its_seq_as_id_then_the_end(
    client: AgentRunsClient,
) -> None:
    run = await _leased(client, 2)
    app = agentruns.create_run_stream(client)
    async with _http(app) as http:
        pending = asyncio.create_task(http.get(f"/{run.id}"))
        await asyncio.sleep(0.05)
        await client.runs.step_boundary(run.fence, "said", {"n": 3})
        await client.runs.end(run.fence, TerminationReason.COMPLETED, result={"answer": 1})
        async with asyncio.timeout(10):
            answer = await pending
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.text.startswith("retry: ")
    messages = _messages(answer.text)
    assert [m["event"] for m in messages] == ["state", "step", "step", "step", "end"]
    assert [m.get("id") for m in messages] == [None, "1", "2", "3", None]
    step = json.loads(messages[1]["data"])
    assert step["seq"] == 1
    assert step["type"] == "said"
    assert step["data"]["api_key"] != "sk-secret-1"  # redacted as the console redacts
    end = json.loads(messages[-1]["data"])
    assert (end["state"], end["end_reason"], end["result"]) == ("ended", "completed", {"answer": 1})


@pytest.mark.parametrize("resume", [{"headers": {"Last-Event-ID": "2"}}, {"params": {"after": 2}}])
async def test_a_stream_resumes_after_the_last_event_id_with_nothing_repeated(
    client: AgentRunsClient, resume: dict[str, object]
) -> None:
    run = await _leased(client, 4)
    await client.runs.end(run.fence, TerminationReason.COMPLETED)
    async with _http(agentruns.create_run_stream(client)) as http:
        answer = await http.get(f"/{run.id}", **resume)  # type: ignore[arg-type]
    ids = [m.get("id") for m in _messages(answer.text) if m["event"] == "step"]
    assert ids == ["3", "4"]


async def test_the_header_wins_over_the_query(client: AgentRunsClient) -> None:
    run = await _leased(client, 3)
    await client.runs.end(run.fence, TerminationReason.COMPLETED)
    async with _http(agentruns.create_run_stream(client)) as http:
        answer = await http.get(f"/{run.id}", params={"after": 1}, headers={"Last-Event-ID": "2"})
    assert [m.get("id") for m in _messages(answer.text) if m["event"] == "step"] == ["3"]


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/not-a-uuid", {}, 400),
        ("/{run}", {"Last-Event-ID": "x"}, 400),
        ("/{run}", {"Last-Event-ID": "-1"}, 400),
        ("/{run}", {"Last-Event-ID": "99"}, 400),  # the run has no event 99
        ("/{run}", {"Last-Event-ID": "9" * 40}, 400),
        ("/{other}", {}, 404),
    ],
)
async def test_bad_resume_points_and_unknown_runs_are_statuses_not_errors(
    client: AgentRunsClient, path: str, headers: dict[str, str], status: int
) -> None:
    run = await _leased(client, 1)
    await client.runs.end(run.fence, TerminationReason.COMPLETED)
    async with _http(agentruns.create_run_stream(client)) as http:
        answer = await http.get(path.format(run=run.id, other=uuid4()), headers=headers)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("text/plain")


async def test_the_hosts_rule_decides_who_reads_a_stream(client: AgentRunsClient) -> None:
    run = await _leased(client, 1)
    await client.runs.end(run.fence, TerminationReason.COMPLETED)
    asked: list[str] = []

    async def only_acme_users(request: Request, run: AgentRun) -> bool:
        asked.append(run.workspace)
        return request.headers.get("x-user-workspace") == run.workspace

    app = agentruns.create_run_stream(client, authorize=only_acme_users)
    async with _http(app) as http:
        refused = await http.get(f"/{run.id}", headers={"x-user-workspace": "other"})
        allowed = await http.get(f"/{run.id}", headers={"x-user-workspace": "acme"})
    assert refused.status_code == 403
    assert allowed.status_code == 200
    assert "event: end" in allowed.text
    assert asked == ["acme", "acme"]


async def test_without_a_rule_the_consoles_access_holds(client: AgentRunsClient) -> None:
    run = await _leased(client, 1)
    await client.runs.end(run.fence, TerminationReason.COMPLETED)
    token = "stream-token-123456"
    app = agentruns.create_run_stream(client, access=agentruns.ConsoleAccess(token=token))
    async with _http(app) as http:
        anonymous = await http.get(f"/{run.id}")
        bearer = await http.get(f"/{run.id}", headers={"Authorization": f"Bearer {token}"})
    assert anonymous.status_code == 401
    assert bearer.status_code == 200
    local_only = agentruns.create_run_stream(client)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=local_only),  # type: ignore[arg-type]
        base_url="http://attacker.example",
    ) as http:
        assert (await http.get(f"/{run.id}")).status_code == 421


async def test_the_console_streams_a_run_and_its_page_follows_it(client: AgentRunsClient) -> None:
    run = await _leased(client, 2)
    console = agentruns.create_console(client)
    async with _http(console) as http:
        page = await http.get(f"/runs/{run.id}")
        assert f'data-stream="/runs/{run.id}/events/stream?after=2"' in page.text
        pending = asyncio.create_task(
            http.get(f"/runs/{run.id}/events/stream", headers={"Last-Event-ID": "1"})
        )
        await asyncio.sleep(0.05)
        await client.runs.end(run.fence, TerminationReason.COMPLETED)
        async with asyncio.timeout(10):
            answer = await pending
        ended_page = await http.get(f"/runs/{run.id}")
        missing = await http.get(f"/runs/{uuid4()}/events/stream")
        bad = await http.get(f"/runs/{run.id}/events/stream?after=abc")
    assert [m.get("id") for m in _messages(answer.text)] == [None, "2", None]
    assert "data-stream" not in ended_page.text  # an ended run is not followed
    assert (missing.status_code, bad.status_code) == (404, 400)


async def test_an_idle_stream_keeps_alive_and_still_hands_out_every_event(
    client: AgentRunsClient,
) -> None:
    run = await _leased(client, 1)
    app = agentruns.create_run_stream(client, keepalive=0.02)
    async with _http(app) as http:
        pending = asyncio.create_task(http.get(f"/{run.id}", params={"after": 1}))
        await asyncio.sleep(0.2)
        await client.runs.step_boundary(run.fence, "said", {"n": 2})
        await asyncio.sleep(0.1)
        await client.runs.end(run.fence, TerminationReason.COMPLETED)
        async with asyncio.timeout(10):
            answer = await pending
    assert ": keep-alive" in answer.text
    assert [m.get("id") for m in _messages(answer.text)] == [None, "2", None]
    with pytest.raises(ValueError, match="keepalive"):
        agentruns.create_run_stream(client, keepalive=0)
