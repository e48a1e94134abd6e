"""The one Powertools Logger, Metrics and Tracer every handler shares, and the business metrics derived from parts.

Business metrics are emitted from handlers only, derived from the `data-om-*` parts the engine returns (and, for the
reflection workflow, from its tasks' results). Failures are counted per `reason` (CONTRACT §2), a dimension, so the
alarms can tell a broken model (`error`, `timeout`) from the system working as designed (`deferred`, `conflict`, ...).

Tracing: X-Ray active tracing (the deployed functions) records each invocation; the Tracer adds a subsegment per AWS
call and per Gemini request. The X-Ray SDK's import and patching (~40 ms in Lambda) happen on the first traced
invocation, not at import (and during a SnapStart init, where they cost no request anything: `warm_tracing`).
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.metrics.functions import is_metrics_disabled
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

SERVICE = os.environ.get('POWERTOOLS_SERVICE_NAME', 'observational-memory')
NAMESPACE = 'ObservationalMemory'
OBSERVATION_FAILURES = 'ObservationFailures'
REFLECTION_FAILURES = 'ReflectionFailures'
ANSWER_NOTES = 'AnswerNotes'
# What the tracer patches: every AWS call (botocore). Model calls get a subsegment at the adapter (`_patch_once`):
# google-genai may run on httpx2, which the X-Ray SDK cannot patch.
TRACED_MODULES = ('botocore',)

Handler = TypeVar('Handler', bound=Callable[..., Any])


class _EmfProvider(AmazonCloudWatchEMFProvider):
    """Powertools' EMF provider, quiet when a request emitted no metric.

    Health checks, reads and empty batches emit no business metric; that is expected, and Powertools' warning about it
    would otherwise land in every such invocation's log (and fail tests that turn warnings into errors).
    """

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='No application metrics to publish')
            super().flush_metrics(raise_on_empty_metrics=raise_on_empty_metrics)


logger = Logger(service=SERVICE)
metrics = Metrics(provider=_EmfProvider(namespace=NAMESPACE, service=SERVICE))
_patched = False
_lock = threading.Lock()
_TRUE = frozenset({'1', 'true', 'yes', 'on'})


@functools.cache
def tracer() -> Tracer | None:
    """The Tracer where tracing is on (a Lambda runtime, POWERTOOLS_TRACE_DISABLED unset), else None.

    Built on first use, not at import: a disabled Tracer still imports the X-Ray SDK, whose non-Lambda sampler builds
    a botocore client (~0.15-0.4 s in every test and local-stack process for nothing).
    """
    if not os.environ.get('LAMBDA_TASK_ROOT') or os.environ.get('POWERTOOLS_TRACE_DISABLED', '').lower() in _TRUE:
        return None
    return Tracer(service=SERVICE, auto_patch=False)


def _patch_once(active: Tracer) -> None:
    global _patched
    if _patched:
        return
    with _lock:
        if not _patched:
            active.patch(modules=TRACED_MODULES)
            from om_lib.adapters.models.gemini import GeminiLanguageModel

            trace_call = active.capture_method(capture_response=False)
            GeminiLanguageModel.generate = trace_call(GeminiLanguageModel.generate)  # type: ignore[method-assign]
            _patched = True


def warm_tracing() -> None:
    """Import the X-Ray SDK and patch the traced calls now (a SnapStart init: free for requests)."""
    active = tracer()
    if active is not None:
        _patch_once(active)


def traced(handler: Handler) -> Handler:
    """Trace `handler` with Powertools' `capture_lambda_handler`, patching AWS and model calls on its first call.

    Responses are never put in traces (they hold users' conversations); exceptions are, by type and message. Where
    tracing is off the handler runs as is.
    """
    captured: list[Callable[..., Any]] = []

    @functools.wraps(handler)
    def wrapper(event: Any, context: Any) -> Any:
        active = tracer()
        if active is None:
            return handler(event, context)
        if not captured:
            _patch_once(active)
            captured.append(active.capture_lambda_handler(handler, capture_response=False))
        return captured[0](event, context)

    # Lets tests see the handler is traced under other decorators (functools.wraps copies __dict__ outwards).
    wrapper.__dict__['om_traced'] = True
    return wrapper  # type: ignore[return-value]


def record_parts_metrics(parts: Iterable[Mapping[str, Any]]) -> None:
    """Count what the engine did in this request, from the `data-om-*` parts it made (`CycleParts.made_here`: not the
    parts background work kept for this request, counted by the worker or workflow that made them).

    `ModelCalls` counts Observer/Reflector cycles that started (one per cycle, retries inside it not included);
    callers add the Actor's calls themselves. Completed observations give `TokensObserved` (messages in) and
    `ObservationTokens` (observations out), reflections `ReflectionInputTokens` / `ReflectionOutputTokens`, each
    cycle its duration (mostly the model call). Failed cycles, synchronous or buffered, count in
    `ObservationFailures` / `ReflectionFailures` with their `reason`.
    """
    totals: Counter[str] = Counter()
    durations: list[tuple[str, int]] = []
    failures: Counter[tuple[str, str]] = Counter()
    notes: Counter[str] = Counter()
    for part in parts:
        kind, data = part.get('type'), part.get('data') or {}
        reflection = data.get('operationType') == 'reflection'
        if kind == 'data-om-observation-start':
            totals['ModelCalls'] += 1
        elif kind == 'data-om-observation-end' and reflection:
            totals['ReflectionsCompleted'] += 1
            totals['ReflectionInputTokens'] += int(data.get('tokensObserved') or 0)
            totals['ReflectionOutputTokens'] += int(data.get('observationTokens') or 0)
            durations.append(('ReflectionDurationMs', int(data.get('durationMs') or 0)))
        elif kind == 'data-om-observation-end':
            totals['ObservationsCompleted'] += 1
            totals['TokensObserved'] += int(data.get('tokensObserved') or 0)
            totals['ObservationTokens'] += int(data.get('observationTokens') or 0)
            durations.append(('ObservationDurationMs', int(data.get('durationMs') or 0)))
        elif kind in ('data-om-observation-failed', 'data-om-buffering-failed'):
            name = REFLECTION_FAILURES if reflection else OBSERVATION_FAILURES
            failures[(name, str(data.get('reason') or 'error'))] += 1
        elif kind == 'data-om-observations-archived':
            totals['ObservationGroupsArchived'] += int(data.get('groupsArchived') or 0)
            totals['ArchivedObservationTokens'] += int(data.get('tokensArchived') or 0)
        if kind == 'data-om-observation-end':
            for note in data.get('notes') or ():
                notes[str(note)] += 1
    for name, value in totals.items():
        if value:
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    for name, value in durations:
        metrics.add_metric(name=name, unit=MetricUnit.Milliseconds, value=value)
    for (name, reason), count in failures.items():
        record_failure(name, reason, count)
    for note, count in notes.items():
        record_note(note, count)


def record_unpublished_events(count: int) -> None:
    """`count` lifecycle events that could not be published (`LifecycleEventsNotPublished`, dimension `service`):
    the outcomes happened; only their events are missing."""
    _single('LifecycleEventsNotPublished', count, {'service': SERVICE})


def record_note(note: str, count: int = 1) -> None:
    """`count` answers accepted with a doubt (`AnswerNotes`, dimensions `service` and `note`): a check was unsure
    about them (om_lib/prompts/log_check.py) but refuses only what is certainly not an observation log."""
    _single(ANSWER_NOTES, count, {'service': SERVICE, 'note': note})


def record_failure(name: str, reason: str, count: int = 1) -> None:
    """`count` failures of `name` (ObservationFailures / ReflectionFailures) with dimensions `service` and `reason`.

    Its own EMF document (a reason is a dimension of this metric only, not of the request's other metrics).
    """
    _single(name, count, {'service': SERVICE, 'reason': reason})


def _single(name: str, value: float, dimensions: dict[str, str]) -> None:
    # single_metric prints at once and ignores POWERTOOLS_METRICS_DISABLED; the shared Metrics honours it.
    if is_metrics_disabled():
        return
    with single_metric(
        name=name, unit=MetricUnit.Count, value=value, namespace=NAMESPACE, default_dimensions=dimensions
    ):
        pass


# The workflow's failure path receives the name of the error that sent it there (the ASL's Catch).
_WORKFLOW_FAILURE_REASONS = {
    'DeadlineExceededError': 'timeout',
    'States.Timeout': 'timeout',
    'States.HeartbeatTimeout': 'timeout',
    'ReflectionRejectedError': 'rejected',
}


def record_workflow_metrics(task: str, result: Mapping[str, Any], error: str | None = None) -> None:
    """Reflection workflow outcomes: a run that started, a committed generation (its tokens in and out), a log that
    would not shrink or an answer that is not a log, a run that failed.

    Counted here, where the run happens, and only here: the parts the run keeps for the client's next step are not
    counted again when that step delivers them (`CycleParts.made_here`).
    """
    outcome = result.get('outcome')
    if task == 'check' and result.get('due'):
        _single('ModelCalls', 1, {'service': SERVICE})
    elif task == 'commit' and outcome == 'committed':
        _single('ReflectionsCompleted', 1, {'service': SERVICE})
        _single('ReflectionInputTokens', int(result.get('inputTokens') or 0), {'service': SERVICE})
        _single('ReflectionOutputTokens', int(result.get('tokens') or 0), {'service': SERVICE})
    elif task == 'reflect' and outcome in ('not_smaller', 'invalid_reflection'):
        record_failure(REFLECTION_FAILURES, str(outcome))
    elif task == 'reflect' and outcome == 'reflected':
        for note in result.get('notes') or ():
            record_note(str(note))
    elif task == 'release':
        record_failure(REFLECTION_FAILURES, _WORKFLOW_FAILURE_REASONS.get(error or '', 'error'))
