"""What the benchmarks share: a simulated background worker and the reflection workflow run in-process.

`SimWork` is the work queue's consumer on a simulated clock: one worker for a thread's FIFO group, jobs run in
order, each starting when the previous one is done; a job whose model call failed can come back later, as SQS
redelivers it (`delay_redelivery`'s schedule). `run_workflow` runs the reflection workflow's tasks as the Step
Functions state machine does. `Wire` times the HTTP transports under the real model clients.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

from om_lib.adapters.aws.work import retry_delay_s
from om_lib.clock import ManualClock
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import ModelError
from om_lib.work import Job

RETRY_REASONS = frozenset({'error', 'timeout', 'model_unavailable'})


def run_workflow(engine: MemoryEngine, job: Job, owner: str) -> None:
    """check → reflect → validate → commit, and release on a failure, as the state machine runs them."""
    try:
        if engine.workflow_check(job, owner).get('due'):
            if engine.workflow_reflect(job, owner).get('outcome') == 'reflected':
                engine.workflow_validate(job, owner)
                engine.workflow_commit(job, owner)
    except ModelError:
        engine.workflow_release(job, owner)


@dataclass(order=True)
class _Event:
    at: float
    order: int
    job: Job = field(compare=False)
    receives: int = field(default=1, compare=False)


class SimWork:
    """A `BackgroundWork` whose jobs run on a simulated clock (see the module docstring).

    `latency_s` > 0 schedules each job one model latency after the previous one finished (the model's time is not
    charged to the clock by the model itself); 0 runs jobs when they are due, the model charging its own time.
    """

    def __init__(self, clock: ManualClock, *, latency_s: float = 0.0, redeliver_failed: bool = False) -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.redeliver_failed = redeliver_failed
        self.engine: MemoryEngine | None = None
        self.events: list[_Event] = []
        self.free_at = 0.0
        self.n = 0
        self.jobs = 0

    def submit(self, job: Job) -> None:
        start = max(self.clock.monotonic(), self.free_at)
        self.free_at = start + self.latency_s
        self._push(self.free_at, job, 1)
        self.jobs += 1

    def _push(self, at: float, job: Job, receives: int) -> None:
        self.n += 1
        heapq.heappush(self.events, _Event(at, self.n, job, receives))

    def run_until(self, until: float) -> None:
        """Run every job due by `until` (in order), then move the clock to `until`."""
        assert self.engine is not None, 'set SimWork.engine first'
        while self.events and self.events[0].at <= until:
            event = heapq.heappop(self.events)
            self.clock.advance(max(0.0, event.at - self.clock.monotonic()))
            if event.job.kind == 'reflect':
                run_workflow(self.engine, event.job, f'sim-{event.order}')
                continue
            parts = self.engine.run_job(event.job)
            failed = any(f.get('reason') in RETRY_REASONS for f in parts.failures())
            if failed and self.redeliver_failed:
                self._push(self.clock.monotonic() + retry_delay_s(event.receives), event.job, event.receives + 1)
        self.clock.advance(max(0.0, until - self.clock.monotonic()))


class Wire:
    """Seconds spent in the transports (request sent, answer read in full)."""

    def __init__(self) -> None:
        self.total_s = 0.0

    def install_httpx2(self) -> None:
        import httpx2  # google-genai's and openai's HTTP library

        original = httpx2.HTTPTransport.handle_request
        wire = self

        def timed(transport: Any, request: Any) -> Any:
            started = time.perf_counter()
            response = original(transport, request)
            response.read()
            wire.total_s += time.perf_counter() - started
            return response

        httpx2.HTTPTransport.handle_request = timed  # type: ignore[method-assign]

    def install_botocore(self, client: Any) -> None:
        session = client._endpoint.http_session
        original = session.send
        wire = self

        def timed(request: Any) -> Any:
            started = time.perf_counter()
            response = original(request)
            _ = response.content  # botocore reads the body later; read it here so the wire time includes it
            wire.total_s += time.perf_counter() - started
            return response

        session.send = timed
