"""The memory inspector in a real browser (the system Chromium through Playwright), on the local stack with the fake
Gemini: what the page shows is what the API says, and a user can work it without a mouse.

One stack and one browser for the module. The conversation is observed and reflected once (module fixture); each
test opens its own page on it.
"""

from __future__ import annotations

import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from functions.api import inspector
from om_cli.local_stack import LocalStack
from tests.e2e.browser import (
    REFUSE_MARKER,
    SayingModels,
    assert_readable,
    observation_lines,
    ready,
    screenshot,
)
from tests.e2e.browser import artifacts as artifacts  # noqa: F401 - fixtures
from tests.e2e.browser import browser as browser  # noqa: F401
from tests.e2e.browser import page as page  # noqa: F401
from tests.e2e.conftest import Api, running_stack, wait_for
from tests.fakes.fake_gemini import FakeGemini

pytestmark = pytest.mark.e2e

CONFIG: dict[str, Any] = {
    'model': 'default',
    # (the archive bound far away: these pages show a log that reflection keeps small)
    'observation': {'messageTokens': 200, 'bufferTokens': False, 'archive': {'afterTokens': 10_000}},
    # (groups cost a few tokens: the six facts pass 200 observation tokens, not 300)
    'reflection': {'observationTokens': 200},
    'retrieval': True,
}
RESOURCE = 'alice'
FACTS = [
    'I live in Lisbon with my partner Ana. We have two cats called Miso and Tofu. I work as a data engineer.',
    'My sister Marta is getting married in Porto in September. I am her witness. I need a speech by August.',
    'I am vegetarian and allergic to peanuts. I cycle to work every day. Where can I buy a cargo bike?',
    'I am learning Japanese every morning. My teacher is called Kenji. I want to visit Kyoto next spring.',
    'I prefer short answers without bullet points. Please remind me about the passport renewal in June.',
    'My favourite band is Radiohead. I play the bass on Sundays. Our band rehearses near the river.',
]


@pytest.fixture(scope='module')
def models() -> Iterator[tuple[FakeGemini, SayingModels]]:
    behaviour = SayingModels()
    with FakeGemini(behaviour) as server:
        yield server, behaviour


@pytest.fixture(scope='module')
def stack(models) -> Iterator[LocalStack]:
    with running_stack(models[0], CONFIG) as running:
        yield running


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


def chat(api: Api, thread: str, text: str, resource: str = RESOURCE) -> None:
    status, body = api.post(f'/threads/{thread}/chat', {'resourceId': resource, 'content': text})
    assert status == 200, body


def memory(api: Api, thread: str, resource: str = RESOURCE) -> dict[str, Any]:
    status, body = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200, body
    return body


@pytest.fixture(scope='module')
def trip(api: Api, stack: LocalStack) -> str:
    """A conversation observed and reflected (the fake Reflector condenses), then quiet."""
    for fact in FACTS:
        chat(api, 'trip', fact)
    stack.drain()
    wait_for(lambda: memory(api, 'trip')['generationCount'] >= 1, timeout=30)
    stack.drain()
    return 'trip'


def url(stack: LocalStack, **params: str) -> str:
    return f'{stack.url}/inspector?{urllib.parse.urlencode(params)}' if params else f'{stack.url}/inspector'


def test_the_page_shows_what_the_api_says(page, stack, api, trip, artifacts) -> None:
    view = memory(api, trip)
    assert view['generationCount'] >= 1 and view['observations']
    page.goto(url(stack, resourceId=RESOURCE, threadId=trip))
    ready(page)
    # The same observation lines, in order, rendered with their priority and time
    shown = page.eval_on_selector_all('#log .obs', 'lines => lines.map(l => l.dataset.raw)')
    assert shown == observation_lines(view['observations']) and shown
    # Observation groups are rendered as labelled blocks naming their messages, never as tags
    labels = page.eval_on_selector_all('#log .obs-group .group-label', 'ls => ls.map(l => l.textContent)')
    assert labels and all(label.startswith(('messages #', 'message #')) for label in labels), labels
    assert 'observation-group' not in page.locator('#log').inner_text()
    assert 'nothing archived' in page.locator('#archive-summary').inner_text()
    assert page.locator('#log .obs .prio').first.inner_text().endswith(('high', 'medium', 'low', 'done'))
    # The same token figures and thresholds
    for metric, value, threshold in [
        ('messages', view['pendingMessageTokens'], view['thresholds']['messageTokens']),
        ('observations', view['observationTokens'], view['thresholds']['observationTokens']),
    ]:
        meter = page.locator(f'.meter[data-metric="{metric}"]')
        assert (meter.get_attribute('data-value'), meter.get_attribute('data-threshold')) == (
            str(value),
            str(threshold),
        )
        assert meter.locator('.figures-text').inner_text().startswith(f'{value:,} / {threshold:,} tokens')
    assert page.locator('#current-task').inner_text() == view['currentTask']
    assert page.locator('#suggested-response').inner_text() == view['suggestedResponse']
    # The same generation count, and one row per generation in the timeline's table
    assert page.locator('#generation-count').get_attribute('data-value') == str(view['generationCount'])
    assert_readable(page)
    screenshot(page, artifacts, 'memory')

    page.click('#tab-generations')
    rows = page.locator('#gen-table tbody tr')
    rows.first.wait_for()
    _, generations = api.get(f'/threads/{trip}/memory/generations?resourceId={RESOURCE}&limit=100')
    assert rows.count() == len(generations['generations']) == view['generationCount'] + 1
    current = generations['generations'][0]
    last = page.locator('#gen-table tbody tr').last
    assert last.locator('td[data-tokens]').get_attribute('data-tokens') == str(current['observationTokens'])
    assert page.locator('#gen-chart svg rect').count() >= len(generations['generations'])
    # The diff between the last two generations: the reflection removed the earlier lines
    assert page.locator('#diff del').count() > 0 and 'removed' in page.locator('#diff-summary').inner_text()
    assert_readable(page)
    screenshot(page, artifacts, 'generations')

    page.click('#tab-messages')
    _, newest = api.get(f'/threads/{trip}/messages?resourceId={RESOURCE}&perPage=50&direction=DESC')
    items = page.locator('#messages .msg')
    assert [items.nth(i).get_attribute('data-id') for i in range(items.count())] == [
        m['id'] for m in newest['messages']
    ]
    assert [items.nth(i).get_attribute('data-status') for i in range(items.count())] == [
        m['omStatus'] for m in newest['messages']
    ]
    assert 'observed' in {m['omStatus'] for m in newest['messages']}
    assert_readable(page)
    screenshot(page, artifacts, 'messages')


def test_one_date_heading_however_many_groups_repeat_the_date(page, stack, api) -> None:
    # Given a log of several observation batches (retrieval groups), each starting with the same `Date:` line
    for n in range(18):  # two observations, not yet reflected (300 observation tokens)
        chat(api, 'groups', f'My number {n} is {n * 7}.', resource='bob')
        stack.drain()
    view = wait_for(
        lambda: next((v for v in [memory(api, 'groups', 'bob')] if v['observations'].count('Date:') > 1), None)
    )
    dates = [line.split(':', 1)[1].strip() for line in view['observations'].splitlines() if line.startswith('Date:')]
    assert len(dates) > len(set(dates)), dates
    # Then the page shows each date once, in the log's order, with every line under it
    page.goto(url(stack, resourceId='bob', threadId='groups'))
    ready(page)
    headings = page.eval_on_selector_all('#log .date', 'dates => dates.map(d => d.textContent)')
    assert headings == list(dict.fromkeys(dates)), headings
    shown = page.eval_on_selector_all('#log .obs', 'lines => lines.map(l => l.dataset.raw)')
    assert shown == observation_lines(view['observations'])


def test_the_search_box_filters_lines(page, stack, api, trip) -> None:
    lines = observation_lines(memory(api, trip)['observations'])
    word = next(w for w in ('lisbon', 'porto', 'condensed', 'miso') if any(w in line.lower() for line in lines))
    page.goto(url(stack, resourceId=RESOURCE, threadId=trip))
    ready(page)
    page.fill('#search', word.upper())
    visible = page.eval_on_selector_all('#log .obs:not([hidden])', 'ls => ls.map(l => l.dataset.raw)')
    assert visible == [line for line in lines if word in line.lower()] and visible
    assert page.locator('#log mark').first.inner_text().lower() == word
    assert page.locator('#log-count').inner_text() == f'{len(visible)} of {len(lines)} lines match'
    page.fill('#search', 'no-such-words-anywhere')
    assert page.locator('#log .obs:not([hidden])').count() == 0 and page.locator('#log-none').is_visible()
    page.fill('#search', '')
    assert page.locator('#log .obs:not([hidden])').count() == len(lines)


def test_the_recall_form_returns_the_api_s_page(page, stack, api, trip, artifacts) -> None:
    page.goto(url(stack, resourceId=RESOURCE, threadId=trip, view='recall'))
    ready(page)
    page.fill('#recall-limit', '3')
    page.click('#recall-form button[type=submit]')
    page.locator('#recall-text').wait_for()
    body = {'resourceId': RESOURCE, 'threadId': trip, 'mode': 'messages', 'detail': 'low', 'limit': 3}
    status, first = api.post('/recall', body)
    assert status == 200 and page.locator('#recall-text').inner_text() == first['messages']
    # Its paging: the next page is the API's next page from the same cursor
    page.get_by_role('button', name='Next page').click()
    page.wait_for_function("() => document.querySelector('#recall-facts')?.textContent.includes('page 2')")
    _, second = api.post('/recall', {**body, 'page': 2, 'cursor': first['cursor']})
    assert page.locator('#recall-text').inner_text() == second['messages'] != first['messages']
    assert_readable(page)
    screenshot(page, artifacts, 'recall')


def test_a_failed_reflection_shows_its_reason(page, stack, api, artifacts) -> None:
    thread = 'refused'
    # Enough said for the log to pass observationTokens (200) once the turns before each input are observed
    for fact in FACTS + FACTS:
        chat(api, thread, f'{REFUSE_MARKER} {fact}')
    stack.drain()
    failures = wait_for(lambda: memory(api, thread)['recentFailures'], timeout=30)
    refused = next(f for f in failures if f['operationType'] == 'reflection')
    assert refused['reason'] == 'invalid_reflection'
    page.goto(url(stack, resourceId=RESOURCE, threadId=thread, view='failures'))
    ready(page)
    article = page.locator('#failures .failure[data-reason="invalid_reflection"]').first
    explanation = next(r for r in inspector.failure_reasons() if r['reason'] == 'invalid_reflection')
    text = article.inner_text()
    assert 'reflection failed: invalid_reflection' in text
    assert explanation['meaning'].replace('`', '')[:60] in text and refused['message'][:40] in text
    assert page.locator('#failure-count').inner_text() == str(len(failures))
    assert_readable(page)
    screenshot(page, artifacts, 'failures')


def test_new_messages_show_within_5_seconds(page, stack, api, trip) -> None:
    chat(api, 'live', 'Hello there. This is the first message.')
    page.goto(url(stack, resourceId=RESOURCE, threadId='live', view='messages'))
    ready(page)
    said = f'The code word is {uuid.uuid4().hex[:8]}.'
    started = time.monotonic()
    chat(api, 'live', said)
    page.locator('#messages .msg-body', has_text=said).wait_for(timeout=5_000)
    assert time.monotonic() - started < 5.0


def test_empty_memory_a_missing_thread_and_an_api_error_each_say_so(page, stack, api, artifacts) -> None:
    chat(api, 'quiet', 'Hi.')
    page.goto(url(stack, resourceId=RESOURCE, threadId='quiet'))
    ready(page)
    empty = page.locator('#log-empty').inner_text()
    assert empty.startswith('Nothing observed yet.'), empty
    # and when the sweeper would observe it (no sweeper runs on this test stack)
    assert 'it counts as quiet at ' in empty and 'no sweeper runs on this stack' in empty, empty
    assert page.locator('#failures .empty').inner_text() == 'No failures recorded for this memory.'

    page.goto(url(stack, resourceId=RESOURCE, threadId='no-such-thread'))
    ready(page, 'missing')
    alert = page.get_by_role('alert')
    assert 'Thread “no-such-thread” was not found for resource “alice”' in alert.inner_text()
    assert_readable(page)
    screenshot(page, artifacts, 'missing-thread')

    page.goto(url(stack, resourceId='not an id'))
    ready(page, 'error')
    assert '(422 invalid_id)' in page.get_by_role('alert').inner_text()

    page.goto(url(stack, resourceId=f'nobody-{uuid.uuid4().hex[:6]}'))
    ready(page, 'empty-resource')
    assert 'has no threads yet' in page.get_by_role('alert').inner_text()


def test_it_works_without_a_mouse(page, stack, api, trip) -> None:
    page.goto(url(stack))
    ready(page, 'idle')
    assert page.evaluate('document.activeElement.id') == 'resource'
    page.keyboard.type(RESOURCE)
    page.keyboard.press('Enter')
    ready(page)
    # Tab from the resource field to the tabs; arrows move between views, as in any tab list
    focused = []
    for _ in range(12):
        page.keyboard.press('Tab')
        focused.append(page.evaluate('document.activeElement.id'))
        if focused[-1] == 'tab-memory':
            break
    assert focused[-1] == 'tab-memory', focused
    assert page.evaluate('getComputedStyle(document.activeElement).outlineStyle') != 'none'  # focus is visible
    page.keyboard.press('ArrowRight')
    page.keyboard.press('ArrowRight')
    assert page.evaluate('document.activeElement.id') == 'tab-messages'
    assert page.locator('#view-messages').is_visible() and not page.locator('#view-memory').is_visible()
    page.keyboard.press('End')
    assert page.evaluate('document.activeElement.id') == 'tab-recall'
    # Into the recall form, fill it and submit with the keyboard
    page.keyboard.press('Tab')  # the panel
    page.keyboard.press('Tab')  # mode
    assert page.evaluate('document.activeElement.id') == 'recall-mode'
    page.keyboard.press('Tab')
    page.keyboard.type('')  # the query field: Enter in a field submits the form
    assert page.evaluate('document.activeElement.id') == 'recall-query'
    page.keyboard.press('Enter')
    page.locator('#recall-text').wait_for()
    assert page.locator('#recall-text').inner_text().strip()
    # The thread picker and the search box are reachable and work from the keyboard too
    page.focus('#thread')
    page.keyboard.press('Home')
    page.keyboard.press('Shift+Tab')
    assert page.evaluate('document.activeElement.tagName') == 'BUTTON'  # Open


def test_deep_links_name_the_view_and_the_thread(page, stack, api, trip) -> None:
    page.goto(url(stack, resourceId=RESOURCE, threadId=trip, view='generations'))
    ready(page)
    assert page.locator('#tab-generations').get_attribute('aria-selected') == 'true'
    page.click('#tab-messages')
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)
    assert query == {'resourceId': [RESOURCE], 'threadId': [trip], 'view': ['messages']}
