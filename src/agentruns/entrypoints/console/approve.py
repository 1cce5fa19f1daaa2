"""The approval pages (ADRs/0027): ``GET /{token}`` shows what a signed link answers and a form,
``POST /{token}`` answers (approve or reject, with an optional comment) and shows the result.

No login: the signed link is the credential, and the form carries it back, so a page of another
site cannot post an answer it does not know. ``GET`` never writes (mail clients and chat
previews fetch links before a person opens them). A forged, expired, malformed or used link, an
ended or unknown run, and a body too large get a page that says so with a 4xx status, and
nothing is written. The console mounts these under ``/approve``; a host may mount
:func:`create_approvals` alone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from agentruns.app.approvals import MAX_COMMENT, AgentApprovals
from agentruns.domain.errors import (
    AgentRunsError,
    InvalidRequest,
    InvalidToken,
    RunAlreadyEnded,
    RunNotFound,
    StoreUnavailable,
)
from agentruns.domain.payload import JsonValue
from agentruns.domain.states import AgentRunState

if TYPE_CHECKING:
    from agentruns.entrypoints.connect import AgentRunsClient

log = logging.getLogger("agentruns.approvals")

# A form with the longest comment, percent-encoded, fits well within this (the console's gate
# lets this much through to these pages: APPROVE_MAX_BODY).
MAX_BODY_BYTES = 64 * 1024
MAX_TOKEN_CHARS = 4096

_ENVIRONMENT = Environment(
    loader=PackageLoader("agentruns.entrypoints.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


class _Refused(Exception):
    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def _page(template: str, context: Mapping[str, Any], status: int = 200) -> HTMLResponse:
    response = HTMLResponse(_ENVIRONMENT.get_template(template).render(**context), status)
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    # The token is in the URL: no page it leads to may learn it.
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    return response


def _refusal(refused: _Refused, answer: Mapping[str, Any] | None = None) -> HTMLResponse:
    context = {"title": refused.title, "message": refused.message, "answer": answer}
    return _page("approve_result.html", context, refused.status)


def _shown(answer: JsonValue | None) -> dict[str, Any] | None:
    """The answer a link gave, as the page shows it (a payload not of a link's shape: none)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("approved"), bool):
        return None
    comment = answer.get("comment")
    return {
        "approved": answer["approved"],
        "comment": comment if isinstance(comment, str) else None,
    }


def _used(answer: JsonValue | None) -> HTMLResponse:
    refused = _Refused(
        409, "This link was already used", "Its first answer counts; nothing changed."
    )
    return _refusal(refused, _shown(answer))


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except _Refused as refused:
            return _refusal(refused)
        except InvalidToken as invalid:
            if "expired" in str(invalid):
                return _refusal(
                    _Refused(410, "This link has expired", "Its wait has ended; nothing changed.")
                )
            return _refusal(
                _Refused(403, "This link is not valid", "It is malformed or was not signed here.")
            )
        except RunNotFound:
            return _refusal(_Refused(404, "No such run", "The run this link names is gone."))
        except RunAlreadyEnded:
            return _refusal(
                _Refused(409, "The run has ended", "It takes no answer now; nothing changed.")
            )
        except InvalidRequest as invalid:
            return _refusal(_Refused(400, "The answer was refused", str(invalid)))
        except StoreUnavailable as down:
            log.warning("approvals: the database is unavailable", extra={"error": str(down)})
            return _refusal(_Refused(503, "Try again later", "The database is unavailable."))
        except AgentRunsError as other:
            return _refusal(_Refused(409, "The answer was refused", str(other)))

    return guarded


def _token(request: Request) -> str:
    token: str = request.path_params["token"]
    if len(token) > MAX_TOKEN_CHARS:
        raise _Refused(414, "This link is not valid", "It is too long.")
    return token


async def _form(request: Request) -> dict[str, str]:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
        raise _Refused(
            413, "The answer is too large", f"A comment is at most {MAX_COMMENT} characters."
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _Refused(
                413, "The answer is too large", f"A comment is at most {MAX_COMMENT} characters."
            )
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError as exc:
        raise _Refused(400, "The answer was refused", "The form is not UTF-8.") from exc
    return dict(pairs)


def routes(approvals: AgentApprovals) -> list[Route]:
    """The two routes, to mount under a prefix of the host's (the console's is ``/approve``)."""

    async def show(request: Request) -> Response:
        token = _token(request)
        seen = await approvals.view(token)
        if seen.used:
            return _used(seen.answer)
        if seen.run.state is AgentRunState.ENDED:
            raise RunAlreadyEnded(f"run {seen.run.id} has ended")
        context = {"run": seen.run, "link": seen.link, "token": token, "max_comment": MAX_COMMENT}
        return _page("approve.html", context)

    async def answer(request: Request) -> Response:
        token = _token(request)
        form = await _form(request)
        if form.get("token") != token:
            raise _Refused(403, "This link is not valid", "The form does not carry this link.")
        decision = form.get("decision")
        if decision not in ("approve", "reject"):
            raise _Refused(400, "The answer was refused", "Choose Approve or Reject.")
        done = await approvals.answer(
            token, approved=decision == "approve", comment=form.get("comment")
        )
        if not done.created:
            return _used(done.answer)
        title = "Approved" if decision == "approve" else "Rejected"
        message = f"Your answer was delivered to {done.run.subject}."
        return _page(
            "approve_result.html",
            {"title": title, "message": message, "answer": _shown(done.answer)},
        )

    return [
        Route("/{token}", _guarded(show), methods=["GET"]),
        Route("/{token}", _guarded(answer), methods=["POST"]),
    ]


def approvals_app(approvals: AgentApprovals) -> Starlette:
    """The approval pages over ``approvals`` as a Starlette app (see the module docstring)."""
    app = Starlette(routes=routes(approvals))

    async def not_found(request: Request, exc: Exception) -> Response:
        return _refusal(_Refused(404, "No such page", "This is not an approval link."))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _refusal(_Refused(405, "Not allowed", "That method is not allowed here."))

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    return app


def create_approvals(client: AgentRunsClient) -> Starlette:
    """The approval pages over ``client`` (its hosting's signing keys), for a host to mount
    alone, e.g. ``app.mount("/approve", agentruns.create_approvals(client))``; the links it
    serves are made with ``client.approval_link(..., base_url="https://<host>/approve")``."""
    return approvals_app(client.approvals)
