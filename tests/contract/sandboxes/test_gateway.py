"""The gateway over HTTP: a sandbox's whole life, and every way a call is refused."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import jwt
import pytest

from agentruns.app.reaper import AgentRunReaper
from agentruns.domain.sandbox import AgentSandbox, SandboxState
from agentruns.domain.states import AgentRunState
from agentruns.entrypoints.gateway import MAX_BODY_BYTES, create_gateway
from tests.contract.sandboxes.world import START, World, run_kinds


@pytest.fixture
async def http(world: World) -> AsyncIterator[httpx.AsyncClient]:
    app = create_gateway(world.sandboxes, world.runs)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def started(world: World, subject: str = "task:1") -> tuple[AgentSandbox, str]:
    sandbox = await world.sandboxes.ensure("coder", workspace="ws", subject=subject)
    return sandbox, await world.token_of(sandbox)


async def test_a_sandbox_lives_from_ensure_to_reaped_over_http(
    world: World, http: httpx.AsyncClient
) -> None:
    """ensure -> claim -> first call -> next -> renew -> end -> idle -> reaped -> token refused."""
    sandbox, token = await started(world)
    assert world.cluster.names() == {sandbox.claim_name}
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1", payload={"n": 1})

    world.clock.advance(timedelta(seconds=30))
    hello = await http.get("/internal/agent/sandbox", headers=bearer(token))
    assert hello.status_code == 200
    assert hello.json()["state"] == "ready"
    assert (await world.row(sandbox.id)).state is SandboxState.READY  # type: ignore[union-attr]

    leased = await http.post("/internal/agent/next", headers=bearer(token))
    assert leased.status_code == 200
    lease = leased.json()
    assert lease["run"]["id"] == str(run.id)
    assert lease["run"]["payload"] == {"n": 1}
    assert lease["fence"] == {"run_id": str(run.id), "workspace": "ws", "epoch": 1}

    world.clock.advance(timedelta(seconds=20))
    renewed = await http.post(
        f"/internal/agent/runs/{run.id}/renew", headers=bearer(token), json={"epoch": 1}
    )
    assert renewed.status_code == 200
    assert renewed.json()["leased_until"] == "2026-03-01T12:01:20Z"

    ended = await http.post(
        f"/internal/agent/runs/{run.id}/end",
        headers=bearer(token),
        json={"epoch": 1, "reason": "completed"},
    )
    assert ended.status_code == 200
    assert ended.json()["state"] == "ended"
    assert (await world.runs.get(run.id)).state is AgentRunState.ENDED

    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 204
    world.clock.advance(timedelta(seconds=39))  # a minute after its lease, less a second
    assert (await world.reaper.tick()).taken_back == []
    world.clock.advance(timedelta(seconds=1))
    reap = await world.reaper.tick()
    assert [s.id for s in reap.taken_back] == [sandbox.id]
    assert reap.deleted == [sandbox.claim_name]
    assert world.cluster.names() == set()
    assert await world.row(sandbox.id) is None

    refused = await http.post("/internal/agent/next", headers=bearer(token))
    assert refused.status_code == 401
    assert refused.json() == {"detail": "unauthorized"}


def _unsigned(token: str) -> str:
    header = base64.urlsafe_b64encode(json.dumps({"alg": "none", "kid": "k1"}).encode())
    _, payload, _ = token.split(".")
    return f"{header.rstrip(b'=').decode()}.{payload}."


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda token: None, id="missing"),
        pytest.param(lambda token: {"Authorization": token}, id="no-scheme"),
        pytest.param(lambda token: {"Authorization": "Basic " + token}, id="other-scheme"),
        pytest.param(lambda token: bearer("garbage"), id="malformed"),
        pytest.param(lambda token: bearer(token[:-2] + "AA"), id="forged-signature"),
        pytest.param(lambda token: bearer(_unsigned(token)), id="alg-none"),
        pytest.param(
            lambda token: bearer(
                jwt.encode(
                    jwt.decode(token, options={"verify_signature": False}),
                    b"x" * 32,
                    algorithm="HS256",
                    headers={"kid": "k1"},
                )
            ),
            id="other-secret",
        ),
    ],
)
async def test_a_bad_token_gets_401_with_no_detail_and_writes_nothing(
    world: World, http: httpx.AsyncClient, spoil: object
) -> None:
    """Every refusal looks the same; the sandbox stays REQUESTED and the run stays queued."""
    sandbox, token = await started(world)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    headers = spoil(token)  # type: ignore[operator]
    for method, path in (("GET", "/sandbox"), ("POST", "/next")):
        answer = await http.request(method, f"/internal/agent{path}", headers=headers)
        assert answer.status_code == 401
        assert answer.json() == {"detail": "unauthorized"}
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert (await world.row(sandbox.id)).state is SandboxState.REQUESTED  # type: ignore[union-attr]
    assert (await world.runs.get(run.id)).state is AgentRunState.QUEUED


async def test_an_expired_token_gets_401(world: World, http: httpx.AsyncClient) -> None:
    """At its sandbox's shutdown the token is refused."""
    sandbox, token = await started(world)
    world.clock.set(sandbox.shutdown_at)
    answer = await http.get("/internal/agent/sandbox", headers=bearer(token))
    assert answer.status_code == 401
    assert answer.json() == {"detail": "unauthorized"}


async def test_a_revoked_token_gets_401_before_the_reaper_runs(
    world: World, http: httpx.AsyncClient
) -> None:
    """Taking the sandbox back stops its token at once, while the claim still exists."""
    sandbox, token = await started(world)
    assert (await http.get("/internal/agent/sandbox", headers=bearer(token))).status_code == 200
    await world.sandboxes.take_back(sandbox.id)
    answer = await http.post("/internal/agent/next", headers=bearer(token))
    assert answer.status_code == 401
    assert answer.json() == {"detail": "unauthorized"}


async def test_a_bad_body_gets_422_and_writes_nothing(
    world: World, http: httpx.AsyncClient
) -> None:
    """Bodies are validated before anything is written; the lease is untouched."""
    _, token = await started(world)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    lease = (await http.post("/internal/agent/next", headers=bearer(token))).json()
    before = await world.runs.get(run.id)
    world.clock.advance(timedelta(seconds=5))
    for path, body in (
        ("renew", {}),
        ("renew", {"epoch": "1"}),
        ("renew", {"epoch": 0}),
        ("renew", {"epoch": 1, "extra": True}),
        ("end", {"epoch": 1}),
        ("end", {"epoch": 1, "reason": "retries_exhausted"}),
    ):
        answer = await http.post(
            f"/internal/agent/runs/{run.id}/{path}", headers=bearer(token), json=body
        )
        assert answer.status_code == 422, (path, body)
    bad_id = await http.post(
        "/internal/agent/runs/not-a-uuid/renew", headers=bearer(token), json={"epoch": 1}
    )
    assert bad_id.status_code == 422
    assert await world.runs.get(run.id) == before
    assert lease["fence"]["epoch"] == 1


async def test_a_bad_token_is_refused_before_its_body_is_read(
    world: World, http: httpx.AsyncClient
) -> None:
    """An unauthenticated caller learns nothing about the bodies the gateway takes."""
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    answer = await http.post(
        f"/internal/agent/runs/{run.id}/renew", headers=bearer("nope"), json={"bad": 1}
    )
    assert answer.status_code == 401


async def test_a_stale_or_foreign_fence_gets_409(world: World, http: httpx.AsyncClient) -> None:
    """Another epoch, or a run another sandbox holds, is a lease that does not hold."""
    _, token = await started(world)
    _, other = await started(world, "task:2")
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    stale = await http.post(
        f"/internal/agent/runs/{run.id}/renew", headers=bearer(token), json={"epoch": 2}
    )
    assert stale.status_code == 409
    foreign = await http.post(
        f"/internal/agent/runs/{run.id}/end",
        headers=bearer(other),
        json={"epoch": 1, "reason": "cancelled"},
    )
    assert foreign.status_code == 409
    assert (await world.runs.get(run.id)).state is AgentRunState.LEASED


async def test_an_expired_lease_cannot_be_renewed(world: World, http: httpx.AsyncClient) -> None:
    """The sandbox renews too late: 409, and the reaper may take the run back."""
    _, token = await started(world)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    world.clock.advance(timedelta(seconds=30))
    late = await http.post(
        f"/internal/agent/runs/{run.id}/renew", headers=bearer(token), json={"epoch": 1}
    )
    assert late.status_code == 409


async def _refusal(
    http: httpx.AsyncClient, token: str, run_id: object, epoch: int, route: str = "renew"
) -> object:
    """The reason of a fenced call's 409 (and that it is a 409 with the lease phrase)."""
    body: dict[str, object] = {"epoch": epoch}
    if route == "end":
        body["reason"] = "completed"
    answer = await http.post(
        f"/internal/agent/runs/{run_id}/{route}", headers=bearer(token), json=body
    )
    assert answer.status_code == 409, answer.text
    assert set(answer.json()) == {"detail", "reason"}
    assert answer.json()["detail"] == "the lease does not hold"
    return answer.json()["reason"]


async def test_a_refused_renew_says_the_run_was_cancelled_ended_or_lost(
    world: World, http: httpx.AsyncClient
) -> None:
    """A sandbox told 409 learns why: its run was cancelled or ended at its epoch (so it stops
    the work for good), or the lease was lost (another epoch, taken back, expired)."""
    _, token = await started(world)
    cancelled = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    assert await _refusal(http, token, cancelled.id, 2) == "lease_lost"  # another epoch
    await world.runs.cancel(cancelled.id)
    assert await _refusal(http, token, cancelled.id, 1) == "cancelled"
    assert await _refusal(http, token, cancelled.id, 1, "end") == "cancelled"
    assert await _refusal(http, token, cancelled.id, 2) == "lease_lost"
    after = await world.runs.get(cancelled.id)
    assert (after.state, after.epoch) == (AgentRunState.ENDED, 1)  # the refusals wrote nothing

    done = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    ended = await http.post(
        f"/internal/agent/runs/{done.id}/end",
        headers=bearer(token),
        json={"epoch": 1, "reason": "completed"},
    )
    assert ended.status_code == 200
    assert await _refusal(http, token, done.id, 1) == "ended"

    lost = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    world.clock.advance(timedelta(seconds=31))
    assert await _refusal(http, token, lost.id, 1) == "lease_lost"  # expired, not yet taken
    await AgentRunReaper(world.stores, run_kinds(), random.Random(0)).tick()
    requeued = await world.runs.get(lost.id)
    assert requeued.state is AgentRunState.QUEUED
    assert requeued.due_at is not None
    world.clock.advance(max(timedelta(0), requeued.due_at - world.clock.now()))
    again = await http.post("/internal/agent/next", headers=bearer(token))
    assert again.json()["fence"]["epoch"] == 2
    assert await _refusal(http, token, lost.id, 1) == "lease_lost"  # taken back, leased again
    renewed = await http.post(
        f"/internal/agent/runs/{lost.id}/renew", headers=bearer(token), json={"epoch": 2}
    )
    assert renewed.status_code == 200


async def test_a_refusal_says_nothing_of_a_run_outside_the_sandboxs_subject(
    world: World, http: httpx.AsyncClient
) -> None:
    """Another subject's, or another workspace's, cancelled run is only a lost lease to a
    sandbox: the reason is told of its own subject's runs alone."""
    _, token = await started(world)
    _, neighbour = await started(world, "task:2")
    abroad = await world.sandboxes.ensure("coder", workspace="ws-2", subject="task:1")
    stranger = await world.token_of(abroad)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    await world.runs.cancel(run.id)
    assert await _refusal(http, token, run.id, 1) == "cancelled"
    assert await _refusal(http, neighbour, run.id, 1) == "lease_lost"
    assert await _refusal(http, stranger, run.id, 1) == "lease_lost"
    assert await _refusal(http, stranger, run.id, 1, "end") == "lease_lost"


async def test_tokens_are_taken_only_under_internal_agent(
    world: World, http: httpx.AsyncClient
) -> None:
    """No other path exists on the gateway, with or without a token."""
    _, token = await started(world)
    for path in ("/", "/internal", "/internal/agents/next", "/api/runs", "/docs", "/openapi.json"):
        assert (await http.get(path, headers=bearer(token))).status_code == 404, path


async def test_a_sandbox_that_only_polls_is_ready_but_never_used(
    world: World, http: httpx.AsyncClient
) -> None:
    """204s mark it READY but leave last_used_at unset, so it still goes idle."""
    sandbox, token = await started(world)
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 204
    row = await world.row(sandbox.id)
    assert row is not None
    assert row.state is SandboxState.READY
    assert row.ready_at == START
    assert row.last_used_at is None


async def test_a_sandbox_never_gets_another_workspaces_run_on_its_subject_string(
    world: World, http: httpx.AsyncClient
) -> None:
    """acme's token on /next gets 204 while only globex has a run on the same subject string,
    then acme's own run; globex's run waits for globex's sandbox, which gets it."""
    acme = await world.sandboxes.ensure("coder", workspace="acme", subject="pull-request:42")
    acme_token = await world.token_of(acme)
    theirs = await world.runs.enqueue(
        "code", workspace="globex", subject="pull-request:42", payload={"secret": "globex"}
    )

    nothing = await http.post("/internal/agent/next", headers=bearer(acme_token))
    assert nothing.status_code == 204

    mine = await world.runs.enqueue("code", workspace="acme", subject="pull-request:42")
    leased = await http.post("/internal/agent/next", headers=bearer(acme_token))
    assert leased.status_code == 200
    assert leased.json()["run"]["id"] == str(mine.id)

    globex = await world.sandboxes.ensure("coder", workspace="globex", subject="pull-request:42")
    assert globex.id != acme.id
    got = await http.post("/internal/agent/next", headers=bearer(await world.token_of(globex)))
    assert got.status_code == 200
    assert got.json()["run"]["id"] == str(theirs.id)


async def _asgi_call(
    app: object, path: str, headers: list[tuple[bytes, bytes]], body_read: list[bool]
) -> tuple[int, bytes]:
    """Call the ASGI app directly and note whether it ever asked for the body."""
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        body_read.append(True)
        return {"type": "http.request", "body": b'{"epoch": 1}', "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("gateway", 80),
    }
    await app(scope, receive, send)  # type: ignore[operator]
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")  # type: ignore[misc]
    return int(start["status"]), body  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "authorization",
    [None, b"Bearer nope", b"Basic abc"],
    ids=["missing", "forged", "other-scheme"],
)
async def test_the_token_is_checked_before_a_byte_of_the_body_is_read(
    world: World, authorization: bytes | None
) -> None:
    """An unauthenticated caller is answered 401 without the app ever asking for its body, so a
    huge body costs the gateway nothing (the server discards what it does not read)."""
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    app = create_gateway(world.sandboxes, world.runs)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"104857600")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    body_read: list[bool] = []
    status, body = await _asgi_call(app, f"/internal/agent/runs/{run.id}/renew", headers, body_read)
    assert (status, json.loads(body)) == (401, {"detail": "unauthorized"})
    assert body_read == []


async def test_a_body_over_the_limit_gets_413_and_writes_nothing(
    world: World, http: httpx.AsyncClient
) -> None:
    """Declared or streamed, a body over MAX_BODY_BYTES is refused; the lease is untouched."""
    _, token = await started(world)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    before = await world.runs.get(run.id)
    padded = b'{"epoch": 1' + b" " * MAX_BODY_BYTES + b"}"

    async def streamed() -> AsyncIterator[bytes]:
        for start in range(0, len(padded), 4096):
            yield padded[start : start + 4096]

    path = f"/internal/agent/runs/{run.id}/renew"
    headers = {**bearer(token), "Content-Type": "application/json"}
    for content in (padded, streamed()):
        answer = await http.post(path, headers=headers, content=content)
        assert (answer.status_code, answer.json()) == (413, {"detail": "body too large"})
    assert await world.runs.get(run.id) == before
    exact = b'{"epoch": 1' + b" " * (MAX_BODY_BYTES - 12) + b"}"
    assert len(exact) == MAX_BODY_BYTES
    assert (await http.post(path, headers=headers, content=exact)).status_code == 200


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"epoch": NaN}', "application/json"),
        (b'{"epoch": Infinity}', "application/json"),
        (b'{"epoch": -Infinity}', "application/json"),
        (b'{"epoch": 1e400}', "application/json"),
        (b'{"epoch": 1.0}', "application/json"),
        (b'{"epoch": 4294967296}', "application/json"),
        (b'{"epoch": ' + b"9" * 5000 + b"}", "application/json"),
        (b"\xff\xfe{\x00", "application/json"),
        (b'{"epoch": 1, "reason": "\xc3\x28"}', "application/json"),
        (b"\xff\xfe{\x00", "text/plain"),
        (b'{"epoch": 1, "reason": "\xc3\x28"}', None),
        (b"[" * 10000, "application/json"),
        (b"", "application/json"),
    ],
    ids=[
        "nan",
        "infinity",
        "minus-infinity",
        "1e400",
        "float-epoch",
        "epoch-beyond-integer",
        "5000-digit-epoch",
        "non-utf8-json",
        "non-utf8-string",
        "non-utf8-text",
        "non-utf8-untyped",
        "deep-nesting",
        "empty",
    ],
)
async def test_no_body_makes_a_500_and_no_refusal_echoes_it(
    world: World, http: httpx.AsyncClient, body: bytes, content_type: str | None
) -> None:
    """A valid caller's malformed body is a 4xx of the fixed shape, whatever it holds; the lease
    is untouched."""
    _, token = await started(world)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    before = await world.runs.get(run.id)
    headers = bearer(token)
    if content_type is not None:
        headers["Content-Type"] = content_type
    for path in ("renew", "end"):
        answer = await http.post(
            f"/internal/agent/runs/{run.id}/{path}", headers=headers, content=body
        )
        assert answer.status_code in (400, 422), (path, answer.status_code)
        assert answer.json() == {
            "detail": {400: "bad request", 422: "invalid request"}[answer.status_code]
        }
    assert await world.runs.get(run.id) == before


async def test_a_signed_token_with_an_absurd_expiry_gets_401(
    world: World, http: httpx.AsyncClient
) -> None:
    """exp of 1e20, under the gateway's own key: refused like any bad token, not a 500."""
    sandbox, token = await started(world)
    claims = jwt.decode(token, options={"verify_signature": False})
    for exp in (10**20, 2**64, 10**300):
        absurd = jwt.encode(
            {**claims, "exp": exp}, b"k" * 32, algorithm="HS256", headers={"kid": "k1"}
        )
        answer = await http.get("/internal/agent/sandbox", headers=bearer(absurd))
        assert (answer.status_code, answer.json()) == (401, {"detail": "unauthorized"})
    assert (await world.row(sandbox.id)).state is SandboxState.REQUESTED  # type: ignore[union-attr]


async def test_a_sandbox_ends_its_run_with_a_result(world: World, http: httpx.AsyncClient) -> None:
    """The end's optional result is stored with it (ADRs/0026); one that cannot be stored is a
    422 and the run stays leased."""
    _, token = await started(world)
    run = await world.runs.enqueue("code", workspace="ws", subject="task:1")
    assert (await http.post("/internal/agent/next", headers=bearer(token))).status_code == 200
    path = f"/internal/agent/runs/{run.id}/end"
    deep: object = "leaf"
    for _ in range(70):
        deep = [deep]
    refused = await http.post(
        path, headers=bearer(token), json={"epoch": 1, "reason": "completed", "result": deep}
    )
    assert refused.status_code == 422
    assert (await world.runs.get(run.id)).state is AgentRunState.LEASED
    ended = await http.post(
        path,
        headers=bearer(token),
        json={"epoch": 1, "reason": "completed", "result": {"patch": "diff --git", "ok": True}},
    )
    assert ended.status_code == 200
    assert ended.json()["result"] == {"patch": "diff --git", "ok": True}
    assert (await world.runs.get(run.id)).result == {"patch": "diff --git", "ok": True}
