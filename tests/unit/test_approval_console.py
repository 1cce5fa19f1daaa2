"""Approval links through the composed client and the console: made by ``approval_link``,
answered under the console's ``/approve`` without its login, refused without signing keys."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import httpx
import pytest

import agentruns
from agentruns import AgentRunsClient, ConsoleAccess, create_console
from agentruns.testing import ManualClock, MemoryFamily, MemorySandboxClaims

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "console-token-1234"
GOT: list[object] = []


async def _approve(run: agentruns.AgentRun, ctx: agentruns.StepContext) -> None:
    GOT.append(await ctx.wait_for("approval", timeout=timedelta(hours=1)))


KIND = agentruns.RunKind(agentruns.RunKindPolicy(name="approve"), agentruns.RecordedSteps(_approve))
HOSTING = agentruns.SandboxHosting(
    kinds=[agentruns.AgentSandboxKind("coder", runs=(), warm_pool="pool")],
    keys=[agentruns.SigningKey("k", b"k" * 32, not_after=START + timedelta(days=1))],
    claims=MemorySandboxClaims(),
)


@pytest.fixture
async def client() -> AsyncIterator[AgentRunsClient]:
    clock = ManualClock(START)
    kinds = agentruns.RunKinds([KIND])
    async with agentruns.connect(
        kinds=kinds, family=MemoryFamily(clock), clock=clock, sandboxes=HOSTING
    ) as made:
        yield made


async def test_the_console_serves_a_link_without_its_login(client: AgentRunsClient) -> None:
    """The console asks for its token everywhere but /approve, where the link is the
    credential; the answer wakes the run and its wait returns it."""
    GOT.clear()
    run = await client.runs.enqueue("approve", workspace="acme", subject="invoice:9")
    worker = client.worker(holder="w")
    await worker.drive((await client.runs.claim("w"))[0])
    url = await client.approval_link(run.id, "approval", base_url="http://localhost/ops/approve")
    console = create_console(client, access=ConsoleAccess(token=TOKEN))
    transport = httpx.ASGITransport(app=console, root_path="/ops")
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        assert (await http.get("/ops/runs")).status_code == 401
        path = urlsplit(url).path
        shown = await http.get(path)
        assert shown.status_code == 200
        assert "invoice:9" in shown.text
        token = path.removeprefix("/ops/approve/")
        # The longest comment, in a script of three bytes a character, passes the console's gate.
        long = {"token": token, "decision": "approve", "comment": "\u8a31" * 4001}
        assert (await http.post(path, data=long)).status_code == 400
        form = {"token": token, "decision": "approve", "comment": "ok"}
        answered = await http.post(path, data=form)
        assert answered.status_code == 200
    await worker.drive((await client.runs.claim("w"))[0])
    assert GOT == [{"approved": True, "comment": "ok"}]


async def test_no_keys_no_links() -> None:
    """A client without a sandbox hosting has no keys to sign with: a clear refusal, and the
    console mounts no approval pages."""
    clock = ManualClock(START)
    async with agentruns.connect(
        kinds=agentruns.RunKinds([KIND]), family=MemoryFamily(clock), clock=clock
    ) as client:
        assert not client.signs_approvals
        with pytest.raises(agentruns.StoreUnavailable, match="signing keys"):
            client.approvals  # noqa: B018
        console = create_console(client)
        transport = httpx.ASGITransport(app=console)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            assert (await http.get("/approve/x")).status_code == 404


async def test_approval_keys_alone_sign_links_without_a_sandbox_hosting() -> None:
    """A host that runs no sandboxes passes its keys to connect; the link it makes is answered
    by the console's pages and wakes the run."""
    GOT.clear()
    clock = ManualClock(START)
    key = agentruns.SigningKey("mail", b"m" * 32, not_after=START + timedelta(days=1))
    async with agentruns.connect(
        kinds=agentruns.RunKinds([KIND]),
        family=MemoryFamily(clock),
        clock=clock,
        approval_keys=[key],
    ) as client:
        assert client.signs_approvals
        run = await client.runs.enqueue("approve", workspace="acme", subject="invoice:10")
        worker = client.worker(holder="w")
        await worker.drive((await client.runs.claim("w"))[0])
        url = await client.approval_link(run.id, "approval", base_url="http://localhost/approve")
        transport = httpx.ASGITransport(app=create_console(client))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            path = urlsplit(url).path
            form = {"token": path.removeprefix("/approve/"), "decision": "reject", "comment": ""}
            assert (await http.post(path, data=form)).status_code == 200
        await worker.drive((await client.runs.claim("w"))[0])
    assert GOT == [{"approved": False, "comment": None}]


async def test_the_gateway_serves_links_when_given_approvals(client: AgentRunsClient) -> None:
    """Mounted in the gateway, the pages need no sandbox token; its API still does."""
    GOT.clear()
    run = await client.runs.enqueue("approve", workspace="acme", subject="invoice:10")
    worker = client.worker(holder="w")
    await worker.drive((await client.runs.claim("w"))[0])
    url = await client.approval_link(run.id, "approval", base_url="http://gw/approve")
    gateway = agentruns.create_gateway(client.sandboxes, client.runs, approvals=client.approvals)
    transport = httpx.ASGITransport(app=gateway)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        assert (await http.get("/internal/agent/sandbox")).status_code == 401
        path = urlsplit(url).path
        assert (await http.get(path)).status_code == 200
        form = {"token": path.removeprefix("/approve/"), "decision": "reject"}
        assert (await http.post(path, data=form)).status_code == 200
        assert (await http.post(path, data=form)).status_code == 409
    await worker.drive((await client.runs.claim("w"))[0])
    assert GOT == [{"approved": False, "comment": None}]
