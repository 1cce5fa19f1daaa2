"""What a demo run found: the killed worker's orphans, the counts, and the invariant checks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from agentruns.app.stats import RunStatus
from agentruns.domain.claim_order import SubjectKey
from agentruns.domain.run import AgentRunFence
from agentruns.domain.states import AgentRunState


@dataclass
class Orphan:
    """A run the killed worker held, and what became of it."""

    fence: AgentRunFence
    kind: str
    taken_back_after: float | None = None
    claimed_again_after: float | None = None
    zombie_writes_tried: bool = False


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


@dataclass
class DemoReport:
    enqueued: int
    offered: int
    final: RunStatus
    outcomes: Counter[str]
    taken_back: int
    taken_back_requeued: int
    overdue_ended: int
    killed: str | None
    orphans: list[Orphan]
    zombie_refused: int
    zombie_accepted: int
    samples: int
    doubly_leased: set[SubjectKey]
    leased_share: dict[str, float]
    contended_share: dict[str, float]
    run_share: dict[str, float]
    elapsed: float
    settled: bool
    lease: timedelta
    faults: dict[str, int] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.passed for check in self.checks)


def check_invariants(report: DemoReport, unsettled: int) -> list[Check]:
    final = report.final
    leased = final.total(AgentRunState.LEASED)
    tried = len(report.orphans) * 3
    lost_live = report.outcomes.get("lease_lost", 0)
    return [
        Check(
            "no subject ever had two leased runs",
            not report.doubly_leased,
            f"{report.samples} samples"
            + (f"; seen: {sorted(report.doubly_leased)}" if report.doubly_leased else ""),
        ),
        Check(
            "every run ended with a reason or is queued with a due time",
            unsettled == 0 and leased == 0,
            f"{unsettled} unsettled, {leased} still leased",
        ),
        Check(
            "no write under a stale epoch was accepted",
            report.zombie_accepted == 0,
            f"{report.zombie_refused} of {tried} deliberate zombie writes refused, "
            f"{report.zombie_accepted} accepted; {lost_live} live holders stopped on a lost lease",
        ),
        Check(
            "no run was lost",
            sum(count.count for count in final.counts) == report.enqueued,
            f"{sum(count.count for count in final.counts)} of {report.enqueued} runs in the store",
        ),
        Check(
            "the workload settled in time",
            report.settled,
            f"{report.elapsed:.1f}s",
        ),
    ]
