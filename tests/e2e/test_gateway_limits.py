"""The gateway under real uvicorn, in a process of its own: an unauthenticated 100 MB body is
answered 401 before it is read and the process does not grow; an authenticated one over the
limit is answered 413; an ordinary call still works.

Memory is the process's peak resident set (``VmHWM`` in ``/proc/<pid>/status``), read before and
after: reading a 100 MB body into memory would raise it by at least that much.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
BODY = 100 * 1024 * 1024
CHUNK = b"x" * (1024 * 1024)
# What a process may grow by while it refuses a 100 MB body: allocator noise, not the body.
GROWTH_KIB = 16 * 1024


@dataclass
class Served:
    url: str
    token: str
    run: str
    epoch: int
    process: subprocess.Popen[bytes]

    def peak_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM in /proc: the memory of the process cannot be read")


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    if not Path("/proc/self/status").exists():
        pytest.fail("these tests read a process's memory from /proc (Linux)")
    body_timeout = getattr(request, "param", None)
    extra = [str(body_timeout)] if body_timeout is not None else []
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.gateway_process", *extra],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, "the gateway process said nothing"
        said = json.loads(line)
        yield Served(said["url"], said["token"], said["run"], said["epoch"], process)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Close the connection and wait until its transport is gone: a transport left closing when
    the test ends is collected later, with a ResourceWarning in whichever test runs then. The
    server may have reset the connection first: then the close has nothing more to say."""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _post_streaming(url: str, path: str, headers: dict[str, str], size: int) -> int:
    """POST ``size`` bytes to ``path`` while reading the answer; the status, as soon as it comes.
    The body keeps flowing after the answer (as a client that does not look would send it),
    until it is all sent or the server closes."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", f"Content-Length: {size}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())

    async def pump() -> None:
        sent = 0
        try:
            while sent < size:
                writer.write(CHUNK[: size - sent])
                await writer.drain()
                sent += min(len(CHUNK), size - sent)
        except ConnectionError:
            pass

    pumping = asyncio.create_task(pump())
    try:
        status = await asyncio.wait_for(reader.readline(), timeout=30)
        await asyncio.wait_for(pumping, timeout=120)
    finally:
        pumping.cancel()
        await _closed(writer)
    return int(status.split()[1])


async def test_an_unauthenticated_huge_body_is_refused_before_it_is_read(served: Served) -> None:
    path = f"/internal/agent/runs/{served.run}/renew"
    before = served.peak_kib()
    for headers in (
        {"Content-Type": "application/json"},
        {"Content-Type": "application/json", "Authorization": "Bearer forged.token.here"},
    ):
        assert await _post_streaming(served.url, path, headers, BODY) == 401
    grown = served.peak_kib() - before
    assert grown < GROWTH_KIB, f"the gateway grew by {grown} KiB refusing 100 MB bodies"


async def test_an_authenticated_body_over_the_limit_is_refused_unread(served: Served) -> None:
    path = f"/internal/agent/runs/{served.run}/renew"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {served.token}"}
    before = served.peak_kib()
    assert await _post_streaming(served.url, path, headers, BODY) == 413
    grown = served.peak_kib() - before
    assert grown < GROWTH_KIB, f"the gateway grew by {grown} KiB refusing a 100 MB body"
    async with httpx.AsyncClient(base_url=served.url) as http:
        renewed = await http.post(
            path, headers={"Authorization": f"Bearer {served.token}"}, json={"epoch": served.epoch}
        )
    assert renewed.status_code == 200
    assert renewed.json()["id"] == served.run


@pytest.mark.parametrize("served", [1.0], indirect=True)
async def test_a_body_trickled_past_the_body_timeout_is_refused(served: Served) -> None:
    """14 bytes, one a second: answered 408 after the body timeout (1 s here), not held."""
    parts = urlsplit(served.url)
    body = json.dumps({"epoch": served.epoch}).encode().ljust(14)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = [
        f"POST /internal/agent/runs/{served.run}/renew HTTP/1.1",
        f"Host: {parts.netloc}",
        f"Authorization: Bearer {served.token}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def trickle() -> None:
        try:
            for byte in body:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)
        except ConnectionError:
            pass

    trickling = asyncio.create_task(trickle())
    try:
        status = await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        trickling.cancel()
        await _closed(writer)
    assert int(status.split()[1]) == 408
    assert loop.time() - started < 4
