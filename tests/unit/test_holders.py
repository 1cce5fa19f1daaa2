"""The holders' judgement: live or gone, quiet leases, kinds nobody claims, and a scan that
never misses a quiet lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given, strategies as st

from agentruns.domain.holders import (
    HeldLease,
    Holder,
    Quiet,
    lease_scan,
    liveness_window,
    quiet,
    view_holders,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RENEWAL = timedelta(seconds=10)


def holder(name: str, seen_ago: float, *kinds: str, stopped: bool = False) -> Holder:
    seen = NOW - timedelta(seconds=seen_ago)
    return Holder(
        name,
        "agentruns-worker",
        kinds,
        RENEWAL,
        seen - timedelta(hours=1),
        seen,
        seen if stopped else None,
    )


def lease(number: int, holder: str | None, renewed_ago: float) -> HeldLease:
    lease = timedelta(minutes=2)
    renewed = NOW - timedelta(seconds=renewed_ago)
    return HeldLease(
        UUID(int=number), "chat", "acme", f"s{number}", holder, 1, renewed + lease, lease
    )


def test_a_holder_is_live_for_three_renewals_unless_it_stopped() -> None:
    assert liveness_window(RENEWAL) == timedelta(seconds=30)
    assert holder("w", 30).is_live(NOW)
    assert not holder("w", 30.001).is_live(NOW)
    assert not holder("w", 0, stopped=True).is_live(NOW)


def test_a_lease_is_quiet_when_its_holder_is_gone_or_it_was_not_renewed_in_the_window() -> None:
    live, gone = holder("live", 1), holder("gone", 31)
    assert quiet(lease(1, "live", 29), live, NOW, RENEWAL) is None
    assert quiet(lease(1, "live", 31), live, NOW, RENEWAL) is Quiet.NOT_RENEWED
    assert quiet(lease(1, "gone", 0), gone, NOW, RENEWAL) is Quiet.HOLDER_GONE
    # No row (a host's own loop, a sandbox): its renewals alone, against the expected renewal.
    assert quiet(lease(1, "sandbox:1", 29), None, NOW, RENEWAL) is None
    assert quiet(lease(1, "sandbox:1", 29), None, NOW, timedelta(seconds=5)) is Quiet.NOT_RENEWED


def test_the_view_sorts_holders_and_names_the_queued_kinds_no_live_holder_claims() -> None:
    view = view_holders(
        NOW,
        [holder("b", 1, "chat"), holder("a", 100, "review"), holder("c", 0, "sweep", stopped=True)],
        [lease(2, "b", 40), lease(1, "a", 50), lease(3, "b", 1)],
        {"chat": 2, "review": 3, "sweep": 0, "unheard": 1},
        default_renewal=RENEWAL,
    )
    assert [row.holder for row in view.live] == ["b"]
    assert [row.holder for row in view.gone] == ["a", "c"]
    assert [(q.lease.run_id.int, q.why) for q in view.quiet] == [
        (1, Quiet.HOLDER_GONE),
        (2, Quiet.NOT_RENEWED),
    ]
    assert [(kind.kind, kind.queued) for kind in view.unclaimed] == [("review", 3), ("unheard", 1)]
    assert view.unclaimed_runs == 4
    assert view.is_unclaimed("review")
    assert not view.is_unclaimed("chat")


holders = st.lists(
    st.builds(
        lambda name, ago, renewal, stopped: Holder(
            name,
            "p",
            (),
            timedelta(seconds=renewal),
            NOW - timedelta(days=1),
            NOW - timedelta(seconds=ago),
            NOW if stopped else None,
        ),
        st.sampled_from(["a", "b", "c"]),
        st.floats(0, 200),
        st.integers(1, 60),
        st.booleans(),
    ),
    unique_by=lambda row: row.holder,
)
leases = st.lists(
    st.builds(
        lease, st.integers(0, 1000), st.sampled_from(["a", "b", "c", "d", None]), st.floats(0, 400)
    )
)


@given(holders, leases, st.integers(1, 60))
def test_the_scan_reads_every_lease_the_view_finds_quiet(
    rows: list[Holder], held: list[HeldLease], renewal: int
) -> None:
    """What a store reads for the view (renewed before the scan's time, or held by a holder not
    live) is a superset of the quiet leases: the view never misses one."""
    default = timedelta(seconds=renewal)
    scan = lease_scan(NOW, rows, default)
    read = [
        found
        for found in held
        if found.renewed_at < scan.renewed_before or found.holder not in scan.live
    ]
    assert (
        view_holders(NOW, rows, held, {}, default_renewal=default).quiet
        == view_holders(NOW, rows, read, {}, default_renewal=default).quiet
    )
