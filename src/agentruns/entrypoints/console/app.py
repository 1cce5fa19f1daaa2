"""The console's routes: pages rendered on the server from the read model, and the actions.

Every page reads through the use cases (:class:`~agentruns.app.runs.AgentRuns`,
:class:`~agentruns.app.schedules.AgentSchedules`) or the read model
(:class:`~agentruns.app.stats.RunStats`, the sandbox store), and every action writes through
:class:`~agentruns.app.runs.AgentRuns` as the command line does, so each is fenced, validated and
refused the same way. Bad input is a 4xx page that says what was wrong; nothing a client sends
makes a 500.

========================================  ===================================================
``GET  /``                                overview (live: ``/live/overview`` every 2 s)
``GET  /workspaces``                      the fairness view, ``?sort=&desc=``
``GET  /runs``                            filtered, keyset-paged runs
``GET  /runs/{id}``                       a run: epochs, events, failures, subject, links
``GET  /schedules``, ``/sandboxes``       schedules; live sandboxes (when there are any)
``GET  /confirm?action=...``              an action's confirmation, with its form
``POST /actions/{action}``                the action (CSRF-checked), then back to its page;
                                          ``signal`` is posted from a waiting run's page
``GET|POST /login``                       a browser gives the token once (a session cookie)
``GET|POST /approve/{token}``             a signed approval link's page (no login; ADRs/0027)
========================================  ===================================================
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html import escape
from typing import Any
from urllib.parse import parse_qsl, urlencode
from uuid import UUID

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agentruns.app.approvals import AgentApprovals
from agentruns.app.holders import AgentHolders
from agentruns.app.overview import Overview
from agentruns.app.ports import BudgetHold, TransactionScope
from agentruns.app.runs import MAX_PAGE, AgentRuns, RunPage
from agentruns.app.sandbox_ports import SandboxStore
from agentruns.app.schedules import AgentSchedules
from agentruns.app.stats import RunStats
from agentruns.domain.bands import Band
from agentruns.domain.durations import parse_duration
from agentruns.domain.errors import (
    AgentRunsError,
    DatabaseTimeout,
    IllegalTransition,
    InvalidRequest,
    RetryBudgetExhausted,
    RunNotFound,
    ScheduleNotFound,
    StoreUnavailable,
    UnknownKind,
)
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState
from agentruns.domain.termination import TerminationReason
from agentruns.domain.usage import WorkspaceSpend, cost_text, period_start
from agentruns.domain.waits import is_waiting
from agentruns.entrypoints.console import views
from agentruns.entrypoints.console.access import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    ConsoleAccess,
    CsrfSigner,
    LoginThrottle,
    origin_holds,
    session_of,
)
from agentruns.entrypoints.console.approve import approvals_app
from agentruns.entrypoints.stream import open_stream

log = logging.getLogger("agentruns.console")

PAGE = 50
EVENTS_PAGE = 200
OTHER_RUNS = 20
SANDBOXES_SHOWN = 500
WORKSPACES_SHOWN = 500
ACTIONS = (
    "cancel",
    "retry",
    "signal",
    "hold",
    "release",
    "deactivate",
    "activate",
    "pause",
    "resume",
)
NOTICES = {
    "cancelled": "The run was cancelled: its holder's next renewal is refused.",
    "retried": "The dead letter continues as this run.",
    "signalled": "The signal was delivered: a run waiting for it is due now, any other keeps it "
    "for its wait.",
    "signalled_before": "That signal id was delivered before: nothing was written, the first "
    "delivery stands.",
    "held": "The workspace's budget is held: its runs are not offered until the hold ends.",
    "released": "The workspace's budget hold was lifted.",
    "deactivated": "The workspace is inactive: its runs are not offered.",
    "activated": "The workspace is active again.",
    "paused": "The schedule is paused.",
    "resumed": "The schedule resumed from its next tick.",
}


class Refused(Exception):
    """A request the console answers with a 4xx page that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ConsoleServices:
    """What the console reads and writes through."""

    runs: AgentRuns
    stats: RunStats
    scope: TransactionScope
    schedules: AgentSchedules
    sandboxes: SandboxStore
    # Leases expiring within this (the reaper's period) are listed; expired for three of them,
    # a lease is orphaned (no reaper registers its kind), as `agentruns status` says.
    soon: timedelta
    window: timedelta = timedelta(minutes=30)
    # Who holds what (live and gone holders, quiet leases, kinds nobody claims); None: not shown.
    holders: AgentHolders | None = None
    # Signed approval links' pages under /approve (no login: the link is the credential); None
    # when the client has no signing keys.
    approvals: AgentApprovals | None = None


_ENVIRONMENT = Environment(
    loader=PackageLoader("agentruns.entrypoints.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENVIRONMENT.filters.update(
    duration=views.duration,
    moment=views.moment,
    tick_moment=views.tick_moment,
    band=lambda band: Band(band).name.lower(),
    pct=lambda value: f"{value:.0%}",
    cost=cost_text,
)


def build(
    services: ConsoleServices,
    *,
    read_only: bool,
    access: ConsoleAccess | None,
    throttle: LoginThrottle | None = None,
) -> Starlette:
    """The console's Starlette app (without the access gate: :func:`create_console` adds it)."""
    console = _Console(services, read_only=read_only, access=access, throttle=throttle)
    routes = [
        Route("/", console.page(console.overview)),
        Route("/live/overview", console.page(console.overview_live)),
        Route("/workspaces", console.page(console.workspaces)),
        Route("/runs", console.page(console.runs_page)),
        Route("/runs/{run_id}", console.page(console.run_page)),
        Route("/runs/{run_id}/events/stream", console.run_stream),
        Route("/schedules", console.page(console.schedules_page)),
        Route("/sandboxes", console.page(console.sandboxes_page)),
        Route("/confirm", console.page(console.confirm)),
        Route("/actions/{action}", console.page(console.act), methods=["POST"]),
        Route("/login", console.page(console.login), methods=["GET", "POST"]),
        *(
            []
            if services.approvals is None
            else [Mount("/approve", app=approvals_app(services.approvals))]
        ),
        Mount(
            "/static",
            app=StaticFiles(packages=[("agentruns.entrypoints.console", "static")]),
            name="static",
        ),
    ]
    app = Starlette(routes=routes)

    async def not_found(request: Request, exc: Exception) -> Response:
        return console.error_page(request, Refused(404, "There is no such page."))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return console.error_page(request, Refused(405, "That method is not allowed here."))

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    return app


Handler = Callable[[Request], Awaitable[Response]]


def _too_slow(slow: DatabaseTimeout) -> str:
    within = "" if slow.seconds is None else f" within {slow.seconds:g} s"
    return (
        f"The database did not answer{within}, so the read was cancelled (the console's reads "
        "are bounded by AGENTRUNS_READ_TIMEOUT). Try again, or narrow the filters."
    )


class _Console:
    def __init__(
        self,
        services: ConsoleServices,
        *,
        read_only: bool,
        access: ConsoleAccess | None,
        throttle: LoginThrottle | None,
    ) -> None:
        self._services = services
        self._read_only = read_only
        self._access = access
        # Signed with the credential's key (replicas agree), else a key of this process.
        self._csrf = CsrfSigner(access.secret() if access is not None else None)
        self._throttle = throttle if throttle is not None else LoginThrottle()

    # -- plumbing -------------------------------------------------------------------------------

    def page(self, handler: Handler) -> Handler:
        """A route that answers every refusal with a page that says why (4xx, 503)."""

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except Refused as refused:
                return self.error_page(request, refused)
            except (RunNotFound, ScheduleNotFound) as missing:
                return self.error_page(request, Refused(404, str(missing)))
            except InvalidRequest as invalid:
                return self.error_page(request, Refused(400, str(invalid)))
            except (IllegalTransition, RetryBudgetExhausted, UnknownKind) as refused:
                return self.error_page(request, Refused(409, str(refused)))
            except DatabaseTimeout as slow:
                log.warning(
                    "console: the database did not answer in time", extra={"error": str(slow)}
                )
                return self.error_page(request, Refused(503, _too_slow(slow)))
            except StoreUnavailable as down:
                log.warning("console: the database is unavailable", extra={"error": str(down)})
                return self.error_page(request, Refused(503, "The database is unavailable."))
            except AgentRunsError as other:
                return self.error_page(request, Refused(409, str(other)))

        return guarded

    def error_page(self, request: Request, refused: Refused) -> Response:
        if request.url.path.startswith(_root(request) + "/live/"):
            return HTMLResponse(
                f'<p class="error">{escape(refused.message)}</p>', status_code=refused.status
            )
        return self._render(
            request,
            "error.html",
            {"status": refused.status, "message": refused.message},
            status=refused.status,
        )

    def _render(
        self,
        request: Request,
        template: str,
        context: Mapping[str, Any],
        *,
        status: int = 200,
    ) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or ""
        session = session_of(request.headers, request.cookies)
        fresh = not self._csrf.valid(csrf, session)
        if fresh:
            csrf = self._csrf.issue(session)
        body = _ENVIRONMENT.get_template(template).render(
            base=_root(request),
            read_only=self._read_only,
            signed_in=self._access is not None,
            csrf=csrf,
            notice=NOTICES.get(request.query_params.get("notice", "")),
            **context,
        )
        response = HTMLResponse(body, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"
        )
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                csrf,
                httponly=True,
                samesite="strict",
                path=_root(request) or "/",
            )
        return response

    async def _overview(self) -> Overview:
        async with self._services.scope.transaction() as tx:
            return await self._services.stats.overview(
                tx, window=self._services.window, soon=self._services.soon
            )

    # -- pages ----------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        return self._render(request, "overview.html", await self._overview_context())

    async def overview_live(self, request: Request) -> Response:
        return self._render(request, "overview_live.html", await self._overview_context())

    async def _spent_today(self, now: datetime) -> list[WorkspaceSpend]:
        """Every workspace's spend of the UTC day ``now`` falls in (ADRs/0033)."""
        day = period_start(now, "day")
        return await self._services.runs.spend_by_workspace(day, day + timedelta(days=1))

    async def _overview_context(self) -> dict[str, Any]:
        found = await self._overview()
        orphaned = found.orphaned(self._services.soon * 3)
        held = await self._services.holders.view() if self._services.holders else None
        spent = await self._spent_today(found.now)
        async with self._services.scope.transaction() as tx:
            holds = await self._services.runs.stores.workspaces.holds(tx)
        return {
            "holds": holds,
            "spent": spent,
            "spent_input": sum(s.input_tokens for s in spent),
            "spent_output": sum(s.output_tokens for s in spent),
            "spent_cost": sum((s.cost for s in spent), Decimal(0)),
            "held": held,
            "page": "overview",
            "o": found,
            "bands": list(Band),
            "states": [AgentRunState.QUEUED, AgentRunState.LEASED, AgentRunState.ENDED],
            "chart": views.minute_chart(found.minutes),
            "orphaned": orphaned,
            "expired": found.expired_by_kind,
            "last_minute": found.minutes[-1] if found.minutes else None,
        }

    async def workspaces(self, request: Request) -> Response:
        sort = request.query_params.get("sort", "workspace")
        if sort not in views.SORTS:
            raise Refused(400, f"Workspaces sort by one of {', '.join(views.SORTS)}.")
        descending = request.query_params.get("desc", "") in ("1", "true", "yes")
        async with self._services.scope.transaction() as tx:
            loads = await self._services.stats.workspace_loads(tx)
        found = views.shares(loads)
        spent = await self._spent_today(loads.now)
        ordered = views.sorted_loads(loads, sort, descending, found)
        return self._render(
            request,
            "workspaces.html",
            {
                "page": "workspaces",
                "loads": loads,
                "rows": ordered[:WORKSPACES_SHOWN],
                "hidden": max(0, len(ordered) - WORKSPACES_SHOWN),
                "shares": found,
                "sort": sort,
                "desc": descending,
                "sorts": list(views.SORTS),
                "spent": spent[:WORKSPACES_SHOWN],
            },
        )

    async def runs_page(self, request: Request) -> Response:
        query = request.query_params
        filters = {name: _text(query, name) for name in _RUN_FILTERS}
        limit = _integer(query, "limit", PAGE, 1, MAX_PAGE)
        now = await self._now() if filters["after"] or filters["before"] else None
        page: RunPage = await self._services.runs.list_runs(
            workspace=filters["workspace"],
            subject=filters["subject"],
            kind=filters["kind"],
            state=filters["state"],
            reason=filters["reason"],
            band=filters["band"],
            enqueued_after=_when(filters["after"], "after", now),
            enqueued_before=_when(filters["before"], "before", now),
            limit=limit,
            cursor=_text(query, "cursor"),
        )
        given = {name: value for name, value in filters.items() if value is not None}
        if limit != PAGE:
            given["limit"] = str(limit)
        return self._render(
            request,
            "runs.html",
            {
                "page": "runs",
                "runs": page.runs,
                "filters": filters,
                "next": None
                if page.next_cursor is None
                else "?" + urlencode({**given, "cursor": page.next_cursor}),
                "first": "?" + urlencode(given) if _text(query, "cursor") else None,
                # "waiting" lists the queued runs that wait (ADRs/0025).
                "states": [state.value for state in AgentRunState] + ["waiting"],
                "reasons": [reason.value for reason in TerminationReason],
                "band_names": [band.name.lower() for band in Band],
            },
        )

    async def run_page(self, request: Request) -> Response:
        run_id = _run_id(request.path_params["run_id"])
        after = _integer(request.query_params, "events_after", 0, 0, 2**31 - 1)
        runs = self._services.runs
        run = await runs.get(run_id)
        events = await runs.events(run_id, after_seq=after, limit=EVENTS_PAGE + 1)
        failures = await runs.failures(run_id)
        continued = await runs.get(run.continues) if run.continues else None
        continued_by = await runs.continued_by(run_id)
        others = await runs.list_runs(
            workspace=run.workspace, subject=run.subject, limit=OTHER_RUNS + 1
        )
        async with self._services.scope.transaction() as tx:
            now = await runs.stores.runs.now(tx)
        first_epoch = continued.epoch + 1 if continued is not None else 1
        shown = events[:EVENTS_PAGE]
        return self._render(
            request,
            "run.html",
            {
                "page": "runs",
                "run": run,
                "now": now,
                "payload": views.capped_json(run.payload),
                "result": None if run.result is None else views.capped_json(run.result),
                "events": [(event, views.capped_json(event.data)) for event in shown],
                "events_after": after,
                "more_events": shown[-1].seq if len(events) > EVENTS_PAGE else None,
                # The page follows a run that has not ended, once its last page is shown: the
                # stream resumes after the last event the page holds.
                "stream_after": None
                if run.state is AgentRunState.ENDED or len(events) > EVENTS_PAGE
                else (shown[-1].seq if shown else after),
                "timeline": views.epoch_timeline(
                    run, shown if after == 0 else [], failures, now, first_epoch=first_epoch
                ),
                "failures": failures,
                "continued": continued,
                "continued_by": continued_by,
                "others": [other for other in others.runs if other.id != run.id][:OTHER_RUNS],
                "cancellable": run.state is not AgentRunState.ENDED,
                "waiting": is_waiting(run),
                "retryable": _retryable(run) and continued_by is None,
                "lease_left": None
                if run.leased_until is None
                else (run.leased_until - now).total_seconds(),
            },
        )

    async def run_stream(self, request: Request) -> Response:
        """The run's live Server-Sent Events (ADRs/0030), behind the console's gate; what the
        run page's script follows. Refusals are one line of text, never a page."""
        try:
            run_id = _run_id(request.path_params["run_id"])
        except Refused as refused:
            return PlainTextResponse(refused.message + "\n", status_code=refused.status)
        return await open_stream(self._services.runs, request, run_id)

    async def schedules_page(self, request: Request) -> Response:
        found = await self._services.schedules.all()
        async with self._services.scope.transaction() as tx:
            now = await self._services.runs.stores.runs.now(tx)
        return self._render(
            request, "schedules.html", {"page": "schedules", "schedules": found, "now": now}
        )

    async def sandboxes_page(self, request: Request) -> Response:
        async with self._services.scope.transaction() as tx:
            found = await self._services.sandboxes.listing(tx, SANDBOXES_SHOWN + 1)
            now = await self._services.sandboxes.now(tx)
        by_state: dict[tuple[str, str], int] = {}
        for sandbox in found:
            key = (str(sandbox.state), sandbox.kind)
            by_state[key] = by_state.get(key, 0) + 1
        return self._render(
            request,
            "sandboxes.html",
            {
                "page": "sandboxes",
                "sandboxes": found[:SANDBOXES_SHOWN],
                "more": len(found) > SANDBOXES_SHOWN,
                "by_state": sorted(by_state.items()),
                "now": now,
            },
        )

    # -- actions --------------------------------------------------------------------------------

    async def confirm(self, request: Request) -> Response:
        self._writable()
        action = request.query_params.get("action", "")
        target = await self._target(action, request.query_params)
        return self._render(
            request, "confirm.html", {"page": target.page, "action": action, "target": target}
        )

    async def act(self, request: Request) -> Response:
        self._writable()
        action = request.path_params["action"]
        if action not in ACTIONS:
            raise Refused(404, f"There is no action {action!r}.")
        form = _form(await request.body())
        if not origin_holds(request.headers) or not self._csrf.holds(
            request.cookies.get(CSRF_COOKIE),
            form.get("csrf"),
            session_of(request.headers, request.cookies),
        ):
            raise Refused(
                403,
                "This form is stale or did not come from this console: open the page again "
                "and confirm from there.",
            )
        target = await self._target(action, form)
        runs = self._services.runs
        base = _root(request)
        match action:
            case "cancel":
                ended = await runs.cancel(_require_run(target))
                log.info("console: run cancelled", extra={"run_id": str(ended.id)})
                return _back(f"{base}/runs/{ended.id}", "cancelled")
            case "retry":
                later = await runs.retry(_require_run(target))
                log.info("console: run retried", extra={"run_id": str(later.id)})
                return _back(f"{base}/runs/{later.id}", "retried")
            case "signal":
                delivered = await runs.signal(
                    _require_run(target),
                    form.get("name", "").strip(),
                    _json(form.get("payload", "")),
                    signal_id=form.get("signal_id", "").strip() or None,
                )
                log.info(
                    "console: signal delivered",
                    extra={
                        "run_id": str(delivered.signal.run_id),
                        "first_delivery": delivered.created,
                    },
                )
                notice = "signalled" if delivered.created else "signalled_before"
                return _back(f"{base}/runs/{delivered.signal.run_id}", notice)
            case "hold":
                until = _until(form.get("until", ""), await self._now())
                await runs.hold_budget(
                    BudgetHold(target.workspace or "", until, form.get("reason", "").strip())
                )
                return _back(f"{base}/workspaces", "held")
            case "release":
                await runs.release_budget(target.workspace or "")
                return _back(f"{base}/workspaces", "released")
            case "deactivate" | "activate":
                await runs.set_workspace_active(target.workspace or "", action == "activate")
                return _back(f"{base}/workspaces", f"{action}d")
            case "pause":
                await self._services.schedules.pause(target.schedule or "")
                return _back(f"{base}/schedules", "paused")
            case _:
                await self._services.schedules.resume(target.schedule or "")
                return _back(f"{base}/schedules", "resumed")

    def _writable(self) -> None:
        if self._read_only:
            raise Refused(403, "This console is read-only: it shows runs and changes nothing.")

    async def _now(self) -> datetime:
        async with self._services.scope.transaction() as tx:
            return await self._services.runs.stores.runs.now(tx)

    async def _target(self, action: str, given: Mapping[str, str]) -> _Target:
        """What an action acts on, checked before it is offered or done."""
        if action not in ACTIONS:
            raise Refused(400, f"Actions are {', '.join(ACTIONS)}.")
        if action in ("cancel", "retry", "signal"):
            run = await self._services.runs.get(_run_id(given.get("run", "")))
            # A signal to an ended run is the use case's to refuse (a known id is answered).
            if action == "cancel" and run.state is AgentRunState.ENDED:
                raise Refused(409, f"Run {run.id} has already ended ({run.end_reason}).")
            if action == "cancel":
                try:
                    self._services.runs.handler_of(run)
                except UnknownKind:
                    raise Refused(
                        409,
                        f"Run {run.id} is of kind {run.kind!r}, which keeps a domain row: start "
                        "the console with --kinds module:object so its row moves too.",
                    ) from None
            if action == "retry" and not _retryable(run):
                raise Refused(
                    409, f"Run {run.id} ended {run.end_reason}: only dead letters are retried."
                )
            if action == "retry" and run.kind not in self._services.runs.kinds:
                raise Refused(
                    409,
                    f"Run {run.id} is of kind {run.kind!r}, which this console does not load: "
                    "start it with --kinds module:object to retry it.",
                )
            return _Target("runs", run=run)
        if action in ("pause", "resume"):
            name = given.get("schedule", "")
            state = await self._services.schedules.get(name)
            return _Target("schedules", schedule=state.schedule.name)
        workspace = given.get("workspace", "").strip()
        if not workspace:
            raise Refused(400, "Which workspace? Give workspace=NAME.")
        return _Target("workspaces", workspace=workspace)

    async def login(self, request: Request) -> Response:
        access = self._access
        if access is None or access.token is None:
            raise Refused(404, "This console has no login: it uses no token.")
        if request.method == "GET":
            return self._render(request, "login.html", {"page": "login", "failed": False})
        address = request.client.host if request.client is not None else ""
        wait = self._throttle.wait(address)
        if wait > 0:
            # Guessing is slowed per client address; the token is not even compared.
            seconds = math.ceil(wait)
            refused = self._render(
                request,
                "error.html",
                {
                    "status": 429,
                    "message": f"Too many failed logins from this address: try again in "
                    f"{seconds} s.",
                },
                status=429,
            )
            refused.headers["Retry-After"] = str(seconds)
            return refused
        form = _form(await request.body())
        session = access.session()
        if session is None or not access.admits_token(form.get("token", "")):
            self._throttle.failed(address)
            return self._render(
                request, "login.html", {"page": "login", "failed": True}, status=401
            )
        self._throttle.succeeded(address)
        response = RedirectResponse(f"{_root(request)}/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE, session, httponly=True, samesite="strict", path=_root(request) or "/"
        )
        return response


@dataclass(frozen=True)
class _Target:
    page: str
    run: AgentRun | None = None
    workspace: str | None = None
    schedule: str | None = None


def _require_run(target: _Target) -> UUID:
    if target.run is None:
        raise Refused(400, "Which run?")
    return target.run.id


def _retryable(run: AgentRun) -> bool:
    reason = run.end_reason
    return reason is not None and (reason.is_dead_letter or reason.is_retryable)


def _back(url: str, notice: str) -> Response:
    return RedirectResponse(f"{url}?{urlencode({'notice': notice})}", status_code=303)


def _root(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


_RUN_FILTERS = ("state", "reason", "kind", "workspace", "subject", "band", "after", "before")


def _text(query: Mapping[str, str], name: str) -> str | None:
    """A query parameter's text, or ``None`` when it is missing or blank."""
    value = query.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _integer(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = _text(query, name)
    if value is None:
        return default
    if not value.isdigit() or len(value) > 10 or not low <= int(value) <= high:
        raise Refused(400, f"{name} is a whole number from {low} to {high}.")
    return int(value)


def _run_id(text: str) -> UUID:
    try:
        return UUID(text.strip())
    except ValueError:
        raise Refused(400, "That is not a run id (a UUID).") from None


def _when(text: str | None, name: str, now: datetime | None) -> datetime | None:
    """A time given as ISO 8601 (UTC unless it says its zone) or as a duration before ``now``
    (``2h``, on the store's clock)."""
    if text is None or now is None:
        return None
    try:
        return now - parse_duration(text)
    except AgentRunsError:
        pass
    except OverflowError:
        raise Refused(400, f"{name} is within a century.") from None
    try:
        found = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise Refused(
            400, f"{name} is an ISO 8601 time (2026-05-01T09:00) or a duration ago (2h)."
        ) from None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


def _until(text: str, now: datetime) -> datetime:
    """A hold's end: a duration from now (``2h``) or an ISO 8601 time."""
    text = text.strip()
    try:
        found = now + parse_duration(text)
    except AgentRunsError:
        try:
            found = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise Refused(
                400, "Hold until: a duration from now (2h) or an ISO 8601 time (2026-05-01T09:00)."
            ) from None
        found = found if found.tzinfo is not None else found.replace(tzinfo=UTC)
    except OverflowError:
        raise Refused(400, "A hold ends within a century.") from None
    if found <= now:
        raise Refused(400, "A hold ends in the future.")
    return found


def _json(text: str) -> object:
    """A signal's payload as typed in the form: JSON text, or nothing (``null``)."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise Refused(400, f"The payload is not JSON: {error}.") from None
    except RecursionError:
        raise Refused(
            400, "The payload is not JSON the console reads: it nests too deep."
        ) from None


def _form(body: bytes) -> dict[str, str]:
    """An urlencoded form (the console's only kind), its first value per field."""
    try:
        pairs = parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=20
        )
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "The form is not an urlencoded form of UTF-8 text.") from None
    found: dict[str, str] = {}
    for name, value in pairs:
        found.setdefault(name, value)
    return found
