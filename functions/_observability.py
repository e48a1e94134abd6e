"""The one Powertools Logger and Metrics pair every handler shares (no Tracer: its import costs 0.1-0.45 s).

Business metrics are emitted from handlers only, derived from the `data-om-*` parts the engine returns.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

SERVICE = os.environ.get('POWERTOOLS_SERVICE_NAME', 'observational-memory')
NAMESPACE = 'ObservationalMemory'


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


def record_parts_metrics(parts: Iterable[dict[str, Any]]) -> None:
    """Count what the engine did in this request, from its `data-om-*` parts.

    `ModelCalls` counts Observer/Reflector cycles that started (one per cycle, retries inside it not included);
    callers add the Actor's calls themselves.
    """
    completed = tokens_observed = observation_tokens = model_calls = 0
    for part in parts:
        kind, data = part.get('type'), part.get('data') or {}
        if kind == 'data-om-observation-start':
            model_calls += 1
        elif kind == 'data-om-observation-end':
            completed += 1
            tokens_observed += int(data.get('tokensObserved') or 0)
            observation_tokens += int(data.get('observationTokens') or 0)
    if model_calls:
        metrics.add_metric(name='ModelCalls', unit=MetricUnit.Count, value=model_calls)
    if completed:
        metrics.add_metric(name='ObservationsCompleted', unit=MetricUnit.Count, value=completed)
        metrics.add_metric(name='TokensObserved', unit=MetricUnit.Count, value=tokens_observed)
        metrics.add_metric(name='ObservationTokens', unit=MetricUnit.Count, value=observation_tokens)
