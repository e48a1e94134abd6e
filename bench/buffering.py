"""Async buffering: how often a step waits on a model call, and the context the Actor carries, over a long conversation.

    .venv/bin/python bench/buffering.py [--steps 200] [--observer-latency 3] [--turn-period 12] [--plot out.svg]

A 200-step conversation (a user message of ~150 tokens, an assistant answer of ~400) runs through a real
`MemoryEngine` over the in-memory store and o200k token counting, three times: with async buffering (the defaults'
ratios, bufferTokens 0.2, bufferActivation 0.8, blockAfter 1.2, reflection.bufferActivation 0.5); with `bufferTokens:
false` and the work queue (a turn that crosses the threshold queues a full observation); and with `bufferTokens: false`
and no queue (the library without AWS: the step observes and reflects itself). Thresholds are scaled down
(messageTokens 6,000, observationTokens 4,000) so the run crosses them many times.

Time is simulated, not slept: a fake clock, a scripted Observer/Reflector whose every call takes `--observer-latency`
seconds, and a single background worker (the SQS consumer of the thread's FIFO group) that runs queued jobs one at a
time, each finishing one model latency after it starts. A turn is a step, the Actor's answer (4 s), `complete_turn`,
then the user's next message after the rest of `--turn-period`. A step "waited" when it made a model call itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
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
from om_lib.llm import ModelRequest, ModelResponse  # noqa: E402
from om_lib.messages import Message  # noqa: E402
from om_lib.models.model_router import ModelRouter  # noqa: E402

ACTOR_LATENCY_S = 4.0
VOCAB = (
    'migration plan owner deadline budget rollout table queue region review latency cache index schema tenant '
    'invoice customer refund ticket release branch feature flag dashboard alert metric'
).split()


def text(tag: str, n: int, words: int) -> str:
    return f'{tag} {n}: ' + ' '.join(VOCAB[(n * 7 + i) % len(VOCAB)] for i in range(words))


class SimModel:
    """Observer and Reflector with a fixed latency; the latency counts against the clock only inside a step."""

    def __init__(self, clock: ManualClock, latency_s: float) -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.in_step = False
        self.step_calls = 0
        self.calls = 0

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        self.calls += 1
        if self.in_step:
            self.step_calls += 1
            self.clock.advance(self.latency_s)
        if request.purpose == 'reflector':
            # Condense: one date header, every third observation line.
            lines = [line for line in (request.source_observations or '').split('\n') if line.strip()]
            notes = [line for line in lines if not line.startswith('Date:')]
            kept = ['Date: Jan 1, 2025', *notes[::3]]
            return ModelResponse(text='<observations>\n' + '\n'.join(kept) + '\n</observations>', model=model_id)
        messages = request.source_messages or ()
        lines = [
            f'* 🟡 (09:00) {m.role} said: ' + ' '.join(m.text().split()[:18]) for m in messages if m.text().strip()
        ]
        body = 'Date: Jan 1, 2025\n' + '\n'.join(lines)
        return ModelResponse(
            text=f'<observations>\n{body}\n</observations>\n<current-task>\nPrimary: the plan\n</current-task>',
            model=model_id,
        )


@dataclass
class Figures:
    name: str
    waited: int = 0
    steps: int = 0
    window: list[int] = field(default_factory=list)
    observations: list[int] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)
    model_calls: int = 0
    jobs: int = 0
    record_writes: int = 0  # OM-record writes made inside steps (each one a conditional DynamoDB write in AWS)


def run(
    name: str, observation: dict[str, Any], *, steps: int, latency: float, period: float, queue: bool = True
) -> Figures:
    clock = ManualClock()
    store = InMemoryStore()
    in_step = [False]
    figures = Figures(name)
    real_put, real_put_generation = store.put_record, store.put_generation

    def counted(put):  # noqa: ANN001, ANN202 - wraps the store's two record writes
        def write(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            figures.record_writes += in_step[0]
            return put(*args, **kwargs)

        return write

    store.put_record, store.put_generation = counted(real_put), counted(real_put_generation)
    model = SimModel(clock, latency)
    work = SimWork(clock, latency_s=latency)
    router = ModelRouter({'google': model}, clock=clock, sleep=clock.advance)
    engine = MemoryEngine(
        OMConfig.model_validate(
            {
                'model': 'default',
                'observation': {'messageTokens': 6000, **observation},
                'reflection': {'observationTokens': 4000},
            }
        ),
        store=store,
        router=router,
        counter=TokenCounter(get_tokenizer()),
        clock=clock,
        work=work if queue else None,
        time_budget_s=20.0,
    )
    work.engine = engine
    start = clock.monotonic()
    run_due = work.run_until

    for n in range(steps):
        run_due(start + n * period)
        before = model.step_calls
        model.in_step = in_step[0] = True
        user = Message.model_validate(
            {'id': f'u{n}', 'role': 'user', 'createdAt': clock.now().isoformat(), 'content': text('user', n, 110)}
        )
        result = engine.prepare_step('r1', 't1', [user], step_number=0)
        model.in_step = in_step[0] = False
        figures.steps += 1
        if model.step_calls > before:
            figures.waited += 1
        status = next(p for p in result.parts.to_json() if p['type'] == 'data-om-status')['data']['windows']['active']
        figures.window.append(status['messages']['tokens'])
        figures.observations.append(status['observations']['tokens'])
        for part in result.parts.to_json():
            figures.parts[part['type']] = figures.parts.get(part['type'], 0) + 1
        run_due(clock.monotonic() + ACTOR_LATENCY_S)
        reply = Message.model_validate(
            {
                'id': f'a{n}',
                'role': 'assistant',
                'createdAt': clock.now().isoformat(),
                'content': text('assistant', n, 300),
            }
        )
        engine.complete_turn('r1', 't1', [reply])
    run_due(clock.monotonic() + 600)
    figures.model_calls = model.calls
    figures.jobs = work.jobs
    return figures


def report(f: Figures) -> None:
    window = sorted(f.window)
    obs = sorted(f.observations)
    print(f'\n{f.name}')
    print(f'  steps that waited on a model call: {f.waited}/{f.steps} = {100 * f.waited / f.steps:.1f} %')
    print(
        f'  message-window tokens per step: mean {statistics.mean(window):,.0f}, p50 {window[len(window) // 2]:,}, '
        f'p95 {window[int(len(window) * 0.95)]:,}, max {window[-1]:,}'
    )
    print(
        f'  observation tokens per step:    mean {statistics.mean(obs):,.0f}, p50 {obs[len(obs) // 2]:,}, '
        f'max {obs[-1]:,}'
    )
    interesting = ('data-om-activation', 'data-om-buffering-start', 'data-om-observation-end')
    print(
        '  parts in step answers: '
        + ', '.join(f'{k.removeprefix("data-om-")} {f.parts.get(k, 0)}' for k in interesting)
    )
    print(f'  model calls in all: {f.model_calls}; background jobs: {f.jobs}')
    print(f'  OM-record writes inside steps: {f.record_writes} ({f.record_writes / f.steps:.2f} per step)')


def write_plot(path: Path, runs: list[Figures]) -> None:
    """An SVG (no plotting library): message-window and observation tokens per step, one panel per run."""
    width, panel, pad = 900, 220, 40
    top = max(max(f.window + f.observations) for f in runs) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{panel * len(runs)}" font-size="12">']
    for i, figures in enumerate(runs):
        y0 = i * panel
        plot_w, plot_h = width - 2 * pad, panel - 2 * pad

        def points(values: list[int], y0: int = y0, plot_w: int = plot_w, plot_h: int = plot_h) -> str:
            step = plot_w / max(1, len(values) - 1)
            return ' '.join(
                f'{pad + k * step:.1f},{y0 + pad + plot_h * (1 - v / top):.1f}' for k, v in enumerate(values)
            )

        out.append(
            f'<text x="{pad}" y="{y0 + pad - 12}">{figures.name} — waited {figures.waited}/{figures.steps}</text>'
        )
        out.append(
            f'<rect x="{pad}" y="{y0 + pad}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>'
            f'<text x="2" y="{y0 + pad + 10}">{top:,}</text><text x="2" y="{y0 + pad + plot_h}">0</text>'
        )
        out.append(f'<polyline fill="none" stroke="#1f77b4" points="{points(figures.window)}"/>')
        out.append(f'<polyline fill="none" stroke="#d62728" points="{points(figures.observations)}"/>')
    out.append(
        f'<text x="{width - 330}" y="14" fill="#1f77b4">message-window tokens</text>'
        f'<text x="{width - 160}" y="14" fill="#d62728">observation tokens</text></svg>'
    )
    path.write_text('\n'.join(out), encoding='utf-8')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, default=200)
    parser.add_argument('--observer-latency', type=float, default=3.0)
    parser.add_argument('--turn-period', type=float, default=12.0)
    parser.add_argument('--plot', type=Path, help='also write an SVG of the tokens per step to this file')
    args = parser.parse_args()
    print(
        f'{args.steps} steps, Observer/Reflector latency {args.observer_latency:g} s (simulated), '
        f'a turn every {args.turn_period:g} s; messageTokens 6,000, observationTokens 4,000'
    )
    options = {'steps': args.steps, 'latency': args.observer_latency, 'period': args.turn_period}
    buffered = run('async buffering (bufferTokens 0.2, bufferActivation 0.8, blockAfter 1.2)', {}, **options)
    sync = run('bufferTokens: false, observation queued at the end of the turn', {'bufferTokens': False}, **options)
    inline = run(
        'bufferTokens: false, no work queue (observation inside the step)',
        {'bufferTokens': False},
        queue=False,
        **options,
    )
    report(buffered)
    report(sync)
    report(inline)
    if args.plot is not None:
        write_plot(args.plot, [buffered, sync, inline])
        print(f'\nplot: {args.plot}')
    goal = 'met' if 100 * buffered.waited / buffered.steps <= 5 else 'NOT met'
    print(f'\ngoal (≤ 5 % of steps wait on a model call with buffering): {goal}')


if __name__ == '__main__':
    main()
