"""The port an approval link is signed and checked through (ADRs/0027).

A link names a run, the signal its wait asks for, a link id and its expiry. Its single use is
the signal id ``link:<link id>``: both answers of one link deliver with that id, so only the
first counts (ADRs/0025's delivery once per signal id). No table holds links.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID


@dataclass(frozen=True, slots=True)
class ApprovalLink:
    """What a signed approval link says: the run, the signal's name, the link's id, its end."""

    run_id: UUID
    name: str
    link_id: str
    expires_at: datetime

    @property
    def signal_id(self) -> str:
        """The id both answers of this link deliver with, so only the first counts."""
        return f"link:{self.link_id}"


class ApprovalTokens(Protocol):
    """Signs approval links with the newest live key and checks them with any known live key.

    ``verify`` raises :class:`~agentruns.domain.errors.InvalidToken` for a token that is
    missing, malformed, forged, expired, meant for another audience (a sandbox's token), signed
    with an unknown or expired key, or with another algorithm.
    """

    def signable_until(self) -> datetime:
        """The latest expiry a link signed now can carry: the signing key's ``not_after``."""
        ...

    def issue(self, link: ApprovalLink) -> str:
        """A token for ``link``, expiring at its ``expires_at`` (whole seconds, rounded down)."""
        ...

    def verify(self, token: str | None) -> ApprovalLink: ...
