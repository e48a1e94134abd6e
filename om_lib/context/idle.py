"""Activation on idle and on a change of the Actor's model (the reference's `activateAfterIdle`,
`activateOnProviderChange`).

Buffered observations wait for the threshold so that the Actor's prompt prefix (and the provider's prompt cache built
on it) stays the same from step to step. Once the thread has been idle longer than the provider keeps that cache, or
the Actor's model changed (a new model has no cache of ours), waiting buys nothing: the next step activates what is
buffered, below the threshold too. No model call is made.

- **Idle time** is measured from the thread's last reply (its newest assistant message before the step's input) to the
  step's time (`messages.now_of`: the newest input's `createdAt`, else the service's clock), both message times.
- **`"auto"`** picks the idle time from the Actor's provider and model, as the reference's table does: how long that
  provider keeps a prompt cache (`AUTO_TTL_S`, `auto_ttl_s`).
- **Which model** a step's Actor runs is said by the caller (`actorModel` on `POST /steps`; the chat route's own
  `actorModel`). The memory keeps the last one it was told (`OMRecord.actor_model`) to notice a change.
- Reflection opts in separately (`reflection.activateAfterIdle` / `reflection.activateOnProviderChange`): a buffered
  reflection is activated below the threshold only when those are set.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeAlias

MINUTE = 60.0
HOUR = 60 * MINUTE
# The reference's provider table (seconds): how long each provider keeps a prompt cache.
SHORT_TTL_S = 5 * MINUTE
OPENAI_EXTENDED_TTL_S = HOUR
GEMINI_TTL_S = 24 * HOUR
DEEPSEEK_TTL_S = HOUR
GROQ_TTL_S = 2 * HOUR
AUTO_TTL_S: dict[str, float] = {
    'openai (gpt-4*, gpt-5, gpt-5.1 to gpt-5.4)': SHORT_TTL_S,
    'openai (other models)': OPENAI_EXTENDED_TTL_S,
    'google / gemini': GEMINI_TTL_S,
    'deepseek': DEEPSEEK_TTL_S,
    'groq': GROQ_TTL_S,
    'anthropic, xai / grok, openrouter, bedrock, any other': SHORT_TTL_S,
}
"""The `"auto"` table as documented (docs/lifecycle-and-operations.md shows it)."""

_UNITS = {
    'ms': 0.001,
    'msec': 0.001,
    'millisecond': 0.001,
    'milliseconds': 0.001,
    's': 1.0,
    'sec': 1.0,
    'secs': 1.0,
    'second': 1.0,
    'seconds': 1.0,
    'm': MINUTE,
    'min': MINUTE,
    'mins': MINUTE,
    'minute': MINUTE,
    'minutes': MINUTE,
    'h': HOUR,
    'hr': HOUR,
    'hrs': HOUR,
    'hour': HOUR,
    'hours': HOUR,
    'd': 24 * HOUR,
    'day': 24 * HOUR,
    'days': 24 * HOUR,
    'w': 7 * 24 * HOUR,
    'week': 7 * 24 * HOUR,
    'weeks': 7 * 24 * HOUR,
}
_DURATION = re.compile(r'\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*')


def parse_duration(value: str) -> float:
    """Seconds of a duration written `"30s"`, `"5m"`, `"1hr"`, `"2 days"` (ms, s, m, h, d, w and their long forms).

    Raises:
        ValueError: Not a duration, no unit, or not more than zero.
    """
    match = _DURATION.fullmatch(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f'{value!r} is not a duration: write a number and a unit, e.g. "30s", "5m", "1h" or "2d" '
            '(a bare number means seconds)'
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not seconds > 0:
        raise ValueError(f'the duration {value!r} must be more than zero')
    return seconds


def duration_seconds(value: float | str) -> float:
    """A number of seconds, or a duration string, as seconds (checked: finite and more than zero)."""
    if isinstance(value, str):
        return parse_duration(value)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f'must be more than zero seconds, got {value!r}')
    return seconds


# A resolved idle setting: seconds, or "auto" (from the Actor's provider and model).
IdleTTL: TypeAlias = float | Literal['auto']


@dataclass(frozen=True)
class IdleTTLMap:
    """A per-provider idle setting: `providers` by provider name (lowercase; `False`: never for that provider), else
    `default` (None: never)."""

    default: IdleTTL | None = None
    providers: dict[str, IdleTTL | Literal[False]] = field(default_factory=dict)


@dataclass(frozen=True)
class IdleActivation:
    """When buffered work is activated below its threshold (observation or reflection, resolved)."""

    after_idle: IdleTTL | IdleTTLMap | None = None
    on_provider_change: bool = False

    @property
    def enabled(self) -> bool:
        """Either trigger is on."""
        return self.after_idle is not None or self.on_provider_change


def split_model(model: str | None) -> tuple[str, str]:
    """`provider/model` as (provider, model id), both lowercase; a bare id has no provider."""
    if not model:
        return '', ''
    provider, slash, model_id = model.strip().lower().partition('/')
    return (provider, model_id) if slash else ('', provider)


def _openai_short_ttl(model_id: str) -> bool:
    return bool(re.match(r'gpt-4', model_id) or re.match(r'gpt-5(?:$|-|\.([1-4])(?:$|-))', model_id))


def auto_ttl_s(model: str | None) -> float:
    """How long the provider of `model` (`provider/model`) keeps a prompt cache, from the reference's table."""
    provider, model_id = split_model(model)
    if 'openai' in provider:
        return SHORT_TTL_S if _openai_short_ttl(model_id) else OPENAI_EXTENDED_TTL_S
    if 'google' in provider or 'gemini' in provider:
        return GEMINI_TTL_S
    if 'deepseek' in provider:
        return DEEPSEEK_TTL_S
    if 'groq' in provider:
        return GROQ_TTL_S
    return SHORT_TTL_S


def resolve_ttl_s(setting: IdleTTL | IdleTTLMap | None, model: str | None) -> float | None:
    """The idle time in force for an Actor running `model`, in seconds (None: idle activation is off for it).

    A per-provider map matches the provider before its first `.` (`anthropic.messages` is `anthropic`), never by
    substring; an unmatched provider takes `default`.
    """
    ttl: IdleTTL | Literal[False] | None
    if isinstance(setting, IdleTTLMap):
        provider = split_model(model)[0].split('.')[0]
        ttl = setting.providers[provider] if provider and provider in setting.providers else setting.default
    else:
        ttl = setting
    if ttl is None or ttl is False:
        return None
    if ttl == 'auto':
        return auto_ttl_s(model)
    return float(ttl)


def model_changed(current: str | None, previous: str | None) -> bool:
    """Did the Actor's model change? Model ids are compared, and providers when both sides name one (a provider's
    sub-namespace, `openai.responses`, compares as its base, `openai`). Unknown on either side: no change."""
    if not current or not previous:
        return False
    now_provider, now_id = split_model(current)
    was_provider, was_id = split_model(previous)
    if now_id != was_id:
        return True
    if now_provider and was_provider:
        return now_provider.split('.')[0] != was_provider.split('.')[0]
    return False


Trigger: TypeAlias = Literal['ttl', 'provider_change']


@dataclass(frozen=True)
class ActivationTrigger:
    """Why buffered work is activated below its threshold, with the reference's fields for the activation part."""

    triggered_by: Trigger
    last_activity_at: datetime | None = None
    idle_s: float | None = None
    ttl_s: float | None = None
    previous_model: str | None = None
    current_model: str | None = None

    def part_fields(self) -> dict[str, object]:
        """The activation part's fields for this trigger (milliseconds, as the reference reports them)."""
        if self.triggered_by == 'provider_change':
            return {
                'triggered_by': 'provider_change',
                'previous_model': self.previous_model,
                'current_model': self.current_model,
            }
        return {
            'triggered_by': 'ttl',
            'last_activity_at': int(self.last_activity_at.timestamp() * 1000) if self.last_activity_at else None,
            'ttl_expired_ms': int((self.idle_s or 0) * 1000),
            'activate_after_idle': int((self.ttl_s or 0) * 1000),
        }


def activation_trigger(
    setting: IdleActivation,
    *,
    now: datetime,
    last_reply_at: datetime | None,
    current_model: str | None,
    previous_model: str | None,
) -> ActivationTrigger | None:
    """The trigger that applies to this step, if any: a model change first (as the reference), then idle time."""
    if setting.on_provider_change and model_changed(current_model, previous_model):
        return ActivationTrigger('provider_change', previous_model=previous_model, current_model=current_model)
    ttl = resolve_ttl_s(setting.after_idle, current_model)
    if ttl is None or last_reply_at is None:
        return None
    idle = (now - last_reply_at).total_seconds()
    if idle < ttl:
        return None
    return ActivationTrigger('ttl', last_activity_at=last_reply_at, idle_s=idle, ttl_s=ttl, current_model=current_model)
