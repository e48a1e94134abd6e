"""The memory inspector on a resource-scope memory, in a real browser: the shared log with each observation under
the thread it came from, named by its real id (never the hash the Observer saw); and the same page served by
`om inspect`, its calls forwarded to the stack."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from om_cli import inspect
from om_cli.local_stack import LocalStack
from om_lib.observation.resource_scope import shown_thread_id
from tests.e2e.browser import SayingModels, assert_readable, observation_lines, ready, screenshot
from tests.e2e.browser import artifacts as artifacts  # noqa: F401 - fixtures
from tests.e2e.browser import browser as browser  # noqa: F401
from tests.e2e.browser import page as page  # noqa: F401
from tests.e2e.conftest import Api, running_stack, wait_for
from tests.fakes.fake_gemini import FakeGemini

pytestmark = pytest.mark.e2e

CONFIG: dict[str, Any] = {
    'model': 'default',
    'scope': 'resource',
    'observation': {'messageTokens': 100},
    'reflection': {'observationTokens': 30_000},
}
RESOURCE = 'bob'
SAID = {
    'home-renovation': [
        'We are renovating the kitchen in March. The budget is twelve thousand euros. My partner wants green tiles.',
        'The plumber is called Rui and comes on Tuesdays. Which oven fits a sixty centimetre niche?',
        'The electrician needs the final layout by Friday. We chose an induction hob. Remind me to order the sink.',
    ],
    'work:planning': [
        'I lead the data platform team of six people. Our quarterly review is on the fourth of April.',
        'I need a roadmap for the streaming migration. The deadline is the end of June. Can you draft milestones?',
        'Two engineers join in May. I want a pairing plan for them. My manager Ines reviews it on Thursday.',
    ],
}


@pytest.fixture(scope='module')
def stack() -> Iterator[LocalStack]:
    with FakeGemini(SayingModels()) as server, running_stack(server, CONFIG) as running:
        yield running


@pytest.fixture(scope='module')
def shared(stack: LocalStack) -> dict[str, Any]:
    """Both conversations observed into the resource's one memory."""
    api = Api(stack.url)
    for turn in range(3):
        for thread, lines in SAID.items():
            status, body = api.post(f'/threads/{thread}/chat', {'resourceId': RESOURCE, 'content': lines[turn]})
            assert status == 200, body
    stack.drain()

    def observed() -> dict[str, Any] | None:
        _, view = api.get(f'/threads/home-renovation/memory?resourceId={RESOURCE}')
        return view if all(f'<thread id="{t}">' in view['observations'] for t in SAID) else None

    return wait_for(observed, timeout=30)  # type: ignore[no-any-return]


def test_the_shared_log_names_the_real_thread_of_each_observation(page, stack, shared, artifacts) -> None:
    query = urllib.parse.urlencode({'resourceId': RESOURCE, 'threadId': 'home-renovation'})
    page.goto(f'{stack.url}/inspector?{query}')
    ready(page)
    sections = page.locator('#log .thread-section')
    attributed: dict[str, list[str]] = {}
    in_order: list[str] = []
    for i in range(sections.count()):
        lines = sections.nth(i).locator('.obs').evaluate_all('ls => ls.map(l => l.dataset.raw)')
        attributed.setdefault(sections.nth(i).get_attribute('data-thread'), []).extend(lines)
        in_order.extend(lines)
    assert set(attributed) == set(SAID)
    home, work = ' '.join(attributed['home-renovation']), ' '.join(attributed['work:planning'])
    assert 'kitchen' in home and 'data platform' in work and 'kitchen' not in work
    assert in_order == observation_lines(shared['observations'])
    html = page.content()
    assert not [t for t in SAID if shown_thread_id(RESOURCE, t) in html], 'an obscured id reached the page'
    assert 'resource scope' in page.locator('#summary').inner_text()
    assert '(this thread)' in sections.first.locator('.thread-label').inner_text()
    assert_readable(page)
    screenshot(page, artifacts, 'resource-scope', docs=True)
    # A section of another thread opens that thread
    page.get_by_role('button', name='Open work:planning').first.click()
    page.wait_for_url('**threadId=work%3Aplanning**')
    ready(page)
    assert page.locator('#thread').input_value() == 'work:planning'


def test_om_inspect_serves_the_same_page_against_the_stack(page, stack, shared) -> None:
    upstream = inspect.Upstream(stack.url, inspect.bearer_auth('not-checked-by-the-local-stack'))
    with inspect.InspectServer(upstream) as server:
        page.goto(f'{server.url}?resourceId={RESOURCE}&threadId=home-renovation')
        ready(page)
        shown = page.eval_on_selector_all('#log .obs', 'ls => ls.map(l => l.dataset.raw)')
        _, now = Api(stack.url).get(f'/threads/home-renovation/memory?resourceId={RESOURCE}')
        assert shown == observation_lines(now['observations'])
        page.click('#tab-messages')
        assert page.locator('#messages .msg').count() == 6  # three turns: the user's and the Actor's messages
