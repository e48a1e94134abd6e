"""Model tokens per question and role, and what they cost (prices from bench/prices.json).

On the local stack every model call runs in this process, so `ModelMeter` counts the usage each provider reports, per
resource (one resource per question) and per role (`observer`, `reflector`, `actor`, `title`). A call is attributed
to the resource its messages belong to, or else (the Reflector reads observations, not messages) to the resource of
the service call running on that thread: the harness marks each step, turn, chat, worker job and workflow task.

A deployed stack does not report its model usage to clients: there the report shows the judge's tokens only, and
the models' bills are the providers'.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PRICES_FILE = Path(__file__).resolve().parents[1] / 'prices.json'
ROLES = ('observer', 'reflector', 'actor', 'title', 'judge')

Usage = dict[str, int]  # calls, input_tokens, output_tokens, cache_read_tokens


def empty_usage() -> Usage:
    return {'calls': 0, 'input_tokens': 0, 'output_tokens': 0, 'cache_read_tokens': 0}


def add_usage(into: Usage, other: Mapping[str, int]) -> None:
    for key in ('calls', 'input_tokens', 'output_tokens', 'cache_read_tokens'):
        into[key] = into.get(key, 0) + int(other.get(key, 0))


class ModelMeter:
    """Counts reported model usage per resource, role and model, for the local stack running in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        # resource → role → model → usage
        self._usage: dict[str, dict[str, dict[str, Usage]]] = defaultdict(lambda: defaultdict(dict))
        self._installed: list[Callable[[], None]] = []

    @contextmanager
    def acting_for(self, resource_id: str | None) -> Iterator[None]:
        """Attribute this thread's model calls without messages to `resource_id` for the block."""
        previous = getattr(self._local, 'resource', None)
        self._local.resource = resource_id
        try:
            yield
        finally:
            self._local.resource = previous

    def record(self, resource_id: str | None, role: str, model: str, usage: Any) -> None:
        """One successful model call."""
        key = resource_id or '(unattributed)'
        with self._lock:
            entry = self._usage[key][role].setdefault(model, empty_usage())
            add_usage(
                entry,
                {
                    'calls': 1,
                    'input_tokens': getattr(usage, 'input_tokens', 0),
                    'output_tokens': getattr(usage, 'output_tokens', 0),
                    'cache_read_tokens': getattr(usage, 'cache_read_tokens', 0),
                },
            )

    def take(self, resource_id: str) -> dict[str, dict[str, Usage]]:
        """The usage counted for `resource_id` so far, removed from the meter: role → model → usage."""
        with self._lock:
            found = self._usage.pop(resource_id, {})
        return {role: dict(models) for role, models in found.items()}

    # -- installing on the local stack -------------------------------------------------------------------------------
    def install(self, providers: Mapping[str, Any], service: Any) -> None:
        """Wrap each provider's `generate` and mark the service's entry points (objects of the running stack)."""
        seen: set[int] = set()
        for provider, model in providers.items():
            if id(model) in seen:
                continue  # one object serving several provider names is counted once
            seen.add(id(model))
            self._wrap_model(provider, model)
        for name in ('step', 'turn', 'chat'):
            self._mark(service, name, lambda args, kwargs: args[0] if args else kwargs.get('resource_id'))
        for name in ('run_job', 'workflow_task'):
            self._mark(service, name, _job_resource)

    def uninstall(self) -> None:
        """Undo `install`."""
        for undo in reversed(self._installed):
            undo()
        self._installed.clear()

    def _wrap_model(self, provider: str, model: Any) -> None:
        original = model.generate

        def generate(model_id: str, request: Any, *, timeout_s: float) -> Any:
            response = original(model_id, request, timeout_s=timeout_s)
            resource = next((m.resource_id for m in request.source_messages if m.resource_id), None)
            name = f'{provider}/{model_id}' if model_id else provider
            self.record(resource or getattr(self._local, 'resource', None), request.purpose, name, response.usage)
            return response

        model.generate = generate
        self._installed.append(lambda: delattr(model, 'generate'))

    def _mark(self, service: Any, name: str, resource_of: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> None:
        original = getattr(service, name, None)
        if original is None:
            return

        def marked(*args: Any, **kwargs: Any) -> Any:
            resource = resource_of(args, kwargs)
            with self.acting_for(resource if isinstance(resource, str) else None):
                return original(*args, **kwargs)

        setattr(service, name, marked)
        self._installed.append(lambda: delattr(service, name))


def _job_resource(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    job = kwargs.get('job')
    if job is None:
        job = next((a for a in args if hasattr(a, 'resource_id')), None)
    return getattr(job, 'resource_id', None)


# -- prices ----------------------------------------------------------------------------------------------------------
def model_prices(path: Path = PRICES_FILE) -> dict[str, dict[str, float]]:
    """USD per 1M tokens by model name (`openai/gpt-4o`): `input`, `output` and, where published, `cached_input`."""
    data = json.loads(path.read_text())
    return {name: dict(rates) for name, rates in data.get('models', {}).get('per_million_tokens', {}).items()}


def price_of(model: str, prices: Mapping[str, Mapping[str, float]]) -> Mapping[str, float] | None:
    """The model's rates; a Bedrock inference profile (`us.`, `eu.`, `global.` …) is priced as its model; `offline`
    costs nothing."""
    if model.split('/', 1)[0] == 'offline':
        return {'input': 0.0, 'output': 0.0}
    if model in prices:
        return prices[model]
    provider, _, model_id = model.partition('/')
    if provider == 'bedrock' and '.' in model_id:
        bare = (
            model_id.split('.', 1)[1]
            if model_id.split('.', 1)[0] in ('us', 'eu', 'apac', 'global', 'jp', 'au')
            else model_id
        )
        return prices.get(f'bedrock/{bare}')
    return None


def cost_usd(usage: Mapping[str, int], rates: Mapping[str, float]) -> float:
    """What one model's usage costs; cached input at `cached_input` where the provider reported cache hits."""
    cached = int(usage.get('cache_read_tokens', 0))
    fresh = max(0, int(usage.get('input_tokens', 0)) - cached)
    cached_rate = rates.get('cached_input', rates['input'])
    return (fresh * rates['input'] + cached * cached_rate + int(usage.get('output_tokens', 0)) * rates['output']) / 1e6


def cost_of(
    usage_by_role: Mapping[str, Mapping[str, Mapping[str, int]]], prices: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, float | None], list[str]]:
    """Cost per role (None where a model has no price) and the models without a price."""
    out: dict[str, float | None] = {}
    unpriced: list[str] = []
    for role, models in usage_by_role.items():
        total: float | None = 0.0
        for model, usage in models.items():
            rates = price_of(model, prices)
            if rates is None:
                unpriced.append(model)
                total = None
            elif total is not None:
                total += cost_usd(usage, rates)
        out[role] = total
    return out, sorted(set(unpriced))
