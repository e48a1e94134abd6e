"""Per-provider request overhead: each model adapter's own time per call, the HTTP round trip excluded (issue 17).

    .venv/bin/python bench/provider_overhead.py [--calls 100]

Each adapter (Gemini on google-genai, Bedrock on boto3's Converse, OpenAI-compatible on the openai client) makes
`--calls` calls to its loopback fake with two request shapes: an Observer call (a ~3,000-token prompt and a ~2,000-token
system prompt) and an Actor call (a 12-turn history with a tool call and its result, two tools offered). The time in
the transport (sending the request and reading the whole answer) is measured under each client and taken out:
google-genai's and openai's `httpx2` transport, botocore's HTTP session. What is left is the adapter: building the
request, the SDK's serialisation, signing (Bedrock) and validation, parsing the answer.

Goal: no provider adds more than a few milliseconds per call over Gemini's adapter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sim import Wire  # noqa: E402
from om_lib.adapters.models.bedrock import BedrockLanguageModel  # noqa: E402
from om_lib.adapters.models.gemini import GeminiLanguageModel  # noqa: E402
from om_lib.adapters.models.openai import OpenAILanguageModel  # noqa: E402
from om_lib.llm import (  # noqa: E402
    Content,
    FunctionCall,
    FunctionDeclaration,
    FunctionResponse,
    ModelRequest,
)
from om_lib.ports import LanguageModel  # noqa: E402
from tests.fakes.fake_bedrock import ConverseReply, FakeBedrock  # noqa: E402
from tests.fakes.fake_gemini import FakeGemini, FakeReply  # noqa: E402
from tests.fakes.fake_openai import ChatReply, FakeOpenAI  # noqa: E402

OBSERVATIONS = '\n'.join(f'* 🟡 (09:{i % 60:02d}) User said item {i} of the migration plan matters' for i in range(120))
ANSWER = '<observations>\nDate: Jan 1, 2025\n' + OBSERVATIONS[:3000] + '\n</observations>'
TOOLS = (
    FunctionDeclaration(
        'recall',
        'Look up older messages.',
        {'type': 'object', 'properties': {'query': {'type': 'string'}, 'mode': {'type': 'string'}}},
    ),
    FunctionDeclaration(
        'updateWorkingMemory',
        'Replace working memory.',
        {'type': 'object', 'properties': {'memory': {'type': 'string'}}},
    ),
)


def observer_request() -> ModelRequest:
    system = 'You are the memory of an AI assistant. ' + 'Write dated, prioritised observations. ' * 200
    prompt = '## New Message History to Observe\n' + '\n'.join(
        f'User (09:{i:02d}): we should move the billing service to the new region before the budget review {i}'
        for i in range(160)
    )
    return ModelRequest('observer', system, (Content('user', (prompt,)),), temperature=0.3, max_output_tokens=8000)


def actor_request() -> ModelRequest:
    turns: list[Content] = []
    for i in range(5):
        turns.append(Content('user', (f'Question {i} about the rollout and its owners?',)))
        turns.append(Content('model', (f'Answer {i}: the platform team owns it; the deadline is Friday.',)))
    turns.append(Content('user', ('What did I say about Lisbon?',)))
    turns.append(Content('model', (FunctionCall('recall', {'query': 'lisbon', 'mode': 'search'}, id='call_1'),)))
    turns.append(Content('user', (FunctionResponse('recall', {'results': 'moving in May ' * 40}, id='call_1'),)))
    return ModelRequest('actor', 'You are helpful.\n\n' + OBSERVATIONS, tuple(turns), tools=TOOLS)


def measure(
    model: LanguageModel, model_id: str, request: ModelRequest, calls: int, wire: Wire
) -> tuple[list[float], list[float]]:
    """(adapter ms per call: its time minus the transport's, transport ms per call), after a few warm-up calls."""
    for _ in range(5):
        model.generate(model_id, request, timeout_s=30)
    adapter: list[float] = []
    transport: list[float] = []
    for _ in range(calls):
        wire_before = wire.total_s
        started = time.perf_counter()
        model.generate(model_id, request, timeout_s=30)
        elapsed = time.perf_counter() - started
        in_wire = wire.total_s - wire_before
        if in_wire <= 0:
            raise RuntimeError(f'{model_id}: no transport time measured; the wire hook is not on this client')
        adapter.append((elapsed - in_wire) * 1000)
        transport.append(in_wire * 1000)
    return adapter, transport


# One process, one first call: SDK import, client construction and the first request (what a cold start pays when
# the provider's first model call comes; SnapStart moves the import and the client into the snapshot).
FIRST_CALL = """
import sys, time
started = time.perf_counter()
from om_lib.llm import Content, ModelRequest
import om_lib.adapters.models.{module} as adapter
model = adapter.{cls}(**{kwargs})
model.generate({model_id!r}, ModelRequest('actor', 'hi', (Content('user', ('hi',)),)), timeout_s=30)
print((time.perf_counter() - started) * 1000)
"""


def first_call_ms(module: str, cls: str, kwargs: dict[str, str], model_id: str) -> float:
    code = FIRST_CALL.format(module=module, cls=cls, kwargs=kwargs, model_id=model_id)
    env = {**os.environ, 'PYTHONPATH': str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f'median {statistics.median(ordered):5.2f} ms, p90 {ordered[int(len(ordered) * 0.9)]:5.2f} ms, '
        f'mean {statistics.fmean(ordered):5.2f} ms'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--calls', type=int, default=100)
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID='bench', AWS_SECRET_ACCESS_KEY='bench', AWS_DEFAULT_REGION='us-east-1')
    wire = Wire()
    wire.install_httpx2()
    shapes: dict[str, Callable[[], ModelRequest]] = {'observer': observer_request, 'actor': actor_request}
    results: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    with (
        FakeGemini(lambda _r: FakeReply.text(ANSWER)) as gemini_server,
        FakeBedrock(lambda _r: ConverseReply.text(ANSWER)) as bedrock_server,
        FakeOpenAI(lambda _r: ChatReply.text(ANSWER)) as openai_server,
    ):
        bedrock = BedrockLanguageModel(endpoint_url=bedrock_server.url)
        wire.install_botocore(bedrock.client())
        providers: dict[str, tuple[LanguageModel, str]] = {
            'gemini (google-genai)': (
                GeminiLanguageModel(api_key='bench', base_url=gemini_server.url),
                'gemini-2.5-flash',
            ),
            'bedrock (boto3 Converse)': (bedrock, 'us.amazon.nova-lite-v1:0'),
            'openai (openai client)': (
                OpenAILanguageModel(api_key='bench', base_url=openai_server.base_url),
                'gpt-4o-mini',
            ),
        }
        for name, (model, model_id) in providers.items():
            for shape, build in shapes.items():
                results[(name, shape)] = measure(model, model_id, build(), args.calls, wire)
        first = {
            'gemini (google-genai)': first_call_ms(
                'gemini',
                'GeminiLanguageModel',
                {'api_key': 'b', 'base_url': gemini_server.url},
                'gemini-2.5-flash',
            ),
            'bedrock (boto3 Converse)': first_call_ms(
                'bedrock', 'BedrockLanguageModel', {'endpoint_url': bedrock_server.url}, 'amazon.nova-lite-v1:0'
            ),
            'openai (openai client)': first_call_ms(
                'openai',
                'OpenAILanguageModel',
                {'api_key': 'b', 'base_url': openai_server.base_url},
                'gpt-4o-mini',
            ),
        }
    print(f'adapter time per call, HTTP round trip excluded ({args.calls} calls each, loopback fakes)')
    baseline = {shape: statistics.median(results[('gemini (google-genai)', shape)][0]) for shape in shapes}
    for (name, shape), (adapter, transport) in results.items():
        delta = statistics.median(adapter) - baseline[shape]
        print(
            f'  {name:26s} {shape:8s} {summary(adapter)}  ({delta:+.2f} ms vs Gemini; '
            f'round trip excluded: median {statistics.median(transport):.2f} ms)'
        )
    print('first call in a fresh process (SDK import + client + one request)')
    for name, ms in first.items():
        print(f'  {name:26s} {ms:7.0f} ms')


if __name__ == '__main__':
    main()
