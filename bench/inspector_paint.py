"""First paint of the memory inspector for a long thread: time to interactive in Chromium, and bytes transferred.

    .venv/bin/python bench/inspector_paint.py [--messages 2000] [--runs 5] [--chromium /usr/bin/chromium]

The local stack (embedded moto, the offline model) holds one thread of 2,000 messages whose observation log is about
30,000 tokens: the messages go in through `POST /threads/{id}/steps` (100 a request) with `messageTokens` 4,000 and
reflection out of reach, so the offline Observer writes the log the way a conversation would. Then each run opens
`/inspector?resourceId=…&threadId=…` in a fresh browser context (nothing cached) and measures:

- time to interactive: from navigation start until the page has rendered the log, the token bars and the newest
  page of messages and handles input (`window.inspectorReadyMs`, set when the first answers are on screen);
- bytes: every response the page received until then (HTML, CSS, JS, the failure reasons, the API's JSON), by
  request, against the size of the whole history as JSON (what a page that fetched every message would transfer).

Goal: < 1 s to interactive locally; the page fetches one page of messages (50), never the whole history.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from om_cli.local_stack import LocalStack  # noqa: E402

CONFIG = {
    'model': 'offline',
    'observation': {'messageTokens': 4000, 'bufferTokens': False},
    'reflection': {'observationTokens': 1_000_000},
}
RESOURCE, THREAD = 'bench', 'long-thread'
TOPICS = [
    'the kitchen renovation budget',
    'my sister Marta wedding in Porto',
    'the data platform roadmap',
    'learning Japanese with Kenji',
    'the cargo bike for the school run',
    'the passport renewal before June',
    'the band rehearsal near the river',
    'the streaming migration deadline',
]


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method='POST', headers={'Content-Type': 'application/json'}
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - the local stack
        return json.loads(response.read())  # type: ignore[no-any-return]


def get(url: str, path: str) -> tuple[dict[str, Any], int]:
    with urllib.request.urlopen(url + path, timeout=120) as response:  # noqa: S310 - the local stack
        raw = response.read()
    return json.loads(raw), len(raw)


def fill(url: str, messages: int) -> dict[str, Any]:
    """`messages` messages (user and assistant in turn) in 100-message steps; returns the memory view."""
    batch: list[dict[str, Any]] = []
    for n in range(messages):
        topic = TOPICS[n % len(TOPICS)]
        if n % 2 == 0:
            text = f'About {topic}: item {n} is due on day {n % 28 + 1}, for the whole team.'
            batch.append({'role': 'user', 'content': text})
        else:
            batch.append({'role': 'assistant', 'content': 'Noted.'})
        if len(batch) == 100:
            post(url, f'/threads/{THREAD}/steps', {'resourceId': RESOURCE, 'messages': batch})
            batch = []
    if batch:
        post(url, f'/threads/{THREAD}/steps', {'resourceId': RESOURCE, 'messages': batch})
    post(url, f'/threads/{THREAD}/steps', {'resourceId': RESOURCE, 'messages': [{'role': 'user', 'content': 'Hi.'}]})
    return get(url, f'/threads/{THREAD}/memory?resourceId={RESOURCE}')[0]


def history_bytes(url: str) -> int:
    """The whole history as the messages route serves it, 1,000 a page."""
    total, page = 0, 0
    while True:
        body, size = get(url, f'/threads/{THREAD}/messages?resourceId={RESOURCE}&page={page}&perPage=1000')
        total += size
        if not body['hasMore']:
            return total
        page += 1


def measure(browser: Any, url: str) -> dict[str, Any]:
    context = browser.new_context(viewport={'width': 1280, 'height': 860})
    page = context.new_page()
    received: list[tuple[str, int, float]] = []

    def on_finished(request: Any) -> None:
        sizes, timing = request.sizes(), request.timing
        took = timing['responseEnd'] - max(timing['requestStart'], 0)
        received.append((request.url, sizes['responseBodySize'] + sizes['responseHeadersSize'], took))

    page.on('requestfinished', on_finished)
    page.goto(f'{url}/inspector?resourceId={RESOURCE}&threadId={THREAD}')
    page.wait_for_selector('body[data-state="ready"]', timeout=30_000)
    ready_ms = page.evaluate('window.inspectorReadyMs')
    nav = page.evaluate("() => performance.getEntriesByType('navigation')[0].responseEnd")
    # When the last answer the first paint needed arrived: what follows is the page's own work (parse, render)
    answers_ms = page.evaluate(
        "() => Math.max(...performance.getEntriesByType('resource').filter(e => e.initiatorType === 'fetch')"
        '.map(e => e.responseEnd))'
    )
    lines = page.locator('#log .obs').count()
    shown = page.locator('#messages .msg').count()
    page.wait_for_timeout(200)  # any request still in flight at the mark finishes (none should be)
    context.close()
    return {
        'ready_ms': ready_ms,
        'html_ms': nav,
        'render_ms': ready_ms - answers_ms,
        'lines': lines,
        'messages': shown,
        'received': received,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--messages', type=int, default=2000)
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--chromium', default='/usr/bin/chromium')
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    env = {'POWERTOOLS_LOG_LEVEL': 'ERROR', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    with LocalStack(port=0, config=CONFIG, sweep_interval_s=None, env=env) as stack:
        base = stack.url
        started = time.perf_counter()
        view = fill(stack.url, args.messages)
        stack.drain()
        print(
            f'thread: {args.messages:,} messages, observation log {view["observationTokens"]:,} tokens '
            f'({len(view["observations"]):,} characters), filled in {time.perf_counter() - started:.1f} s'
        )
        whole = history_bytes(stack.url)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, headless=True, args=['--no-sandbox'])
            measure(browser, stack.url)  # warm the server side (tokenizer, clients), as a running om serve is
            runs = [measure(browser, stack.url) for _ in range(args.runs)]
            browser.close()
    ready = [r['ready_ms'] for r in runs]
    last = runs[-1]
    total = sum(size for _, size, _ in last['received'])
    print(
        f'time to interactive: median {statistics.median(ready):.0f} ms, best {min(ready):.0f} ms, '
        f'worst {max(ready):.0f} ms over {len(runs)} cold page loads (goal < 1,000 ms)'
    )
    print(
        f"  HTML received at {statistics.median(r['html_ms'] for r in runs):.0f} ms; the page's own work after the "
        f'last answer (parse, render): median {statistics.median(r["render_ms"] for r in runs):.0f} ms; on screen: '
        f'{last["lines"]:,} observation lines, {last["messages"]} messages (the newest page)'
    )
    print(f'bytes transferred until interactive: {total:,} in {len(last["received"])} responses')
    for request_url, size, took in last['received']:
        print(f'  {size:>9,} bytes {took:>6.0f} ms  {request_url.removeprefix(base)[:100]}')
    print(f'the whole history as JSON: {whole:,} bytes ({whole / total:.0f}x what the page fetched)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
