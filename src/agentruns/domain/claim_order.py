"""The claim order, as one pure function the SQL claim must agree with.

A subject is named within its workspace: (workspace, subject) is its identity, so two workspaces
that use the same subject string never see or block each other's runs.

Offered are the subject heads: for each subject with no LEASED run, its QUEUED run first in queue
order, if that run is due and its workspace is active and not under a budget hold. A subject's
later runs wait behind its head, so a subject's runs are claimed in the order they were queued.

Heads are taken in the order of :func:`claim_key`: effective band (with aging), then the load of
the workspace, then age (oldest due first), then queue order. The load is the workspace's leased
runs plus the heads of the same workspace taken before this one, so a batch claim spreads over
workspaces just as the same number of single claims would.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timedelta

from agentruns.domain.bands import Band, effective_band
from agentruns.domain.run import AgentRun
from agentruns.domain.states import AgentRunState

ClaimKey = tuple[int, int, datetime, int]
SubjectKey = tuple[str, str]
"""A subject's identity: (workspace, subject)."""


def subject_key(run: AgentRun) -> SubjectKey:
    return (run.workspace, run.subject)


@dataclass(frozen=True, slots=True)
class ClaimContext:
    """What the order depends on besides the runs: the time, aging, and workspace facts."""

    now: datetime
    band_aging: timedelta
    leased_per_workspace: Mapping[str, int]
    excluded_workspaces: Set[str] = frozenset()
    kinds: Set[str] | None = None
    subject: SubjectKey | None = None


def subject_heads(runs: Iterable[AgentRun]) -> list[AgentRun]:
    """Per subject with no LEASED run, its first QUEUED run in queue order."""
    leased_subjects: set[SubjectKey] = set()
    heads: dict[SubjectKey, AgentRun] = {}
    for run in runs:
        key = subject_key(run)
        if run.state is AgentRunState.LEASED:
            leased_subjects.add(key)
        elif run.state is AgentRunState.QUEUED:
            head = heads.get(key)
            if head is None or run.seq < head.seq:
                heads[key] = run
    return [run for subject, run in heads.items() if subject not in leased_subjects]


def is_offered(run: AgentRun, context: ClaimContext) -> bool:
    """A subject head is offered when it is due, its workspace is neither inactive nor held, and
    it matches the claimer's kinds and subject, if given. Heads are found over all kinds first,
    so a claimer of one kind never overtakes another kind's run queued earlier on the subject."""
    return (
        run.due_at <= context.now
        and run.workspace not in context.excluded_workspaces
        and (context.kinds is None or run.kind in context.kinds)
        and (context.subject is None or subject_key(run) == context.subject)
    )


def claim_order(runs: Iterable[AgentRun], context: ClaimContext) -> list[AgentRun]:
    """Every run a claim may take, first to take first (see the module docstring)."""
    offered = [run for run in subject_heads(runs) if is_offered(run, context)]
    offered.sort(key=lambda run: _within_workspace_key(run, context))
    taken_before: defaultdict[str, int] = defaultdict(int)
    keyed: list[tuple[ClaimKey, AgentRun]] = []
    for run in offered:
        load = context.leased_per_workspace.get(run.workspace, 0) + taken_before[run.workspace]
        taken_before[run.workspace] += 1
        keyed.append((claim_key(run, context, load), run))
    keyed.sort(key=lambda pair: pair[0])
    return [run for _, run in keyed]


def next_claims(runs: Iterable[AgentRun], context: ClaimContext, limit: int) -> list[AgentRun]:
    """The runs a claim of up to ``limit`` takes: at most one per subject, in claim order."""
    return claim_order(runs, context)[: max(limit, 0)]


def claim_key(run: AgentRun, context: ClaimContext, load: int) -> ClaimKey:
    band = effective_band(run.band, run.due_at, context.now, context.band_aging)
    return (int(band), load, run.due_at, run.seq)


def _within_workspace_key(run: AgentRun, context: ClaimContext) -> tuple[str, int, datetime, int]:
    band: Band = effective_band(run.band, run.due_at, context.now, context.band_aging)
    return (run.workspace, int(band), run.due_at, run.seq)


def next_moment(
    runs: Sequence[AgentRun],
    *,
    now: datetime,
    holds: Mapping[str, datetime],
    inactive: Set[str] = frozenset(),
    waits: bool = True,
) -> datetime | None:
    """The earliest moment after ``now`` at which a worker or a reaper could act on ``runs`` (the
    unended runs of a store) if only time moved: a subject head falls due (or the budget hold of
    its workspace ends, whichever is later), a lease expires, or a queued run's deadline passes;
    ``None`` if no such moment comes.

    A run waiting behind its subject's head (a head backing off, or a leased run) becomes due
    only when the head moves, so its own due time is no such moment; its deadline is, since the
    reaper ends a queued run past its deadline wherever it waits. A head of an inactive
    workspace waits for a person, not for time. ``holds`` maps each held workspace to the end
    of its hold. Without ``waits``, a head that waits for a signal (ADRs/0025) waits for the
    signal, not for its timeout: its due time is no such moment (a sleep's end still is).
    """
    moments: list[datetime] = []
    for head in subject_heads(runs):
        if not waits and head.waiting_for is not None and head.waiting_until is not None:
            continue
        if head.workspace not in inactive:
            held_until = holds.get(head.workspace)
            moments.append(head.due_at if held_until is None else max(head.due_at, held_until))
    for run in runs:
        if run.state is AgentRunState.LEASED and run.leased_until is not None:
            moments.append(run.leased_until)
        elif run.state is AgentRunState.QUEUED and run.deadline_at is not None:
            moments.append(run.deadline_at)
    return min((moment for moment in moments if moment > now), default=None)
