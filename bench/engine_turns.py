"""The engine's own cost per chat turn, its model work per role, and the Actor's peak context (issue 15).

    .venv/bin/python bench/engine_turns.py [--turns 40] [--repeat 3]

One deterministic 40-turn conversation (user messages of ~120-220 tokens, assistant answers of ~250-450; o200k),
with messageTokens 600 and observationTokens 4,000, run two ways:

1. **Engine time per chat turn**, in-process: `MemoryService.chat` over the in-memory store with the real
   google-genai client talking to the loopback fake Gemini (tests/fakes/fake_gemini.py), which answers as Observer,
   Reflector and Actor. Background jobs a turn queues run right after it (their engine time counts). The time inside
   the Gemini adapter's `generate` is taken out; the adapter's own cost per call (request building, the SDK, parsing:
   its time minus the HTTP round trip in the transport) is reported on its own. Sync (`bufferTokens: false`) and
   buffered (the defaults).
2. **Model work and context**, on a simulated clock with a 1 s Observer and Reflector and one background worker (as
   in bench/buffering.py): Observer and Reflector calls with their input and output tokens, steps that waited on a
   model call, and the peak Actor context (messages + observations) as a ratio of messageTokens + observationTokens.

Goals (issue 15): engine median ≤ 3 ms per turn excluding the adapter; peak context ≤ 1.1; with buffering, no more
Observer or Reflector calls, and no more OM input or output tokens, than the reference on this conversation, with no
more steps waiting. bench/reference_compare.py measures the reference (Mastra's @mastra/memory, run offline with mock
models) on the same turns and prints both side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sim import SimWork, Wire, run_workflow  # noqa: E402
from om_lib.adapters.memory.store import InMemoryStore  # noqa: E402
from om_lib.adapters.models.gemini import GeminiLanguageModel  # noqa: E402
from om_lib.adapters.tiktoken_counter import get_tokenizer  # noqa: E402
from om_lib.clock import ManualClock, SystemClock  # noqa: E402
from om_lib.config import OMConfig  # noqa: E402
from om_lib.context.tokens import TokenCounter  # noqa: E402
from om_lib.engine.engine import MemoryEngine  # noqa: E402
from om_lib.llm import Content, ModelRequest, ModelResponse  # noqa: E402
from om_lib.messages import Message  # noqa: E402
from om_lib.models.model_router import ModelRouter  # noqa: E402
from om_lib.service import MemoryService  # noqa: E402
from om_lib.work import Job  # noqa: E402
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest  # noqa: E402

MESSAGE_TOKENS, OBSERVATION_TOKENS = 600, 4000
ACTOR_LATENCY_S = 4.0
TURN_PERIOD_S = 12.0
TOPICS = (
    'the migration of the billing service to a new region',
    'a refund policy for annual plans',
    'the on-call rota for the platform team',
    'a latency regression after the cache change',
    'the quarterly budget for the data warehouse',
    'onboarding two engineers in Lisbon',
    'the schema change for tenant isolation',
    'a customer escalation about invoices',
)
FILLER = (
    'we agreed that the owner should review the rollout plan before Friday and keep the dashboard alerts quiet '
    'while the queue drains; the team lead wants a written summary with the risks, the cost estimate and the '
    'fallback if the release branch breaks the nightly jobs again'
).split()


def words(n: int, seed: int) -> str:
    return ' '.join(FILLER[(seed * 5 + i) % len(FILLER)] for i in range(n))


def conversation(turns: int) -> list[tuple[str, str]]:
    """(user, assistant) texts: a deterministic mix of topics and lengths."""
    out = []
    for n in range(turns):
        topic = TOPICS[n % len(TOPICS)]
        user = f'About {topic}: I need your help (turn {n}). ' + words(90 + (n * 37) % 90, n)
        assistant = f'Here is a plan for {topic} (turn {n}). ' + words(190 + (n * 53) % 160, n + 3)
        out.append((user, assistant))
    return out


CONFIGS: dict[str, dict[str, Any]] = {
    'sync (bufferTokens: false)': {
        'model': 'default',
        'observation': {'messageTokens': MESSAGE_TOKENS, 'bufferTokens': False},
        'reflection': {'observationTokens': OBSERVATION_TOKENS},
    },
    'buffered (defaults)': {
        'model': 'default',
        'observation': {'messageTokens': MESSAGE_TOKENS},
        'reflection': {'observationTokens': OBSERVATION_TOKENS},
    },
}


# ---------------------------------------------------------------------------------------------------------------------
# The roles' answers (shared by the fake Gemini and the simulated model)
# ---------------------------------------------------------------------------------------------------------------------
def observer_answer(transcript: str) -> str:
    """One observation line per message: who said it and its first 30 words (about a third of the input)."""
    lines = []
    for line in transcript.split('\n'):
        if line.startswith(('User', 'Assistant')) and ': ' in line:
            who, said = line.split(': ', 1)
            lines.append(f'* 🟡 (09:00) {who.split()[0]} said: ' + ' '.join(said.split()[:30]))
    body = 'Date: Jan 1, 2025\n' + '\n'.join(lines or ['* 🟢 (09:00) Nothing notable'])
    return f'<observations>\n{body}\n</observations>\n<current-task>\nPrimary: the plan\n</current-task>'


def messages_observed(answers: list[str], turns: list[tuple[str, str]]) -> int:
    """How many of the conversation's messages some Observer answer covers (each answer line quotes a message's first
    30 words): calls compare like for like only at equal coverage."""
    seen = '\n'.join(answers)
    return sum(' '.join(text.split()[:30]) in seen for pair in turns for text in pair)


def reflector_answer(observations: str) -> str:
    """Condense: one date header, every third observation line."""
    notes = [line for line in observations.split('\n') if line.strip() and not line.startswith('Date:')]
    return '<observations>\nDate: Jan 1, 2025\n' + '\n'.join(notes[::3] or notes[:1]) + '\n</observations>'


def gemini_handler(request: FakeRequest) -> FakeReply:
    system = request.system_text
    text = '\n'.join(request.user_texts)
    if 'observation reflector' in system:
        return FakeReply.text(reflector_answer(text))
    if 'You are the memory of an AI assistant' in system:
        return FakeReply.text(observer_answer(text.split('## New Message History to Observe', 1)[-1]))
    return FakeReply.text('Understood. Here is what I suggest for the next step.')


# ---------------------------------------------------------------------------------------------------------------------
# 1. Engine time per chat turn (real google-genai client, fake Gemini)
# ---------------------------------------------------------------------------------------------------------------------
class TimedGemini(GeminiLanguageModel):
    """The Gemini adapter, timing each call (the transport's HTTP round trip is timed by `wire`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.total_s = 0.0
        self.calls = 0

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        started = time.perf_counter()
        try:
            return super().generate(model_id, request, timeout_s=timeout_s)
        finally:
            self.total_s += time.perf_counter() - started
            self.calls += 1


class InlineWork:
    """Runs each queued job right after the request that queued it (its engine time counts for that turn)."""

    def __init__(self) -> None:
        self.pending: list[Job] = []
        self.engine: MemoryEngine | None = None

    def submit(self, job: Job) -> None:
        self.pending.append(job)

    def run_all(self) -> None:
        assert self.engine is not None
        while self.pending:
            job = self.pending.pop(0)
            if job.kind == 'reflect':
                run_workflow(self.engine, job, f'bench-{id(job)}')
            else:
                self.engine.run_job(job)


def engine_time(config: dict[str, Any], turns: list[tuple[str, str]], server: FakeGemini, wire: Wire) -> dict[str, Any]:
    clock = SystemClock()
    gemini = TimedGemini(api_key='bench', base_url=server.url)
    work = InlineWork()
    engine = MemoryEngine(
        OMConfig.model_validate(config),
        store=InMemoryStore(),
        router=ModelRouter({'google': gemini}, clock=clock),
        counter=TokenCounter(get_tokenizer()),
        clock=clock,
        work=work,
    )
    work.engine = engine
    service = MemoryService(engine)
    per_turn_ms: list[float] = []
    for n, (user, _) in enumerate(turns):
        message = Message.model_validate({'id': f'u{n}', 'role': 'user', 'createdAt': clock.now(), 'content': user})
        adapter_before, wire_before = gemini.total_s, wire.total_s
        started = time.perf_counter()
        service.chat('bench', 't1', message)
        work.run_all()
        elapsed = time.perf_counter() - started
        per_turn_ms.append((elapsed - (gemini.total_s - adapter_before)) * 1000)
        del wire_before
    return {'per_turn_ms': per_turn_ms, 'adapter_s': gemini.total_s, 'calls': gemini.calls}


# ---------------------------------------------------------------------------------------------------------------------
# 2. Model work per role and the Actor's context (simulated clock, 1 s Observer and Reflector)
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class RoleWork:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    system_tokens: int = 0  # the part of input_tokens that is the role's system prompt


class SimModel:
    """Observer and Reflector with a fixed latency; the latency counts against the clock only inside a step."""

    def __init__(self, clock: ManualClock, latency_s: float, counter: TokenCounter) -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.counter = counter
        self.in_step = False
        self.step_calls = 0
        self.work: dict[str, RoleWork] = defaultdict(RoleWork)
        self.observer_answers: list[str] = []

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        if self.in_step:
            self.step_calls += 1
            self.clock.advance(self.latency_s)
        prompt = '\n'.join(p for c in request.contents for p in c.parts if isinstance(p, str))
        if request.purpose == 'reflector':
            text = reflector_answer(request.source_observations or '')
        else:
            text = observer_answer(prompt.split('## New Message History to Observe', 1)[-1])
            self.observer_answers.append(text)
        role = self.work[request.purpose]
        role.calls += 1
        system_tokens = self.counter.count_string(request.system)
        role.system_tokens += system_tokens
        role.input_tokens += system_tokens + self.counter.count_string(prompt)
        role.output_tokens += self.counter.count_string(text)
        return ModelResponse(text=text, model=model_id)


def model_work(config: dict[str, Any], turns: list[tuple[str, str]], latency: float) -> dict[str, Any]:
    clock = ManualClock()
    counter = TokenCounter(get_tokenizer())
    model = SimModel(clock, latency, counter)
    work = SimWork(clock, latency_s=latency)
    engine = MemoryEngine(
        OMConfig.model_validate(config),
        store=InMemoryStore(),
        router=ModelRouter({'google': model}, clock=clock, sleep=clock.advance),
        counter=counter,
        clock=clock,
        work=work,
        sleep=clock.advance,
    )
    work.engine = engine
    run_due = work.run_until

    waited, peak = 0, 0.0
    start = clock.monotonic()
    for n, (user, assistant) in enumerate(turns):
        run_due(start + n * TURN_PERIOD_S)
        before = model.step_calls
        model.in_step = True
        message = Message.model_validate({'id': f'u{n}', 'role': 'user', 'createdAt': clock.now(), 'content': user})
        result = engine.prepare_step('r1', 't1', [message])
        model.in_step = False
        waited += model.step_calls > before
        active = next(p for p in result.parts.to_json() if p['type'] == 'data-om-status')['data']['windows']['active']
        context = active['messages']['tokens'] + active['observations']['tokens']
        peak = max(peak, context / (MESSAGE_TOKENS + OBSERVATION_TOKENS))
        run_due(clock.monotonic() + ACTOR_LATENCY_S)
        reply = Message.model_validate(
            {'id': f'a{n}', 'role': 'assistant', 'createdAt': clock.now(), 'content': assistant}
        )
        engine.complete_turn('r1', 't1', [reply])
    run_due(clock.monotonic() + 600)
    observed = messages_observed(model.observer_answers, turns)
    return {'waited': waited, 'peak': peak, 'work': dict(model.work), 'observed': observed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--turns', type=int, default=40)
    parser.add_argument('--repeat', type=int, default=3, help='engine-time runs per mode (the best median is kept)')
    parser.add_argument('--latency', type=float, default=1.0, help='simulated Observer/Reflector latency (s)')
    args = parser.parse_args()
    turns = conversation(args.turns)
    counter = TokenCounter(get_tokenizer())
    said = sum(counter.count_string(u) + counter.count_string(a) for u, a in turns)
    print(
        f'{args.turns} turns, {said:,} tokens said; messageTokens {MESSAGE_TOKENS:,}, '
        f'observationTokens {OBSERVATION_TOKENS:,}'
    )

    print('\n1. engine time per chat turn (in-process, google-genai against the fake Gemini; adapter time excluded)')
    wire = Wire()
    wire.install_httpx2()
    with FakeGemini(gemini_handler) as server:
        # Warm up: import the SDK and open a connection once, so no mode pays for it.
        warm = GeminiLanguageModel(api_key='bench', base_url=server.url)
        warm.generate('gemini-2.5-flash', ModelRequest('actor', '', (Content('user', ('hi',)),)), timeout_s=10)
        for name, config in CONFIGS.items():
            runs = []
            for _ in range(args.repeat):
                wire_before = wire.total_s
                result = engine_time(config, turns, server, wire)
                result['wire_s'] = wire.total_s - wire_before
                runs.append(result)
            best = min(runs, key=lambda r: statistics.median(r['per_turn_ms']))
            ms = sorted(best['per_turn_ms'])
            adapter_ms = 1000 * (best['adapter_s'] - best['wire_s']) / max(1, best['calls'])
            print(
                f'  {name}: median {statistics.median(ms):.2f} ms, p90 {ms[int(len(ms) * 0.9)]:.2f} ms per turn; '
                f'adapter {adapter_ms:.2f} ms per call over {best["calls"]} calls (its time minus the HTTP round trip)'
            )

    print(f'\n2. model work and context ({args.latency:g} s Observer/Reflector, simulated clock, one worker)')
    for name, config in CONFIGS.items():
        result = model_work(config, turns, args.latency)
        obs, refl = result['work'].get('observer', RoleWork()), result['work'].get('reflector', RoleWork())
        print(
            f'  {name}: Observer {obs.calls} calls ({obs.input_tokens:,} in / {obs.output_tokens:,} out tokens), '
            f'Reflector {refl.calls} calls ({refl.input_tokens:,} in / {refl.output_tokens:,} out); '
            f'steps that waited {result["waited"]}/{args.turns}; peak context {result["peak"]:.2f} × '
            f'(messageTokens + observationTokens); messages the Observer covered {result["observed"]}/{2 * args.turns}'
        )


if __name__ == '__main__':
    main()
