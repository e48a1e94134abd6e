"""The streamed chat route next to the JSON one, through `om serve`: when does a client see what?

    .venv/bin/python bench/streaming.py [--turns 20] [--first-token-ms 300] [--word-ms 40]

The local stack (embedded moto, `om serve`'s HTTP server) runs with the fake Gemini behind it; the Actor streams its
reply at a fixed rate: its first word `--first-token-ms` after the request, then one word every `--word-ms` (a
40-word reply). Each turn is a new message on its own thread (no observation due: the figures are the route's own),
sent once to `/chat/stream` and once to `/chat` (JSON), alternating. For each, from the request's first byte sent:

    first byte           the response's status line
    first status         the first `data-om-status` chunk (the memory's windows, before any memory work)
    first text           the first `text-delta` chunk (the Actor's first word on screen)
    last byte            the end of the answer

Goal: first byte ≤ 50 ms plus the model's own time to first token — the stream answers as soon as the user's message
is saved, and the first word follows the model's first token by a few milliseconds; the JSON route shows nothing
until the last word was written.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from om_cli.local_stack import LocalStack  # noqa: E402
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest, fake_gemini_env  # noqa: E402

REPLY = ' '.join(f'word{i}' for i in range(40))
OBSERVER = 'You are the memory of an AI assistant'


def timings(url: str, path: str, body: dict[str, Any], *, stream: bool) -> dict[str, float]:
    """Milliseconds from sending the request to each moment the client can tell apart."""
    host, port = url.removeprefix('http://').rsplit(':', 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {'Content-Type': 'application/json', 'Accept': 'text/event-stream' if stream else 'application/json'}
    payload = json.dumps(body)
    connection.connect()
    started = time.perf_counter()
    connection.request('POST', path, body=payload, headers=headers)
    response = connection.getresponse()
    seen = {'first byte': (time.perf_counter() - started) * 1000}
    assert response.status == 200, response.read()
    if not stream:
        response.read()
        seen['last byte'] = (time.perf_counter() - started) * 1000
        connection.close()
        return seen
    buffer = b''
    while True:
        data = response.read1(65536)
        now = (time.perf_counter() - started) * 1000
        if not data:
            break
        buffer += data
        while b'\n\n' in buffer:
            event, buffer = buffer.split(b'\n\n', 1)
            if b'"type":"data-om-status"' in event:
                seen.setdefault('first status', now)
            if b'"type":"text-delta"' in event:
                seen.setdefault('first text', now)
    seen['last byte'] = (time.perf_counter() - started) * 1000
    connection.close()
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--turns', type=int, default=20, help='turns per route')
    parser.add_argument('--first-token-ms', type=float, default=300.0, help="the model's time to its first token")
    parser.add_argument('--word-ms', type=float, default=40.0, help='the model writes one word every this many ms')
    args = parser.parse_args()

    def gemini(request: FakeRequest) -> FakeReply:
        if OBSERVER in request.system_text:
            return FakeReply.text('<observations>\n* 🟡 (09:00) User said something\n</observations>')
        # Streamed: first word after first-token-ms, then one a word-ms; whole (JSON route): after all of it.
        reply = FakeReply.text(REPLY).paced(args.word_ms / 1000)
        if request.method == 'streamGenerateContent':
            return reply.after(args.first_token_ms / 1000)
        return reply.after((args.first_token_ms + args.word_ms * (len(REPLY.split()) - 1)) / 1000)

    for name in ('AWS_ENDPOINT_URL', 'GOOGLE_API_KEY'):
        os.environ.pop(name, None)
    env = {'POWERTOOLS_LOG_LEVEL': 'ERROR', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    rows: dict[str, list[dict[str, float]]] = {'stream': [], 'json': []}
    with FakeGemini(gemini) as fake:
        config = {'model': 'default', 'observation': {'messageTokens': 30000, 'bufferTokens': False}}
        with LocalStack(port=0, config=config, env={**env, **fake_gemini_env(fake)}, sweep_interval_s=None) as stack:
            for turn in range(args.turns + 2):
                for route, stream in (('stream', True), ('json', False)):
                    path = f'/threads/bench-{route}-{turn}/chat' + ('/stream' if stream else '')
                    got = timings(
                        stack.url, path, {'resourceId': 'bench', 'content': f'Hello, turn {turn}.'}, stream=stream
                    )
                    if turn >= 2:  # the first turns warm the stack up (imports, clients, the tokenizer)
                        rows[route].append(got)
    print(
        f'streaming chat vs JSON chat through om serve: {args.turns} turns each; the model: first token after '
        f'{args.first_token_ms:g} ms, then one word every {args.word_ms:g} ms ({len(REPLY.split())} words)\n'
    )
    print(f'{"ms (median / p95)":<22}{"first byte":>18}{"first status":>18}{"first text":>18}{"last byte":>18}')
    for route, label in (('stream', '/chat/stream (SSE)'), ('json', '/chat (JSON)')):
        cells = []
        for column in ('first byte', 'first status', 'first text', 'last byte'):
            values = sorted(r[column] for r in rows[route] if column in r)
            if not values:
                cells.append(f'{"—":>18}')
                continue
            p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
            cells.append(f'{statistics.median(values):>9.0f} / {p95:>5.0f} ')
        print(f'{label:<22}' + ''.join(cells))
    first_byte = statistics.median(r['first byte'] for r in rows['stream'])
    gap = statistics.median(r['first text'] - r['first status'] - args.first_token_ms for r in rows['stream'])
    print(
        f"\nstream: first byte {first_byte:.0f} ms (goal: ≤ 50 ms); the first word {gap:.0f} ms after the model's "
        f'first token (the Actor is called once the step has saved the message and read the memory: first status);'
        "\nthe JSON answer's first byte is its last"
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
