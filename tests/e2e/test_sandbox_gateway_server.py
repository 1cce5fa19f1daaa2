"""The gateway served by uvicorn on 127.0.0.1, called over TCP as a sandbox calls it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn

from agentruns.entrypoints.gateway import create_gateway
from tests.contract.sandboxes.world import World, world_of


@asynccontextmanager
async def served(world: World) -> AsyncIterator[str]:
    app = create_gateway(world.sandboxes, world.runs)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, ws="none", lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: the server binds in milliseconds
            if server.started or serving.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the gateway did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


async def test_a_sandbox_leases_and_ends_a_run_over_tcp() -> None:
    """Check in, lease, end, and be refused once taken back, on a real socket."""
    async with world_of("memory", "memory") as world, served(world) as url:
        sandbox = await world.sandboxes.ensure("coder", workspace="ws", subject="task:1")
        headers = {"Authorization": f"Bearer {await world.token_of(sandbox)}"}
        run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
        async with httpx.AsyncClient(base_url=url, headers=headers) as http:
            assert (await http.get("/internal/agent/sandbox")).json()["state"] == "ready"
            lease = (await http.post("/internal/agent/next")).json()
            assert lease["run"]["id"] == str(run.id)
            ended = await http.post(
                f"/internal/agent/runs/{run.id}/end",
                json={"epoch": lease["fence"]["epoch"], "reason": "completed"},
            )
            assert ended.json()["state"] == "ended"
            await world.sandboxes.take_back(sandbox.id)
            assert (await http.post("/internal/agent/next")).status_code == 401


async def test_a_sandbox_is_told_over_tcp_that_its_run_was_cancelled() -> None:
    """The renew of a run cancelled under the sandbox answers 409 with reason ``cancelled``;
    the same call at another epoch answers ``lease_lost``."""
    async with world_of("memory", "memory") as world, served(world) as url:
        sandbox = await world.sandboxes.ensure("coder", workspace="ws", subject="task:1")
        headers = {"Authorization": f"Bearer {await world.token_of(sandbox)}"}
        run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
        async with httpx.AsyncClient(base_url=url, headers=headers) as http:
            epoch = (await http.post("/internal/agent/next")).json()["fence"]["epoch"]
            await world.runs.cancel(run.id)
            renew = f"/internal/agent/runs/{run.id}/renew"
            cancelled = await http.post(renew, json={"epoch": epoch})
            assert (cancelled.status_code, cancelled.json()) == (
                409,
                {"detail": "the lease does not hold", "reason": "cancelled"},
            )
            lost = await http.post(renew, json={"epoch": epoch + 1})
            assert (lost.status_code, lost.json()["reason"]) == (409, "lease_lost")
