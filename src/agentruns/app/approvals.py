"""Signed approval links: a wait that asks for a person answered from an e-mail or a chat
message (ADRs/0027).

:meth:`AgentApprovals.link` signs a single-use URL for a run's wait; :meth:`AgentApprovals.view`
reads what a link names (and writes nothing: mail clients fetch links before a person does);
:meth:`AgentApprovals.answer` delivers the signal ``{"approved", "comment"}`` with the link's
signal id, so the first answer of a link counts and a later one finds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote, urlsplit
from uuid import UUID, uuid4

from agentruns.app.approval_ports import ApprovalLink, ApprovalTokens
from agentruns.app.runs import AgentRuns
from agentruns.domain import limits
from agentruns.domain.errors import InvalidRequest, RunAlreadyEnded
from agentruns.domain.payload import JsonValue
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState

# The longest comment an answer carries, in characters.
MAX_COMMENT = 4000


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """What a link names, read now: the link, its run, and the answer it already gave (``None``
    while it is unused)."""

    link: ApprovalLink
    run: AgentRun
    answer: JsonValue | None

    @property
    def used(self) -> bool:
        return self.answer is not None


@dataclass(frozen=True, slots=True)
class ApprovalAnswer:
    """What answering a link did: the answer that counts (this one, or the link's first) and
    whether it was this one."""

    link: ApprovalLink
    run: AgentRun
    answer: JsonValue
    created: bool


class AgentApprovals:
    """Signs approval links and answers them through :meth:`AgentRuns.signal`: a link is a
    credential for one answer to one wait, and is never a sandbox's token (another audience)."""

    def __init__(
        self,
        runs: AgentRuns,
        tokens: ApprovalTokens,
        new_id: Callable[[], UUID] = uuid4,
    ) -> None:
        self._runs = runs
        self._tokens = tokens
        self._new_id = new_id

    async def link(
        self,
        run_id: UUID,
        name: str,
        *,
        base_url: str,
        expires_at: datetime | None = None,
    ) -> str:
        """A single-use URL ``<base_url>/<token>`` that approves or rejects the run's wait for
        the signal ``name`` (``base_url`` is where the approval pages are mounted, e.g.
        ``https://ops.example.com/agentruns/approve``).

        It expires at ``expires_at``, else at the end of the wait the run is in for ``name``,
        and never after the signing key's end of life. Refused (nothing signed): a ``base_url``
        that is not http(s) (:class:`InvalidRequest`), an unknown run (``RunNotFound``), an
        ended run (``RunAlreadyEnded``), no ``expires_at`` for a run that does not wait for
        ``name`` now, or an end that is not after now (:class:`InvalidRequest`)."""
        limits.run_id(run_id)
        checked = limits.name(name, "a signal's name")
        parts = urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidRequest(f"an approval link's base_url is an http(s) URL, not {base_url!r}")
        run = await self._runs.get(run_id)
        if run.state is AgentRunState.ENDED:
            raise RunAlreadyEnded(f"run {run_id} has ended: no approval link for it")
        if expires_at is None:
            if run.waiting_for != checked or run.waiting_until is None:
                raise InvalidRequest(
                    f"run {run_id} does not wait for {checked!r} now: give expires_at"
                )
            expires_at = run.waiting_until
        elif expires_at.tzinfo is None:
            raise InvalidRequest("an approval link's expires_at needs an aware datetime")
        ends = min(expires_at, self._tokens.signable_until())
        token = self._tokens.issue(ApprovalLink(run_id, checked, self._new_id().hex, ends))
        return f"{base_url.rstrip('/')}/{quote(token, safe='')}"

    async def view(self, token: str | None) -> ApprovalView:
        """What the link names and the answer it gave, if any; writes nothing. ``InvalidToken``
        for a forged, expired or malformed link, ``RunNotFound`` if its run was purged."""
        link = self._tokens.verify(token)
        run = await self._runs.get(link.run_id)
        given = [s for s in await self._runs.signals(link.run_id) if s.signal_id == link.signal_id]
        return ApprovalView(link, run, given[0].payload if given else None)

    async def answer(
        self, token: str | None, *, approved: bool, comment: str | None
    ) -> ApprovalAnswer:
        """Deliver ``{"approved", "comment"}`` to the link's run under the link's signal id: the
        first answer counts, a later one finds it (``created`` False) and writes nothing. An
        ended run that this link did not answer is ``RunAlreadyEnded``; a comment longer than
        :data:`MAX_COMMENT` characters is refused before anything is written."""
        link = self._tokens.verify(token)
        text = (comment or "").strip() or None
        if text is not None:
            if len(text) > MAX_COMMENT:
                raise InvalidRequest(f"a comment is at most {MAX_COMMENT} characters")
            limits.check_text(text, "a comment")
        payload = {"approved": bool(approved), "comment": text}
        delivered = await self._runs.signal(
            link.run_id, link.name, payload, signal_id=link.signal_id
        )
        run = await self._runs.get(link.run_id)
        return ApprovalAnswer(link, run, delivered.signal.payload, delivered.created)
