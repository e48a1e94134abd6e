"""Cold start of each Lambda function (init + its first request) next to the unavoidable floor, and the asset size.

    .venv/bin/python bench/cold_start.py [--runs 5] [--model gemini|offline] [--init-type on-demand|snap-start]
                                         [--functions api ...] [--importtime] [--no-asset]

Every measurement runs in a FRESH Python process (nothing imported, nothing cached but the `.pyc` files), pointed at
one moto server the parent starts once (`ThreadedMotoServer` on a free port: table, bucket, FIFO queue, the Gemini
secret). For each function the child process

- imports `functions.<function>.handler` with `AWS_LAMBDA_FUNCTION_NAME` set: the Lambda init phase, including
  whatever setup the handler module does at import (`_wiring.init()`);
- calls `lambda_handler` once with the function's sample event (events/<function>/*.json), adapted to data the
  parent seeded for that run so the request does real work: the API saves a step in a thread with a few messages,
  the buffer worker observes a 4-turn backlog, the reflection `check` takes the lease on a record over the reflection
  threshold, the sweeper finds one quiet thread and queues its job.

Each function's floor is what the issue names as what it cannot avoid, in a fresh process too: `import boto3`, the
clients it uses (from its `FunctionAccess` in infra/constants.py: DynamoDB, and S3, SQS, Step Functions, Secrets
Manager as it needs them), one GetItem against the same server, the o200k tokenizer (`tiktoken_counter.preload()`),
and for the functions that call a model the model client (`import google.genai` and a `genai.Client`). The sweeper
never counts a token, so it is also shown against a strict floor without the tokenizer. The goal is
init + first request ≤ 1.3 × the function's floor. Times are in-process `perf_counter` spans (the bare interpreter
start, ~20 ms, is in neither number); each case runs once untimed first (so `.pyc` files exist, as they should in the
asset), then `--runs` times, in rounds of every floor + every function (so a change in the machine's load hits both
sides of the ratio); the table shows each case's fastest run (`--stat median` for medians): on a machine shared
with other work the minimum is the steadiest estimate of the uncontended cost, for functions and floors alike. The
last column is the ratio to the old common floor (boto3 + DynamoDB client + GetItem + tokenizer), for comparison
with earlier figures.

Tracing is on, as deployed (`--tracing off` to compare): the children see a Lambda-like environment for X-Ray
(`LAMBDA_TASK_ROOT`, a trace header, a daemon address on a local UDP socket that swallows the segments), so the
Powertools Tracer really imports the X-Ray SDK and patches botocore and httpx, and its cost is in the figures.

`--model gemini` (default) runs the deployed configuration: the Gemini key comes from a Secrets Manager secret
(`OM_GEMINI_SECRET_ARN`, in moto) and the model is a loopback fake of the Gemini REST API
(tests/fakes/fake_gemini.py) driven through the real google-genai client. `--model offline` uses the built-in
offline model instead (`OM_OFFLINE_FALLBACK=1`, google-genai never imported).

`--importtime` also runs each function's init once under `-X importtime` and prints its most expensive imports.

The asset size is that of the full Lambda asset `infra/asset_builder.py` builds (wheels + source + tokenizer file;
all four functions deploy the same asset), unzipped and as a deflate zip (what the CDK uploads).

Caveats: this machine's Python is the venv's (the runtime is 3.12; the asset's cp312 wheels cannot be imported
here, so the children import from the repository and the venv); Lambda at 1024 MB has ~0.6 vCPU, so absolute times
there are higher; the ratio is the number to watch.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL = 1.3
REGION = 'us-east-1'
TABLE, BUCKET, QUEUE, SECRET = 'om-bench-memory', 'om-bench-blobs', 'om-bench-work.fifo', 'om-bench-gemini-key'
STATE_MACHINE_ARN = f'arn:aws:states:{REGION}:123456789012:stateMachine:om-bench-reflection'
FUNCTIONS = ('api', 'buffer_worker', 'reflection', 'sweeper')
API_RESOURCE, WORKER_RESOURCE = 'user-42', 'user-123'
# Small thresholds for the workers (as in tests/integration/test_workers.py): a 4-turn backlog is a real observation,
# a few observations are due for reflection. The API runs the default config, so its step is the common steady state.
WORKER_CONFIG = {
    'model': 'default',
    'observation': {'messageTokens': 120, 'bufferTokens': False},
    'reflection': {'observationTokens': 150},
}
FAKE_CREDENTIALS = {
    'AWS_ACCESS_KEY_ID': 'testing',
    'AWS_SECRET_ACCESS_KEY': 'testing',
    'AWS_SESSION_TOKEN': 'testing',
}
MARK = 'BENCH-RESULT '

# The child: read the event, then time the handler import (Lambda init) and the first invocation.
CHILD = r"""
import json, os, sys, time
event = json.loads(os.environ.pop('BENCH_EVENT'))
class Context:
    function_name = os.environ['AWS_LAMBDA_FUNCTION_NAME']
    function_version = '$LATEST'
    invoked_function_arn = 'arn:aws:lambda:us-east-1:123456789012:function:' + function_name
    memory_limit_in_mb = 1024
    aws_request_id = '5f0c4f3e-0000-4000-8000-000000000001'
    log_group_name = '/aws/lambda/' + function_name
    log_stream_name = 'bench'
    def get_remaining_time_in_millis(self):
        return 60_000
t0 = time.perf_counter()
import importlib
handler = importlib.import_module(sys.argv[1])
t1 = time.perf_counter()
result = handler.lambda_handler(event, Context())
t2 = time.perf_counter()
print('BENCH-RESULT ' + json.dumps({'init': t1 - t0, 'first': t2 - t1, 'result': result}, default=str), flush=True)
"""

# A floor: what a function cannot avoid (argv[1]: its clients, whether it counts tokens and calls a model).
FLOOR = r"""
import json, os, sys, time
spec = json.loads(sys.argv[1])
t0 = time.perf_counter()
import boto3
clients = {name: boto3.client(name) for name in spec['clients']}
key = {'PK': {'S': 'THREAD#none'}, 'SK': {'S': 'THREAD'}}
clients['dynamodb'].get_item(TableName=os.environ['OM_TABLE_NAME'], Key=key)
if spec['tokenizer']:
    from om_lib.adapters.tiktoken_counter import preload
    preload()
if spec['model']:
    from google import genai
    from google.genai import types
    genai.Client(api_key='floor', http_options=types.HttpOptions(base_url=os.environ.get('GOOGLE_GEMINI_BASE_URL')))
t1 = time.perf_counter()
print('BENCH-RESULT {"init": %f, "first": 0.0, "result": null}' % (t1 - t0), flush=True)
"""
OLD_FLOOR_SPEC = {'clients': ['dynamodb'], 'tokenizer': True, 'model': False}


def floor_spec(function: str) -> dict[str, Any]:
    """What `function`'s floor includes, from its FunctionAccess (what its role lets it call)."""
    from infra.constants import ALL_FUNCTIONS

    (spec,) = [s for s in ALL_FUNCTIONS if s.handler == f'functions.{function}.handler.lambda_handler']
    access = spec.access
    clients = ['dynamodb']
    clients += ['s3'] if access.object_actions else []
    clients += ['sqs'] if access.sends_jobs else []
    clients += ['stepfunctions'] if access.starts_reflections else []
    clients += ['secretsmanager'] if access.model_roles else []
    return {'clients': clients, 'tokenizer': True, 'model': bool(access.model_roles)}


def strict_floor_spec(function: str) -> dict[str, Any] | None:
    """The floor without the tokenizer, for a function that never counts tokens (None for the others)."""
    spec = floor_spec(function)
    return None if spec['model'] else {**spec, 'tokenizer': False}


# The Gemini fake's answer to every call: a well-formed observation block, so the worker's job completes.
FAKE_OBSERVATIONS = (
    '<observations>\n'
    'Date: Mar 3, 2025\n'
    '* 🔴 (09:00) User said their sister Maya moves to Lisbon in May with her cat Olive.\n'
    '</observations>'
)


@dataclass
class Case:
    """One row of the table: a function (or the floor) and its timings."""

    name: str
    init: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def total(self) -> list[float]:
        return [a + b for a, b in zip(self.init, self.first, strict=True)]


def load_event(function: str, scenario: str) -> dict[str, Any]:
    return json.loads((ROOT / 'events' / function / f'{scenario}.json').read_text())


# ---------------------------------------------------------------------------------------------------------------------
# The shared backend: moto (and the Gemini fake), started once by this process
# ---------------------------------------------------------------------------------------------------------------------
@contextmanager
def backend(model: str, tracing: bool = True) -> Iterator[dict[str, str]]:
    """Start moto (and the Gemini fake), create the resources; yield the environment every child gets."""
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    logging.getLogger('werkzeug').setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)
    server.start()
    fake = None
    # The X-Ray daemon's stand-in: a UDP socket nobody reads (segments are fire-and-forget datagrams).
    daemon = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    daemon.bind(('127.0.0.1', 0))
    try:
        host, port = server.get_host_and_port()
        endpoint = f'http://{host}:{port}'
        base = {
            **FAKE_CREDENTIALS,
            'AWS_DEFAULT_REGION': REGION,
            'AWS_REGION': REGION,
            'AWS_ENDPOINT_URL': endpoint,
            'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
            'OM_TABLE_NAME': TABLE,
            'OM_BUCKET_NAME': BUCKET,
            'OM_REFLECTION_STATE_MACHINE_ARN': STATE_MACHINE_ARN,
            'OM_AUTH_MODE': 'iam',
            'POWERTOOLS_METRICS_NAMESPACE': 'ObservationalMemory',
        }
        os.environ.update(base)
        for name in ('AWS_PROFILE', 'OM_CONFIG_FILE', 'GEMINI_API_KEY', 'GOOGLE_API_KEY', 'GOOGLE_GEMINI_BASE_URL'):
            os.environ.pop(name, None)
        base['OM_WORK_QUEUE_URL'] = create_resources()
        from om_lib.adapters.tiktoken_counter import prepare_cache_dir

        # As deployed: TIKTOKEN_CACHE_DIR names a folder that already holds the verified encoding file.
        base['TIKTOKEN_CACHE_DIR'] = str(prepare_cache_dir())
        if model == 'gemini':
            from tests.fakes.fake_gemini import FakeGemini, FakeReply

            fake = FakeGemini(lambda request: FakeReply.text(FAKE_OBSERVATIONS)).start()
            base['GOOGLE_GEMINI_BASE_URL'] = fake.url
            base['OM_GEMINI_SECRET_ARN'] = create_secret()
        else:
            base['OM_OFFLINE_FALLBACK'] = '1'
        if tracing:
            # What the Lambda runtime gives a traced function: Powertools traces only where LAMBDA_TASK_ROOT is set.
            base['LAMBDA_TASK_ROOT'] = str(ROOT)
            base['AWS_XRAY_DAEMON_ADDRESS'] = f'127.0.0.1:{daemon.getsockname()[1]}'
            base['_X_AMZN_TRACE_ID'] = 'Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1'
            base['AWS_XRAY_CONTEXT_MISSING'] = 'LOG_ERROR'
        else:
            base['POWERTOOLS_TRACE_DISABLED'] = '1'
        yield base
    finally:
        if fake is not None:
            fake.stop()
        daemon.close()
        server.stop()


def create_resources() -> str:
    import boto3

    from om_lib.adapters.aws.dynamodb.schema import create_table

    create_table(boto3.client('dynamodb'), TABLE)
    boto3.client('s3').create_bucket(Bucket=BUCKET)
    sqs = boto3.client('sqs')
    return sqs.create_queue(QueueName=QUEUE, Attributes={'FifoQueue': 'true', 'ContentBasedDeduplication': 'true'})[
        'QueueUrl'
    ]


def create_secret() -> str:
    import boto3

    return boto3.client('secretsmanager').create_secret(Name=SECRET, SecretString='bench-key')['ARN']


# ---------------------------------------------------------------------------------------------------------------------
# Seeding (in this process, with the offline model): one fresh thread per run, so every run does the same work
# ---------------------------------------------------------------------------------------------------------------------
class Seeder:
    """Writes the data each run's first request works on, through the real engine over the moto server."""

    def __init__(self, env: dict[str, str]) -> None:
        from functions import _wiring

        os.environ.update({k: v for k, v in env.items() if k not in ('OM_GEMINI_SECRET_ARN', 'GOOGLE_GEMINI_BASE_URL')})
        os.environ['OM_OFFLINE_FALLBACK'] = '1'
        os.environ['OM_CONFIG'] = json.dumps(WORKER_CONFIG)
        _wiring.reset()
        self.engine = _wiring.engine()
        self._sweeper_seeded = False

    def conversation(self, resource: str, thread: str, turns: int, *, ago: timedelta = timedelta(0)) -> None:
        from om_lib.messages import Message

        counter, now = self.engine.counter, self.engine.clock.now() - ago
        for step in range(turns):
            at = (datetime(2025, 3, 3, 9, step, tzinfo=UTC)).isoformat()
            said = [
                ('user', f'Note {step}: my sister Maya moves to Lisbon on May {step + 1} with her cat Olive.'),
                ('assistant', f'Got it, Maya moves to Lisbon on May {step + 1}; Olive goes too.'),
            ]
            messages = [
                counter.with_token_counts(
                    Message.model_validate({'id': f'{role[0]}{step}', 'role': role, 'createdAt': at, 'content': text})
                )
                for role, text in said
            ]
            self.engine.store.append_messages(resource, thread, messages, now=now)

    def event(self, function: str, run: int) -> dict[str, Any]:
        """The function's sample event for run `run`, pointing at data seeded for it."""
        thread = f'bench-{function.replace("_", "-")}-{run}'
        key = f'thread:{WORKER_RESOURCE}/{thread}'
        if function == 'api':
            self.conversation(API_RESOURCE, thread, 2)
            event = load_event('api', 'steps_basic')
            event['path'] = f'/threads/{thread}/steps'
            event['requestContext']['path'] = f'/prod/threads/{thread}/steps'
            event['pathParameters'] = {'threadId': thread}
            body = json.loads(event['body'])
            assert body['resourceId'] == API_RESOURCE
            return event
        if function == 'buffer_worker':
            self.conversation(WORKER_RESOURCE, thread, 4)
            event = load_event('buffer_worker', 'sqs_batch')
            record = event['Records'][0]
            body = json.loads(record['body'])
            body.update(resourceId=WORKER_RESOURCE, threadId=thread, recordKey=key)
            record['body'] = json.dumps(body)
            record['attributes']['MessageGroupId'] = key
            return event
        if function == 'reflection':
            self.grow_observations(thread, key)
            event = copy.deepcopy(load_event('reflection', 'check'))
            event['job'].update(resourceId=WORKER_RESOURCE, threadId=thread, recordKey=key)
            event['owner'] = f'reflect-bench-{run}'
            return event
        if function == 'sweeper':
            # One thread, quiet for an hour with unobserved messages: every run finds it and queues its job.
            if not self._sweeper_seeded:
                self.conversation(WORKER_RESOURCE, 'bench-sweeper', 3, ago=timedelta(hours=1))
                self._sweeper_seeded = True
            return load_event('sweeper', 'schedule')
        raise ValueError(function)

    def grow_observations(self, thread: str, key: str) -> None:
        threshold = WORKER_CONFIG['reflection']['observationTokens']
        for round_ in range(8):
            self.conversation(WORKER_RESOURCE, thread, 4 + 4 * round_)
            self.engine.observe_now(WORKER_RESOURCE, thread, reflect=False)
            record = self.engine.store.get_record(key)
            if record is not None and record.observation_tokens > threshold:
                return
        raise RuntimeError('seeding: observations never passed the reflection threshold')


def check(function: str, result: Any) -> str:
    """Did the first request do its real work? ('ok', or what went wrong.)"""
    if function == 'api':
        ok = isinstance(result, dict) and result.get('statusCode') == 200
    elif function == 'buffer_worker':
        ok = result == {'batchItemFailures': []}
    elif function == 'reflection':
        ok = isinstance(result, dict) and result.get('due') is True
    else:
        ok = isinstance(result, dict) and (result.get('submitted') or 0) >= 1
    return 'ok' if ok else f'unexpected result {str(result)[:200]}'


# ---------------------------------------------------------------------------------------------------------------------
# Children
# ---------------------------------------------------------------------------------------------------------------------
def child_env(base: dict[str, str], function: str | None, init_type: str = 'on-demand') -> dict[str, str]:
    prefixes = ('AWS_', 'OM_', 'GEMINI', 'GOOGLE', 'POWERTOOLS', 'LAMBDA_', '_X_AMZN')
    keep = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env = {**keep, **base}
    env.pop('OM_CONFIG', None)
    env['PYTHONPATH'] = str(ROOT)
    if function is not None:
        env['AWS_LAMBDA_FUNCTION_NAME'] = f'om-bench-{function.replace("_", "-")}'
        env['AWS_LAMBDA_INITIALIZATION_TYPE'] = init_type
        env['POWERTOOLS_SERVICE_NAME'] = f'om-{function.replace("_", "-")}'
        if function != 'api':
            env['OM_CONFIG'] = json.dumps(WORKER_CONFIG)
    return env


def run_child(code: str, env: dict[str, str], *args: str, importtime: bool = False) -> tuple[dict[str, Any], str]:
    command = [sys.executable, *(['-X', 'importtime'] if importtime else []), '-c', code, *args]
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f'child {args or "floor"} failed ({proc.returncode}):\n{proc.stderr[-3000:]}')
    return json.loads(lines[-1][len(MARK) :]), proc.stderr


def measure_once(case: Case, base: dict[str, str], seeder: Seeder, run: int, init_type: str) -> None:
    """One fresh process for `case` (a function, or a floor); run 0 is untimed (it compiles any stale .pyc)."""
    if case.name.startswith(('floor:', 'strict:')):
        kind, function = case.name.split(':', 1)
        spec = OLD_FLOOR_SPEC if function == 'old' else floor_spec(function)
        if kind == 'strict':
            spec = strict_floor_spec(function)
        out, _ = run_child(FLOOR, child_env(base, None), json.dumps(spec))
    else:
        env = child_env(base, case.name, init_type)
        env['BENCH_EVENT'] = json.dumps(seeder.event(case.name, run + (100 if init_type == 'snap-start' else 0)))
        out, _ = run_child(CHILD, env, f'functions.{case.name}.handler')
        if run:
            case.checks.append(check(case.name, out['result']))
    if run:
        case.init.append(out['init'])
        case.first.append(out['first'])


def measure(functions: list[str], base: dict[str, str], seeder: Seeder, runs: int, init_type: str) -> dict[str, Case]:
    """Rounds of every floor + every function, so a change in the machine's load hits floors and functions alike."""
    strict = [f'strict:{f}' for f in functions if strict_floor_spec(f) is not None]
    names = ['floor:old', *(f'floor:{f}' for f in functions), *strict, *functions]
    cases = {name: Case(name) for name in names}
    for run in range(runs + 1):
        for case in cases.values():
            measure_once(case, base, seeder, run, init_type)
    return cases


_IMPORTTIME = re.compile(r'^import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S.*)$')


def import_profile(function: str, base: dict[str, str], seeder: Seeder, top: int = 12) -> None:
    """One init under `-X importtime`: the top-level packages by cumulative time, and the slowest modules by self."""
    env = child_env(base, function)
    env['BENCH_EVENT'] = json.dumps(seeder.event(function, 1000))
    _, stderr = run_child(CHILD, env, f'functions.{function}.handler', importtime=True)
    rows = []
    for line in stderr.splitlines():
        m = _IMPORTTIME.match(line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), (len(m.group(3)) - 1) // 2, m.group(4)))
    roots = sorted((r for r in rows if r[2] == 0), key=lambda r: -r[1])[:top]
    selfs = sorted(rows, key=lambda r: -r[0])[:top]
    print(f'\n-X importtime, {function} (whole process: init and first request):')
    print('  top-level imports by cumulative ms: ' + ', '.join(f'{r[3]} {r[1] / 1000:.0f}' for r in roots))
    print('  slowest modules by self ms:         ' + ', '.join(f'{r[3]} {r[0] / 1000:.0f}' for r in selfs))


# ---------------------------------------------------------------------------------------------------------------------
# Asset size
# ---------------------------------------------------------------------------------------------------------------------
def asset_sizes() -> list[str]:
    from infra.asset_builder import AssetBuildError, build_lambda_asset

    started = time.perf_counter()
    try:
        asset = build_lambda_asset('full')
    except (AssetBuildError, OSError, subprocess.SubprocessError) as exc:
        return [f'full asset: could not build it (the wheels come from the package registry): {exc}'.strip()]
    files = sorted(p for p in asset.path.rglob('*') if p.is_file())
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / 'asset.zip'
        with zipfile.ZipFile(target, 'w', compression=zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, path.relative_to(asset.path).as_posix())
        zipped = target.stat().st_size
    manifest = json.loads((asset.path / 'om_asset.json').read_text())
    source = sum(p.stat().st_size for p in files if p.relative_to(asset.path).parts[0] in ('om_lib', 'functions'))
    tokenizer = sum(p.stat().st_size for p in files if p.relative_to(asset.path).parts[0] == 'tiktoken_cache')
    state = 'reused' if asset.reused else 'built'
    return [
        f'full Lambda asset ({state} in {time.perf_counter() - started:.1f} s): {asset.path.relative_to(ROOT)}',
        f'  unzipped {asset.size_bytes:,} bytes ({asset.size_mb:.1f} MB; Lambda limit 250 MB), {len(files):,} files,'
        f' .pyc shipped: {manifest.get("pyc")}',
        f'  zipped (deflate) {zipped:,} bytes ({zipped / 1e6:.1f} MB; direct-upload limit 50 MB)',
        f'  of which our source (om_lib/, functions/) {source:,} bytes, tokenizer file {tokenizer:,} bytes',
        '  per function: api, buffer_worker, reflection and sweeper all deploy this one asset (same size each;'
        ' uploaded once)',
    ]


# ---------------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--runs', type=int, default=5, help='timed runs per case (median); one untimed run before')
    parser.add_argument('--model', choices=('gemini', 'offline'), default='gemini')
    parser.add_argument('--functions', nargs='*', choices=FUNCTIONS, default=list(FUNCTIONS))
    parser.add_argument(
        '--init-type',
        choices=('on-demand', 'snap-start'),
        default='on-demand',
        help='AWS_LAMBDA_INITIALIZATION_TYPE the children see: snap-start warms everything at init (what SnapStart'
        ' snapshots), so "first req s" is then the request path after a restore',
    )
    parser.add_argument('--importtime', action='store_true', help='profile each init with -X importtime')
    parser.add_argument('--no-asset', action='store_true', help='skip building/measuring the Lambda asset')
    parser.add_argument('--tracing', choices=('on', 'off'), default='on', help='X-Ray tracing as deployed (on)')
    parser.add_argument(
        '--stat',
        choices=('min', 'median'),
        default='min',
        help='per case: the fastest run (default; the uncontended cost on a shared machine) or the median',
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()

    with backend(args.model, tracing=args.tracing == 'on') as base:
        seeder = Seeder(base)
        cases = measure(args.functions, base, seeder, args.runs, args.init_type)
        if args.importtime:
            for function in args.functions:
                import_profile(function, base, seeder)

    stat = min if args.stat == 'min' else statistics.median
    old_floor_s = stat(cases['floor:old'].init)
    print(
        f'\nCold start, fresh process per run, {args.stat} of {args.runs} (moto server; model: {args.model};'
        f' init type: {args.init_type}; tracing {args.tracing}; Python {sys.version.split()[0]})'
    )
    header = (
        f'{"function":<14} {"init s":>7} {"first req s":>11} {"total s":>8} {"floor s":>8} {"ratio":>6}  goal ≤ 1.3×'
        f'  {"vs old floor":>12}  floor = boto3 + clients + GetItem + tokenizer (+ model client)'
    )
    print(header)
    print('-' * len(header))
    for function in args.functions:
        case, floor = cases[function], cases[f'floor:{function}']
        init, first, total = (stat(v) for v in (case.init, case.first, case.total))
        floor_s = stat(floor.init)
        ratio = total / floor_s
        verdict = 'met   ' if ratio <= GOAL else 'MISSED'
        bad = [c for c in case.checks if c != 'ok']
        note = f'  (first request: {bad[0]})' if bad else ''
        spec = floor_spec(function)
        parts = ', '.join(spec['clients']) + ' + tokenizer' + (' + model client' if spec['model'] else '')
        print(
            f'{function:<14} {init:7.3f} {first:11.3f} {total:8.3f} {floor_s:8.3f} {ratio:6.2f}  {verdict}      '
            f'{total / old_floor_s:12.2f}  {parts}{note}'
        )
    print(f'old common floor (boto3 + DynamoDB client + GetItem + tokenizer): {old_floor_s:.3f} s')
    for function in args.functions:
        if f'strict:{function}' in cases:
            strict_s = stat(cases[f'strict:{function}'].init)
            total = stat(cases[function].total)
            print(
                f'{function} against a floor without the tokenizer it never loads: {strict_s:.3f} s, ratio '
                f'{total / strict_s:.2f} (its own imports, pydantic, the configuration and Powertools, are the rest)'
            )
    if not args.no_asset:
        print()
        for line in asset_sizes():
            print(line)
    print(f'\n(bench took {time.perf_counter() - started:.0f} s)')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
