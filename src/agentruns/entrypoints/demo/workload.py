"""The demo's workload: workspaces of different sizes, all three bands, faults on cue.

Built from a seed, so a demo run and its test enqueue the same runs. ``scale`` sizes it: 1.0 is
the full demo (several hundred runs), 0.1 a quick test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta

from agentruns.domain.bands import Band
from agentruns.domain.payload import JsonObject
from agentruns.entrypoints.demo.kinds import CHAT, DIGEST, REVIEW

# Active workspaces by their number of subjects at scale 1.0: one big tenant, a few smaller.
WORKSPACES: tuple[tuple[str, int], ...] = (
    ("acme", 48),
    ("globex", 24),
    ("initech", 10),
    ("hooli", 4),
)
INACTIVE = "dormant"
HELD = "overdrawn"

_BAND_OF_KIND = {CHAT: Band.INTERACTIVE, REVIEW: Band.BATCH, DIGEST: Band.BACKGROUND}


@dataclass(frozen=True, slots=True)
class DemoRun:
    """One run to enqueue."""

    kind: str
    workspace: str
    subject: str
    band: Band
    payload: JsonObject = field(compare=False)
    deadline_after: timedelta | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    runs: tuple[DemoRun, ...]
    inactive: str = INACTIVE
    held: str = HELD

    def faults(self) -> dict[str, int]:
        """How many runs carry each injected fault."""
        found: dict[str, int] = {}
        for run in self.runs:
            for key in ("fail", "stall_ms"):
                if key in run.payload:
                    name = "stall past the lease" if key == "stall_ms" else str(run.payload[key])
                    found[name] = found.get(name, 0) + 1
        return found


def _subjects(count: float) -> int:
    return max(1, round(count))


def build_workload(*, scale: float = 1.0, seed: int = 7) -> Workload:
    """Several runs per subject, bands by kind, a few deadlines, one inactive workspace, one
    workspace under a budget hold, and the faults: 503s and 429s a retry fixes, 401s no retry
    fixes, exhausted fallback chains, and stalls past the lease."""
    rng = random.Random(seed)
    runs: list[DemoRun] = []
    for workspace, subjects in WORKSPACES:
        for number in range(_subjects(subjects * scale)):
            kind = rng.choice((CHAT, REVIEW, REVIEW, DIGEST))
            subject = f"{workspace}/{kind.split('.')[1]}-{number}"
            for _ in range(rng.randint(2, 5)):
                payload: JsonObject = {"steps": rng.randint(2, 4), "step_ms": rng.randint(30, 90)}
                runs.append(DemoRun(kind, workspace, subject, _BAND_OF_KIND[kind], payload))
    _inject_faults(runs, rng, scale)
    for number in range(_subjects(3 * scale)):
        for workspace in (INACTIVE, HELD):
            subject = f"{workspace}/review-{number}"
            runs.append(DemoRun(REVIEW, workspace, subject, Band.BATCH, {"steps": 2}))
    # A digest that waits behind a budget hold outlives its deadline: the reaper ends it.
    runs.append(
        DemoRun(
            DIGEST, HELD, f"{HELD}/digest-0", Band.BACKGROUND, {"steps": 1}, timedelta(seconds=2)
        )
    )
    return Workload(tuple(runs))


def _inject_faults(runs: list[DemoRun], rng: random.Random, scale: float) -> None:
    faults: list[tuple[JsonObject, float]] = [
        ({"fail": 503, "fail_attempts": 1}, 8),
        ({"fail": 429, "fail_attempts": 2}, 6),
        ({"fail": 401}, 3),
        ({"fail": "chain"}, 2),
        ({"stall_ms": 2600}, 2),
    ]
    plan = [fault for fault, count in faults for _ in range(_subjects(count * scale))]
    chosen = rng.sample(range(len(runs)), min(len(plan), len(runs)))
    for index, fault in zip(chosen, plan, strict=False):
        run = runs[index]
        runs[index] = DemoRun(
            run.kind, run.workspace, run.subject, run.band, {**run.payload, **fault}
        )
    # A few background digests must finish within seconds of their enqueue.
    digests = [index for index, run in enumerate(runs) if run.kind == DIGEST]
    for index in rng.sample(digests, min(len(digests), _subjects(4 * scale))):
        run = runs[index]
        runs[index] = DemoRun(
            run.kind, run.workspace, run.subject, run.band, run.payload, timedelta(seconds=6)
        )
