"""Memory that stays bounded without a model, over HTTP on the local stack.

- A Reflector that always refuses, for 150 turns (the real google-genai client, the fake Gemini): the Actor's context
  stays within the documented bound on every step, every stated fact is in the active log or the archive and comes
  back through the recall tool, the failures are reported, and the Reflector is not asked on every turn.
- Ten one-line facts on the offline model (retrieval on, default buffering): every generation is smaller than what
  it condensed and under `observationTokens`, and a turn with nothing new to reflect calls no model for it.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from functions import _wiring
from om_cli.local_stack import LocalStack
from tests.e2e.conftest import Api, running_stack
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest

pytestmark = pytest.mark.e2e

OBSERVER = 'You are the memory of an AI assistant'
REFLECTOR = 'observation reflector'
REFUSAL = "I'm sorry, but I can't help with rewriting these notes."
CONFIG: dict[str, Any] = {
    'model': 'default',
    'retrieval': True,
    'observation': {'messageTokens': 200},
    'reflection': {'observationTokens': 400},
}
BOUND = 600  # observation.archive.afterTokens: 1.5 × observationTokens (the documented default)
TURNS = 150


class RefusingReflector:
    """The Observer writes one line per code word it is shown; the Reflector always refuses; the Actor says ok."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = {'observer': 0, 'reflector': 0, 'actor': 0}

    def __call__(self, request: FakeRequest) -> FakeReply:
        system = request.system_text
        role = 'reflector' if REFLECTOR in system else 'observer' if OBSERVER in system else 'actor'
        with self.lock:
            self.calls[role] += 1
        if role == 'reflector':
            return FakeReply.text(REFUSAL)
        if role == 'actor':
            return FakeReply.text('ok')
        new = ''.join(request.user_texts).split('New Message History', 1)[-1]
        codes = dict.fromkeys(re.findall(r'code word (K\d+)', new))
        lines = '\n'.join(f'* 🔴 (09:00) User stated code word {code} about the launch plan' for code in codes)
        return FakeReply.text(f'<observations>\nDate: Nov 28, 2026\n{lines or "* 🟡 (09:00) chatter"}\n</observations>')


@pytest.fixture(scope='module')
def refusing() -> Iterator[tuple[LocalStack, RefusingReflector]]:
    behaviour = RefusingReflector()
    with FakeGemini(behaviour) as server, running_stack(server, CONFIG) as stack:
        yield stack, behaviour


def chat(api: Api, resource: str, thread: str, text: str) -> dict[str, Any]:
    status, body = api.post(f'/threads/{thread}/chat', {'resourceId': resource, 'content': text})
    assert status == 200, body
    return body


def test_a_reflector_that_always_refuses_never_lets_memory_pass_its_bound_and_loses_nothing(refusing) -> None:
    stack, model = refusing
    api = Api(stack.url)
    resource, thread = 'bounded', f't-{uuid.uuid4().hex[:8]}'
    shown: list[int] = []
    reflecting: list[bool] = []
    archived_parts = 0
    for n in range(TURNS):
        body = chat(api, resource, thread, f'Remember code word K{n}: it opens the launch plan for week {n}.')
        status = next(p['data'] for p in body['parts'] if p['type'] == 'data-om-status')
        shown.append(status['windows']['active']['observations']['tokens'])
        reflecting.append(status['windows']['buffered']['reflection']['status'] == 'running')
        archived_parts += sum(p['type'] == 'data-om-observations-archived' for p in body['parts'])
    # The observations the Actor was shown (counted as it reads them) stay within the bound on every step, but while
    # a reflection of that very log runs (its result is about to shrink it: the bound waits for it)
    over = [(n, tokens) for n, tokens in enumerate(shown) if tokens > BOUND and not reflecting[n]]
    assert over == [], (over, shown)
    assert archived_parts > 0 and max(shown) > CONFIG['reflection']['observationTokens']

    # Everything said is observed, in the active log or in the archive (the last turns once the worker is done)
    _wiring.engine().observe_now(resource, thread)
    status, view = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200
    stored = view['observations'] + '\n'.join(g['observations'] for g in view['archive']['groups'])
    missing = [n for n in range(TURNS) if not re.search(rf'\bK{n}\b', stored)]
    assert missing == []
    assert view['archive']['groups'] and view['archive']['afterTokens'] == BOUND

    # An archived fact comes back through the recall tool (`mode: "observations"`)
    oldest = re.search(r'K\d+', view['archive']['groups'][-1]['observations'])
    assert oldest is not None
    status, found = api.post(
        '/recall',
        {'resourceId': resource, 'threadId': thread, 'mode': 'observations', 'query': oldest.group(0)},
    )
    assert status == 200 and found['count'] >= 1 and oldest.group(0) in found['observations']
    # ...and its range leads to the message it came from
    first = re.search(r'## Messages (#\d+)–', found['observations'])
    assert first is not None
    status, page = api.post('/recall', {'resourceId': resource, 'threadId': thread, 'cursor': first.group(1)})
    assert status == 200 and 'code word' in page['messages']

    # The refusals were reported, and the Reflector was not asked on every turn (backoff, unchanged input)
    assert any(f['reason'] == 'invalid_reflection' for f in view['recentFailures']), view['recentFailures']
    assert 0 < model.calls['reflector'] <= 4 * 4, model.calls


# ---------------------------------------------------------------------------------------------------------------------
# Ten facts, the offline model in every role
# ---------------------------------------------------------------------------------------------------------------------
OFFLINE_CONFIG: dict[str, Any] = {
    'model': 'offline',
    'actorModel': 'offline',
    'observation': {'messageTokens': 150},
    'reflection': {'observationTokens': 400},
    'retrieval': True,
}
FACTS = [
    'My name is Alice Moreau and I grew up in a small village near Annecy before my engineering studies in Grenoble.',
    'I live in Lyon now, in a third floor flat near the Croix-Rousse hill with a view over the Saone and the old town.',
    'My sister Claire is a marine biologist in Brest who studies grey seals and spends her summers near Ushant.',
    'I am allergic to peanuts and shellfish, so I always carry an adrenaline pen and check every menu twice.',
    'I drive a green 2012 Renault Clio that my father gave me, and it still starts in the coldest January weeks.',
    'My daughter Emma turns six in May and starts primary school in September at the school at the end of our street.',
    'I work as a structural engineer at Arup on the new footbridge over the Rhone; the concrete pour is next spring.',
    'My favourite composer is Erik Satie, and I play his Gymnopedies on the upright piano my grandmother left me.',
    'I run the Lyon half marathon every October, and my best time so far is one hour and forty two minutes.',
    'Our cat is called Biscotte, she is nine years old, sleeps on the piano and eats nothing but salmon pate.',
]


def test_ten_facts_on_the_offline_model_every_generation_lands_smaller_and_under_the_threshold() -> None:
    with LocalStack(
        port=0,
        config=OFFLINE_CONFIG,
        sweep_interval_s=None,
        visibility_timeout_s=2,
        env={'POWERTOOLS_METRICS_DISABLED': 'true', 'POWERTOOLS_LOG_LEVEL': 'ERROR'},
    ) as stack:
        api = Api(stack.url)
        resource, thread = 'offline', f't-{uuid.uuid4().hex[:8]}'
        seen: list[tuple[int, bool]] = []  # per turn: observation tokens shown, did a reflection start
        for text in [*FACTS, 'ok', 'ok', 'ok']:
            body = chat(api, resource, thread, text)
            status = next(p['data'] for p in body['parts'] if p['type'] == 'data-om-status')
            started = any(
                p['type'] in ('data-om-observation-start', 'data-om-buffering-start')
                and p['data'].get('operationType') == 'reflection'
                for p in body['parts']
            )
            seen.append((status['windows']['active']['observations']['tokens'], started))
        status, answer = api.get(f'/threads/{thread}/memory/generations?resourceId={resource}&limit=50')
        assert status == 200
        generations = list(reversed(answer['generations']))  # oldest first
        assert len(generations) >= 2, 'ten facts should reach a reflection'
        for before, after in zip(generations, generations[1:], strict=False):
            assert after['trigger'] == 'reflection', after
            # smaller than what it condensed, and under the threshold
            assert after['initialObservationTokens'] < before['observationTokens'], (before, after)
            assert after['initialObservationTokens'] < OFFLINE_CONFIG['reflection']['observationTokens'], after
        # A turn whose memory did not change since the turn before has nothing new to reflect: no model call for it
        idle = [n for n in range(1, len(seen)) if seen[n][0] == seen[n - 1][0] and seen[n][1]]
        assert idle == [], seen
        status, view = api.get(f'/threads/{thread}/memory?resourceId={resource}')
        assert '<observation-group' in view['observations'] and view['recentFailures'] == []
