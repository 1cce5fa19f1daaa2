"""The console served by uvicorn on a real socket, attacked over HTTP: a rebound host name, a
planted CSRF pair, login guessing. (The memory adapters behind it: what is tested is the edge.)"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import httpx
import pytest

import agentruns
from agentruns import AgentRunsClient, ConsoleAccess, create_console
from agentruns.entrypoints.http import serve
from agentruns.testing import ManualClock, MemoryFamily

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "console-token-0123456789"


async def _nothing(run: agentruns.AgentRun) -> AsyncIterator[agentruns.StepEvent]:
    return
    yield


KIND = agentruns.RunKind(agentruns.RunKindPolicy(name="summarise"), _nothing)


@pytest.fixture
async def client() -> AsyncIterator[AgentRunsClient]:
    clock = ManualClock(START)
    kinds = agentruns.RunKinds([KIND])
    async with agentruns.connect(kinds=kinds, family=MemoryFamily(clock), clock=clock) as made:
        yield made


@asynccontextmanager
async def _served(client: AgentRunsClient, **options: object) -> AsyncIterator[str]:
    stop, ready = asyncio.Event(), asyncio.Event()
    urls: list[str] = []

    def started(url: str) -> None:
        urls.append(url)
        ready.set()

    app = create_console(client, **options)  # type: ignore[arg-type]
    task = asyncio.create_task(serve(app, "127.0.0.1", 0, stop, started=started, grace=1))
    try:
        await asyncio.wait_for(ready.wait(), timeout=10)
        yield urls[0]
    finally:
        stop.set()
        await task


async def _raw(url: str, request: str) -> list[str]:
    """Send ``request`` as written (its own Host), return the answer's lines."""
    host, _, port = url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request.encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return answer.decode().split("\r\n")


async def test_a_console_without_credential_refuses_a_rebound_host_name(
    client: AgentRunsClient,
) -> None:
    queued = await client.runs.enqueue("summarise", workspace="acme", subject="doc:1")
    async with _served(client) as url:
        port = url.rpartition(":")[2]
        for path in ("/runs", f"/runs/{queued.id}"):
            lines = await _raw(
                url,
                f"GET {path} HTTP/1.1\r\nHost: attacker.example:{port}\r\n"
                "Connection: close\r\n\r\n",
            )
            assert lines[0] == "HTTP/1.1 421 Misdirected Request"
            body = lines[lines.index("") + 1 :]
            assert body == [
                "misdirected request: this console answers to its own host names only\n"
            ]
        # A rebound page cancels nothing, whatever CSRF pair and Origin it sends.
        form = f"csrf=x&run={queued.id}"
        lines = await _raw(
            url,
            f"POST /actions/cancel HTTP/1.1\r\nHost: attacker.example:{port}\r\n"
            f"Origin: http://attacker.example:{port}\r\nCookie: agentruns_csrf=x\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(form)}\r\nConnection: close\r\n\r\n{form}",
        )
        assert lines[0] == "HTTP/1.1 421 Misdirected Request"
        assert (await client.runs.get(queued.id)).state is agentruns.AgentRunState.QUEUED
        for name in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
            lines = await _raw(
                url, f"GET /runs HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n"
            )
            assert lines[0] == "HTTP/1.1 200 OK", name
    async with _served(client, hosts=("console.internal",)) as url:
        lines = await _raw(
            url, "GET /runs HTTP/1.1\r\nHost: console.internal\r\nConnection: close\r\n\r\n"
        )
        assert lines[0] == "HTTP/1.1 200 OK"
        lines = await _raw(
            url, "GET /runs HTTP/1.1\r\nHost: other.internal\r\nConnection: close\r\n\r\n"
        )
        assert lines[0] == "HTTP/1.1 421 Misdirected Request"


async def test_a_planted_equal_csrf_pair_is_refused(client: AgentRunsClient) -> None:
    queued = await client.runs.enqueue("summarise", workspace="acme", subject="doc:1")
    async with _served(client) as url, httpx.AsyncClient(base_url=url) as http:
        for planted in ("A" * 32, "planted-nonce.0123456789abcdef0123456789abcdef"):
            http.cookies.set("agentruns_csrf", planted)
            answer = await http.post(
                "/actions/cancel", data={"csrf": planted, "run": str(queued.id)}
            )
            assert answer.status_code == 403
            assert (await client.runs.get(queued.id)).state is agentruns.AgentRunState.QUEUED
        http.cookies.clear()
        # The console's own form, with the token it signed, still works.
        page = (await http.get(f"/confirm?action=cancel&run={queued.id}")).text
        match = re.search(r'name="csrf" value="([^"]+)"', page)
        assert match is not None
        answer = await http.post(
            "/actions/cancel", data={"csrf": match.group(1), "run": str(queued.id)}
        )
        assert answer.status_code == 303
    assert (await client.runs.get(queued.id)).state is agentruns.AgentRunState.ENDED


async def test_login_guessing_is_slowed_per_client_address(client: AgentRunsClient) -> None:
    async with _served(client, access=ConsoleAccess(token=TOKEN)) as url:
        guesser = httpx.AsyncClient(
            base_url=url, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        )
        async with guesser, httpx.AsyncClient(base_url=url) as other:
            for guess in range(5):
                answer = await guesser.post("/login", data={"token": f"guess-{guess:020d}"})
                assert answer.status_code == 401
            # Even the right token waits now; the answer says how long.
            slowed = await guesser.post("/login", data={"token": TOKEN})
            assert slowed.status_code == 429
            assert int(slowed.headers["retry-after"]) >= 1
            # Another address is not slowed by this one's failures.
            assert (await other.post("/login", data={"token": TOKEN})).status_code == 303
            await asyncio.sleep(1.1)
            assert (await guesser.post("/login", data={"token": TOKEN})).status_code == 303


def test_a_console_token_has_at_least_16_characters() -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        ConsoleAccess(token="x" * 15)
    assert ConsoleAccess(token="x" * 16).token == "x" * 16
