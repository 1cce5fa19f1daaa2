"""How ``status`` shows who holds what: the holders, the quiet leases and the queued kinds no live
holder claims, as rich tables and as plain JSON values. The domain judged them all
(:func:`agentruns.domain.holders.view_holders`); this only shows its answer."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agentruns.domain.holders import Holder, HolderView
from agentruns.entrypoints.cli.render import duration

# Shown in the table; the JSON has them all.
SHOWN_QUIET = 20


def holders(view: HolderView) -> RenderableType:
    table = Table(title="Holders", title_justify="left")
    for column in ("holder", "process", "kinds", "started", "last seen", ""):
        table.add_column(column)
    for row in (*view.live, *view.gone):
        table.add_row(
            row.holder,
            row.process,
            ", ".join(row.kinds) or "-",
            f"{row.started_at:%Y-%m-%d %H:%M:%S}",
            f"{duration(view.now - row.seen_at)} ago",
            _state(row, view),
        )
    parts: list[RenderableType] = [table if view.live or view.gone else Text("holders: none seen")]
    if view.quiet:
        quiet = Table(title="Quiet leases (holder gone, or not renewed)", title_justify="left")
        for column in ("run", "kind", "workspace", "subject", "holder", "renewed", "why"):
            quiet.add_column(column)
        for found in view.quiet[:SHOWN_QUIET]:
            lease = found.lease
            quiet.add_row(
                str(lease.run_id),
                lease.kind,
                lease.workspace,
                lease.subject,
                lease.holder or "-",
                f"{duration(view.now - lease.renewed_at)} ago",
                Text(found.why.replace("_", " "), style="yellow"),
            )
        parts.append(quiet)
        if len(view.quiet) > SHOWN_QUIET:
            parts.append(Text(f"and {len(view.quiet) - SHOWN_QUIET} more quiet leases (--json)"))
    unclaimed = ", ".join(
        f"{kind.kind}: {kind.queued} (start a worker whose --kinds registers it)"
        for kind in view.unclaimed
    )
    parts.append(
        Text(
            f"queued runs of kinds no live holder claims: {unclaimed or 'none'}",
            style="yellow" if unclaimed else "",
        )
    )
    return Group(*parts)


def _state(row: Holder, view: HolderView) -> Text:
    if row in view.live:
        return Text("live")
    if row.stopped_at is not None:
        return Text("stopped", style="yellow")
    return Text("gone", style="yellow")


def fields(view: HolderView) -> dict[str, object]:
    """The holders' view as plain JSON values."""
    return {
        "holders": [
            {
                "holder": row.holder,
                "process": row.process,
                "kinds": list(row.kinds),
                "renewal_seconds": row.renewal.total_seconds(),
                "started_at": row.started_at.isoformat(),
                "seen_at": row.seen_at.isoformat(),
                "stopped_at": None if row.stopped_at is None else row.stopped_at.isoformat(),
                "live": row in view.live,
            }
            for row in (*view.live, *view.gone)
        ],
        "quiet_leases": [
            {
                "run_id": str(found.lease.run_id),
                "kind": found.lease.kind,
                "workspace": found.lease.workspace,
                "subject": found.lease.subject,
                "holder": found.lease.holder,
                "epoch": found.lease.epoch,
                "renewed_at": found.lease.renewed_at.isoformat(),
                "leased_until": found.lease.leased_until.isoformat(),
                "why": str(found.why),
            }
            for found in view.quiet
        ],
        "unclaimed_kinds": [{"kind": kind.kind, "queued": kind.queued} for kind in view.unclaimed],
    }
