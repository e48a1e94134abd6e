"""Token counting benchmark: o200k throughput, encoding load time, and the per-step cost of counting a window.

Run: `.venv/bin/python bench/token_counting.py`. Prints figures only (no assertions on time).

The point of the last section: a step counts the whole unobserved window (up to ~30k tokens). With per-part counts
cached on stored messages (`TokenCounter.with_token_counts`), that count never calls the tokenizer, so it costs about
as much as counting a 1-message window; without the cache it re-tokenizes everything.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from om_lib.context.tokens import TokenCounter  # noqa: E402
from om_lib.messages import Message  # noqa: E402

WORDS = (
    'the observer records what the user asked and what the assistant did with the tool results '
    'memory threshold reflection buffer activation token window context serverless lambda dynamodb'
).split()
SNIPPETS = [
    'def handler(event, context):\n    return {"statusCode": 200, "body": json.dumps(event)}\n',
    '{"id": 12345, "items": [1, 2, 3], "ok": true, "name": "Zürich"}',
    'Observações: o utilisateur préfère les réponses courtes. Größe: 1.234,56 €.',
    '用户希望在周五之前完成迁移。会议改到下午三点。',
    'ERROR 2025-01-01T00:00:00Z request_id=5f1c timeout after 30000ms (retry 3/5)',
    '🔴 High: user is allergic to peanuts ✅ done',
]


def mixed_text(n_chars: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        if rng.random() < 0.15:
            chunk = rng.choice(SNIPPETS)
        else:
            chunk = ' '.join(rng.choice(WORDS) for _ in range(rng.randint(5, 25))) + '.\n'
        out.append(chunk)
        size += len(chunk)
    return ''.join(out)[:n_chars]


def best_of(fn: Callable[[], object], repeat: int, number: int) -> float:
    """Median seconds per call over `repeat` runs of `number` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


class CallCounting:
    """Wraps a tokenizer to count calls (shows the cached path never calls it)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.version = inner.version  # type: ignore[attr-defined]
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return self.inner.count(text)  # type: ignore[attr-defined]


def build_window(counter: TokenCounter, target_tokens: int) -> list[Message]:
    """Stored messages (user text, assistant tool call, tool result, assistant answer) totalling ~target tokens."""
    rng = random.Random(11)
    messages: list[Message] = []
    now = datetime(2025, 1, 1, tzinfo=UTC)
    i = 0
    while counter.count_messages(messages) < target_tokens:
        kind = i % 4
        if kind == 0:
            parts = [{'type': 'text', 'text': mixed_text(rng.randint(300, 1500), seed=i)}]
            role = 'user'
        elif kind == 1:
            args = {'query': mixed_text(80, seed=i), 'limit': 5}
            parts = [{'type': 'tool-call', 'toolCallId': f'c{i}', 'toolName': 'search', 'args': args}]
            role = 'assistant'
        elif kind == 2:
            result = {'hits': [{'title': mixed_text(60, seed=i + j), 'score': j / 10} for j in range(5)]}
            parts = [{'type': 'tool-result', 'toolCallId': f'c{i - 1}', 'toolName': 'search', 'result': result}]
            role = 'tool'
        else:
            parts = [{'type': 'text', 'text': mixed_text(rng.randint(200, 1200), seed=i)}]
            role = 'assistant'
        m = Message.model_validate({'id': f'm{i}', 'role': role, 'createdAt': now, 'parts': parts, 'seq': i + 1})
        messages.append(counter.with_token_counts(m))
        i += 1
    return messages


def main() -> None:
    t0 = time.perf_counter()
    import tiktoken  # noqa: F401 - import cost measured separately from the encoding load

    t_import = time.perf_counter() - t0
    from om_lib.adapters import tiktoken_counter

    t1 = time.perf_counter()
    tokenizer = tiktoken_counter.get_tokenizer()
    t_load = time.perf_counter() - t1
    t2 = time.perf_counter()
    tiktoken_counter.get_tokenizer()
    t_memo = time.perf_counter() - t2

    print('== o200k encoding load ==')
    print(f'import tiktoken:                       {t_import * 1000:8.1f} ms')
    print(f'first get_tokenizer() (file + BPE):    {t_load * 1000:8.1f} ms')
    print(f'memoised get_tokenizer():              {t_memo * 1e6:8.1f} µs')

    text = mixed_text(4 * 1024 * 1024)
    n_bytes = len(text.encode())
    start = time.perf_counter()
    n_tokens = tokenizer.count(text)
    elapsed = time.perf_counter() - start
    chunks = [text[i : i + 2000] for i in range(0, len(text), 2000)]
    start = time.perf_counter()
    chunk_tokens = sum(tokenizer.count(c) for c in chunks)
    chunk_elapsed = time.perf_counter() - start
    print('\n== string counting throughput (encode_ordinary) ==')
    print(f'text: {n_bytes / 1e6:.2f} MB, {n_tokens:,} tokens ({n_bytes / n_tokens:.2f} bytes/token)')
    print(f'one 4 MB string:     {n_tokens / elapsed:12,.0f} tokens/s  {n_bytes / 1e6 / elapsed:7.2f} MB/s')
    print(
        f'2000-char messages:  {chunk_tokens / chunk_elapsed:12,.0f} tokens/s  '
        f'{n_bytes / 1e6 / chunk_elapsed:7.2f} MB/s  ({len(chunks)} calls)'
    )

    counting = CallCounting(tokenizer)
    counter = TokenCounter(counting)
    window = build_window(counter, 30_000)
    total = counter.count_messages(window)
    uncached = [m.model_copy(update={'token_counts': None}) for m in window]
    assert counter.count_messages(uncached) == total  # the cache never changes results
    one = window[-1:]
    new_message = uncached[-1:]
    step = window[:-1] + new_message  # a real step: the stored window plus one message not yet counted

    counting.calls = 0
    t_cached = best_of(lambda: counter.count_messages(window), repeat=7, number=50)
    cached_calls = counting.calls
    t_one = best_of(lambda: counter.count_messages(one), repeat=7, number=2000)
    t_new = best_of(lambda: counter.count_messages(new_message), repeat=7, number=500)
    t_step = best_of(lambda: counter.count_messages(step), repeat=7, number=50)
    counting.calls = 0
    t_uncached = best_of(lambda: counter.count_messages(uncached), repeat=5, number=3)
    uncached_calls = counting.calls // 15
    t_fill = best_of(lambda: counter.with_token_counts(uncached[0]), repeat=5, number=200)

    print('\n== counting cost of one step ==')
    print(f'window: {len(window)} stored messages, {total:,} tokens (cached per-part counts)')
    print(f'30k window, cached counts:   {t_cached * 1e6:10.1f} µs/step  (tokenizer calls: {cached_calls})')
    print(f'1-message window, cached:    {t_one * 1e6:10.1f} µs/step')
    print(f'1-message window, new msg:   {t_new * 1e6:10.1f} µs/step  (tokenizes {len(one[0].text())} chars)')
    print(f'30k cached + 1 new message:  {t_step * 1e6:10.1f} µs/step')
    print(f'30k window, uncached:        {t_uncached * 1e6:10.1f} µs/step  ({uncached_calls} tokenizer calls/step)')
    print(f'with_token_counts (1 msg):   {t_fill * 1e6:10.1f} µs  (paid once, when a message is stored)')
    print(
        f'cached 30k / new 1-message: {t_cached / t_new:5.1f}×   '
        f'uncached / cached 30k: {t_uncached / t_cached:6.1f}×   '
        f'cached per message: {t_cached / len(window) * 1e6:.2f} µs'
    )


if __name__ == '__main__':
    main()
