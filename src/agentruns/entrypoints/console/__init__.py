"""The web console (the ``console`` extra): see and steer agent runs in a browser (ADRs/0018).

``agentruns console`` serves it; a host mounts :func:`create_console`'s ASGI app under its own
prefix, behind its own authentication if it likes::

    app.mount("/ops/agentruns", agentruns.create_console(client, hosts=["ops.example.com"]))

Pages are rendered on the server (Jinja2) from the read model; a few lines of JavaScript refresh
the overview every two seconds and count leases down. Templates and static files ship inside the
package.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING

from starlette.types import ASGIApp

from agentruns.app.holders import AgentHolders
from agentruns.entrypoints.console.access import (
    MAX_BODY_BYTES,
    ConsoleAccess,
    Gate,
    LoginThrottle,
    is_local,
)
from agentruns.entrypoints.console.app import ConsoleServices, build

if TYPE_CHECKING:
    from agentruns.entrypoints.connect import AgentRunsClient

__all__ = ["ConsoleAccess", "ConsoleServices", "create_console", "is_local"]


def create_console(
    client: AgentRunsClient,
    *,
    access: ConsoleAccess | None = None,
    read_only: bool = False,
    window: timedelta = timedelta(minutes=30),
    hosts: Collection[str] = (),
) -> ASGIApp:
    """The console over ``client``'s runs, as an ASGI app.

    - ``access``: the credential every request must carry (a bearer token, or basic auth);
      ``None`` when the host authenticates in front of it, or serves localhost only.
    - ``read_only``: show everything, offer and accept no action.
    - ``window``: how far back the overview's chart and its ended counts look.
    - ``hosts``: without ``access``, the console answers only requests sent to a loopback name
      or address (``Host: localhost``, ``127.0.0.1``, ``[::1]``) and to these names; any other
      ``Host`` gets 421 (a defence against DNS rebinding). A host that mounts the console behind
      its own authentication names its hosts here, or passes ``("*",)`` for any.

    ``/login`` slows down guessing: five failures per client address are free, then each
    attempt waits twice as long as the last (up to five minutes, 429 until then).

    Actions go through ``client.runs`` as the command line's do: retrying a dead letter needs
    its kind among ``client.kinds``, and so does cancelling a run whose kind keeps a domain row.
    """
    if not isinstance(window, timedelta) or not timedelta(minutes=1) <= window <= timedelta(
        hours=24
    ):
        raise ValueError("the console's window is from one minute to a day")
    if isinstance(hosts, str):
        raise ValueError("hosts is a collection of host names, not one string")
    services = ConsoleServices(
        runs=client.runs,
        stats=client.family.stats,
        scope=client.family.stores.scope,
        schedules=client.schedules,
        sandboxes=client.family.sandboxes,
        soon=client.settings.lease_renewal,
        window=window,
        holders=AgentHolders(
            client.family.stores.scope,
            client.family.stores.runs,
            client.family.holders,
            client.family.stats,
            renewal=client.settings.lease_renewal,
        ),
        approvals=client.approvals if client.signs_approvals else None,
    )
    app = build(services, read_only=read_only, access=access, throttle=LoginThrottle())
    return Gate(app, access, max_body=MAX_BODY_BYTES, hosts=hosts)
