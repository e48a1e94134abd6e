"""ModelRouter: tier choice, retries with backoff, fallbacks and the single deadline, with scripted providers."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from om_lib.errors import (
    ConfigError,
    DeadlineExceededError,
    ModelOutputError,
    ModelRequestError,
    ModelUnavailableError,
)
from om_lib.llm import Content, ModelRequest, ModelResponse
from om_lib.models.model_router import CircuitBreakers, ModelRouter
from om_lib.models.model_spec import ModelByInputTokens, ModelFallbacks, ModelRef, ModelRoutingError

REQUEST = ModelRequest(purpose='observer', system='sys', contents=(Content('user', ('hello',)),))
FLASH = ModelRef('google', 'gemini-2.5-flash')
PRO = ModelRef('google', 'gemini-2.5-pro')
LITE = ModelRef('google', 'gemini-2.5-flash-lite')


class FakeClock:
    """Monotonic time that moves only through `sleep` (and a per-call cost the provider charges)."""

    def __init__(self) -> None:
        self.mono = 100.0
        self.sleeps: list[float] = []

    def now(self):  # pragma: no cover - unused by the router
        raise NotImplementedError

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.mono += seconds


Outcome = str | Exception


@dataclass
class ScriptedProvider:
    """Replays outcomes per model id: a str is an answer, an exception is raised. Each call costs `call_s`."""

    clock: FakeClock
    scripts: dict[str, list[Outcome]] = field(default_factory=dict)
    call_s: float = 0.0
    calls: list[tuple[str, float, float]] = field(default_factory=list)  # (model_id, started_at, timeout_s)

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        self.calls.append((model_id, self.clock.mono, timeout_s))
        self.clock.mono += self.call_s
        outcome = self.scripts[model_id].pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return ModelResponse(text=outcome, model=model_id)


def unavailable() -> ModelUnavailableError:
    return ModelUnavailableError('503 UNAVAILABLE', status_code=503)


def make_router(
    clock: FakeClock, scripts: dict[str, list[Outcome]], **kwargs: object
) -> tuple[ModelRouter, ScriptedProvider]:
    provider = ScriptedProvider(clock, scripts)
    router = ModelRouter({'google': provider}, clock=clock, sleep=clock.sleep, rng=random.Random(7), **kwargs)  # type: ignore[arg-type]
    return router, provider


def test_model_router_retries_transient_error_then_succeeds() -> None:
    # Given a model that fails twice with 503 and then answers
    clock = FakeClock()
    router, provider = make_router(clock, {'gemini-2.5-flash': [unavailable(), unavailable(), 'ok']})

    # When the router calls it with the default budget (2 retries)
    response = router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60)

    # Then it answers after three attempts, backing off ~1 s then ~2 s (±20 %), and names the full model
    assert response.text == 'ok'
    assert response.model == 'google/gemini-2.5-flash'
    assert len(provider.calls) == 3
    assert len(clock.sleeps) == 2
    assert 0.8 <= clock.sleeps[0] <= 1.2
    assert 1.6 <= clock.sleeps[1] <= 2.4


def test_a_stand_in_provider_is_named_as_it_names_itself_not_as_the_model_it_stands_in_for() -> None:
    # Given the offline model standing in for Google (a local run without a Gemini key)
    from om_lib.models.offline_model import OfflineLanguageModel

    clock = FakeClock()
    router = ModelRouter({'google': OfflineLanguageModel()}, clock=clock, sleep=clock.sleep)
    # When a role configured on google/gemini-2.5-flash calls it
    response = router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60)
    # Then the answer (and every usage made from it) names the model that ran
    assert response.model == 'offline/gemini-2.5-flash'
    # while the offline model asked by name, and a real provider answering as asked, keep the configured name
    offline = ModelRouter({'offline': OfflineLanguageModel()}, clock=clock, sleep=clock.sleep)
    assert offline.generate(ModelRef('offline', ''), REQUEST, input_tokens=10, deadline=clock.mono + 60).model == (
        'offline'
    )
    real, _ = make_router(clock, {'gemini-2.5-flash': ['ok']})
    assert real.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60).model == 'google/gemini-2.5-flash'


def test_model_router_gives_up_after_max_retries() -> None:
    clock = FakeClock()
    router, provider = make_router(clock, {'gemini-2.5-flash': [unavailable()] * 5}, default_max_retries=1)

    with pytest.raises(ModelUnavailableError) as info:
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60)

    assert len(provider.calls) == 2
    assert info.value.model == 'google/gemini-2.5-flash'


def test_model_router_backoff_is_capped() -> None:
    clock = FakeClock()
    router, _ = make_router(
        clock,
        {'gemini-2.5-flash': [unavailable()] * 6 + ['ok']},
        default_max_retries=6,
        backoff_cap_s=4.0,
        breakers=CircuitBreakers(clock, threshold=100),  # (the breaker's own tests are below)
    )

    router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 600)

    assert max(clock.sleeps) <= 4.0 * 1.2
    assert clock.sleeps[-1] >= 4.0 * 0.8


def test_model_router_does_not_retry_permanent_error() -> None:
    # Given a model that refuses the request (400)
    clock = FakeClock()
    router, provider = make_router(clock, {'gemini-2.5-flash': [ModelRequestError('bad', status_code=400), 'ok']})

    # When / Then: one attempt, the error surfaces unchanged
    with pytest.raises(ModelRequestError) as info:
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60)
    assert info.value.status_code == 400
    assert len(provider.calls) == 1
    assert clock.sleeps == []


def test_model_router_samples_again_once_after_unusable_output() -> None:
    clock = FakeClock()
    router, provider = make_router(clock, {'gemini-2.5-flash': [ModelOutputError('blocked'), 'ok']})

    response = router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60)

    assert response.text == 'ok'
    assert len(provider.calls) == 2
    assert clock.sleeps == []  # a fresh sample needs no backoff


def test_model_router_raises_after_second_unusable_output() -> None:
    clock = FakeClock()
    router, provider = make_router(
        clock, {'gemini-2.5-flash': [ModelOutputError('empty'), ModelOutputError('empty'), 'ok']}
    )

    with pytest.raises(ModelOutputError):
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60)
    assert len(provider.calls) == 2


def test_model_router_fallback_serves_from_second_model_after_retries() -> None:
    # Given a fallback list whose first model stays unavailable for 1 + max_retries attempts
    clock = FakeClock()
    spec = ModelFallbacks(entries=((FLASH, 2), (PRO, 0)))
    router, provider = make_router(clock, {'gemini-2.5-flash': [unavailable()] * 3, 'gemini-2.5-pro': ['from pro']})

    # When the router runs the list
    response = router.generate(spec, REQUEST, input_tokens=10, deadline=clock.mono + 60)

    # Then the second model answers, and the response names it
    assert response.text == 'from pro'
    assert response.model == 'google/gemini-2.5-pro'
    assert [model for model, _, _ in provider.calls] == ['gemini-2.5-flash'] * 3 + ['gemini-2.5-pro']
    assert len(clock.sleeps) == 2  # backoff between retries of one model, none when switching models


def test_model_router_fallback_moves_on_after_permanent_error() -> None:
    clock = FakeClock()
    spec = ModelFallbacks(entries=((FLASH, 3), (PRO, 0)))
    router, provider = make_router(
        clock, {'gemini-2.5-flash': [ModelRequestError('404 model gone', status_code=404)], 'gemini-2.5-pro': ['ok']}
    )

    response = router.generate(spec, REQUEST, input_tokens=10, deadline=clock.mono + 60)

    assert response.model == 'google/gemini-2.5-pro'
    assert len(provider.calls) == 2


def test_model_router_fallback_raises_last_error_when_all_fail() -> None:
    clock = FakeClock()
    spec = ModelFallbacks(entries=((FLASH, 0), (PRO, 0)))
    router, _ = make_router(
        clock, {'gemini-2.5-flash': [unavailable()], 'gemini-2.5-pro': [ModelRequestError('400', status_code=400)]}
    )

    with pytest.raises(ModelRequestError) as info:
        router.generate(spec, REQUEST, input_tokens=10, deadline=clock.mono + 60)
    assert info.value.model == 'google/gemini-2.5-pro'


@pytest.mark.parametrize(
    ('input_tokens', 'expected'),
    [(5000, 'gemini-2.5-flash-lite'), (10000, 'gemini-2.5-flash-lite'), (10001, 'gemini-2.5-flash')],
)
def test_model_router_by_input_tokens_picks_tier(input_tokens: int, expected: str) -> None:
    clock = FakeClock()
    spec = ModelByInputTokens(tiers=((40000, FLASH), (10000, LITE)))  # unsorted on purpose
    router, provider = make_router(clock, {'gemini-2.5-flash-lite': ['lite'], 'gemini-2.5-flash': ['flash']})

    response = router.generate(spec, REQUEST, input_tokens=input_tokens, deadline=clock.mono + 60)

    assert response.model == f'google/{expected}'
    assert [model for model, _, _ in provider.calls] == [expected]


def test_model_router_by_input_tokens_over_largest_tier_raises() -> None:
    clock = FakeClock()
    spec = ModelByInputTokens(tiers=((10000, LITE), (40000, FLASH)))
    router, provider = make_router(clock, {})

    with pytest.raises(ModelRoutingError, match=r'input token count \(50000\) exceeds the largest .* \(40000\)'):
        router.generate(spec, REQUEST, input_tokens=50000, deadline=clock.mono + 60)
    assert provider.calls == []


def test_model_router_deadline_stops_retries() -> None:
    # Given calls that each take 3 s and fail, and a 10 s deadline with generous retries
    clock = FakeClock()
    deadline = clock.mono + 10
    router, provider = make_router(
        clock,
        {'gemini-2.5-flash': [unavailable()] * 10},
        default_max_retries=8,
        breakers=CircuitBreakers(clock, threshold=100),  # (the breaker would stop the retries first)
    )
    provider.call_s = 3.0

    # When the router keeps retrying
    with pytest.raises(DeadlineExceededError) as info:
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=deadline)

    # Then no attempt started at or after the deadline, each got only the time left, and the cause is kept
    assert provider.calls
    assert all(started < deadline for _, started, _ in provider.calls)
    assert all(abs(started + timeout - deadline) < 1e-9 for _, started, timeout in provider.calls)
    assert clock.mono <= deadline + 3.0  # at most the last in-flight call overran, never a sleep
    assert isinstance(info.value.__cause__, ModelUnavailableError)


def test_model_router_no_time_left_raises_without_calling() -> None:
    clock = FakeClock()
    router, provider = make_router(clock, {'gemini-2.5-flash': ['ok']})

    with pytest.raises(DeadlineExceededError):
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono)
    assert provider.calls == []


def test_model_router_unknown_provider_is_named() -> None:
    clock = FakeClock()
    router, _ = make_router(clock, {})

    with pytest.raises(ModelRequestError, match="unknown model provider 'openai'"):
        router.generate(ModelRef('openai', 'gpt-4o'), REQUEST, input_tokens=10, deadline=clock.mono + 60)


def test_model_router_routes_to_each_provider() -> None:
    clock = FakeClock()
    google = ScriptedProvider(clock, {'gemini-2.5-flash': [unavailable()]})
    offline = ScriptedProvider(clock, {'': ['offline answer']})
    router = ModelRouter({'google': google, 'offline': offline}, clock=clock, sleep=clock.sleep)
    spec = ModelFallbacks(entries=((FLASH, 0), (ModelRef.parse('offline'), 0)))

    response = router.generate(spec, REQUEST, input_tokens=10, deadline=clock.mono + 60)

    assert response.model == 'offline'
    assert response.text == 'offline answer'


@pytest.mark.parametrize(
    ('build', 'message'),
    [
        (lambda: ModelByInputTokens(tiers=()), 'requires at least one threshold in "upTo"'),
        (lambda: ModelByInputTokens(tiers=((0, FLASH),)), 'threshold keys must be positive numbers. Got: 0'),
        (lambda: ModelByInputTokens(tiers=((-5, FLASH),)), 'threshold keys must be positive numbers. Got: -5'),
        (
            lambda: ModelByInputTokens(tiers=((float('inf'), FLASH),)),  # type: ignore[arg-type]
            'threshold keys must be positive numbers. Got: inf',
        ),
        (lambda: ModelByInputTokens.from_up_to({'lots': FLASH}), 'threshold keys must be positive numbers. Got: lots'),
        (lambda: ModelFallbacks(entries=()), 'at least one entry'),
        (lambda: ModelFallbacks(entries=((FLASH, -1),)), 'maxRetries'),
        (lambda: ModelRef.parse('/x'), 'provider/model'),
    ],
)
def test_model_spec_validation(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace('(', r'\(').replace(')', r'\)')):
        build()


def test_model_spec_from_up_to_sorts_and_parses_string_keys() -> None:
    spec = ModelByInputTokens.from_up_to({'40000': FLASH, '10000': LITE})

    assert spec.thresholds == (10000, 40000)
    assert spec.resolve(10000) == LITE


def test_model_ref_parse_and_name() -> None:
    assert ModelRef.parse('google/gemini-2.5-flash') == FLASH
    assert ModelRef.parse('offline') == ModelRef('offline', '')
    assert ModelRef.parse('google/tunedModels/abc').model_id == 'tunedModels/abc'
    assert FLASH.name == 'google/gemini-2.5-flash'


# -- the circuit breaker (issue 16) ----------------------------------------------------------------------------------
def test_three_failures_open_the_circuit_and_later_calls_fail_at_once() -> None:
    # Given a model that keeps failing
    clock = FakeClock()
    router, provider = make_router(clock, {'gemini-2.5-flash': [unavailable()] * 20}, default_max_retries=2)
    # When one call spends its retries (three attempts)
    with pytest.raises(ModelUnavailableError):
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 600)
    attempts = len(provider.calls)
    sleeps = list(clock.sleeps)
    # Then the circuit is open: the next calls fail at once, without calling the model or sleeping
    for _ in range(5):
        with pytest.raises(ModelUnavailableError) as info:
            router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 600)
        assert info.value.circuit_open
    assert len(provider.calls) == attempts == 3
    assert clock.sleeps == sleeps


def test_after_the_cooldown_one_trial_call_closes_the_circuit_when_the_model_is_back() -> None:
    clock = FakeClock()
    router, provider = make_router(clock, {'gemini-2.5-flash': [unavailable()] * 3 + ['ok', 'ok']})
    with pytest.raises(ModelUnavailableError):
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 600)
    assert router.breakers.is_open('google/gemini-2.5-flash')
    clock.mono += 6  # past the 5 s cooldown
    assert router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 600).text == 'ok'
    assert not router.breakers.is_open('google/gemini-2.5-flash')
    assert router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 600).text == 'ok'


def test_a_failed_trial_reopens_the_circuit_for_twice_as_long() -> None:
    clock = FakeClock()
    breakers = CircuitBreakers(clock, threshold=3, base_cooldown_s=5)
    for _ in range(3):
        breakers.failed('m')
    clock.mono += 6
    breakers.admit('m')  # the trial goes through
    with pytest.raises(ModelUnavailableError):
        breakers.admit('m')  # the others still fail fast while it runs
    breakers.failed('m')  # the trial failed
    clock.mono += 6
    with pytest.raises(ModelUnavailableError):
        breakers.admit('m')  # 10 s now
    clock.mono += 5
    breakers.admit('m')


def test_retry_after_from_the_provider_is_honoured() -> None:
    # Given a 429 that asks to wait 7 s, and a deadline that allows it
    clock = FakeClock()
    slow_down = ModelUnavailableError('429', status_code=429, retry_after_s=7.0)
    router, _ = make_router(clock, {'gemini-2.5-flash': [slow_down, 'ok']})
    assert router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 60).text == 'ok'
    # Then the retry waited at least what the provider asked for (not our 1 s backoff)
    assert clock.sleeps and clock.sleeps[0] >= 7.0


def test_a_fallback_model_answers_at_once_while_the_primary_circuit_is_open() -> None:
    clock = FakeClock()
    router, provider = make_router(
        clock, {'gemini-2.5-flash': [unavailable()] * 10, 'gemini-2.5-pro': ['pro'] * 10}, default_max_retries=2
    )
    with pytest.raises(ModelUnavailableError):
        router.generate(FLASH, REQUEST, input_tokens=10, deadline=clock.mono + 600)
    spec = ModelFallbacks(entries=((FLASH, 2), (PRO, 0)))
    before = len(provider.calls)
    assert router.generate(spec, REQUEST, input_tokens=10, deadline=clock.mono + 600).text == 'pro'
    assert len(provider.calls) == before + 1  # the open primary was not called
