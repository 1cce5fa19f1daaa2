"""The run and sandbox state tables: every move allowed or refused, as the seed's table says."""

from __future__ import annotations

import itertools

import pytest

from agentruns.domain.errors import IllegalTransition
from agentruns.domain.sandbox import SandboxState, check_sandbox_move
from agentruns.domain.states import AgentRunState, can_move, check_move

Q, L, E = AgentRunState.QUEUED, AgentRunState.LEASED, AgentRunState.ENDED
ALLOWED_RUN_MOVES = {(Q, L), (Q, E), (L, L), (L, Q), (L, E)}

R, Y, D = SandboxState.REQUESTED, SandboxState.READY, SandboxState.DELETING
ALLOWED_SANDBOX_MOVES = {(R, Y), (R, D), (Y, D)}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(AgentRunState, repeat=2)))
def test_run_moves_follow_the_state_table(source: AgentRunState, target: AgentRunState) -> None:
    """A run moves only QUEUED->LEASED|ENDED and LEASED->LEASED|QUEUED|ENDED; ENDED is final."""
    allowed = (source, target) in ALLOWED_RUN_MOVES
    assert can_move(source, target) is allowed
    if allowed:
        check_move(source, target)
    else:
        with pytest.raises(IllegalTransition):
            check_move(source, target)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(SandboxState, repeat=2)))
def test_sandbox_moves_follow_the_state_table(source: SandboxState, target: SandboxState) -> None:
    """A sandbox moves REQUESTED->READY|DELETING and READY->DELETING; DELETING is final."""
    if (source, target) in ALLOWED_SANDBOX_MOVES:
        check_sandbox_move(source, target)
    else:
        with pytest.raises(IllegalTransition):
            check_sandbox_move(source, target)
