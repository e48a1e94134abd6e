"""Which model a role calls: one model, a model chosen by input size, or an ordered fallback list.

These are plain frozen values; `om_lib.config` builds them from the configuration document and
`om_lib.models.model_router.ModelRouter` executes them. Nothing here talks to a provider.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from om_lib.errors import ConfigError, ModelRequestError


class ModelRoutingError(ModelRequestError):
    """No configured model accepts this input (it is larger than the largest `ModelByInputTokens` threshold)."""

    code = 'model_routing_error'

    def __init__(self, message: str, *, input_tokens: int, max_threshold: int) -> None:
        super().__init__(message)
        self.input_tokens = input_tokens
        self.max_threshold = max_threshold


@dataclass(frozen=True)
class ModelRef:
    """One model of one provider, e.g. `google/gemini-2.5-flash` or the built-in `offline` model.

    Attributes:
        provider: The provider key the router looks up (`google`, `offline`, ...).
        model_id: The id passed to the provider unchanged (the part after the first `/`; '' for `offline`).
    """

    provider: str
    model_id: str = ''

    @property
    def name(self) -> str:
        """The full `provider/model_id` name (just `provider` when there is no model id)."""
        return f'{self.provider}/{self.model_id}' if self.model_id else self.provider

    @classmethod
    def parse(cls, name: str) -> ModelRef:
        """Split `provider/model_id` at the first slash; a name without a slash is a bare provider (`offline`).

        Raises:
            ConfigError: The name or its provider part is empty.
        """
        provider, _, model_id = name.strip().partition('/')
        if not provider:
            raise ConfigError(f'model name must look like "provider/model", got {name!r}')
        return cls(provider=provider, model_id=model_id)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ModelByInputTokens:
    """Pick a model by the size of the input: the first tier whose limit is >= the input token count.

    Attributes:
        tiers: `(up_to_tokens, model)` pairs; validated and sorted ascending on construction.
    """

    tiers: tuple[tuple[int, ModelRef], ...]

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError('ModelByInputTokens requires at least one threshold in "upTo"')
        for limit, _ in self.tiers:
            # bool is an int subclass; `True` as a threshold is a typo, not "1 token".
            if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit) or limit <= 0:
                raise ConfigError(f'ModelByInputTokens: threshold keys must be positive numbers. Got: {limit}')
        # frozen dataclass: sorting on construction is the one place we write a field.
        object.__setattr__(self, 'tiers', tuple(sorted(self.tiers, key=lambda tier: tier[0])))

    @classmethod
    def from_up_to(cls, up_to: Mapping[str | int | float, ModelRef]) -> ModelByInputTokens:
        """Build from the document's `{"upTo": {"10000": ..., "40000": ...}}` map (keys may be numeric strings).

        Raises:
            ConfigError: The map is empty or a key is not a positive finite number.
        """
        tiers: list[tuple[int, ModelRef]] = []
        for key, model in up_to.items():
            try:
                limit = float(key)
            except (TypeError, ValueError):
                raise ConfigError(f'ModelByInputTokens: threshold keys must be positive numbers. Got: {key}') from None
            if not math.isfinite(limit) or limit <= 0:
                raise ConfigError(f'ModelByInputTokens: threshold keys must be positive numbers. Got: {key}')
            tiers.append((int(limit) if limit.is_integer() else math.floor(limit), model))
        return cls(tiers=tuple(tiers))

    @property
    def thresholds(self) -> tuple[int, ...]:
        """The limits, ascending (the reference's `getThresholds()`)."""
        return tuple(limit for limit, _ in self.tiers)

    def resolve(self, input_tokens: int) -> ModelRef:
        """The model of the first tier with `input_tokens <= limit`.

        Raises:
            ModelRoutingError: `input_tokens` is above the largest threshold.
        """
        for limit, model in self.tiers:
            if input_tokens <= limit:
                return model
        largest = self.tiers[-1][0]
        raise ModelRoutingError(
            f'ModelByInputTokens: input token count ({input_tokens}) exceeds the largest configured threshold '
            f'({largest}); add a larger "upTo" tier or lower the batch size',
            input_tokens=input_tokens,
            max_threshold=largest,
        )


@dataclass(frozen=True)
class ModelFallbacks:
    """An ordered list of models: each is tried (with its own retry budget) until one gives a usable answer.

    Attributes:
        entries: `(model, max_retries)` pairs, in the order they are tried.
    """

    entries: tuple[tuple[ModelRef, int], ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ConfigError('a model fallback list needs at least one entry')
        for model, max_retries in self.entries:
            if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
                raise ConfigError(f'maxRetries for {model.name} must be a whole number >= 0, got {max_retries!r}')


ModelSpec = ModelRef | ModelByInputTokens | ModelFallbacks
"""Anything a role's `model` setting can be."""


def model_refs(spec: ModelSpec) -> tuple[ModelRef, ...]:
    """Every model a spec can call: the model itself, each `upTo` tier's, or each fallback entry's (in order)."""
    if isinstance(spec, ModelRef):
        return (spec,)
    if isinstance(spec, ModelByInputTokens):
        return tuple(ref for _, ref in spec.tiers)
    return tuple(ref for ref, _ in spec.entries)
