"""A gateway served by uvicorn in a process of its own, so a test can watch its memory.

``python -m tests.e2e.gateway_process`` builds a memory world with one sandbox holding one leased
run, serves the gateway on a free port of 127.0.0.1, prints one JSON line (its URL, the sandbox's
token, the leased run and its epoch), and serves until its standard input closes. An argument
is the body timeout in seconds (the default otherwise).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from datetime import timedelta

from agentruns.entrypoints.gateway import BODY_TIMEOUT, create_gateway, serve
from tests.contract.sandboxes.world import world_of


async def main() -> None:
    async with world_of("memory", "memory") as world:
        sandbox = await world.sandboxes.ensure("coder", workspace="ws", subject="task:1")
        token = await world.token_of(sandbox)
        await world.runs.enqueue("code", workspace="ws", subject="task:1")
        leased = await world.sandboxes.next_run(token, world.runs)
        assert leased is not None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def until_stdin_closes() -> None:
            sys.stdin.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=until_stdin_closes, daemon=True).start()

        def started(url: str) -> None:
            said = {"url": url, "token": token, "run": str(leased.id), "epoch": leased.epoch}
            print(json.dumps(said), flush=True)

        body_timeout = timedelta(seconds=float(sys.argv[1])) if sys.argv[1:] else BODY_TIMEOUT
        app = create_gateway(world.sandboxes, world.runs, body_timeout=body_timeout)
        await serve(app, "127.0.0.1", 0, stop, started=started, grace=1)


if __name__ == "__main__":
    asyncio.run(main())
