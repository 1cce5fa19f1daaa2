"""The console over the memory adapters, in process: pages, refusals, access, CSRF, actions."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import agentruns
from agentruns import AgentRunsClient, ConsoleAccess, StepEvent, create_console
from agentruns.domain.errors import LeaseLost
from agentruns.domain.holders import HolderBeat
from agentruns.testing import ManualClock, MemoryFamily

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SECRET = "payload-secret-4242"
TOKEN = "console-token-1234"


async def _steps(run: agentruns.AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("fetched", {"note": "x" * 6000})
    if run.payload.get("fail"):
        raise agentruns.ProviderError("bad key", status=401)
    yield StepEvent("done", {"ok": True})


KIND = agentruns.RunKind(agentruns.RunKindPolicy(name="summarise"), _steps)
PROVIDER_KEY = "sk-proj-ABCDEFGHIJKLMNOPQRST"


async def _calls(run: agentruns.AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("called", {"api_key": PROVIDER_KEY, "model": "m1", "max_tokens": 512})
    raise agentruns.FallbackChainExhausted([agentruns.ProviderError("down", status=401)])


CALLS = agentruns.RunKind(agentruns.RunKindPolicy(name="calls"), _calls)
DAILY = agentruns.Schedule(
    "nightly", kind="summarise", every=timedelta(hours=1), workspace="acme", subject="n:{tick}"
)
PARIS = agentruns.Schedule(
    "paris-digest",
    kind="summarise",
    cron="0 7 * * *",
    timezone="Europe/Paris",
    workspace="acme",
    subject="d:{date}",
)


@pytest.fixture
async def client() -> AsyncIterator[AgentRunsClient]:
    clock = ManualClock(START)
    kinds = agentruns.RunKinds([KIND, CALLS], schedules=[DAILY, PARIS])
    async with agentruns.connect(kinds=kinds, family=MemoryFamily(clock), clock=clock) as made:
        await made.schedules.sync()
        for number in range(3):
            await made.runs.enqueue(
                "summarise",
                workspace="acme",
                subject=f"doc:{number}",
                payload={"notes": SECRET, "fail": number == 1},
            )
        await made.worker(holder="w1").claim_and_drive(limit=3)
        yield made


def _http(app: object, **options: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
        base_url="http://localhost",
        **options,  # type: ignore[arg-type]
    )


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the confirmation has its CSRF field"
    return found[1]


async def _dead(client: AgentRunsClient) -> agentruns.AgentRun:
    [dead] = (await client.runs.list_runs(reason="not_retryable")).runs
    return dead


async def test_every_page_renders(client: AgentRunsClient) -> None:
    dead = await _dead(client)
    async with _http(create_console(client)) as http:
        for path in (
            "/",
            "/live/overview",
            "/workspaces",
            "/workspaces?sort=share&desc=1",
            "/workspaces?sort=oldest",
            "/runs",
            "/runs?state=ended&reason=not_retryable&band=batch&kind=summarise&after=1h",
            "/runs?workspace=acme&subject=doc:1&before=2030-01-01T00:00",
            f"/runs/{dead.id}",
            f"/runs/{dead.id}?events_after=1",
            "/schedules",
            "/sandboxes",
            f"/confirm?action=retry&run={dead.id}",
            "/confirm?action=hold&workspace=acme",
            "/confirm?action=pause&schedule=nightly",
            "/static/console.css",
            "/static/console.js",
        ):
            answer = await http.get(path)
            assert answer.status_code == 200, (path, answer.text[:500])
        run_page = (await http.get(f"/runs/{dead.id}")).text
    assert "bad key" in run_page
    assert "not_retryable" in run_page
    assert 'data-epoch="1"' in run_page
    assert "more characters not shown" in run_page  # the 6,000-character note is cut


async def _answers(run: agentruns.AgentRun) -> AsyncIterator[StepEvent]:
    yield agentruns.RunResult({"verdict": "approve", "api_key": PROVIDER_KEY})


async def test_a_run_page_shows_the_result_its_run_ended_with_redacted(
    client: AgentRunsClient,
) -> None:
    done = (await client.runs.list_runs(reason="completed")).runs[0]
    async with _http(create_console(client)) as http:
        plain = (await http.get(f"/runs/{done.id}")).text
    assert 'id="result"' not in plain  # no result, no section
    kinds = agentruns.RunKinds(
        [agentruns.RunKind(agentruns.RunKindPolicy(name="answers"), _answers)]
    )
    clock = ManualClock(START)
    async with agentruns.connect(kinds=kinds, family=MemoryFamily(clock), clock=clock) as other:
        run = await other.runs.enqueue("answers", workspace="acme", subject="a:1")
        await other.worker(holder="w3").claim_and_drive(limit=1)
        async with _http(create_console(other)) as http:
            page = (await http.get(f"/runs/{run.id}")).text
    assert 'id="result"' in page
    assert "approve" in page
    assert PROVIDER_KEY not in page


async def test_a_run_page_redacts_its_event_and_payload_by_the_failures_rule(
    client: AgentRunsClient,
) -> None:
    """An event's ``api_key`` showed in clear beside a failure whose message had lost the
    payload's ``"chain"``: one rule now, by key name and by shape, and short values stay."""
    run = await client.runs.enqueue(
        "calls",
        workspace="acme",
        subject="calls:1",
        payload={"fail": "chain", "openai_api_key": "k-short", "note": f"use {PROVIDER_KEY}"},
    )
    await client.worker(holder="w2").claim_and_drive(limit=1)
    async with _http(create_console(client)) as http:
        page = (await http.get(f"/runs/{run.id}")).text
    assert PROVIDER_KEY not in page
    assert "k-short" not in page
    assert "[redacted]" in page
    assert "max_tokens" in page
    assert "512" in page
    assert "fallback chain exhausted after 1 attempt(s)" in page
    assert "chain" in page


async def test_a_run_page_shows_its_enqueue_key(client: AgentRunsClient) -> None:
    keyed = await client.runs.enqueue(
        "summarise", workspace="acme", subject="doc:k", key="webhook-<7>"
    )
    plain = await client.runs.enqueue("summarise", workspace="acme", subject="doc:p")
    async with _http(create_console(client)) as http:
        keyed_page = (await http.get(f"/runs/{keyed.id}")).text
        plain_page = (await http.get(f"/runs/{plain.id}")).text
    assert '<td id="enqueue-key">webhook-&lt;7&gt;</td>' in keyed_page
    assert '<td id="enqueue-key">-</td>' in plain_page


async def test_a_run_page_shows_what_a_waiting_run_waits_for(client: AgentRunsClient) -> None:
    """ADRs/0025: a run given back to wait says for which signal and until when."""
    run = await client.runs.enqueue("summarise", workspace="acme", subject="doc:w")
    leased = await client.runs.claim_subject("w1", "acme", "doc:w", kinds=["summarise"])
    assert leased is not None
    await client.runs.wait_point(
        leased.fence, name="approval<1>", occurrence=1, longest=timedelta(hours=2)
    )
    async with _http(create_console(client)) as http:
        page = (await http.get(f"/runs/{run.id}")).text
        done = (await http.get(f"/runs/{(await _dead(client)).id}")).text
    assert (
        '<td id="waiting">for signal <code>approval&lt;1&gt;</code> since 2026-03-01 12:00:00 '
        "UTC until 2026-03-01 14:00:00" in page
    )
    assert '<td id="waiting">-</td>' in done


TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?![^<]*(?:UTC|Europe/Paris))")


async def test_every_time_says_its_zone_and_a_schedule_ticks_in_its_own(
    client: AgentRunsClient,
) -> None:
    """``cron 0 7 * * * (Europe/Paris)`` showed its next tick as 06:00:00 without a zone."""
    dead = await _dead(client)
    async with _http(create_console(client)) as http:
        schedules = (await http.get("/schedules")).text
        pages = [schedules]
        for path in ("/", "/runs", f"/runs/{dead.id}", "/workspaces", "/sandboxes"):
            pages.append((await http.get(path)).text)
    paris = schedules.split('data-schedule="paris-digest"')[1].split("</tr>")[0]
    assert "2026-03-02 07:00:00 Europe/Paris (+01:00)" in paris  # 06:00 UTC
    hourly = schedules.split('data-schedule="nightly"')[1].split("</tr>")[0]
    assert "2026-03-01 13:00:00 UTC" in hourly
    for page in pages:
        assert TIME.findall(page) == []  # no time without its zone
    assert "2026-03-01 12:00:00 UTC" in pages[3]


async def test_the_overview_shows_holders_quiet_leases_and_kinds_nobody_claims(
    client: AgentRunsClient,
) -> None:
    """With no live holder, queued runs of a kind are flagged; once a holder that claims it
    beats, the flag goes; a lease nobody renewed for three renewals is listed as quiet."""
    await client.runs.enqueue("summarise", workspace="acme", subject="waiting")
    await client.runs.enqueue("summarise", workspace="acme", subject="held")
    [held] = await client.runs.claim("ghost", kinds=["summarise"])
    clock = client.clock
    assert isinstance(clock, ManualClock)
    clock.advance(timedelta(seconds=31))  # past three renewals of the default 10 s
    async with _http(create_console(client)) as http:
        before = (await http.get("/live/overview")).text
        async with client.family.stores.scope.transaction() as tx:
            await client.family.holders.started(
                tx, HolderBeat("w-live", "agentruns-worker", ("summarise",), timedelta(seconds=10))
            )
        after = (await http.get("/")).text
    assert 'id="total-unclaimed">1<' in before
    assert "no live holder claims it" in before
    assert 'id="quiet-leases"' in before
    assert str(held.id)[:12] in before
    assert "not renewed" in before
    assert 'id="total-unclaimed">0<' in after
    assert "no live holder claims it" not in after
    assert 'data-holder="w-live"' in after
    assert "agentruns-worker" in after


BAD = [
    ("/runs/not-a-uuid", 400),
    ("/runs/00000000-0000-0000-0000-000000000000", 404),
    ("/runs?state=sleeping", 400),
    ("/runs?reason=bored", 400),
    ("/runs?band=loud", 400),
    ("/runs?limit=0", 400),
    ("/runs?limit=99999999999999", 400),
    ("/runs?cursor=xyz", 400),
    ("/runs?after=yesterday", 400),
    ("/runs?after=99999999d", 400),
    ("/runs?workspace=a%00b", 400),
    ("/runs?workspace=" + "w" * 600, 400),
    ("/runs?kind=%ff%fe", 200),  # undecodable bytes are replaced: an unknown kind lists nothing
    ("/runs/00000000-0000-0000-0000-000000000000?events_after=-1", 400),
    ("/workspaces?sort=mood", 400),
    ("/confirm?action=explode", 400),
    ("/confirm?action=cancel", 400),
    ("/confirm?action=cancel&run=zzz", 400),
    ("/confirm?action=hold", 400),
    ("/confirm?action=pause&schedule=nope", 404),
    ("/nowhere", 404),
    ("/login", 404),
]


@pytest.mark.parametrize(("path", "status"), BAD)
async def test_bad_input_gets_a_clear_4xx(client: AgentRunsClient, path: str, status: int) -> None:
    async with _http(create_console(client)) as http:
        answer = await http.get(path)
    assert answer.status_code == status, answer.text[:300]
    if status >= 400:
        assert 'id="error"' in answer.text


async def test_bad_posts_are_refused_without_a_500(client: AgentRunsClient) -> None:
    dead = await _dead(client)
    async with _http(create_console(client)) as http:
        token = _csrf((await http.get(f"/confirm?action=retry&run={dead.id}")).text)
        cases = [
            ("/actions/explode", {"csrf": token}, 404),
            ("/actions/retry", {"run": str(dead.id)}, 403),
            ("/actions/retry", {"csrf": "forged-token-forged-token", "run": str(dead.id)}, 403),
            ("/actions/hold", {"csrf": token, "workspace": "acme", "until": "soon"}, 400),
            ("/actions/hold", {"csrf": token, "workspace": "acme", "until": "0s"}, 400),
            ("/actions/hold", {"csrf": token, "workspace": "", "until": "1h"}, 400),
            ("/actions/cancel", {"csrf": token, "run": str(dead.id)}, 409),
            ("/actions/pause", {"csrf": token, "schedule": "missing"}, 404),
        ]
        for path, form, status in cases:
            answer = await http.post(path, data=form)
            assert answer.status_code == status, (path, form, answer.text[:300])
        raw = await http.post(
            "/actions/retry",
            content=b"csrf=\xff\xfe&run=1",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert raw.status_code == 400
        huge = await http.post("/actions/retry", content=b"x" * 100_000)
        assert huge.status_code == 413
        other_site = await http.post(
            "/actions/retry",
            data={"csrf": token, "run": str(dead.id)},
            headers={"origin": "https://elsewhere.example"},
        )
        assert other_site.status_code == 403
        assert (await http.get("/actions/retry")).status_code == 405


async def test_cancelling_a_leased_run_fences_its_holder_out(client: AgentRunsClient) -> None:
    run = await client.runs.enqueue("summarise", workspace="acme", subject="doc:9")
    [leased] = await client.runs.claim("holder-x", limit=1)
    assert leased.id == run.id
    async with _http(create_console(client)) as http:
        page = (await http.get(f"/confirm?action=cancel&run={run.id}")).text
        assert "holder-x" in page
        answer = await http.post("/actions/cancel", data={"csrf": _csrf(page), "run": str(run.id)})
        assert answer.status_code == 303
        assert answer.headers["location"] == f"/runs/{run.id}?notice=cancelled"
    with pytest.raises(LeaseLost):
        await client.runs.renew(leased.fence)
    assert (await client.runs.get(run.id)).end_reason == agentruns.TerminationReason.CANCELLED


async def test_retrying_a_dead_letter_continues_it(client: AgentRunsClient) -> None:
    dead = await _dead(client)
    async with _http(create_console(client)) as http:
        page = (await http.get(f"/confirm?action=retry&run={dead.id}")).text
        answer = await http.post("/actions/retry", data={"csrf": _csrf(page), "run": str(dead.id)})
        assert answer.status_code == 303
        later = await client.runs.continued_by(dead.id)
        assert later is not None
        assert answer.headers["location"].startswith(f"/runs/{later.id}")
        # A second retry of the same run is refused: it was continued already.
        again = await http.get(f"/runs/{dead.id}")
        assert 'id="retry-run"' not in again.text
        refused = await http.post("/actions/retry", data={"csrf": _csrf(page), "run": str(dead.id)})
        assert refused.status_code == 409


async def test_workspace_and_schedule_actions(client: AgentRunsClient) -> None:
    async with _http(create_console(client)) as http:
        token = _csrf((await http.get("/confirm?action=hold&workspace=acme")).text)
        held = await http.post(
            "/actions/hold", data={"csrf": token, "workspace": "acme", "until": "2h", "reason": "$"}
        )
        assert held.status_code == 303
        page = (await http.get("/workspaces")).text
        assert "budget held until" in page
        await http.post("/actions/release", data={"csrf": token, "workspace": "acme"})
        await http.post("/actions/deactivate", data={"csrf": token, "workspace": "acme"})
        page = (await http.get("/workspaces")).text
        assert "budget held" not in page
        assert "inactive" in page
        await http.post("/actions/pause", data={"csrf": token, "schedule": "nightly"})
        assert (await client.schedules.get("nightly")).paused
        await http.post("/actions/resume", data={"csrf": token, "schedule": "nightly"})
        assert not (await client.schedules.get("nightly")).paused


async def test_a_read_only_console_offers_and_accepts_no_action(client: AgentRunsClient) -> None:
    dead = await _dead(client)
    async with _http(create_console(client, read_only=True)) as http:
        token = "forged-token-forged-token"
        page = (await http.get(f"/runs/{dead.id}")).text
        assert "read-only" in page
        assert "/confirm?" not in page
        assert "/confirm?" not in (await http.get("/workspaces")).text
        assert (await http.get(f"/confirm?action=retry&run={dead.id}")).status_code == 403
        answer = await http.post("/actions/retry", data={"csrf": token, "run": str(dead.id)})
        assert answer.status_code == 403
    assert await client.runs.continued_by(dead.id) is None


async def test_without_the_credential_no_data_is_served(client: AgentRunsClient) -> None:
    dead = await _dead(client)
    access = ConsoleAccess(token=TOKEN, user="ops", password="correct-horse")
    app = create_console(client, access=access)
    async with _http(app) as http:
        for path in ("/", "/live/overview", "/runs", f"/runs/{dead.id}", "/workspaces"):
            for headers in (
                {},
                {"authorization": "Bearer wrong-token-123"},
                {"authorization": "Basic " + base64.b64encode(b"ops:wrong-pass").decode()},
                {"authorization": "Basic !!!"},
                {"cookie": "agentruns_session=forged"},
            ):
                answer = await http.get(path, headers=headers)
                assert answer.status_code == 401
                assert SECRET not in answer.text
                assert "doc:" not in answer.text
        assert (await http.get("/static/console.css")).status_code == 200
        basic = base64.b64encode(b"ops:correct-horse").decode()
        assert (await http.get("/runs", headers={"authorization": f"Basic {basic}"})).is_success
        bearer = await http.get(f"/runs/{dead.id}", headers={"authorization": f"Bearer {TOKEN}"})
        assert SECRET in bearer.text
        # A browser gives the token once; its session cookie is not the token.
        assert (await http.post("/login", data={"token": "nope"})).status_code == 401
        login = await http.post("/login", data={"token": TOKEN})
        assert login.status_code == 303
        assert TOKEN not in login.headers["set-cookie"]
        assert (await http.get("/runs")).status_code == 200


async def test_a_host_mounts_the_console_under_its_own_prefix(client: AgentRunsClient) -> None:
    host = Starlette(routes=[Mount("/ops/agentruns", app=create_console(client))])
    async with _http(host) as http:
        page = (await http.get("/ops/agentruns/runs")).text
        assert 'href="/ops/agentruns/static/console.css"' in page
        assert 'href="/ops/agentruns/runs/' in page
        assert (await http.get("/ops/agentruns/static/console.js")).status_code == 200


def test_console_access_refuses_a_weak_or_half_credential() -> None:
    for options in (
        {},
        {"token": "short"},
        {"user": "ops"},
        {"user": "ops", "password": "short"},
        {"user": "o:ps", "password": "long-enough"},
    ):
        with pytest.raises(ValueError, match="console"):
            ConsoleAccess(**options)  # type: ignore[arg-type]


def test_the_command_refuses_a_network_address_without_a_credential(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentruns.entrypoints.cli.main import app

    for name in ("AGENTRUNS_CONSOLE_TOKEN", "AGENTRUNS_CONSOLE_USER", "AGENTRUNS_CONSOLE_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exited:
        app(["console", "--host", "0.0.0.0"], prog_name="agentruns")
    assert exited.value.code == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("agentruns: error: --host 0.0.0.0 is not this machine only")
    monkeypatch.setenv("AGENTRUNS_CONSOLE_TOKEN", "short")
    with pytest.raises(SystemExit):
        app(["console", "--host", "10.0.0.1"], prog_name="agentruns")
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "a console token has at least 16 characters" in line


def test_the_login_throttle_doubles_its_wait_and_remembers_a_bounded_number_of_addresses() -> None:
    from agentruns.entrypoints.console.access import LoginThrottle

    now = [0.0]
    throttle = LoginThrottle(free=2, longest=8.0, remembered=3, clock=lambda: now[0])
    for _ in range(2):
        assert throttle.wait("a") == 0
        throttle.failed("a")
    assert throttle.wait("a") == 1.0
    for expected in (2.0, 4.0, 8.0, 8.0):
        throttle.failed("a")
        assert throttle.wait("a") == expected
    now[0] = 8.0
    assert throttle.wait("a") == 0
    for address in ("b", "c", "d"):
        throttle.failed(address)
    assert len(throttle) == 3
    assert throttle.wait("a") == 0  # the least recently failed address was forgotten
    throttle.failed("b")
    throttle.succeeded("b")
    assert len(throttle) == 2


async def test_a_planted_csrf_pair_and_a_token_of_another_session_are_refused(
    client: AgentRunsClient,
) -> None:
    queued = await client.runs.enqueue("summarise", workspace="acme", subject="doc:9")
    app = create_console(client, access=ConsoleAccess(token=TOKEN))
    bearer = {"authorization": f"Bearer {TOKEN}"}
    async with _http(app, headers=bearer) as http:
        page = (await http.get(f"/confirm?action=cancel&run={queued.id}")).text
        mine = _csrf(page)
    async with _http(app) as browser:
        assert (await browser.post("/login", data={"token": TOKEN})).status_code == 303
        # The bearer session's token does not hold for the browser's session.
        browser.cookies.set("agentruns_csrf", mine)
        answer = await browser.post("/actions/cancel", data={"csrf": mine, "run": str(queued.id)})
        assert answer.status_code == 403
    assert (await client.runs.get(queued.id)).state is agentruns.AgentRunState.QUEUED


async def _waiting(client: AgentRunsClient, subject: str) -> agentruns.AgentRun:
    """A run given back to wait for the signal ``approval`` for two hours."""
    run = await client.runs.enqueue("summarise", workspace="acme", subject=subject)
    leased = await client.runs.claim_subject("w1", "acme", subject, kinds=["summarise"])
    assert leased is not None
    await client.runs.wait_point(
        leased.fence, name="approval", occurrence=1, longest=timedelta(hours=2)
    )
    return run


async def test_a_signal_is_delivered_from_a_waiting_runs_page(client: AgentRunsClient) -> None:
    """The run page's form delivers the signal it waits for; a second delivery of its id
    writes nothing; a cancel is offered while it waits."""
    run = await _waiting(client, "doc:s")
    async with _http(create_console(client)) as http:
        page = (await http.get(f"/runs/{run.id}")).text
        assert 'id="signal-form"' in page
        assert 'id="signal-name" value="approval"' in page
        assert 'id="cancel-run"' in page
        confirm = await http.get(f"/confirm?action=signal&run={run.id}")
        assert confirm.status_code == 200
        assert 'name="name" value="approval"' in confirm.text
        form = {
            "csrf": _csrf(page),
            "run": str(run.id),
            "name": "approval",
            "payload": '{"ok": true}',
            "signal_id": "mail-1",
        }
        answer = await http.post("/actions/signal", data=form)
        assert answer.status_code == 303, answer.text[:300]
        assert answer.headers["location"] == f"/runs/{run.id}?notice=signalled"
        after = (await http.get(answer.headers["location"])).text
        assert "The signal was delivered" in after
        assert '<td id="waiting">-</td>' in after
        assert 'id="signal-form"' not in after
        again = await http.post("/actions/signal", data={**form, "payload": "2"})
        assert again.headers["location"] == f"/runs/{run.id}?notice=signalled_before"
    [signal] = await client.runs.signals(run.id)
    assert (signal.signal_id, signal.payload) == ("mail-1", {"ok": True})
    assert (await client.runs.get(run.id)).waiting_until is None


async def test_a_bad_signal_is_refused_with_a_clear_page_and_writes_nothing(
    client: AgentRunsClient,
) -> None:
    run = await _waiting(client, "doc:b")
    dead = await _dead(client)
    async with _http(create_console(client)) as http:
        token = _csrf((await http.get(f"/runs/{run.id}")).text)
        base = {"csrf": token, "run": str(run.id), "name": "approval"}
        cases = [
            ({**base, "payload": "{not json"}, 400, "The payload is not JSON"),
            ({**base, "payload": "[" * 2000 + "]" * 2000}, 400, "nests too deep"),
            ({**base, "payload": "NaN"}, 400, ""),
            ({**base, "name": " "}, 400, ""),
            ({**base, "run": "not-a-uuid"}, 400, "not a run id"),
            ({**base, "run": "00000000-0000-4000-8000-000000000000"}, 404, ""),
            ({**base, "run": str(dead.id)}, 409, "ended"),
            ({**base, "csrf": "forged-token-forged-token"}, 403, "stale"),
        ]
        for form, status, says in cases:
            answer = await http.post("/actions/signal", data=form)
            assert answer.status_code == status, (form["run"], answer.text[:300])
            assert says in answer.text
        huge = await http.post(
            "/actions/signal", data={**base, "payload": '"' + "x" * 20_000 + '"'}
        )
        assert huge.status_code == 413
        assert "too large" in huge.text
    assert await client.runs.signals(run.id) == []
    assert await client.runs.signals(dead.id) == []
    assert (await client.runs.get(run.id)).waiting_for == "approval"


async def test_the_overview_and_the_workspaces_show_the_waiting_runs(
    client: AgentRunsClient,
) -> None:
    run = await _waiting(client, "doc:o")
    async with _http(create_console(client)) as http:
        overview = (await http.get("/live/overview")).text
        workspaces = (await http.get("/workspaces?sort=waiting&desc=1")).text
        listed = (await http.get("/runs?state=waiting")).text
        runs_page = (await http.get("/runs")).text
    assert '<span class="value" id="total-waiting"><a href="/runs?state=waiting">1</a>' in overview
    assert f'<tr data-run="{run.id}">' in overview
    assert "signal <code>approval</code>" in overview
    assert "2026-03-01 14:00:00 UTC" in overview
    assert (
        '<td class="num" data-count="waiting"><a href="/runs?state=waiting&amp;workspace=acme">1'
        in (workspaces)
    )
    assert str(run.id) in listed
    assert "<option >waiting</option>" in runs_page or ">waiting</option>" in runs_page


async def test_a_read_only_console_offers_no_signal_form(client: AgentRunsClient) -> None:
    run = await _waiting(client, "doc:r")
    async with _http(create_console(client, read_only=True)) as http:
        page = (await http.get(f"/runs/{run.id}")).text
        refused = await http.post(
            "/actions/signal",
            data={"csrf": "forged-token-forged-token", "run": str(run.id), "name": "approval"},
        )
    assert 'id="signal-form"' not in page
    assert refused.status_code == 403
    assert await client.runs.signals(run.id) == []


async def _spending(run: agentruns.AgentRun) -> AsyncIterator[StepEvent]:
    yield StepEvent("asked", {}, usage=agentruns.Usage(input_tokens=300, cost=Decimal("0.02")))
    yield StepEvent("asked", {}, usage=agentruns.Usage(output_tokens=40, model="m1"))


async def test_the_run_page_workspaces_and_overview_show_what_steps_spent() -> None:
    """ADRs/0033: a run's totals on its page, today's spend per workspace and in all."""
    kinds = agentruns.RunKinds(
        [agentruns.RunKind(agentruns.RunKindPolicy(name="spends"), _spending)]
    )
    clock = ManualClock(START)
    async with agentruns.connect(kinds=kinds, family=MemoryFamily(clock), clock=clock) as other:
        run = await other.runs.enqueue("spends", workspace="acme", subject="a:1")
        await other.runs.enqueue("spends", workspace="zed", subject="a:1")
        await other.worker(holder="w3").claim_and_drive(limit=2)
        async with _http(create_console(other)) as http:
            page = (await http.get(f"/runs/{run.id}")).text
            workspaces = (await http.get("/workspaces")).text
            overview = (await http.get("/")).text
    assert "300 input tokens, 40 output tokens, cost 0.02" in page
    spent = workspaces.split('id="spent-today"', 1)[1]
    assert 'data-workspace="acme"' in spent
    assert 'data-workspace="zed"' in spent
    assert '<td class="num" data-count="cost">0.02</td>' in spent
    assert "680 tokens, cost 0.04" in overview


async def test_the_overview_and_workspaces_say_why_a_budgeted_workspace_waits() -> None:
    kinds = agentruns.RunKinds(
        [agentruns.RunKind(agentruns.RunKindPolicy(name="spends"), _spending)]
    )
    clock = ManualClock(START)
    async with agentruns.connect(kinds=kinds, family=MemoryFamily(clock), clock=clock) as other:
        await other.runs.set_budget(agentruns.Budget("acme", tokens=100))
        await other.runs.enqueue("spends", workspace="acme", subject="a:1")
        await other.runs.enqueue("spends", workspace="acme", subject="a:2")
        await other.worker(holder="w3").claim_and_drive(limit=1)
        async with _http(create_console(other)) as http:
            workspaces = (await http.get("/workspaces")).text
            overview = (await http.get("/")).text
    assert "held: budget spent (100 tokens per day) until" in workspaces
    held = overview.split('id="held-workspaces"', 1)[1]
    assert "held: budget spent (100 tokens per day) until" in held
