"""Schemathesis over the gateway: any call, with a valid, forged or generated token, is answered
without a 5xx, and every refusal is the fixed shape ``{"detail": <phrase>}``.

The operations come from the app's own OpenAPI document (the gateway serves none; the test asks
the app for it). Cases are schemathesis's positive and negative ones, on a random or the real
leased run, plus raw bodies of any bytes under any content type. A few hundred cases run in the
suite (``FUZZ_EXAMPLES`` per store); ``AGENTRUNS_FUZZ_EXAMPLES`` runs more.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies as st
from schemathesis import GenerationMode

from agentruns.domain.sandbox import LeaseRefusal
from agentruns.entrypoints.gateway import create_gateway
from tests.contract.sandboxes.world import World, world_of

FUZZ_EXAMPLES = int(os.environ.get("AGENTRUNS_FUZZ_EXAMPLES", "100"))
PHRASES = {
    400: "bad request",
    401: "unauthorized",
    404: "not found",
    405: "method not allowed",
    409: "the lease does not hold",
    413: "body too large",
    422: "invalid request",
}


class Gateway:
    """A world, its gateway app and a client, on one event loop the examples share."""

    def __init__(self, family: str, url: str | None) -> None:
        self.runner = asyncio.Runner()
        self.stack = AsyncExitStack()
        self.world: World = self.runner.run(
            self.stack.enter_async_context(world_of(family, "memory", url))
        )
        self.app = create_gateway(self.world.sandboxes, self.world.runs)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gateway"
        )
        self.token, self.run_id = self.runner.run(self._lease())

    async def _lease(self) -> tuple[str, str]:
        sandbox = await self.world.sandboxes.ensure("coder", workspace="ws", subject="task:1")
        token = await self.world.token_of(sandbox)
        for number in range(20):
            await self.world.runs.enqueue(
                "code", workspace="ws", subject="task:1", payload={"n": number}
            )
        leased = await self.world.sandboxes.next_run(token, self.world.runs)
        assert leased is not None
        return token, str(leased.id)

    def send(self, request: dict[str, Any]) -> httpx.Response:
        return self.runner.run(self.client.request(**request))

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.run(self.stack.aclose())
        self.runner.close()


@pytest.fixture(params=["memory", "postgres"])
def gateway(request: pytest.FixtureRequest) -> Iterator[Gateway]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    built = Gateway(request.param, url)
    try:
        yield built
    finally:
        built.close()


@functools.cache
def _operations() -> list[Any]:
    async def document() -> dict[str, Any]:
        async with world_of("memory", "memory") as world:
            return create_gateway(world.sandboxes, world.runs).openapi()

    schema = schemathesis.openapi.from_dict(asyncio.run(document()))
    return [result.ok() for result in schema.get_all_operations()]


def _cases(run_id: str | None) -> st.SearchStrategy[Any]:
    strategies = []
    for operation in _operations():
        on_run = run_id is not None and "run_id" in operation.path
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(mode))
            if on_run:
                strategies.append(operation.as_strategy(mode, path_parameters={"run_id": run_id}))
    return st.one_of(strategies)


RAW_BODIES = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(
        [b'{"epoch": NaN}', b'{"epoch": -Infinity}', b'{"epoch": 1e400}', b"\xff\xfe\x00",
         b'{"epoch": 1, "reason": "\xc3"}', b"[" * 5000, b'{"epoch": ' + b"9" * 5000 + b"}"]
    ),
)  # fmt: skip
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/octet-stream",
        "application/json; charset=latin-1",
    ]
)
TOKENS = st.sampled_from(["valid", "forged", "generated"])


@st.composite
def requests(draw: st.DrawFn, run_id: str) -> tuple[str, dict[str, Any]]:
    """A request from schemathesis's cases, its token valid, forged or as generated, and now and
    then its body replaced by raw bytes."""
    case = draw(_cases(run_id))
    token = draw(TOKENS)
    kwargs = case.as_transport_kwargs(base_url="http://gateway")
    headers = {
        name: value
        for name, value in kwargs["headers"].items()
        if token == "generated" or name.lower() != "authorization"
    }
    request: dict[str, Any] = {
        "method": kwargs["method"],
        "url": kwargs["url"],
        "params": kwargs.get("params") or None,
        "headers": headers,
    }
    if "json" in kwargs:
        request["json"] = kwargs["json"]
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        request["content"] = data if isinstance(data, bytes) else str(data).encode()
    if draw(st.integers(min_value=0, max_value=3)) == 0:
        request.pop("json", None)
        request["content"] = draw(RAW_BODIES)
        headers["Content-Type"] = draw(CONTENT_TYPES)
    return token, request


def _check(response: httpx.Response) -> None:
    """Every refusal is its status's fixed phrase; a renew's or an end's refused lease (409) also
    says why, as one of the fixed reasons (ADRs/0023), and nothing else."""
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        body = response.json()
        if response.status_code == 409 and "reason" in body:
            assert body.pop("reason") in {reason.value for reason in LeaseRefusal}
        assert body == {"detail": PHRASES[response.status_code]}


@pytest.mark.postgres
def test_no_call_makes_the_gateway_fail_and_every_refusal_is_fixed(gateway: Gateway) -> None:
    seen: set[int] = set()
    forged = gateway.token[:-4] + ("AAAA" if not gateway.token.endswith("AAAA") else "BBBB")

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(drawn=requests(gateway.run_id))
    def one_call(drawn: tuple[str, dict[str, Any]]) -> None:
        token, request = drawn
        if token != "generated":
            secret = gateway.token if token == "valid" else forged
            request["headers"]["Authorization"] = f"Bearer {secret}"
        response = gateway.send(request)
        seen.add(response.status_code)
        _check(response)

    one_call()
    # The run reached the use cases as well as the gate: both refusals and answers were seen.
    assert 401 in seen
    assert seen & {200, 204, 409}
    assert seen & {400, 404, 405, 422}
