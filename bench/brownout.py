"""A model brown-out: how slow steps get while the Observer fails, and whether the backlog is observed afterwards.

    .venv/bin/python bench/brownout.py [--steps 100] [--outage 20:60] [--failure-s 3]

100 steps (a user message of ~150 tokens, an assistant answer of ~300; o200k), messageTokens 600, observationTokens
4,000, one step every 12 s of simulated time. During steps 20-60 every Observer and Reflector call fails after
`--failure-s` seconds (a slow 503); otherwise a call takes 1 s. The engine runs as deployed: steps with the request
budget (20 s), turns that queue background work, one worker that runs jobs in order and sends a failed job back
later (30 s doubling, as SQS does with `delay_redelivery`), and the per-model circuit breaker.

It prints, for sync and buffered memory: the steps that paid more than 2 s, the total time steps waited, the model
calls made during the outage, and the tokens of messages said during the outage that are still unobserved at the end
(goals, issue 16: at most 3 slow steps; 0 left unobserved after recovery).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sim import SimWork  # noqa: E402
from om_lib.adapters.memory.store import InMemoryStore  # noqa: E402
from om_lib.adapters.tiktoken_counter import get_tokenizer  # noqa: E402
from om_lib.clock import ManualClock  # noqa: E402
from om_lib.config import OMConfig  # noqa: E402
from om_lib.context.tokens import TokenCounter  # noqa: E402
from om_lib.engine.engine import MemoryEngine  # noqa: E402
from om_lib.errors import ModelUnavailableError  # noqa: E402
from om_lib.llm import ModelRequest, ModelResponse  # noqa: E402
from om_lib.messages import Message  # noqa: E402
from om_lib.models.model_router import ModelRouter  # noqa: E402

TURN_PERIOD_S = 12.0
ACTOR_S = 4.0
FILLER = 'owner deadline budget rollout table queue region review latency cache index schema tenant invoice'.split()


def text(tag: str, n: int, words: int) -> str:
    return f'{tag} {n}: ' + ' '.join(FILLER[(n * 3 + i) % len(FILLER)] for i in range(words))


class BrownOutModel:
    """1 s per call; during the outage every call fails after `failure_s` (a slow 503)."""

    def __init__(self, clock: ManualClock, failure_s: float) -> None:
        self.clock = clock
        self.failure_s = failure_s
        self.down = False
        self.calls_during_outage = 0

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        if self.down:
            self.calls_during_outage += 1
            self.clock.advance(min(self.failure_s, timeout_s))
            raise ModelUnavailableError('503 backend overloaded', status_code=503)
        self.clock.advance(min(1.0, timeout_s))
        if request.purpose == 'reflector':
            lines = [line for line in (request.source_observations or '').split('\n') if line.startswith('* ')]
            body = 'Date: Jan 1, 2025\n' + '\n'.join(lines[::3] or lines[:1])
        else:
            lines = [f'* 🟡 (09:00) {m.role} said: ' + ' '.join(m.text().split()[:20]) for m in request.source_messages]
            body = 'Date: Jan 1, 2025\n' + '\n'.join(lines or ['* 🟢 (09:00) nothing notable'])
        return ModelResponse(text=f'<observations>\n{body}\n</observations>', model=model_id)


def run(name: str, observation: dict[str, Any], *, steps: int, outage: tuple[int, int], failure_s: float) -> None:
    clock = ManualClock()
    model = BrownOutModel(clock, failure_s)
    worker = SimWork(clock, redeliver_failed=True)
    counter = TokenCounter(get_tokenizer())
    engine = MemoryEngine(
        OMConfig.model_validate(
            {
                'model': 'default',
                'observation': {'messageTokens': 600, **observation},
                'reflection': {'observationTokens': 4000},
            }
        ),
        store=InMemoryStore(),
        router=ModelRouter({'google': model}, clock=clock, sleep=clock.advance),
        counter=counter,
        clock=clock,
        work=worker,
        sleep=clock.advance,
    )
    worker.engine = engine
    durations: list[float] = []
    start = clock.monotonic()
    for n in range(steps):
        worker.run_until(start + n * TURN_PERIOD_S)
        model.down = outage[0] <= n < outage[1]
        before = clock.monotonic()
        user = Message.model_validate(
            {'id': f'u{n}', 'role': 'user', 'createdAt': clock.now(), 'content': text('u', n, 110)}
        )
        engine.prepare_step('r1', 't1', [user])
        durations.append(clock.monotonic() - before)
        worker.run_until(clock.monotonic() + ACTOR_S)
        reply = Message.model_validate(
            {'id': f'a{n}', 'role': 'assistant', 'createdAt': clock.now(), 'content': text('a', n, 230)}
        )
        engine.complete_turn('r1', 't1', [reply])
    model.down = False
    worker.run_until(clock.monotonic() + 3600)
    record = engine.store.get_record('thread:r1/t1')
    cursor = record.cursor('t1') if record else 0
    stored = engine.store.list_messages('r1', 't1', limit=10_000).messages
    during = [m for m in stored if m.id[1:].isdigit() and outage[0] <= int(m.id[1:]) < outage[1]]
    left = [m for m in during if (m.seq or 0) > cursor]
    slow = [(n, round(d, 1)) for n, d in enumerate(durations) if d > 2.0]
    print(f'\n{name}')
    print(f'  steps that took more than 2 s: {len(slow)} {slow[:8]}{" ..." if len(slow) > 8 else ""}')
    print(f'  time steps spent waiting in all: {sum(durations):.1f} s (max {max(durations):.1f} s)')
    print(f'  model calls during the outage: {model.calls_during_outage}')
    print(f'  tokens said during the outage still unobserved at the end: {counter.count_messages(left)}')


def _quiet_logs() -> None:
    import logging

    logging.getLogger('om_lib').setLevel(logging.ERROR)


def main() -> None:
    _quiet_logs()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, default=100)
    parser.add_argument('--outage', default='20:60', help='first:last step of the outage (last excluded)')
    parser.add_argument('--failure-s', type=float, default=3.0, help='how long a failing call takes')
    args = parser.parse_args()
    first, last = (int(x) for x in args.outage.split(':'))
    print(
        f'{args.steps} steps; Observer/Reflector down for steps {first}-{last - 1}, '
        f'each failing call {args.failure_s:g} s'
    )
    options = {'steps': args.steps, 'outage': (first, last), 'failure_s': args.failure_s}
    run('sync (bufferTokens: false)', {'bufferTokens': False}, **options)
    run('buffered (defaults)', {}, **options)


if __name__ == '__main__':
    main()
