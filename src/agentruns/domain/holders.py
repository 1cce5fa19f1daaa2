"""Holders: the processes that lease runs, whether each is live or gone, and which leases have
gone quiet. Pure: every judgement takes ``now`` (the store's clock, read by the caller).

A holder (a worker; a gateway for the sandboxes it serves) says it is alive about every
``renewal``, off the claim path. It is **live** while it was seen within three renewals and has
not stopped; else **gone**. A leased run is **quiet** when its holder is gone, or when its last
renewal (``leased_until - lease``: a claim or a step boundary) is older than its holder's
liveness window: a holder that beats but does not renew is stuck in a step, or lost the run. A
lease whose holder writes no row (a host's own claim loop, a sandbox) is judged by its renewals
alone, against the window of the renewal the caller expects. A queued kind that no live holder
claims has nobody to run it: its runs stay queued until a process that registers it starts.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

#: How many renewals a holder may miss and still be live.
GONE_AFTER_RENEWALS = 3

#: How long the row of a holder not seen is kept (a holder that starts forgets older ones).
HOLDER_RETENTION = timedelta(days=1)


def liveness_window(renewal: timedelta) -> timedelta:
    """How long a holder that beats every ``renewal`` may go unseen and still be live."""
    return renewal * GONE_AFTER_RENEWALS


@dataclass(frozen=True, slots=True)
class HolderBeat:
    """What a holder says of itself: its name on leases, its process name (``agentruns-worker``),
    the kinds it claims, and how often it says so."""

    holder: str
    process: str
    kinds: tuple[str, ...]
    renewal: timedelta


@dataclass(frozen=True, slots=True)
class Holder:
    """A holder's row as it last wrote it; times on the store's clock. ``stopped_at`` is set by
    a clean shutdown."""

    holder: str
    process: str
    kinds: tuple[str, ...]
    renewal: timedelta
    started_at: datetime
    seen_at: datetime
    stopped_at: datetime | None = None

    @property
    def window(self) -> timedelta:
        return liveness_window(self.renewal)

    def is_live(self, now: datetime) -> bool:
        """Seen within its liveness window, and not stopped."""
        return self.stopped_at is None and now - self.seen_at <= self.window


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A leased run as the holders' view reads it."""

    run_id: UUID
    kind: str
    workspace: str
    subject: str
    holder: str | None
    epoch: int
    leased_until: datetime
    lease: timedelta

    @property
    def renewed_at(self) -> datetime:
        """Its last renewal: the claim, or the latest step boundary."""
        return self.leased_until - self.lease


class Quiet(enum.StrEnum):
    """Why a lease is quiet."""

    HOLDER_GONE = "holder_gone"
    NOT_RENEWED = "not_renewed"


@dataclass(frozen=True, slots=True)
class QuietLease:
    """A lease whose holder has gone quiet, why, and its holder's row (``None``: it has none)."""

    lease: HeldLease
    why: Quiet
    holder: Holder | None


def quiet(
    lease: HeldLease, holder: Holder | None, now: datetime, default_renewal: timedelta
) -> Quiet | None:
    """Why ``lease`` is quiet at ``now``, or ``None`` if it is not. ``holder`` is the row of its
    holder (``None``: it has none, and is judged against ``default_renewal``)."""
    if holder is not None and not holder.is_live(now):
        return Quiet.HOLDER_GONE
    window = holder.window if holder is not None else liveness_window(default_renewal)
    if now - lease.renewed_at > window:
        return Quiet.NOT_RENEWED
    return None


@dataclass(frozen=True, slots=True)
class UnclaimedKind:
    """Queued runs of a kind that no live holder claims."""

    kind: str
    queued: int


@dataclass(frozen=True, slots=True)
class LeaseScan:
    """Which leases can be quiet at ``now``: those renewed before ``renewed_before``, and those
    of a holder not in ``live``. A store reads them (a superset); :func:`view_holders` decides."""

    renewed_before: datetime
    live: tuple[str, ...]


def lease_scan(now: datetime, holders: Iterable[Holder], default_renewal: timedelta) -> LeaseScan:
    """The leases to read for :func:`view_holders`: every quiet lease is among them."""
    rows = list(holders)
    shortest = min([holder.window for holder in rows] + [liveness_window(default_renewal)])
    live = tuple(sorted(holder.holder for holder in rows if holder.is_live(now)))
    return LeaseScan(now - shortest, live)


@dataclass(frozen=True, slots=True)
class HolderView:
    """The holders at ``now``: live and gone ones (by holder name), the quiet leases (oldest
    renewal first, then in the order given), and the queued kinds no live holder claims."""

    now: datetime
    live: tuple[Holder, ...]
    gone: tuple[Holder, ...]
    quiet: tuple[QuietLease, ...]
    unclaimed: tuple[UnclaimedKind, ...]

    @property
    def unclaimed_runs(self) -> int:
        return sum(kind.queued for kind in self.unclaimed)

    def is_unclaimed(self, kind: str) -> bool:
        return any(found.kind == kind for found in self.unclaimed)


def view_holders(
    now: datetime,
    holders: Iterable[Holder],
    leases: Iterable[HeldLease],
    queued: Mapping[str, int],
    *,
    default_renewal: timedelta,
) -> HolderView:
    """Judge the holders, the leases and the queued kinds (``queued``: runs by kind) at ``now``;
    ``default_renewal`` is the renewal expected of a lease whose holder writes no row."""
    rows = sorted(holders, key=lambda holder: holder.holder)
    by_name = {holder.holder: holder for holder in rows}
    live = tuple(holder for holder in rows if holder.is_live(now))
    claimed = {kind for holder in live for kind in holder.kinds}
    found: list[QuietLease] = []
    for lease in leases:
        holder = by_name.get(lease.holder) if lease.holder is not None else None
        why = quiet(lease, holder, now, default_renewal)
        if why is not None:
            found.append(QuietLease(lease, why, holder))
    found.sort(key=lambda q: q.lease.renewed_at)  # stable: ties keep the leases' order
    return HolderView(
        now=now,
        live=live,
        gone=tuple(holder for holder in rows if not holder.is_live(now)),
        quiet=tuple(found),
        unclaimed=tuple(
            UnclaimedKind(kind, count)
            for kind, count in sorted(queued.items())
            if count > 0 and kind not in claimed
        ),
    )
