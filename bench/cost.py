"""What a conversation costs on the deployed architecture, per 1,000 turns, counted from the services' own answers.

    .venv/bin/python bench/cost.py [--turns 200] [--model-latency 4] [--scenarios thread-sync ...] [--json out.json]

Each scenario runs a conversation of `--turns` turns on the local stack (the real handlers, the real workers, the
reflection state machine) with DynamoDB on dynalite, which answers `ReturnConsumedCapacity` by DynamoDB's rules
(moto's figure is a constant). A turn is what a client does per user message: `POST .../steps` with the user's
message (~150 tokens), its own Actor call (not ours: not counted), then `POST .../turns` with the answer (~400
tokens); background work is drained before the next turn, as a user's think time would let it finish.

`om_cli.metering.AwsMeter` hooks boto3's event system and counts, per function: DynamoDB read and write units (from
`ConsumedCapacity`; index writes, which dynalite leaves out, estimated from each request and shown separately), S3
requests by price class, SQS requests (sends, and the event source's receives that delivered a job and its deletes),
Lambda invocations and billed milliseconds, and every model call's tokens by purpose (o200k counts of the prompt and
the answer). Step Functions transitions come from the executions' histories, API requests from the client.

Assumptions, stated: the models run offline (deterministic, instant), so each Observer/Reflector/title call adds
`--model-latency` seconds of billed Lambda time (the function waits for Gemini) and its configured thinking budget in
output tokens (the Observer's 215, the Reflector's 1,024: an upper bound). Lambda time is this machine's, against
moto and dynalite over loopback. The sweeper's schedule, the event source's idle polling, the key, the WAF, alarms
and the dashboard cost per month, not per turn: they are listed apart. Prices: bench/prices.json (dated).

Scenarios: `thread-sync` (observation.bufferTokens false), `thread-buffered` (the defaults: async buffering on),
`resource-sync` (scope resource, 2 threads of one user taking turns; async buffering is thread scope only).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRICES = json.loads((Path(__file__).with_name('prices.json')).read_text())
FUNCTIONS = ('api', 'buffer_worker', 'reflection', 'sweeper')
SCENARIOS: dict[str, tuple[dict[str, Any], int]] = {
    'thread-sync': ({'model': 'default', 'observation': {'bufferTokens': False}}, 1),
    'thread-buffered': ({'model': 'default'}, 1),
    'resource-sync': ({'model': 'default', 'scope': 'resource'}, 2),
}
THINKING = {'observer': 215, 'reflector': 1024}
VOCAB = (
    'migration plan owner deadline budget rollout table queue region review latency cache index schema tenant '
    'invoice customer refund ticket release branch feature flag dashboard alert metric Lisbon sister cat May'
).split()
S3_PUT_CLASS = {'PutObject', 'CopyObject', 'ListObjectsV2', 'ListObjects', 'CreateMultipartUpload', 'UploadPart'}
S3_GET_CLASS = {'GetObject', 'HeadObject'}


def text(tag: str, n: int, words: int) -> str:
    """Varied, plausible text (the offline Observer writes observations from what was said)."""
    return f'{tag} {n}: ' + ' '.join(VOCAB[(n * 7 + i * 3) % len(VOCAB)] for i in range(words))


@dataclass
class Units:
    """Billable units of one scenario, totals over the run."""

    turns: int
    api_requests: int = 0
    invocations: Counter[str] = field(default_factory=Counter)
    billed_ms: Counter[str] = field(default_factory=Counter)
    model_wait_ms: Counter[str] = field(default_factory=Counter)
    read_units: float = 0.0
    write_units: float = 0.0
    index_write_units: float = 0.0
    s3_put: int = 0
    s3_get: int = 0
    sqs_requests: int = 0
    transitions: int = 0
    executions: int = 0
    model_calls: Counter[str] = field(default_factory=Counter)
    input_tokens: Counter[str] = field(default_factory=Counter)
    output_tokens: Counter[str] = field(default_factory=Counter)
    thinking_tokens: Counter[str] = field(default_factory=Counter)

    def gb_seconds(self) -> dict[str, float]:
        from infra.constants import ALL_FUNCTIONS

        memory = {spec.handler.split('.')[1]: spec.memory_mb / 1024 for spec in ALL_FUNCTIONS}
        return {
            f: (self.billed_ms[f] + self.model_wait_ms[f]) / 1000 * memory[f]
            for f in set(self.billed_ms) | set(self.model_wait_ms)
        }

    def infra_cost(self) -> dict[str, float]:
        p = PRICES['per_unit']
        requests = self.api_requests
        return {
            'API Gateway': requests * p['apigateway_rest_request'],
            'WAF': requests * p['waf_request'],
            'Lambda': sum(self.invocations.values()) * p['lambda_request']
            + sum(self.gb_seconds().values()) * p['lambda_gb_second_x86'],
            'DynamoDB': self.read_units * p['dynamodb_read_request_unit']
            + (self.write_units + self.index_write_units) * p['dynamodb_write_request_unit'],
            'S3': self.s3_put * p['s3_put_class_request'] + self.s3_get * p['s3_get_class_request'],
            'SQS': self.sqs_requests * p['sqs_fifo_request'],
            'Step Functions': self.transitions * p['stepfunctions_state_transition'],
            # X-Ray's default sampling at volume: 1 request a second plus 5 % of the rest; 5 % is the bound here.
            'X-Ray': requests * 0.05 * p['xray_trace_recorded'],
        }

    def model_cost(self) -> dict[str, float]:
        p = PRICES['per_unit']
        return {
            purpose: self.input_tokens[purpose] * p['gemini_flash_input_token']
            + (self.output_tokens[purpose] + self.thinking_tokens[purpose]) * p['gemini_flash_output_token']
            for purpose in self.model_calls
        }


# ---------------------------------------------------------------------------------------------------------------------
# The backends
# ---------------------------------------------------------------------------------------------------------------------
@contextmanager
def dynalite() -> Iterator[str | None]:
    """dynalite's endpoint (tests/tools), or None when node or dynalite is missing (moto's units are then fixed)."""
    from tests.dynalite import DYNALITE, running_dynalite
    from tests.node import find_node

    node = find_node()
    if node is None or not DYNALITE.exists():
        print(
            "dynalite is not installed (npm ci --prefix tests/tools): DynamoDB units are moto's constants", flush=True
        )
        yield None
        return
    with running_dynalite(node) as endpoint:
        yield endpoint


@contextmanager
def metered_models(meter: Any) -> Iterator[None]:
    """Count every offline model call's tokens by purpose, for the function making it."""
    from om_lib.models.offline_model import OfflineLanguageModel

    original = OfflineLanguageModel.generate

    def generate(self: Any, model_id: str, request: Any, *, timeout_s: float) -> Any:
        response = original(self, model_id, request, timeout_s=timeout_s)
        prompt = '\n'.join(
            [request.system, *(part for c in request.contents for part in c.parts if isinstance(part, str))]
        )
        meter.count_model_call(request.purpose, prompt, response.text)
        return response

    OfflineLanguageModel.generate = generate  # type: ignore[method-assign]
    try:
        yield
    finally:
        OfflineLanguageModel.generate = original  # type: ignore[method-assign]


def post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method='POST', headers={'Content-Type': 'application/json'}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def run_scenario(name: str, turns: int, model_latency_s: float, dynamo_endpoint: str | None) -> Units:
    """One conversation on a fresh local stack; the units it used."""
    import om_cli.local_stack as local_stack
    from om_cli.metering import AwsMeter

    config, threads = SCENARIOS[name]
    meter = AwsMeter()
    env = {'POWERTOOLS_LOG_LEVEL': 'ERROR', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    saved = os.environ.get('AWS_ENDPOINT_URL_DYNAMODB')
    if dynamo_endpoint:
        os.environ['AWS_ENDPOINT_URL_DYNAMODB'] = dynamo_endpoint
    names = local_stack.StackNames(
        table=f'om-cost-{name}',
        bucket=f'om-cost-{name}',
        queue=f'om-cost-{name}.fifo',
        dead_letter_queue=f'om-cost-{name}-dlq.fifo',
    )
    units = Units(turns=turns)
    try:
        with meter.metering_local_stack(), metered_models(meter):
            stack = local_stack.LocalStack(port=0, config=config, env=env, sweep_interval_s=None, names=names).start()
            try:
                meter.reset()  # the stack's own set-up is not the conversation's
                # The functions' EMF metric lines go to stdout, as in Lambda; they are not this report.
                with contextlib.redirect_stdout(io.StringIO()):
                    converse(stack, turns, threads, units)
                units.transitions, units.executions = transitions(stack)
            finally:
                stack.stop()
    finally:
        if saved is None:
            os.environ.pop('AWS_ENDPOINT_URL_DYNAMODB', None)
        else:
            os.environ['AWS_ENDPOINT_URL_DYNAMODB'] = saved
    count(meter, units, model_latency_s)
    return units


def converse(stack: Any, turns: int, threads: int, units: Units) -> None:
    base, resource = stack.url, 'user-cost'
    for turn in range(turns):
        thread = f'thread-{turn % threads}'
        post(
            base,
            f'/threads/{thread}/steps',
            {'resourceId': resource, 'messages': [{'role': 'user', 'content': text('User', turn, 110)}]},
        )
        post(
            base,
            f'/threads/{thread}/turns',
            {'resourceId': resource, 'messages': [{'role': 'assistant', 'content': text('Assistant', turn, 300)}]},
        )
        units.api_requests += 2
        stack.drain(120)


def transitions(stack: Any) -> tuple[int, int]:
    """State transitions of every reflection execution (each state entered is one), and the executions."""
    sfn = stack.client('stepfunctions')
    total = 0
    executions = stack.executions()
    for execution in executions:
        events = sfn.get_execution_history(executionArn=execution['executionArn'], maxResults=1000)['events']
        total += sum(1 for event in events if event['type'].endswith('StateEntered'))
    return total, len(executions)


def count(meter: Any, units: Units, model_latency_s: float) -> None:
    for function, n in meter.invocations.items():
        units.invocations[function] += n
        units.billed_ms[function] += meter.billed_ms[function]
    for call in meter.calls:
        ours = call.function in FUNCTIONS
        poller = call.function == 'stack:om-queue-poller'
        if not (ours or poller):
            continue
        if call.service == 'dynamodb':
            units.read_units += call.read_units
            units.write_units += call.write_units
            units.index_write_units += call.index_write_units
        elif call.service == 's3':
            units.s3_put += call.operation in S3_PUT_CLASS
            units.s3_get += call.operation in S3_GET_CLASS
        elif call.service == 'sqs':
            # The event source's empty long polls are its idle cost (per month, not per turn).
            if call.operation == 'ReceiveMessage' and not call.messages:
                continue
            units.sqs_requests += 1
    for (function, purpose), use in meter.models.items():
        units.model_calls[purpose] += use.calls
        units.input_tokens[purpose] += use.input_tokens
        units.output_tokens[purpose] += use.output_tokens
        units.thinking_tokens[purpose] += use.calls * THINKING.get(purpose, 0)
        if function in FUNCTIONS:
            units.model_wait_ms[function] += use.calls * model_latency_s * 1000


# ---------------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------------
def per_1000(value: float, turns: int) -> float:
    return value / turns * 1000


def report(results: dict[str, Units]) -> None:
    print(f'\nUnits per turn (prices as of {PRICES["as_of"]}, bench/prices.json)')
    header = f'{"":<34}' + ''.join(f'{name:>18}' for name in results)
    print(header)
    print('-' * len(header))

    def row(label: str, values: list[float], fmt: str = '{:>18.3f}') -> None:
        print(f'{label:<34}' + ''.join(fmt.format(v) for v in values))

    runs = list(results.values())
    row('API requests', [u.api_requests / u.turns for u in runs])
    for function in FUNCTIONS:
        row(f'  {function} invocations', [u.invocations[function] / u.turns for u in runs])
        row(
            f'  {function} billed ms (+model wait)',
            [(u.billed_ms[function] + u.model_wait_ms[function]) / u.turns for u in runs],
            '{:>18.1f}',
        )
    row('Lambda GB-seconds', [sum(u.gb_seconds().values()) / u.turns for u in runs], '{:>18.4f}')
    row('DynamoDB read units', [u.read_units / u.turns for u in runs])
    row('DynamoDB write units (table)', [u.write_units / u.turns for u in runs])
    row('DynamoDB write units (indexes, est.)', [u.index_write_units / u.turns for u in runs])
    row('S3 PUT-class / GET-class requests', [u.s3_put / u.turns for u in runs])
    row('', [u.s3_get / u.turns for u in runs])
    row('SQS requests', [u.sqs_requests / u.turns for u in runs])
    row('Step Functions transitions', [u.transitions / u.turns for u in runs])
    for purpose in ('observer', 'reflector', 'title'):
        row(f'{purpose} calls', [u.model_calls[purpose] / u.turns for u in runs], '{:>18.4f}')
        row(f'  {purpose} tokens in / out (+thinking)', [u.input_tokens[purpose] / u.turns for u in runs], '{:>18.1f}')
        row('', [(u.output_tokens[purpose] + u.thinking_tokens[purpose]) / u.turns for u in runs], '{:>18.1f}')

    managed = PRICES['managed_alternative']
    # A turn stores two events (the user's message and the answer) and retrieves the memory once.
    managed_per_1000 = 2 * managed['per_1000_events'] + managed['per_1000_retrievals']
    print(f'\nCost per 1,000 turns, USD (managed alternative: ${managed_per_1000:.2f} before its runtime)')
    header = f'{"":<34}' + ''.join(f'{name:>18}' for name in results)
    print(header)
    print('-' * len(header))
    services = list(runs[0].infra_cost())
    for service in services:
        row(service, [per_1000(u.infra_cost()[service], u.turns) for u in runs], '{:>18.4f}')
    infra = [per_1000(sum(u.infra_cost().values()), u.turns) for u in runs]
    model = [per_1000(sum(u.model_cost().values()), u.turns) for u in runs]
    row('infrastructure', infra, '{:>18.4f}')
    for purpose in ('observer', 'reflector', 'title'):
        row(f'model: {purpose}', [per_1000(u.model_cost().get(purpose, 0.0), u.turns) for u in runs], '{:>18.4f}')
    row('model tokens', model, '{:>18.4f}')
    row('total', [a + b for a, b in zip(infra, model, strict=True)], '{:>18.4f}')
    row('vs managed (total / managed)', [(a + b) / managed_per_1000 for a, b in zip(infra, model, strict=True)])
    p = PRICES['per_month']
    fixed = p['kms_key'] + p['secretsmanager_secret'] + p['waf_web_acl'] + 3 * p['waf_rule_or_rule_group']
    fixed += p['cloudwatch_dashboard'] + 30 * p['cloudwatch_standard_alarm_metric'] + 14 * p['cloudwatch_custom_metric']
    sweeps = 30 * 24 * 12
    print(
        f'\nPer month, whatever the traffic: key, secret, WAF (ACL + 3 rules), dashboard, ~30 alarm metrics and ~14 '
        f"custom metrics ≈ ${fixed:.2f}; the sweeper ({sweeps:,} runs) and the event source's idle long polls "
        '(≈ 2 a minute per poller) a few cents more.'
    )


# ---------------------------------------------------------------------------------------------------------------------
# Scale: where the first limit bites (docs/capacity.md explains each line)
# ---------------------------------------------------------------------------------------------------------------------
SECONDS_PER_TURN = 30  # an active thread takes a turn every 30 s (the user reads, types; the Actor answers)
API_MS_PER_REQUEST_AWS = 60  # a step or turn in Lambda: ~6 DynamoDB calls of ~5-10 ms plus the handler's own work
LIMITS = {
    # (what, per second, where it comes from)
    'waf_per_ip': (6000 / 300, 'our WAF rule: 6,000 requests per IP per 5 min, if the clients share one IP'),
    'stage': (50, 'our stage throttle: 50 requests/s, burst 100 (-c apiRateLimit)'),
    'worker_concurrency': (10, 'our event source maximum concurrency: 10 worker invocations (QUEUE_MAX_CONCURRENCY)'),
    'api_gateway_account': (10_000, 'API Gateway: 10,000 requests/s per account and region (soft)'),
    'lambda_concurrency': (1_000, 'Lambda: 1,000 concurrent executions per account and region (soft)'),
    'table_reads': (40_000, 'DynamoDB on-demand: 40,000 read request units/s per table (soft)'),
    'table_writes': (40_000, 'DynamoDB on-demand: 40,000 write request units/s per table (soft)'),
    'attention_shards': (4 * 1_000, 'GSI2 (attention): 4 shards x 1,000 WCU/s per partition (ATTENTION_SHARDS)'),
}


def capacity(units: Units, model_latency_s: float) -> list[tuple[str, float]]:
    """Per limit: how many active threads it holds, from one scenario's measured units per turn."""
    turn_rate_per_thread = 1 / SECONDS_PER_TURN

    def busy_s(function: str) -> float:  # seconds a turn keeps `function` running (its model waits included)
        return (units.billed_ms[function] + units.model_wait_ms[function]) / 1000 / units.turns

    per_turn = {
        'requests': units.api_requests / units.turns,
        'reads': units.read_units / units.turns,
        'writes': (units.write_units + units.index_write_units) / units.turns,
        'worker_s': busy_s('buffer_worker'),
        'background_s': busy_s('buffer_worker') + busy_s('reflection'),
    }
    # Each append (2 a turn) moves the thread's attention entry: 2 write units on GSI2.
    attention_writes = 2 * 2
    holds = {
        'waf_per_ip': LIMITS['waf_per_ip'][0] / per_turn['requests'],
        'stage': LIMITS['stage'][0] / per_turn['requests'],
        'api_gateway_account': LIMITS['api_gateway_account'][0] / per_turn['requests'],
        'lambda_concurrency': LIMITS['lambda_concurrency'][0]
        / (per_turn['requests'] * API_MS_PER_REQUEST_AWS / 1000 + per_turn['background_s']),
        'table_reads': LIMITS['table_reads'][0] / per_turn['reads'],
        'table_writes': LIMITS['table_writes'][0] / per_turn['writes'],
        'attention_shards': LIMITS['attention_shards'][0] / attention_writes,
    }
    if per_turn['worker_s']:
        holds['worker_concurrency'] = LIMITS['worker_concurrency'][0] / per_turn['worker_s']
    # turns/s a limit holds -> active threads at one turn per SECONDS_PER_TURN
    return sorted(((name, turns / turn_rate_per_thread) for name, turns in holds.items()), key=lambda item: item[1])


def report_capacity(results: dict[str, Units], model_latency_s: float) -> None:
    print(f'\nActive threads each limit holds (a turn every {SECONDS_PER_TURN} s per thread; docs/capacity.md)')
    for name, units in results.items():
        print(f'  {name}:')
        for limit, threads in capacity(units, model_latency_s):
            print(f'    {threads:>12,.0f}  {LIMITS[limit][1]}')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--turns', type=int, default=200)
    parser.add_argument('--model-latency', type=float, default=4.0, help='seconds a Lambda waits per model call')
    parser.add_argument('--scenarios', nargs='*', choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument('--json', help='also write the units per scenario to this file')
    parser.add_argument('--from-json', help='report from units written by --json instead of running')
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        results = {
            name: Units(**{k: Counter(v) if isinstance(v, dict) else v for k, v in data.items()})
            for name, data in saved.items()
        }
        report(results)
        report_capacity(results, args.model_latency)
        return 0
    os.environ.setdefault('AWS_DEFAULT_REGION', 'us-east-1')
    for name in ('AWS_ENDPOINT_URL', 'GEMINI_API_KEY', 'GOOGLE_API_KEY', 'OM_CONFIG_FILE'):
        os.environ.pop(name, None)
    results: dict[str, Units] = {}
    with dynalite() as endpoint:
        for name in args.scenarios:
            t0 = time.perf_counter()
            results[name] = run_scenario(name, args.turns, args.model_latency, endpoint)
            print(f'{name}: {args.turns} turns in {time.perf_counter() - t0:.0f} s', flush=True)
    report(results)
    report_capacity(results, args.model_latency)
    if args.json:
        data = {
            name: {k: (dict(v) if isinstance(v, Counter) else v) for k, v in vars(u).items()}
            for name, u in results.items()
        }
        Path(args.json).write_text(json.dumps(data, indent=1))
    print(f'\n(bench took {time.perf_counter() - started:.0f} s)')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
