"""Group commit for a worker: step boundaries and ends of concurrently running runs, written
together (ADRs/0011): one autocommitted statement, or one transaction when a group holds both.

Each run's task hands its write to the :class:`GroupSettler` and awaits its own result. While a
group is being written, new writes gather; the next group takes them (up to ``max_group``), so
the group grows with the load and an idle worker still writes at once. Up to ``writers`` groups
(three by default: 8% more renewals than two on two cores, ADRs/0019) are written at once, each
on its own connection, so a server with cores to spare is not left
waiting on one group's round trips; a run is never in two groups at once, so its writes land
in the order it made them. A group is written by
:meth:`AgentRuns.settle_group`: set-based statements, each row under its own fence, so a failed
fence refuses only its run. If the group's transaction fails as a whole (a deadlock, a lost
connection), each write is retried alone, so every run still gets its own answer.

A worker's heartbeats (ADRs/0023) go the same way: :meth:`GroupSettler.renew_many` hands in
the renewal of every run whose step has run long, and they are written with the group, a
set-based fenced update of the leases, each answered on its own.

Workers share groups: :meth:`GroupSettler.shared` gives every worker built on one
:class:`AgentRuns` the same settler (one per event loop), so the runs of all of a process's
claimers settle together, however the host split its claiming.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from weakref import WeakKeyDictionary

from agentruns.app.ports import EndWrite, RenewWrite, RunEvent, StepWrite
from agentruns.app.runs import AgentRuns
from agentruns.domain.errors import AgentRunsError, StoreUnavailable
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.run import AgentRun, AgentRunFence
from agentruns.domain.termination import TerminationReason
from agentruns.domain.usage import Usage

_Write = StepWrite | EndWrite | RenewWrite
_Result = RunEvent | AgentRunsError | None


class GroupSettler:
    _shared: WeakKeyDictionary[
        AgentRuns, WeakKeyDictionary[asyncio.AbstractEventLoop, GroupSettler]
    ]
    _shared = WeakKeyDictionary()

    @classmethod
    def shared(cls, runs: AgentRuns) -> GroupSettler:
        """The settler every worker on ``runs`` uses in the running event loop."""
        loop = asyncio.get_running_loop()
        per_loop = cls._shared.get(runs)
        if per_loop is None:
            per_loop = cls._shared[runs] = WeakKeyDictionary()
        settler = per_loop.get(loop)
        if settler is None:
            settler = per_loop[loop] = cls(runs)
        return settler

    def __init__(self, runs: AgentRuns, *, max_group: int = 256, writers: int = 3) -> None:
        if max_group < 1:
            raise ValueError("a group holds at least one write")
        if writers < 1:
            raise ValueError("a settler needs at least one writer")
        self._runs = runs
        self._max_group = max_group
        self._max_writers = writers
        self._pending: deque[tuple[_Write, asyncio.Future[_Result]]] = deque()
        self._writers: set[asyncio.Task[None]] = set()
        self._in_flight: set[object] = set()  # runs whose write is in a group being written

    async def step_boundary(
        self, fence: AgentRunFence, type: str, data: JsonObject, usage: Usage | None = None
    ) -> RunEvent:
        """As :meth:`AgentRuns.step_boundary`, written with the group."""
        result = await self._submit(StepWrite(fence, type, data, usage))
        if isinstance(result, RunEvent):
            return result
        raise _unexpected(result)

    async def end(
        self, fence: AgentRunFence, reason: TerminationReason, result: JsonValue = None
    ) -> None:
        """As :meth:`AgentRuns.end` for a kind without a domain row (with its ``result``),
        written with the group; it returns once the end is committed, and raises what a lone
        end would. The ended run is not read back: its holder has it, and nothing of it changes
        but the end."""
        answer = await self._submit(EndWrite(fence, reason, result))
        if answer is not None:
            raise _unexpected(answer)

    async def renew_many(self, fences: Sequence[AgentRunFence]) -> list[AgentRunsError | None]:
        """Heartbeats: renew each fence's lease with the group (as :meth:`AgentRuns.renew`,
        nothing read back); one answer per fence, in order: None, or the error its renewal met
        (:class:`~agentruns.LeaseLost` for a run no longer held). The fences name distinct
        runs."""
        loop = asyncio.get_running_loop()
        answers: list[asyncio.Future[_Result]] = []
        for fence in fences:
            answer: asyncio.Future[_Result] = loop.create_future()
            self._pending.append((RenewWrite(fence), answer))
            answers.append(answer)
        self._start_writers()
        results: list[AgentRunsError | None] = []
        for answer in answers:
            try:
                result = await answer
            except AgentRunsError as failed:
                results.append(failed)
                continue
            if isinstance(result, AgentRunsError):
                results.append(result)
            elif result is not None:
                raise _unexpected(result)
            else:
                results.append(None)
        return results

    def _start_writers(self) -> None:
        while len(self._writers) < self._max_writers and len(self._writers) < len(self._pending):
            writer = asyncio.create_task(self._write_groups())
            self._writers.add(writer)

    async def _submit(self, write: _Write) -> RunEvent | None:
        answer: asyncio.Future[_Result] = asyncio.get_running_loop().create_future()
        self._pending.append((write, answer))
        if len(self._writers) < self._max_writers:
            writer = asyncio.create_task(self._write_groups())
            self._writers.add(writer)
        result = await answer
        if isinstance(result, AgentRunsError):
            raise result
        return result

    async def _write_groups(self) -> None:
        """Write groups until none can be taken; the next write starts a new writer."""
        group: Sequence[tuple[_Write, asyncio.Future[_Result]]] = []
        try:
            while group := self._take_group():
                try:
                    await self._write(group)
                finally:
                    self._in_flight.difference_update(w.fence.run_id for w, _ in group)
                group = []
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._writers.discard(task)
            # Only if the writer itself was stopped (cancelled with its loop): nobody waits
            # forever; whether the group in flight committed is unknown.
            stranded = [*group, *(self._pending if not self._writers else ())]
            for _, answer in stranded:
                if not answer.done():
                    answer.set_exception(StoreUnavailable("the group writer stopped"))
            if not self._writers:
                self._pending.clear()

    def _take_group(self) -> list[tuple[_Write, asyncio.Future[_Result]]]:
        """Up to ``max_group`` waiting writes, one per run and none of a run whose write is
        being written (its later write waits), oldest first; it marks their runs in flight."""
        group: list[tuple[_Write, asyncio.Future[_Result]]] = []
        later: list[tuple[_Write, asyncio.Future[_Result]]] = []
        pending, in_flight = self._pending, self._in_flight
        while pending and len(group) < self._max_group:
            entry = pending.popleft()
            if entry[1].done():  # its run's task was cancelled: nothing to write
                continue
            run_id = entry[0].fence.run_id
            if run_id in in_flight:
                later.append(entry)
            else:
                in_flight.add(run_id)
                group.append(entry)
        pending.extendleft(reversed(later))
        return group

    async def _write(self, group: Sequence[tuple[_Write, asyncio.Future[_Result]]]) -> None:
        writes = [write for write, _ in group]
        try:
            results: Sequence[_Result | AgentRun | Exception] = await self._runs.settle_group(
                writes, ended_runs=False
            )
        except Exception:  # the group failed as a whole: each write alone, its own answer
            results = [await self._alone(write) for write in writes]
        for (_, answer), result in zip(group, results, strict=True):
            if answer.done():
                continue
            if isinstance(result, Exception) and not isinstance(result, AgentRunsError):
                answer.set_exception(result)
            elif isinstance(result, AgentRun):  # not asked for: ends answer None
                answer.set_exception(_unexpected(result))
            else:
                answer.set_result(result)

    async def _alone(self, write: _Write) -> _Result | Exception:
        try:
            if isinstance(write, StepWrite):
                return await self._runs.step_boundary(
                    write.fence, write.type, write.data, usage=write.usage
                )
            if isinstance(write, RenewWrite):
                await self._runs.renew(write.fence)
                return None
            await self._runs.end(write.fence, write.reason, result=write.result)
            return None
        except Exception as failed:  # the write's own answer, whatever it is
            return failed


def _unexpected(result: object) -> TypeError:
    return TypeError(f"the group answered a write with {result!r}")
