"""The state table of a run, in one place: SQL's ``guard_agent_run`` refuses the same set."""

from __future__ import annotations

import enum

from agentruns.domain.errors import IllegalTransition


class AgentRunState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    ENDED = "ended"


TRANSITIONS: dict[AgentRunState, frozenset[AgentRunState]] = {
    AgentRunState.QUEUED: frozenset({AgentRunState.LEASED, AgentRunState.ENDED}),
    AgentRunState.LEASED: frozenset(
        {AgentRunState.LEASED, AgentRunState.QUEUED, AgentRunState.ENDED}
    ),
    AgentRunState.ENDED: frozenset(),
}


def can_move(source: AgentRunState, target: AgentRunState) -> bool:
    return target in TRANSITIONS[source]


def check_move(source: AgentRunState, target: AgentRunState) -> None:
    """Raise :class:`IllegalTransition` unless the table allows ``source -> target``."""
    if not can_move(source, target):
        raise IllegalTransition(source, target)
