"""Runs a `ModelSpec` against the configured providers: tier choice, retries with backoff, fallbacks, one deadline,
and a circuit breaker per model.

Providers (`om_lib.ports.LanguageModel`) make exactly one attempt per call; every retry decision lives here, so a
path's single deadline bounds all of them (the google-genai client's own retries are switched off in its adapter).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from om_lib.errors import (
    DeadlineExceededError,
    ModelError,
    ModelOutputError,
    ModelRequestError,
    ModelUnavailableError,
)
from om_lib.llm import ModelRequest, ModelResponse
from om_lib.models.model_spec import ModelByInputTokens, ModelFallbacks, ModelRef, ModelSpec
from om_lib.ports import Clock, LanguageModel, StreamingLanguageModel, TextSink

logger = logging.getLogger(__name__)

_TRANSIENT = (ModelUnavailableError, DeadlineExceededError)


class _Relay:
    """Passes streamed text on to the caller's sink and remembers whether any went out: once the listener has part
    of an answer, a failure is final (no retry, no fallback would give it a clean second answer)."""

    def __init__(self, sink: TextSink) -> None:
        self.sink = sink
        self.emitted = False

    def __call__(self, delta: str) -> None:
        if delta:
            self.emitted = True
            self.sink(delta)


@dataclass
class _Circuit:
    failures: int = 0
    open_until: float = 0.0
    cooldown_s: float = 0.0
    probing: bool = False


class CircuitBreakers:
    """One circuit breaker per model, for this process (a Lambda container, the local stack).

    After `threshold` consecutive transient failures of a model (timeouts, 429, 5xx, unreachable), calls to it fail
    at once for a cooldown: the provider's `Retry-After` when it sent one, else `base_cooldown_s`, doubling on every
    failed trial up to `max_cooldown_s` (a long outage costs one trial call per 5 min at most). Then one call goes
    through (half-open) while the others still fail fast: its success closes the circuit, its failure opens it again.

    So during a brown-out a step answers at once, with its raw messages and a `model_unavailable` failure, instead of
    paying every retry of a dead model; background work backs off through its queue or workflow and catches up when
    the model is back. State is per process, not shared across Lambda containers: each container learns on its own
    within `threshold` calls, which keeps the breaker off the table's write path.
    """

    def __init__(
        self, clock: Clock, *, threshold: int = 3, base_cooldown_s: float = 5.0, max_cooldown_s: float = 300.0
    ) -> None:
        self._clock = clock
        self.threshold = threshold
        self.base_cooldown_s = base_cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self._circuits: dict[str, _Circuit] = {}
        self._lock = threading.Lock()

    def admit(self, model: str) -> None:
        """Let a call to `model` go through, or raise ModelUnavailableError at once while its circuit is open."""
        now = self._clock.monotonic()
        with self._lock:
            circuit = self._circuits.get(model)
            if circuit is None or circuit.failures < self.threshold:
                return
            if now >= circuit.open_until and not circuit.probing:
                circuit.probing = True  # half-open: this call is the trial
                return
            wait = max(0.0, circuit.open_until - now)
        raise ModelUnavailableError(
            f'{model} is failing; not calling it for {wait:.0f} s more (circuit breaker open)',
            model=model,
            retry_after_s=wait or None,
            circuit_open=True,
        )

    def succeeded(self, model: str) -> None:
        """A usable answer (or a permanent refusal): the model is reachable again."""
        with self._lock:
            self._circuits.pop(model, None)

    def failed(self, model: str, *, retry_after_s: float | None = None) -> None:
        """A transient failure of `model`."""
        now = self._clock.monotonic()
        with self._lock:
            circuit = self._circuits.setdefault(model, _Circuit())
            circuit.failures += 1
            if circuit.failures < self.threshold:
                return
            was_probing = circuit.probing
            circuit.probing = False
            if circuit.cooldown_s == 0.0:
                circuit.cooldown_s = self.base_cooldown_s
            elif was_probing:
                circuit.cooldown_s = min(self.max_cooldown_s, circuit.cooldown_s * 2)
            cooldown = max(circuit.cooldown_s, retry_after_s or 0.0)
            circuit.open_until = now + cooldown
            if circuit.failures == self.threshold or was_probing:
                logger.warning('circuit open for a failing model', extra={'model': model, 'cooldown_s': cooldown})

    def is_open(self, model: str) -> bool:
        """Is the model's circuit open now (calls would fail at once)?"""
        with self._lock:
            circuit = self._circuits.get(model)
            return (
                circuit is not None
                and circuit.failures >= self.threshold
                and (self._clock.monotonic() < circuit.open_until or circuit.probing)
            )


class ModelRouter:
    """Sends a request to the model a spec names, retrying transient failures and falling back, within a deadline.

    Retry policy (reference §12.9, bounded by the caller's deadline):
      * transient errors (`ModelUnavailableError`, a single call's `DeadlineExceededError`) are retried on the same
        model with backoff `backoff_base_s × 2ⁿ` capped at `backoff_cap_s`, ±`jitter`, up to `max_retries` times
        (`default_max_retries` for a single model, each fallback entry's own `max_retries` otherwise);
      * `ModelOutputError` (empty, blocked, unusable answer) gets one fresh sample on the same model, no backoff;
      * `ModelRequestError` (permanent) is never retried on the same model;
      * a fallback list moves to its next entry after any `ModelError` the entry could not recover from;
      * no attempt starts once the deadline has passed, no backoff sleeps past it, and each attempt's
        `timeout_s` is the time left;
      * a streamed call (`on_text`) is retried and falls back like any other until its first text went out; after
        that its failure is final (the listener would otherwise see two answers run into each other).
    """

    def __init__(
        self,
        providers: Mapping[str, LanguageModel],
        *,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        default_max_retries: int = 2,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 120.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
        breakers: CircuitBreakers | None = None,
    ) -> None:
        """Create a router.

        Args:
            providers: Provider key (`google`, `offline`, ...) → its LanguageModel.
            clock: Supplies `monotonic()`; deadlines are on this clock.
            sleep: Blocks for the backoff delay (injectable so tests do not wait).
            default_max_retries: Transient-error retries for a single model (not a fallback list).
            backoff_base_s: First backoff delay.
            backoff_cap_s: Largest backoff delay before jitter.
            jitter: Relative jitter, 0.2 means ±20 %.
            rng: Random source for jitter (seed it in tests for determinism).
            breakers: The per-model circuit breakers (default: three failures open a model's circuit for 5 s).
        """
        if default_max_retries < 0:
            raise ValueError('default_max_retries must be >= 0')
        self._providers = dict(providers)
        self._clock = clock
        self._sleep = sleep
        self._default_max_retries = default_max_retries
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._jitter = jitter
        self._rng = rng or random.SystemRandom()
        self.breakers = breakers or CircuitBreakers(clock)

    def generate(
        self,
        spec: ModelSpec,
        request: ModelRequest,
        *,
        input_tokens: int,
        deadline: float,
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        """Get a usable answer for `request` from the model(s) `spec` names.

        Args:
            spec: A `ModelRef`, `ModelByInputTokens` or `ModelFallbacks`.
            request: The provider-neutral request.
            input_tokens: The input size used to pick a `ModelByInputTokens` tier.
            deadline: The path's deadline on `clock.monotonic()`; nothing starts after it.
            on_text: Streams the answer: its text is handed on piece by piece as it arrives (a provider that cannot
                stream hands it on whole when it is done). Must not raise.

        Returns:
            The answer, with `.model` set to the `provider/model_id` that produced it (`answered_by`).

        Raises:
            ModelRoutingError: `input_tokens` exceeds the largest `ModelByInputTokens` tier.
            ModelRequestError: A provider is unknown, or the (last) model refused the request.
            DeadlineExceededError: The deadline passed before a usable answer arrived.
            ModelUnavailableError: The (last) model stayed unavailable after its retries.
            ModelOutputError: The (last) model's answers were unusable twice.
        """
        plan = self._plan(spec, input_tokens)
        relay = _Relay(on_text) if on_text is not None else None
        for index, (ref, max_retries) in enumerate(plan):
            try:
                return self._run_entry(ref, max_retries, request, deadline, relay)
            except ModelError as exc:
                if index + 1 == len(plan) or (relay is not None and relay.emitted):
                    raise
                # Also after a deadline error: the next entry starts only if time is left (it checks first).
                logger.warning(
                    'model failed; falling back',
                    extra={'model': ref.name, 'next_model': plan[index + 1][0].name, 'error': exc.code},
                )
        raise AssertionError('unreachable: a model plan is never empty')

    def _plan(self, spec: ModelSpec, input_tokens: int) -> list[tuple[ModelRef, int]]:
        if isinstance(spec, ModelFallbacks):
            plan = list(spec.entries)
        elif isinstance(spec, ModelByInputTokens):
            plan = [(spec.resolve(input_tokens), self._default_max_retries)]
        else:
            plan = [(spec, self._default_max_retries)]
        # Check every provider before the first call: an unknown provider is a wiring bug that a fallback must not
        # hide until the day the first model fails.
        for ref, _ in plan:
            if ref.provider not in self._providers:
                known = ', '.join(sorted(self._providers)) or 'none'
                raise ModelRequestError(
                    f'unknown model provider {ref.provider!r} in {ref.name!r} (configured providers: {known})',
                    model=ref.name,
                )
        return plan

    def _run_entry(
        self, ref: ModelRef, max_retries: int, request: ModelRequest, deadline: float, relay: _Relay | None
    ) -> ModelResponse:
        """Call one model until it answers usably or its retry budget is spent; raise its last error otherwise."""
        provider = self._providers[ref.provider]
        transient_retries = 0
        output_retry_used = False
        last_error: ModelError | None = None
        while True:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                raise _deadline_error(ref, last_error) from last_error
            self.breakers.admit(ref.name)  # an open circuit fails here, at once: no retries, no sleeping
            try:
                response = _call(provider, ref.model_id, request, remaining, relay)
            except _TRANSIENT as exc:
                _name_model(exc, ref)
                last_error = exc
                retry_after = exc.retry_after_s if isinstance(exc, ModelUnavailableError) else None
                self.breakers.failed(ref.name, retry_after_s=retry_after)
                if transient_retries >= max_retries or self.breakers.is_open(ref.name) or _streamed(relay):
                    raise  # out of retries, or this failure opened the model's circuit: no point sleeping
                # Honour the provider's Retry-After when it asks for longer than our backoff.
                delay = max(self._backoff(transient_retries), retry_after or 0.0)
                if self._clock.monotonic() + delay >= deadline:
                    # Sleeping would land on or past the deadline, leaving no time for the attempt it waits for.
                    raise _deadline_error(ref, exc) from exc
                transient_retries += 1
                logger.info(
                    'model unavailable; retrying',
                    extra={'model': ref.name, 'retry': transient_retries, 'delay_s': round(delay, 3)},
                )
                self._sleep(delay)
            except ModelOutputError as exc:
                _name_model(exc, ref)
                last_error = exc
                if output_retry_used or _streamed(relay):
                    raise
                # A blocked or empty answer is a property of this sample, not of the service: ask again at once.
                output_retry_used = True
                logger.info('unusable model answer; sampling again', extra={'model': ref.name})
            except ModelRequestError as exc:
                _name_model(exc, ref)
                self.breakers.succeeded(ref.name)  # the model answered (with a refusal): it is reachable
                raise
            else:
                self.breakers.succeeded(ref.name)
                return replace(response, model=answered_by(ref, response))

    def _backoff(self, retry_index: int) -> float:
        base = min(self._backoff_base_s * (2**retry_index), self._backoff_cap_s)
        return float(base * self._rng.uniform(1 - self._jitter, 1 + self._jitter))


def answered_by(ref: ModelRef, response: ModelResponse) -> str:
    """The `provider/model` name of the model that answered `ref`'s call: `ref`'s own name when the provider answered
    as the model asked for (it echoes the id), else the name the provider gave itself (a stand-in: the offline model
    answering for a provider without credentials reports `offline/…`). Usage and lifecycle events carry it."""
    if response.model in ('', ref.model_id, ref.name):
        return ref.name
    return response.model


def _call(
    provider: LanguageModel, model_id: str, request: ModelRequest, timeout_s: float, relay: _Relay | None
) -> ModelResponse:
    """One attempt: streamed when the caller listens and the provider can stream, else whole (its text then handed
    on in one piece once it is known to be usable)."""
    if relay is None:
        return provider.generate(model_id, request, timeout_s=timeout_s)
    if isinstance(provider, StreamingLanguageModel):
        return provider.stream(model_id, request, timeout_s=timeout_s, on_text=relay)
    response = provider.generate(model_id, request, timeout_s=timeout_s)
    relay(response.text)
    return response


def _streamed(relay: _Relay | None) -> bool:
    return relay is not None and relay.emitted


def _name_model(exc: ModelError, ref: ModelRef) -> None:
    # Providers know only the model id; fill in the full name so logs and callers see which model failed.
    if hasattr(exc, 'model') and exc.model is None:
        exc.model = ref.name


def _deadline_error(ref: ModelRef, last_error: ModelError | None) -> DeadlineExceededError:
    detail = f' (last error: {last_error})' if last_error is not None else ''
    return DeadlineExceededError(f'deadline passed before {ref.name} gave a usable answer{detail}')
