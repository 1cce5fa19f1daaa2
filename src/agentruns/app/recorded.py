"""Recorded steps: a kind written as plain async code whose steps' results are kept (ADRs/0022).

A kind's steps may be :class:`RecordedSteps` instead of a generator of step events: an async
function of the run and a :class:`StepContext`. Each ``await ctx.step(name, fn, *args)`` is a step
boundary: ``fn`` runs, and its JSON result is recorded as a ``step.recorded`` event in the write
that renews the lease (the renewal first: a holder that lost its lease records nothing). When the
run is claimed again (a failure retried, a lease taken back), the worker reads its recorded steps
once and the same calls return their recorded results without running ``fn`` again; the code
after them runs as usual. The replay rule is :mod:`agentruns.domain.recorded_steps`.

``await ctx.wait_for(name, timeout=...)`` and ``await ctx.sleep(duration)`` give the lease back
until a signal or a time (ADRs/0025); the wait's answer is a recorded step of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import ParamSpec, TypeVar, cast

from agentruns.app.kinds import RunResult, StepEvent
from agentruns.domain import limits, usage as usage_rules
from agentruns.domain.errors import InvalidRequest, StepOutOfOrder, WaitTimedOut
from agentruns.domain.payload import JsonObject, JsonValue
from agentruns.domain.recorded_steps import RECORDED_STEP, RecordedStep, Replay, step_record
from agentruns.domain.run import AgentRun
from agentruns.domain.usage import Usage
from agentruns.domain.waits import SLEEP_STEP, wait_step

P = ParamSpec("P")
T = TypeVar("T")

# Runs one step's work (which returns the step's record) and writes its boundary; the worker's
# spans the work, renews under the run's fence and appends the record in one write.
# (the step's label, its work)
Boundary = Callable[[str, Callable[[], Awaitable[StepEvent]]], Awaitable[JsonObject]]

# A holder's wait (ADRs/0025): (the signal's name, None for a sleep; the occurrence of its step;
# the timeout) -> the wait's record when it resolved, None when the run was given back.
Waiter = Callable[[str | None, int, timedelta], Awaitable[JsonObject | None]]

# The inputs of the run (ADRs/0031): its payload, then each merged enqueue's.
Inputs = Callable[[], Awaitable[list[JsonObject]]]

# A take from a provider limit (ADRs/0032): (the limit's name, requests, tokens, the longest to
# wait) -> once granted.
Taker = Callable[[str, int, int, timedelta | None], Awaitable[None]]

# The longest a wait or a sleep may last.
MAX_WAIT = limits.MAX_DELAY


class RunWaiting(BaseException):
    """Raised out of a recorded kind's code when its run was given back to wait (ADRs/0025):
    the worker stops driving the run, which is neither a failure nor an end. A
    ``BaseException``, so a kind's ``except Exception`` does not swallow it; a ``finally``
    runs as for any exit."""


class StepContext:
    """What a recorded kind's code gets beside its run: :meth:`step`, the one way to make a step
    whose result survives a retry. One context serves one attempt of one run."""

    __slots__ = (
        "_boundary",
        "_inputs",
        "_replay",
        "_running",
        "_spent",
        "_taker",
        "_waiter",
        "run",
    )

    def __init__(
        self,
        run: AgentRun,
        replay: Replay,
        boundary: Boundary,
        waiter: Waiter | None = None,
        inputs: Inputs | None = None,
        taker: Taker | None = None,
    ) -> None:
        self.run = run
        self._taker = taker
        self._replay = replay
        self._boundary = boundary
        self._waiter = waiter
        self._inputs = inputs
        self._running: str | None = None  # the step being run, if one is
        self._spent: Usage | None = None  # what the running step reported it spent

    async def inputs(self) -> list[JsonObject]:
        """What the run answers (ADRs/0031): its payload, then the payload of each enqueue that
        merged into it (``on_active="merge"``), in the order they joined. A claimed run is
        never joined, so every attempt and every replay reads the same list. Driven outside a
        worker (the kind called as a generator), the run's payload alone."""
        if self._inputs is None:
            return [self.run.payload]
        return await self._inputs()

    async def take(
        self,
        limit: str,
        *,
        requests: int = 1,
        tokens: int = 0,
        wait: timedelta | None = timedelta(minutes=1),
    ) -> None:
        """Take ``requests`` and ``tokens`` from the provider limit ``limit`` before a call to
        its provider (ADRs/0032), waiting while it is empty or paused (the lease keeper keeps
        the lease meanwhile); past ``wait`` it raises :class:`~agentruns.LimitExhausted`, a
        retryable failure. Driven outside a worker, it takes nothing."""
        if self._taker is not None:
            await self._taker(limit, requests, tokens, wait)

    @property
    def replaying(self) -> bool:
        """Whether the steps asked for next were recorded by an earlier attempt (and will return
        their results without running)."""
        return self._replay.replaying

    async def step(
        self, name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``await fn(*args, **kwargs)`` as the step ``name``, its result recorded (a JSON value:
        what is returned is the recorded copy, as a later attempt gets it). A step recorded by an
        earlier attempt returns its recorded result and ``fn`` does not run.

        Steps run one at a time (their order is their identity): a step asked for while another
        runs is :class:`~agentruns.StepOutOfOrder`. Raises it too when a resumed run asks for a
        step other than the one recorded at its place; :class:`~agentruns.InvalidStepResult`
        (nothing recorded) when the result is not JSON or too large; what ``fn`` raises,
        unchanged; and :class:`~agentruns.LeaseLost` when the holder lost the run (nothing
        recorded), which the code must let through."""
        if self._running is not None:
            raise StepOutOfOrder(
                f"step {name!r} was asked for while step {self._running!r} runs: the recorded "
                "steps of a run run one at a time, in the order they are asked for"
            )
        occurrence, recorded = self._replay.ask(name)
        if recorded is not None:
            return cast(T, recorded.result)

        async def work() -> StepEvent:
            self._spent = None
            record = step_record(name, occurrence, await fn(*args, **kwargs))
            return StepEvent(RECORDED_STEP, record, usage=self._spent)

        label = RecordedStep(name, occurrence, None).label
        self._running = label
        try:
            record = await self._boundary(label, work)
        finally:
            self._running = None
            self._spent = None
        return cast(T, record["result"])

    def spent(self, usage: Usage) -> None:
        """Report what the running step spent (ADRs/0033): added up over the step's calls and
        written with its step boundary, in the same fenced write as its record (nothing if the
        step fails or the holder lost the run). A step replayed from an earlier attempt does
        not run, so it reports nothing again. Outside a step: :class:`~agentruns.InvalidRequest`."""
        if self._running is None:
            raise InvalidRequest("usage is reported from inside a step (ctx.step), not between")
        checked = usage_rules.usage(usage)
        if checked is not None:
            self._spent = checked if self._spent is None else self._spent + checked

    # The wait's own bound is durable (the run's, not this call's): hence a timeout parameter.
    async def wait_for(self, name: str, *, timeout: timedelta) -> object:  # noqa: ASYNC109
        """Wait for the signal ``name`` (``AgentRuns.signal``) for at most ``timeout``, and
        return its payload (ADRs/0025). A signal delivered before the wait is returned at once.
        Else the run gives its lease back (its worker slot is freed, no attempt is spent, it
        stays its subject's head) and is claimed again when the signal arrives or the timeout
        passes: its recorded steps replay and this call returns the payload, or raises
        :class:`~agentruns.WaitTimedOut`. The answer is a recorded step ``wait:<name>``: a
        later replay returns the same."""
        result = await self._wait(name, timeout)
        if result.get("timed_out") is True:
            raise WaitTimedOut(
                name, f"the wait for signal {name!r} timed out after {timeout} with no signal"
            )
        return result.get("payload")

    async def sleep(self, duration: timedelta) -> None:
        """Sleep durably for ``duration`` (ADRs/0025): the run gives its lease back as a wait
        does and is due again at that time; no attempt is spent and the subject is kept. On
        resume the sleep is a recorded step ``sleep`` that returns at once."""
        await self._wait(None, duration)

    async def _wait(self, name: str | None, longest: timedelta) -> JsonObject:
        limits.duration(longest, "a wait's timeout", longest=MAX_WAIT)
        if self._running is not None:
            raise StepOutOfOrder(
                f"a wait was asked for while step {self._running!r} runs: a run waits between "
                "its steps"
            )
        step = SLEEP_STEP if name is None else wait_step(name)
        occurrence, recorded = self._replay.ask(step)
        if recorded is not None:
            return cast(JsonObject, recorded.result)
        if self._waiter is None:
            raise InvalidRequest(
                "a run waits only when a worker drives it: its steps were run as a plain "
                "generator, with no store to wait in"
            )
        record = await self._waiter(name, occurrence, longest)
        if record is None:
            raise RunWaiting()
        return cast(JsonObject, record["result"])


RecordedFunction = Callable[[AgentRun, StepContext], Awaitable[JsonValue]]


class RecordedSteps:
    """A kind's steps as plain async code with recorded steps: ``RunKind(policy,
    RecordedSteps(review))`` where ``async def review(run, ctx) -> None``. Returning completes
    the run, with what it returns (any JSON value; ``None``: none) as the run's result
    (ADRs/0026); an exception is classified as a generator's would be.

    Called as a plain generator of step events (a host running the steps itself, with no lease
    and no store), every step runs, nothing is replayed, and the ``step.recorded`` events come
    once the function has returned."""

    __slots__ = ("function",)

    def __init__(self, function: RecordedFunction) -> None:
        self.function = function

    async def __call__(self, run: AgentRun) -> AsyncIterator[StepEvent]:
        events: list[StepEvent] = []

        async def boundary(label: str, work: Callable[[], Awaitable[StepEvent]]) -> JsonObject:
            event = await work()
            # The host gets the events to write itself: a plain copy, checked again when written.
            events.append(StepEvent(RECORDED_STEP, dict(event.data), usage=event.usage))
            return event.data

        result = await self.function(run, StepContext(run, Replay(), boundary))
        for event in events:
            yield event
        if result is not None:
            yield RunResult(result)
