"""Group claims for a worker: concurrent claims of one worker made as one claim (ADRs/0017).

A host that drives one run at a time from several tasks (``claim_and_drive(1)`` in a loop, per
task) would pay one claim statement per run, and a fair claim's fixed cost dwarfs its cost per
run. The worker's claims are all for the same holder and kinds, so the runs are
interchangeable: while one claim is in flight, new requests gather, and the next claim asks for
all of them at once (up to ``max_limit``); its runs, already in claim order, are dealt to the
requests in the order they came, each at most its own limit. A request alone is claimed at
once, so an idle worker claims as before.

A run dealt to a request whose task was cancelled meanwhile is not dropped: it is kept for the
next request (its lease runs meanwhile; if no request comes before it runs out, the reaper takes
it back as after a crash).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from agentruns.domain.errors import StoreUnavailable
from agentruns.domain.run import AgentRun

Claim = Callable[[int], Awaitable[list[AgentRun]]]


class GroupClaimer:
    def __init__(self, claim: Claim, *, max_limit: int = 64) -> None:
        if max_limit < 1:
            raise ValueError("a group claim takes at least one run")
        self._claim = claim
        self._max_limit = max_limit
        self._pending: deque[tuple[int, asyncio.Future[list[AgentRun]]]] = deque()
        self._spare: deque[AgentRun] = deque()
        self._claimer: asyncio.Task[None] | None = None

    async def claim(self, limit: int) -> list[AgentRun]:
        """Up to ``limit`` runs, claimed with the other requests waiting now."""
        if limit < 1:
            return []
        spare = [self._spare.popleft() for _ in range(min(limit, len(self._spare)))]
        if spare:
            return spare
        answer: asyncio.Future[list[AgentRun]] = asyncio.get_running_loop().create_future()
        self._pending.append((limit, answer))
        if self._claimer is None:
            self._claimer = asyncio.create_task(self._claim_groups())
        return await answer

    async def _claim_groups(self) -> None:
        group: list[tuple[int, asyncio.Future[list[AgentRun]]]] = []
        try:
            while self._pending:
                group = self._take_group()
                if not group:
                    continue
                try:
                    runs = await self._claim(sum(limit for limit, _ in group))
                except Exception as failed:  # every request of the group gets the error
                    for _, answer in group:
                        if not answer.done():
                            answer.set_exception(failed)
                    group = []
                    continue
                self._deal(group, runs)
                group = []
        finally:
            self._claimer = None
            # Only if the claimer itself was stopped (cancelled with its loop): nobody waits
            # forever; whether the claim in flight leased runs is unknown (the reaper knows).
            for _, answer in [*group, *self._pending]:
                if not answer.done():
                    answer.set_exception(StoreUnavailable("the group claimer stopped"))
            self._pending.clear()

    def _take_group(self) -> list[tuple[int, asyncio.Future[list[AgentRun]]]]:
        group: list[tuple[int, asyncio.Future[list[AgentRun]]]] = []
        total = 0
        while self._pending:
            limit, answer = self._pending[0]
            if answer.done():  # its task was cancelled before the claim: nothing to claim
                self._pending.popleft()
                continue
            if group and total + limit > self._max_limit:
                break
            self._pending.popleft()
            group.append((limit, answer))
            total += limit
        return group

    def _deal(
        self, group: list[tuple[int, asyncio.Future[list[AgentRun]]]], runs: list[AgentRun]
    ) -> None:
        left = deque(runs)
        for limit, answer in group:
            if answer.done():  # cancelled while the claim was in flight
                continue
            answer.set_result([left.popleft() for _ in range(min(limit, len(left)))])
        self._spare.extend(left)
