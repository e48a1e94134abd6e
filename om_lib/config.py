"""The configuration document (CONTRACT §1) and its resolved, validated view (reference spec §3).

`OMConfig` is the document: JSON in camelCase, Python attributes in snake_case, unknown keys refused. Validating it
also resolves it (defaults, fractions, multipliers, models) and runs the reference's checks, so an invalid document
never exists as an `OMConfig`; `OMConfig.resolved()` returns the resolved view, `ResolvedOMConfig`.

`load_config` finds the document (`--config FILE`, `OM_CONFIG_FILE`, `OM_CONFIG`, else defaults) and turns every
problem into one readable `ConfigError`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from om_lib.context.idle import IdleActivation, IdleTTL, IdleTTLMap, duration_seconds
from om_lib.context.temporal import DEFAULT_MIN_GAP_S
from om_lib.context.thresholds import (
    ThresholdRange,
    calculate_dynamic_threshold,
    get_max_threshold,
    resolve_block_after,
    resolve_buffer_tokens,
)
from om_lib.errors import ConfigError
from om_lib.models.model_spec import ModelByInputTokens, ModelFallbacks, ModelRef, ModelSpec, model_refs

__all__ = [
    'DEFAULT_MODEL',
    'DOCS_MODELS_URL',
    'KNOWN_PROVIDERS',
    'ActivationTTLMapConfig',
    'GenerateTitleConfig',
    'MessageRange',
    'ModelFallbackEntry',
    'ModelRole',
    'ModelSettings',
    'ModelSpec',
    'ArchiveSettings',
    'ModelTiers',
    'OMConfig',
    'ObservationArchiveConfig',
    'ObservationConfig',
    'ReflectionConfig',
    'ResolvedOMConfig',
    'RetrievalConfig',
    'RetrievalSettings',
    'SemanticRecallConfig',
    'SemanticRecallSettings',
    'TemporalMarkersConfig',
    'ThresholdRange',
    'TitleGenerationSettings',
    'WorkingMemoryConfig',
    'format_validation_error',
    'load_config',
    'parse_model_spec',
]

DEFAULT_MODEL = 'google/gemini-2.5-flash'
"""What `"default"` (and an unset model) means."""

KNOWN_PROVIDERS: tuple[str, ...] = ('google', 'bedrock', 'openai', 'offline')
"""Providers this build can call (`google/…` Gemini, `bedrock/…` Bedrock Converse, `openai/…` any OpenAI-compatible
endpoint); any other provider is refused at start-up."""

DOCS_MODELS_URL = 'https://mastra.ai/docs/memory/observational-memory#models'

Scope: TypeAlias = Literal['thread', 'resource']
ModelRole: TypeAlias = Literal['observer', 'reflector', 'actor', 'title']
"""The roles a configured model plays (embeddings are configured apart, by OM_EMBEDDING_MODEL)."""

# Reference defaults (spec §3.1).
DEFAULT_MESSAGE_TOKENS = 30_000
DEFAULT_OBSERVATION_TOKENS = 40_000
DEFAULT_MAX_TOKENS_PER_BATCH = 10_000
DEFAULT_BUFFER_TOKENS = 0.2
DEFAULT_BUFFER_ACTIVATION = 0.8
DEFAULT_BLOCK_AFTER = 1.2
DEFAULT_PREVIOUS_OBSERVER_TOKENS = 2000
DEFAULT_REFLECTION_BUFFER_ACTIVATION = 0.5
DEFAULT_OBSERVER_TEMPERATURE = 0.3
DEFAULT_REFLECTOR_TEMPERATURE = 0.0
DEFAULT_MAX_OUTPUT_TOKENS = 100_000
# Seed 003: the recent messages automatically included in the context (message history without observational memory).
DEFAULT_LAST_MESSAGES = 10
OBSERVER_THINKING_BUDGET = 215
REFLECTOR_THINKING_BUDGET = 1024
# The archive bound (`observation.archive`): multiples of observationTokens, and the catalog line's ceiling.
DEFAULT_ARCHIVE_AFTER = 1.5
DEFAULT_ARCHIVE_KEEP = 0.5
DEFAULT_ARCHIVE_MAX_CATALOG_TOKENS = 2000


# ---------------------------------------------------------------------------------------------------------------------
# Value checks shared by several fields
# ---------------------------------------------------------------------------------------------------------------------


def _number(value: Any) -> Any:
    """Refuse booleans and strings where a number is expected (pydantic would quietly turn `true` into 1)."""
    if isinstance(value, bool) or isinstance(value, str):
        raise ValueError(f'must be a number, got {value!r}')
    return value


def _number_or_false(value: Any) -> Any:
    """Accept `false` or a number; refuse `true` and strings."""
    if value is False or value is None:
        return value
    if value is True or isinstance(value, str):
        raise ValueError(f'must be false or a number, got {value!r}')
    return value


Number = Annotated[int | float, BeforeValidator(_number)]
Count = Annotated[int, BeforeValidator(_number)]
# `int | float | bool` (ints stay ints in snapshots), not `Literal[False] | float`: the literal would also take
# 0 (0 == False) and turn it into false. The before-validator has already refused `true`, so bool only holds False.
NumberOrFalse = Annotated[int | float | bool, BeforeValidator(_number_or_false)]


def _check_idle_scalar(value: Any) -> Any:
    """An idle time as written: seconds (a number), a duration string (`"5m"`), `"auto"` or false (not true).

    Like every field's check, its message does not name the field: the error's location does (`format_validation_error`
    writes it once, in front)."""
    if value is None or value is False or value == 'auto':
        return value
    if value is True or not isinstance(value, int | float | str):
        raise ValueError(f'must be a number of seconds, a duration like "5m" or "1h", "auto" or false, got {value!r}')
    duration_seconds(value)
    return value


_MEDIA_TYPE_TOKEN = r'[a-z0-9!#$&^_.+-]+'
_MEDIA_PATTERN = re.compile(rf'\*|{_MEDIA_TYPE_TOKEN}/(\*|{_MEDIA_TYPE_TOKEN})')


def _check_observe_attachments(value: Any) -> Any:
    """`true`, `false`, `"auto"` or a list of media types (`image/png`, `image/*`, `*`), matched case-insensitively."""
    if isinstance(value, bool) or value == 'auto':
        return value
    if not isinstance(value, list | tuple):
        raise ValueError(
            f'must be true, false, "auto" or a list of media types such as ["image/png", "image/*"], got {value!r}'
        )
    patterns = []
    for item in value:
        if not isinstance(item, str) or not _MEDIA_PATTERN.fullmatch(item.strip().lower()):
            raise ValueError(
                f'{item!r} is not a media type pattern; write "type/subtype" ("application/pdf"), "type/*" ("image/*") '
                'or "*"'
            )
        patterns.append(item.strip().lower())
    return patterns


def _check_model_name(value: Any) -> str:
    """Validate one plain model name: `default`, `offline`, `offline/<anything>` or `<known provider>/<model id>`."""
    if not isinstance(value, str):
        raise ValueError(f'a model name must be a string like "{DEFAULT_MODEL}", got {value!r}')
    name = value.strip()
    if name == 'default':
        return name
    provider, slash, model_id = name.partition('/')
    if provider not in KNOWN_PROVIDERS:
        raise ValueError(
            f'unknown model provider {provider!r} in {name!r}; known providers: {", ".join(KNOWN_PROVIDERS)} '
            f'(write "provider/model", e.g. "{DEFAULT_MODEL}", or "default" or "offline")'
        )
    if provider != 'offline' and not model_id:
        raise ValueError(f'model name {name!r} needs a model id after the provider, e.g. "{DEFAULT_MODEL}"')
    if slash and not model_id:
        raise ValueError(f'model name {name!r} has an empty model id after "/"')
    return name


def _model_ref(name: str) -> ModelRef:
    """A validated plain model name as a `ModelRef` (`default` becomes the default model)."""
    return ModelRef.parse(DEFAULT_MODEL if name == 'default' else name)


class _Doc(BaseModel):
    """Base of every part of the document: camelCase JSON, snake_case Python, unknown keys refused, immutable."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra='forbid', frozen=True)

    def to_json_dict(self) -> dict[str, Any]:
        """The part as written (camelCase, only the keys that were set), e.g. for snapshots."""
        return self.model_dump(mode='json', by_alias=True, exclude_unset=True)


# ---------------------------------------------------------------------------------------------------------------------
# Model settings
# ---------------------------------------------------------------------------------------------------------------------


class ModelTiers(_Doc):
    """`{"upTo": {"10000": "google/gemini-2.5-flash", "40000": "..."}}`: a model chosen by input size (§21)."""

    up_to: dict[str, str] = Field(
        description='Largest input (tokens) each model takes -> model name; the first tier with input <= limit wins.'
    )

    @field_validator('up_to')
    @classmethod
    def _check_tiers(cls, up_to: dict[str, str]) -> dict[str, str]:
        checked = {key: _check_model_name(model) for key, model in up_to.items()}
        ModelByInputTokens.from_up_to({key: _model_ref(model) for key, model in checked.items()})
        return checked

    def to_spec(self) -> ModelByInputTokens:
        """The resolved `ModelByInputTokens`."""
        return ModelByInputTokens.from_up_to({key: _model_ref(model) for key, model in self.up_to.items()})


class ModelFallbackEntry(_Doc):
    """One entry of a fallback list: `{"model": "google/gemini-2.5-flash", "maxRetries": 2}`."""

    model: str = Field(description='A plain model name (`provider/model`, `default` or `offline`).')
    max_retries: Count = Field(default=0, ge=0, description='Retries of this model before the next entry is tried.')

    @field_validator('model', mode='before')
    @classmethod
    def _check_model(cls, value: Any) -> str:
        return _check_model_name(value)


_FALLBACK_LIST = TypeAdapter(list[ModelFallbackEntry])


def _check_model_setting(value: Any) -> Any:
    """Validate any form of a `model` setting and hand pydantic a value that matches exactly one union member."""
    if value is None or isinstance(value, ModelTiers):
        return value
    if isinstance(value, str):
        return _check_model_name(value)
    if isinstance(value, Mapping):
        return ModelTiers.model_validate(value)
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError('a model fallback list needs at least one entry')
        return _FALLBACK_LIST.validate_python(list(value))
    raise ValueError(
        'a model must be a name ("provider/model", "default", "offline"), {"upTo": {...}} or a fallback list '
        f'[{{"model": ..., "maxRetries": ...}}], got {value!r}'
    )


ModelSetting = Annotated[str | ModelTiers | list[ModelFallbackEntry], BeforeValidator(_check_model_setting)]
"""A `model` option as written: a name, `{"upTo": ...}` or a fallback list."""


def parse_model_spec(setting: str | ModelTiers | list[ModelFallbackEntry]) -> ModelSpec:
    """Turn a validated `model` option into the `ModelSpec` the router runs.

    Args:
        setting: A name (`default` is the default model), `ModelTiers` or a list of `ModelFallbackEntry`.

    Returns:
        `ModelRef`, `ModelByInputTokens` or `ModelFallbacks`.
    """
    if isinstance(setting, str):
        return _model_ref(setting)
    if isinstance(setting, ModelTiers):
        return setting.to_spec()
    return ModelFallbacks(entries=tuple((_model_ref(entry.model), entry.max_retries) for entry in setting))


def _is_default_model(setting: str | ModelTiers | list[ModelFallbackEntry] | None) -> bool:
    """Whether a role runs on the default model (unset, `default` or the default's full name)."""
    return setting is None or (isinstance(setting, str) and _model_ref(setting) == _model_ref('default'))


def _uses_google(spec: ModelSpec) -> bool:
    """Whether any model a spec can pick is a Google model (thinking budgets only apply there)."""
    return any(ref.provider == 'google' for ref in model_refs(spec))


class ModelSettings(_Doc):
    """`observation.modelSettings` / `reflection.modelSettings`."""

    temperature: Number | None = Field(
        default=None, ge=0, description='Sampling temperature (Observer default 0.3, Reflector default 0).'
    )
    max_output_tokens: Count | None = Field(
        default=None, gt=0, description='Output cap; defaults to 100000 only when the role uses the default model.'
    )


# ---------------------------------------------------------------------------------------------------------------------
# Observational memory
# ---------------------------------------------------------------------------------------------------------------------


class ObservationArchiveConfig(_Doc):
    """`observation.archive`: the bound that keeps memory small when reflection cannot (no model call).

    Past `afterTokens` of observations, the oldest observation groups move into an archive kept with the memory, until
    about `keepTokens` remain; the Actor sees one `<archived-observations>` line instead (at most `maxCatalogTokens`),
    and the recall tool's `mode: "observations"` pages the archived groups back. Nothing is deleted.
    """

    after_tokens: Count | None = Field(
        default=None,
        gt=0,
        description='Observation tokens past which the oldest groups are archived (1.5 × observationTokens).',
    )
    keep_tokens: Count | None = Field(
        default=None,
        gt=0,
        description='About how many of the newest observation tokens stay (0.5 × observationTokens).',
    )
    max_catalog_tokens: Count = Field(
        default=DEFAULT_ARCHIVE_MAX_CATALOG_TOKENS,
        ge=0,
        description='Most tokens the `<archived-observations>` line may take (0 leaves it out).',
    )


class TemporalMarkersConfig(_Doc):
    """`temporalMarkers` as an object: the smallest gap between two messages that gets a marker."""

    min_gap: Number | str = Field(
        default=600,
        description='Seconds, or a duration like "30m" or "2h" (default 10 minutes).',
    )

    @field_validator('min_gap', mode='before')
    @classmethod
    def _gap(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f'must be seconds or a duration like "30m", got {value!r}')
        duration_seconds(value)
        return value


def _check_provider_idle(value: Any) -> Any:
    if value is None:
        raise ValueError('needs an idle time, "auto" or false')
    return _check_idle_scalar(value)


ProviderIdleTime = Annotated[int | float | str | bool, BeforeValidator(_check_provider_idle)]


class ActivationTTLMapConfig(_Doc):
    """`activateAfterIdle` per provider: `{"default": "auto", "providers": {"anthropic": "1h", "openai": false}}`."""

    default: int | float | str | bool | None = Field(
        default=None, description='For providers not listed (unset: no idle activation for them).'
    )
    providers: dict[str, ProviderIdleTime] = Field(
        default_factory=dict, description='By provider (before its first "."), case-insensitive; false: never.'
    )

    @field_validator('default', mode='before')
    @classmethod
    def _default(cls, value: Any) -> Any:
        return _check_idle_scalar(value)

    @field_validator('providers', mode='before')
    @classmethod
    def _providers(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f'must be an object of provider: idle time, got {value!r}')
        for name in value:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f'{name!r} is not a provider name')
        # Each idle time is checked as the value of its key (`ProviderIdleTime`), so an error names the provider.
        return {name.strip().lower(): ttl for name, ttl in value.items()}


def _idle_setting(value: Any) -> Any:
    if isinstance(value, Mapping):
        return ActivationTTLMapConfig.model_validate(value)
    if isinstance(value, ActivationTTLMapConfig):
        return value
    return _check_idle_scalar(value)


def _temporal_markers(value: Any) -> Any:
    if value is None or isinstance(value, bool | TemporalMarkersConfig):
        return value
    if isinstance(value, Mapping):
        return TemporalMarkersConfig.model_validate(value)
    raise ValueError(f'must be true, false or {{"minGap": "30m"}}, got {value!r}')


class ObservationConfig(_Doc):
    """`observation`: when the Observer runs and how (spec §3.1)."""

    model: ModelSetting | None = Field(default=None, description='Observer model; cannot be combined with `model`.')
    instruction: str | None = Field(default=None, description="Appended to the Observer's system prompt.")
    thread_title: bool = Field(default=False, description='The Observer also proposes thread titles.')
    message_tokens: Count = Field(
        default=DEFAULT_MESSAGE_TOKENS, gt=0, description='Unobserved message tokens that trigger observation.'
    )
    max_tokens_per_batch: Count = Field(
        default=DEFAULT_MAX_TOKENS_PER_BATCH, gt=0, description='Resource scope: tokens per multi-thread batch.'
    )
    model_settings: ModelSettings = Field(default_factory=ModelSettings, description='Observer model settings.')
    buffer_tokens: NumberOrFalse | None = Field(
        default=None,
        description='Async buffering interval: a fraction of messageTokens (0 < v < 1), tokens, or false (no async).',
    )
    buffer_activation: Number | None = Field(
        default=None, description='Retention after activation: a ratio in (0, 1] or absolute tokens (>= 1000).'
    )
    block_after: Number | None = Field(
        default=None, description='Forced observation point: a multiplier of messageTokens (1 <= v < 100) or tokens.'
    )
    previous_observer_tokens: NumberOrFalse | None = Field(
        default=None, description="Budget for the Observer's view of earlier observations; false = no truncation."
    )
    archive: ObservationArchiveConfig = Field(
        default_factory=ObservationArchiveConfig,
        description='The bound past which the oldest observation groups are archived (no model call).',
    )
    observe_attachments: bool | Literal['auto'] | list[str] = Field(
        default=True,
        description='Which attachments the Observer is sent: true, false, "auto" or media types ("image/*").',
    )
    temporal_markers: bool | TemporalMarkersConfig | None = Field(
        default=None, description='Same as the top-level temporalMarkers (set it in one place only).'
    )
    activate_after_idle: int | float | str | bool | ActivationTTLMapConfig | None = Field(
        default=None,
        description='Activate buffered observations after this idle time (overrides the top-level setting).',
    )
    activate_on_provider_change: bool | None = Field(
        default=None,
        description="Activate buffered observations when the Actor's model changes (overrides the top level).",
    )

    @field_validator('observe_attachments', mode='before')
    @classmethod
    def _attachments(cls, value: Any) -> Any:
        return _check_observe_attachments(value)

    @field_validator('temporal_markers', mode='before')
    @classmethod
    def _temporal(cls, value: Any) -> Any:
        return _temporal_markers(value)

    @field_validator('activate_after_idle', mode='before')
    @classmethod
    def _idle(cls, value: Any) -> Any:
        return _idle_setting(value)


class ReflectionConfig(_Doc):
    """`reflection`: when the Reflector runs and how (spec §3.1)."""

    model: ModelSetting | None = Field(default=None, description='Reflector model; cannot be combined with `model`.')
    instruction: str | None = Field(default=None, description="Appended to the Reflector's system prompt.")
    observation_tokens: Count = Field(
        default=DEFAULT_OBSERVATION_TOKENS, gt=0, description='Observation tokens above which reflection runs.'
    )
    model_settings: ModelSettings = Field(default_factory=ModelSettings, description='Reflector model settings.')
    buffer_activation: Number | None = Field(
        default=None, description='Start background reflection at this fraction of observationTokens, in (0, 1].'
    )
    block_after: Number | None = Field(
        default=None, description='Forced reflection point: a multiplier of observationTokens or tokens.'
    )
    activate_after_idle: int | float | str | bool | ActivationTTLMapConfig | None = Field(
        default=None,
        description='Activate a buffered reflection after this idle time (not inherited from the top level).',
    )
    activate_on_provider_change: bool | None = Field(
        default=None,
        description="Activate a buffered reflection when the Actor's model changes (not inherited).",
    )

    @field_validator('activate_after_idle', mode='before')
    @classmethod
    def _idle(cls, value: Any) -> Any:
        return _idle_setting(value)


class RetrievalConfig(_Doc):
    """`retrieval` as an object: observation groups plus the `recall` tool."""

    vector: bool = Field(default=False, description='Also offer semantic search over raw messages.')
    scope: Scope = Field(default='resource', description="What `recall` may browse: this thread or the resource's.")


# ---------------------------------------------------------------------------------------------------------------------
# Wider memory options (seed 003)
# ---------------------------------------------------------------------------------------------------------------------


class WorkingMemoryConfig(_Doc):
    """`workingMemory`: a block the agent keeps up to date (Markdown template or JSON Schema, never both)."""

    enabled: bool = Field(description='Turn working memory on.')
    scope: Scope = Field(default='resource', description='Shared by all threads of a resource, or per thread.')
    template: str | None = Field(default=None, description='Markdown template (replace semantics).')
    json_schema: dict[str, Any] | None = Field(
        default=None, alias='schema', description='JSON Schema of a JSON working memory (merge semantics).'
    )
    read_only: bool = Field(default=False, description='Show working memory but offer no tool to change it.')

    @field_validator('json_schema', mode='after')
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            _check_working_memory_schema(value)
        return value

    @model_validator(mode='after')
    def _template_or_schema(self) -> WorkingMemoryConfig:
        if self.template is not None and self.json_schema is not None:
            raise ValueError('set either `template` or `schema`, not both (workingMemory takes one of them)')
        return self


def _check_working_memory_schema(schema: dict[str, Any]) -> None:
    """Refuse a `workingMemory.schema` that is not a valid JSON Schema of an object (named problem and place)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = '/'.join(str(p) for p in exc.absolute_path)
        raise ValueError(f'not a valid JSON Schema: {exc.message}' + (f' (at {where})' if where else '')) from exc
    declared = schema.get('type')
    if declared is not None and declared != 'object' and not (isinstance(declared, list) and 'object' in declared):
        raise ValueError('must describe a JSON object (type "object")')
    # Nothing is fetched at run time: a `$ref` must point into the schema itself.
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            ref = node.get('$ref')
            if isinstance(ref, str) and not ref.startswith('#'):
                raise ValueError(f'only local references ("#/...") are supported, got $ref {ref!r}')
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)


class MessageRange(_Doc):
    """`semanticRecall.messageRange` as an object: context messages around each match."""

    before: Count = Field(ge=0, description='Messages before each match.')
    after: Count = Field(ge=0, description='Messages after each match.')


class SemanticRecallConfig(_Doc):
    """`semanticRecall`: vector search over earlier messages."""

    top_k: Count = Field(default=4, ge=1, description='How many similar messages to retrieve.')
    message_range: Count | MessageRange = Field(
        default=1, description='Context around each match: a count (both sides) or {before, after}.'
    )
    scope: Scope = Field(default='resource', description="Search this thread or all of the resource's threads.")

    @field_validator('message_range', mode='before')
    @classmethod
    def _range(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return MessageRange.model_validate(value)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise ValueError('must be >= 0')
        return _number(value)


class GenerateTitleConfig(_Doc):
    """`generateTitle` as an object."""

    model: ModelSetting | None = Field(default=None, description="Title model; defaults to the actor's model.")
    instructions: str | None = Field(default=None, description='Instructions for the title model.')


# ---------------------------------------------------------------------------------------------------------------------
# Resolved view
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievalSettings:
    """Resolved `retrieval` (None in `ResolvedOMConfig` when off).

    Attributes:
        vector: Semantic search is offered.
        scope: What `recall` may browse.
    """

    vector: bool
    scope: Scope


@dataclass(frozen=True)
class SemanticRecallSettings:
    """Resolved `semanticRecall` (None in `ResolvedOMConfig` when off).

    Attributes:
        top_k: Matches to retrieve.
        before: Context messages before each match.
        after: Context messages after each match.
        scope: Search scope.
    """

    top_k: int
    before: int
    after: int
    scope: Scope


@dataclass(frozen=True)
class ArchiveSettings:
    """Resolved `observation.archive`.

    Attributes:
        after_tokens: Past this many observation tokens the oldest groups are archived.
        keep_tokens: About how many of the newest observation tokens stay active.
        max_catalog_tokens: The `<archived-observations>` line's ceiling (0: never shown).
    """

    after_tokens: int
    keep_tokens: int
    max_catalog_tokens: int


@dataclass(frozen=True)
class TitleGenerationSettings:
    """Resolved `generateTitle` (None in `ResolvedOMConfig` when off).

    Attributes:
        model: The title model (the actor's model unless set).
        instructions: Custom instructions, or None for the built-in ones.
    """

    model: ModelSpec
    instructions: str | None


@dataclass(frozen=True)
class ResolvedOMConfig:
    """Every setting with defaults applied, fractions and multipliers turned into tokens, models resolved.

    Attributes:
        enabled: Observational memory is on.
        scope: `thread` or `resource`.
        observer_model: `model ?? observation.model ?? reflection.model ?? default`.
        reflector_model: `model ?? reflection.model ?? observation.model ?? default`.
        actor_model: The chat endpoint's model.
        message_tokens: Observation threshold; a `ThresholdRange` under `shareTokenBudget`.
        observation_tokens: Reflection threshold.
        buffer_tokens: Async buffering interval in tokens; None when async buffering is off.
        buffer_activation: Ratio or absolute retention; None when async buffering is off.
        block_after: Forced observation point in tokens; None when async buffering is off.
        reflection_buffer_activation: Background reflection start ratio; None when async is off.
        reflection_block_after: Forced reflection point in tokens; None when async is off.
        previous_observer_tokens: Budget for the Observer's previous observations; None means no truncation.
        max_tokens_per_batch: Resource scope batch size.
        observer_temperature: Observer temperature.
        reflector_temperature: Reflector temperature.
        observer_max_output_tokens: Observer output cap, or None for the provider's.
        reflector_max_output_tokens: Reflector output cap, or None for the provider's.
        observer_thinking_budget: Google thinking budget of the Observer (None when no Google model is used).
        reflector_thinking_budget: Google thinking budget of the Reflector (None when no Google model is used).
        observation_instruction: Extra Observer instruction.
        reflection_instruction: Extra Reflector instruction.
        thread_title: The Observer proposes thread titles.
        retrieval: Retrieval mode settings, None when off.
        share_token_budget: Messages and observations share one budget.
        obscure_thread_ids: Thread ids are hashed before models see them.
        async_observation_enabled: Background observation is on (`buffer_tokens > 0`).
        async_reflection_enabled: Background reflection is on (`reflection_buffer_activation > 0`).
        working_memory: The working memory options, None when off.
        semantic_recall: Semantic recall settings, None when off.
        title_generation: Title generation settings, None when off.
        last_messages: How many recent messages a step includes when observational memory is off (0: none).
        archive: The archive bound (`observation.archive`, with its defaults applied).
        temporal_gap_s: The smallest gap between messages that gets a temporal marker, None when markers are off.
        observation_idle: When buffered observations activate below the threshold (idle time, model change).
        reflection_idle: When a buffered reflection activates below the threshold (opt-in, not inherited).
        observe_attachments: Which attachments the Observer is sent: all (True), none (False) or media-type patterns.
    """

    enabled: bool
    scope: Scope
    observer_model: ModelSpec
    reflector_model: ModelSpec
    actor_model: ModelSpec
    message_tokens: int | ThresholdRange
    observation_tokens: int
    buffer_tokens: int | None
    buffer_activation: float | None
    block_after: int | None
    reflection_buffer_activation: float | None
    reflection_block_after: int | None
    previous_observer_tokens: int | None
    max_tokens_per_batch: int
    observer_temperature: float
    reflector_temperature: float
    observer_max_output_tokens: int | None
    reflector_max_output_tokens: int | None
    observer_thinking_budget: int | None
    reflector_thinking_budget: int | None
    observation_instruction: str | None
    reflection_instruction: str | None
    thread_title: bool
    retrieval: RetrievalSettings | None
    share_token_budget: bool
    obscure_thread_ids: bool
    async_observation_enabled: bool
    async_reflection_enabled: bool
    working_memory: WorkingMemoryConfig | None
    semantic_recall: SemanticRecallSettings | None
    title_generation: TitleGenerationSettings | None
    last_messages: int = DEFAULT_LAST_MESSAGES
    archive: ArchiveSettings = ArchiveSettings(
        after_tokens=math.floor(DEFAULT_OBSERVATION_TOKENS * DEFAULT_ARCHIVE_AFTER),
        keep_tokens=math.floor(DEFAULT_OBSERVATION_TOKENS * DEFAULT_ARCHIVE_KEEP),
        max_catalog_tokens=DEFAULT_ARCHIVE_MAX_CATALOG_TOKENS,
    )
    temporal_gap_s: float | None = None
    observation_idle: IdleActivation = IdleActivation()
    reflection_idle: IdleActivation = IdleActivation()
    observe_attachments: bool | tuple[str, ...] = True

    def models_by_role(self) -> dict[ModelRole, tuple[ModelRef, ...]]:
        """Every model each role may call (each size tier and fallback entry); roles that are off are left out.

        What a deployment must give access to (the CDK app's grants) and what a local run needs credentials for.
        """
        roles: dict[ModelRole, tuple[ModelRef, ...]] = {'actor': model_refs(self.actor_model)}
        if self.enabled:
            roles['observer'] = model_refs(self.observer_model)
            roles['reflector'] = model_refs(self.reflector_model)
        if self.title_generation is not None:
            roles['title'] = model_refs(self.title_generation.model)
        return roles

    @property
    def semantic_search(self) -> bool:
        """Semantic search is on (`retrieval.vector` or `semanticRecall`), so messages are embedded."""
        return (self.retrieval is not None and self.retrieval.vector) or self.semantic_recall is not None

    def max_message_threshold(self) -> int:
        """The largest observation threshold (`getMaxThreshold(messageTokens)`)."""
        return get_max_threshold(self.message_tokens)

    def dynamic_message_threshold(self, observation_tokens: int) -> int:
        """The observation threshold in force for a record holding `observation_tokens` of observations."""
        return calculate_dynamic_threshold(self.message_tokens, observation_tokens)


# ---------------------------------------------------------------------------------------------------------------------
# The document
# ---------------------------------------------------------------------------------------------------------------------


class OMConfig(_Doc):
    """The configuration document (CONTRACT §1).

    `OMConfig.model_validate(True)` is every default, `model_validate(False)` turns observational memory off.
    Validation resolves and checks the whole document (reference §3.2-§3.3) and raises `pydantic.ValidationError`
    naming the field and the rule; `resolved()` returns the result.
    """

    enabled: bool = Field(default=True, description='Observational memory is on; only `false` turns it off.')
    model: ModelSetting | None = Field(
        default=None, description='Model of both Observer and Reflector; cannot be combined with observation.model.'
    )
    scope: Scope = Field(default='thread', description='Observations per thread, or shared by a resource.')
    share_token_budget: bool = Field(
        default=False, description='Messages may use the observation budget left unused (needs bufferTokens: false).'
    )
    retrieval: bool | RetrievalConfig = Field(default=False, description='Retrieval mode and the `recall` tool.')
    obscure_thread_ids: bool | None = Field(
        default=None, description='Hash thread ids shown to models; unset means on in resource scope.'
    )
    observation: ObservationConfig = Field(default_factory=ObservationConfig, description='Observation options.')
    reflection: ReflectionConfig = Field(default_factory=ReflectionConfig, description='Reflection options.')
    actor_model: ModelSetting = Field(default='default', description="The chat endpoint's model.")
    working_memory: WorkingMemoryConfig | None = Field(default=None, description='Working memory; off unless set.')
    semantic_recall: SemanticRecallConfig | Literal[False] = Field(
        default=False, description='Semantic recall; off unless set.'
    )
    generate_title: bool | GenerateTitleConfig = Field(default=False, description='Generate thread titles.')
    last_messages: int | Literal[False] = Field(
        default=DEFAULT_LAST_MESSAGES,
        description='Recent messages a step includes when observational memory is off; false: none.',
    )
    temporal_markers: bool | TemporalMarkersConfig | None = Field(
        default=None,
        description='Tell the Actor and the Observer when time passed between messages: true, false or {minGap}.',
    )
    activate_after_idle: int | float | str | bool | ActivationTTLMapConfig | None = Field(
        default=None,
        description='Activate buffered observations after this idle time: seconds, "5m", "auto", or per provider.',
    )
    activate_on_provider_change: bool | None = Field(
        default=None, description="Activate buffered observations when the Actor's model changes."
    )

    _resolved: ResolvedOMConfig = PrivateAttr()

    @model_validator(mode='before')
    @classmethod
    def _from_bool(cls, data: Any) -> Any:
        # `true` is every default and `false` is "off", as for the reference's `observationalMemory` option.
        if data is True:
            return {}
        if data is False:
            return {'enabled': False}
        return data

    @field_validator('retrieval', mode='before')
    @classmethod
    def _retrieval(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return RetrievalConfig.model_validate(value)
        if not isinstance(value, bool | RetrievalConfig):
            raise ValueError(f'must be true, false or {{vector, scope}}, got {value!r}')
        return value

    @field_validator('semantic_recall', mode='before')
    @classmethod
    def _semantic_recall(cls, value: Any) -> Any:
        if value is True:
            return SemanticRecallConfig()
        if isinstance(value, Mapping):
            return SemanticRecallConfig.model_validate(value)
        if value is not False and not isinstance(value, SemanticRecallConfig):
            raise ValueError(f'must be false, true or {{topK, messageRange, scope}}, got {value!r}')
        return value

    @field_validator('generate_title', mode='before')
    @classmethod
    def _generate_title(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return GenerateTitleConfig.model_validate(value)
        if not isinstance(value, bool | GenerateTitleConfig):
            raise ValueError(f'must be true, false or {{model, instructions}}, got {value!r}')
        return value

    @field_validator('temporal_markers', mode='before')
    @classmethod
    def _temporal(cls, value: Any) -> Any:
        return _temporal_markers(value)

    @field_validator('activate_after_idle', mode='before')
    @classmethod
    def _idle(cls, value: Any) -> Any:
        return _idle_setting(value)

    @field_validator('last_messages', mode='before')
    @classmethod
    def _last_messages(cls, value: Any) -> Any:
        if value is False:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f'must be a whole number >= 0 or false, got {value!r}')
        return value

    @model_validator(mode='after')
    def _resolve(self) -> OMConfig:
        self._resolved = _resolve(self)
        return self

    def resolved(self) -> ResolvedOMConfig:
        """The resolved view (computed once, at validation)."""
        return self._resolved

    @property
    def obscure_thread_ids_resolved(self) -> bool:
        """`obscureThreadIds`, with unset meaning on in resource scope (as the reference's Memory API does)."""
        return self.obscure_thread_ids if self.obscure_thread_ids is not None else self.scope == 'resource'


# ---------------------------------------------------------------------------------------------------------------------
# Resolution and validation (reference §3.2 then §3.3; the first failure is raised)
# ---------------------------------------------------------------------------------------------------------------------


def _refuse_async_buffering_in_resource_scope(scope: Scope, async_buffering_configured: bool) -> None:
    """Resource scope does not run async buffering yet (reference §3.3 rule 1).

    Kept on its own so that supporting it later means relaxing this one function.

    Raises:
        ValueError: An async buffering knob was set explicitly in resource scope.
    """
    if async_buffering_configured and scope == 'resource':
        raise ValueError(
            "Async buffering is not yet supported with scope: 'resource'. "
            "Use scope: 'thread', or set observation: { bufferTokens: false } to disable async buffering."
        )


def _resolve_models(config: OMConfig) -> tuple[ModelSpec, ModelSpec, bool, bool]:
    """Observer and Reflector models, and whether each is the default model.

    Raises:
        ValueError: `model` is combined with a role's model, or a config object sets observational-memory
            options without any model.
    """
    observation, reflection = config.observation, config.reflection
    if config.model is not None and observation.model is not None:
        raise ValueError(
            'Cannot set both `model` and `observation.model`. Use `model` to set both agents, or set each individually.'
        )
    if config.model is not None and reflection.model is not None:
        raise ValueError(
            'Cannot set both `model` and `reflection.model`. Use `model` to set both agents, or set each individually.'
        )
    observer = config.model if config.model is not None else observation.model
    observer = observer if observer is not None else reflection.model
    reflector = config.model if config.model is not None else reflection.model
    reflector = reflector if reflector is not None else observation.model
    # Seed 000 asks a config object to name a model; like `observationalMemory: true`, a document without one runs on
    # the default model (a newcomer's `{"observation": {"messageTokens": 500}}` should just work).
    observer_spec = parse_model_spec(observer) if observer is not None else _model_ref('default')
    reflector_spec = parse_model_spec(reflector) if reflector is not None else _model_ref('default')
    return observer_spec, reflector_spec, _is_default_model(observer), _is_default_model(reflector)


def _resolve(config: OMConfig) -> ResolvedOMConfig:
    observation, reflection = config.observation, config.reflection
    observer_model, reflector_model, observer_default, reflector_default = _resolve_models(config)

    message_tokens = observation.message_tokens
    observation_tokens = reflection.observation_tokens
    threshold: int | ThresholdRange = (
        ThresholdRange(min=message_tokens, max=message_tokens + observation_tokens)
        if config.share_token_budget
        else message_tokens
    )

    async_configured = (
        observation.buffer_tokens is not None
        or observation.buffer_activation is not None
        or reflection.buffer_activation is not None
    )
    async_disabled = observation.buffer_tokens is False or (config.scope == 'resource' and not async_configured)

    if config.share_token_budget and not async_disabled:
        common = (
            'shareTokenBudget requires async buffering to be disabled (this is a temporary limitation). '
            'Add observation: { bufferTokens: false } to your config:\n\n'
            '  observationalMemory: {\n'
            '    shareTokenBudget: true,\n'
            '    observation: { bufferTokens: false },\n'
            '  }\n'
        )
        if async_configured:
            raise ValueError(
                common + '\nRemove any other async buffering settings (bufferTokens, bufferActivation, blockAfter).'
            )
        raise ValueError(
            common
            + '\nAsync buffering is enabled by default — this opt-out is only needed when using shareTokenBudget.'
        )

    buffer_tokens: float | None = None
    buffer_activation: float | None = None
    block_after: float | None = None
    reflection_buffer_activation: float | None = None
    reflection_block_after: float | None = None
    if not async_disabled:
        # Async is on, so bufferTokens is unset or a number (`is False` only narrows the type).
        raw_buffer_tokens = observation.buffer_tokens
        user_buffer_tokens: float = (
            DEFAULT_BUFFER_TOKENS if raw_buffer_tokens is None or raw_buffer_tokens is False else raw_buffer_tokens
        )
        buffer_tokens = resolve_buffer_tokens(user_buffer_tokens, message_tokens)
        buffer_activation = (
            observation.buffer_activation if observation.buffer_activation is not None else DEFAULT_BUFFER_ACTIVATION
        )
        raw_block_after = observation.block_after
        if raw_block_after is None and user_buffer_tokens:
            raw_block_after = DEFAULT_BLOCK_AFTER
        block_after = resolve_block_after(raw_block_after, message_tokens) if raw_block_after is not None else None
        reflection_buffer_activation = (
            reflection.buffer_activation
            if reflection.buffer_activation is not None
            else DEFAULT_REFLECTION_BUFFER_ACTIVATION
        )
        raw_reflection_block_after = reflection.block_after
        if raw_reflection_block_after is None and reflection_buffer_activation:
            raw_reflection_block_after = DEFAULT_BLOCK_AFTER
        if raw_reflection_block_after is not None:
            reflection_block_after = resolve_block_after(raw_reflection_block_after, observation_tokens)

    previous_observer_tokens = (
        observation.previous_observer_tokens
        if observation.previous_observer_tokens is not None
        else DEFAULT_PREVIOUS_OBSERVER_TOKENS
    )

    # --- validation (§3.3), on the resolved values; T is the maximum observation threshold ---
    _refuse_async_buffering_in_resource_scope(
        config.scope,
        buffer_tokens is not None or buffer_activation is not None or reflection_buffer_activation is not None,
    )
    max_threshold = get_max_threshold(threshold)
    if buffer_tokens is not None:
        if buffer_tokens <= 0:
            raise ValueError(f'observation.bufferTokens must be > 0, got {_fmt(buffer_tokens)}')
        if buffer_tokens >= max_threshold:
            raise ValueError(
                f'observation.bufferTokens ({_fmt(buffer_tokens)}) must be less than messageTokens ({max_threshold})'
            )
    if buffer_activation is not None:
        if buffer_activation <= 0:
            raise ValueError(f'observation.bufferActivation must be > 0, got {_fmt(buffer_activation)}')
        if 1 < buffer_activation < 1000:
            raise ValueError(
                'observation.bufferActivation must be <= 1 (ratio) or >= 1000 (absolute token retention), '
                f'got {_fmt(buffer_activation)}'
            )
        if buffer_activation >= 1000 and buffer_activation >= max_threshold:
            raise ValueError(
                f'observation.bufferActivation as absolute retention ({_fmt(buffer_activation)}) must be less than '
                f'messageTokens ({max_threshold})'
            )
    if block_after is not None:
        if block_after < max_threshold:
            raise ValueError(f'observation.blockAfter ({_fmt(block_after)}) must be >= messageTokens ({max_threshold})')
        if not buffer_tokens:
            raise ValueError(
                'observation.blockAfter requires observation.bufferTokens to be set '
                '(blockAfter only applies when async buffering is enabled)'
            )
    if previous_observer_tokens is not False and (
        not math.isfinite(previous_observer_tokens) or previous_observer_tokens < 0
    ):
        raise ValueError(
            'observation.previousObserverTokens must be false or a finite number >= 0, '
            f'got {_fmt(previous_observer_tokens)}'
        )
    if reflection_buffer_activation is not None and not 0 < reflection_buffer_activation <= 1:
        raise ValueError(
            f'reflection.bufferActivation must be in range (0, 1], got {_fmt(reflection_buffer_activation)}'
        )
    if reflection_block_after is not None:
        if reflection_block_after < observation_tokens:
            raise ValueError(
                f'reflection.blockAfter ({_fmt(reflection_block_after)}) must be >= reflection.observationTokens '
                f'({observation_tokens})'
            )
        if not reflection_buffer_activation:
            raise ValueError(
                'reflection.blockAfter requires reflection.bufferActivation to be set '
                '(blockAfter only applies when async reflection is enabled)'
            )

    archive = _resolve_archive(observation.archive, observation_tokens)
    temporal_gap_s = _resolve_temporal_markers(config)
    observation_idle, reflection_idle = _resolve_idle_activation(
        config,
        observation_buffering=buffer_tokens is not None and buffer_tokens > 0,
        reflection_buffering=reflection_buffer_activation is not None and reflection_buffer_activation > 0,
    )
    attachments = observation.observe_attachments
    observe_attachments: bool | tuple[str, ...] = (
        True if attachments == 'auto' else attachments if isinstance(attachments, bool) else tuple(attachments)
    )

    observer_settings, reflector_settings = observation.model_settings, reflection.model_settings
    actor_model = parse_model_spec(config.actor_model)
    return ResolvedOMConfig(
        enabled=config.enabled,
        scope=config.scope,
        observer_model=observer_model,
        reflector_model=reflector_model,
        actor_model=actor_model,
        message_tokens=threshold,
        observation_tokens=observation_tokens,
        buffer_tokens=_tokens(buffer_tokens),
        buffer_activation=buffer_activation,
        block_after=_tokens(block_after),
        reflection_buffer_activation=reflection_buffer_activation,
        reflection_block_after=_tokens(reflection_block_after),
        previous_observer_tokens=None if previous_observer_tokens is False else int(previous_observer_tokens),
        max_tokens_per_batch=observation.max_tokens_per_batch,
        observer_temperature=(
            observer_settings.temperature if observer_settings.temperature is not None else DEFAULT_OBSERVER_TEMPERATURE
        ),
        reflector_temperature=(
            reflector_settings.temperature
            if reflector_settings.temperature is not None
            else DEFAULT_REFLECTOR_TEMPERATURE
        ),
        observer_max_output_tokens=(
            observer_settings.max_output_tokens
            if observer_settings.max_output_tokens is not None
            else (DEFAULT_MAX_OUTPUT_TOKENS if observer_default else None)
        ),
        reflector_max_output_tokens=(
            reflector_settings.max_output_tokens
            if reflector_settings.max_output_tokens is not None
            else (DEFAULT_MAX_OUTPUT_TOKENS if reflector_default else None)
        ),
        observer_thinking_budget=OBSERVER_THINKING_BUDGET if _uses_google(observer_model) else None,
        reflector_thinking_budget=REFLECTOR_THINKING_BUDGET if _uses_google(reflector_model) else None,
        observation_instruction=observation.instruction,
        reflection_instruction=reflection.instruction,
        thread_title=observation.thread_title,
        retrieval=_resolve_retrieval(config.retrieval),
        share_token_budget=config.share_token_budget,
        obscure_thread_ids=config.obscure_thread_ids_resolved,
        async_observation_enabled=buffer_tokens is not None and buffer_tokens > 0,
        async_reflection_enabled=reflection_buffer_activation is not None and reflection_buffer_activation > 0,
        working_memory=config.working_memory if config.working_memory and config.working_memory.enabled else None,
        semantic_recall=_resolve_semantic_recall(config.semantic_recall),
        title_generation=_resolve_title_generation(config.generate_title, actor_model),
        last_messages=0 if config.last_messages is False else config.last_messages,
        archive=archive,
        temporal_gap_s=temporal_gap_s,
        observation_idle=observation_idle,
        reflection_idle=reflection_idle,
        observe_attachments=observe_attachments,
    )


def _resolve_temporal_markers(config: OMConfig) -> float | None:
    """The smallest gap that gets a marker (seconds), None when off. Written at the top level (the reference's place)
    or under `observation`, never both."""
    top, nested = config.temporal_markers, config.observation.temporal_markers
    if top is not None and nested is not None:
        raise ValueError(
            'temporalMarkers is set twice, at the top level and as observation.temporalMarkers: set it in one place '
            '(either is accepted)'
        )
    setting = top if top is not None else nested
    if setting is None or setting is False:
        return None
    if setting is True:
        return DEFAULT_MIN_GAP_S
    return duration_seconds(setting.min_gap)


def _idle_ttl(value: int | float | str | bool | ActivationTTLMapConfig | None) -> IdleTTL | IdleTTLMap | None:
    """An idle setting as written, resolved to seconds, "auto", a per-provider map, or None (off)."""
    if value is None or value is False:
        return None
    if isinstance(value, ActivationTTLMapConfig):
        default = _idle_ttl(value.default)
        if isinstance(default, IdleTTLMap):  # pragma: no cover - the map's default is a scalar by validation
            default = None
        providers: dict[str, IdleTTL | Literal[False]] = {}
        for name, ttl in value.providers.items():
            resolved = _idle_ttl(ttl)
            providers[name] = False if resolved is None or isinstance(resolved, IdleTTLMap) else resolved
        return IdleTTLMap(default=default, providers=providers)
    if value == 'auto':
        return 'auto'
    assert not isinstance(value, bool)
    return duration_seconds(value)


def _resolve_idle_activation(
    config: OMConfig, *, observation_buffering: bool, reflection_buffering: bool
) -> tuple[IdleActivation, IdleActivation]:
    """Observation's idle activation (its own setting, else the top level's, as in the reference) and reflection's
    (its own only: reflections do not inherit). Set where nothing is buffered, it could never act: refused."""
    observation, reflection = config.observation, config.reflection
    after = (
        observation.activate_after_idle if observation.activate_after_idle is not None else config.activate_after_idle
    )
    on_change = (
        observation.activate_on_provider_change
        if observation.activate_on_provider_change is not None
        else config.activate_on_provider_change
    )
    observation_idle = IdleActivation(after_idle=_idle_ttl(after), on_provider_change=bool(on_change))
    reflection_idle = IdleActivation(
        after_idle=_idle_ttl(reflection.activate_after_idle),
        on_provider_change=bool(reflection.activate_on_provider_change),
    )
    if observation_idle.enabled and not observation_buffering:
        raise ValueError(
            'activateAfterIdle / activateOnProviderChange activate buffered observations, and this configuration '
            "buffers none (observation.bufferTokens: false, or scope: 'resource'): remove them, or turn buffering on"
        )
    if reflection_idle.enabled and not reflection_buffering:
        raise ValueError(
            'reflection.activateAfterIdle / reflection.activateOnProviderChange activate a buffered reflection, and '
            'this configuration buffers none (reflection.bufferActivation unset or async buffering off): remove them'
        )
    return observation_idle, reflection_idle


def _resolve_archive(archive: ObservationArchiveConfig, observation_tokens: int) -> ArchiveSettings:
    """`observation.archive` with its defaults (multiples of `reflection.observationTokens`), checked."""
    after = (
        archive.after_tokens
        if archive.after_tokens is not None
        else math.floor(observation_tokens * DEFAULT_ARCHIVE_AFTER + 0.5)
    )
    keep = (
        archive.keep_tokens
        if archive.keep_tokens is not None
        else math.floor(observation_tokens * DEFAULT_ARCHIVE_KEEP + 0.5)
    )
    if keep >= after:
        raise ValueError(
            f'observation.archive: keepTokens ({keep}) must be less than afterTokens ({after}): archiving moves the '
            'oldest observations out until about keepTokens remain, so it must leave less than the bound that '
            f'started it (the defaults are {DEFAULT_ARCHIVE_AFTER:g} and {DEFAULT_ARCHIVE_KEEP:g} × '
            'reflection.observationTokens)'
        )
    return ArchiveSettings(after_tokens=after, keep_tokens=keep, max_catalog_tokens=archive.max_catalog_tokens)


def _resolve_retrieval(retrieval: bool | RetrievalConfig) -> RetrievalSettings | None:
    # `true` is the seed's default: cross-thread browsing (scope 'resource'), no vector search.
    if retrieval is True:
        return RetrievalSettings(vector=False, scope='resource')
    if isinstance(retrieval, RetrievalConfig):
        return RetrievalSettings(vector=retrieval.vector, scope=retrieval.scope)
    return None


def _resolve_semantic_recall(recall: SemanticRecallConfig | Literal[False]) -> SemanticRecallSettings | None:
    if recall is False:
        return None
    message_range = recall.message_range
    if isinstance(message_range, MessageRange):
        before, after = message_range.before, message_range.after
    else:
        before = after = message_range
    return SemanticRecallSettings(top_k=recall.top_k, before=before, after=after, scope=recall.scope)


def _resolve_title_generation(
    generate_title: bool | GenerateTitleConfig, actor_model: ModelSpec
) -> TitleGenerationSettings | None:
    if generate_title is False:
        return None
    if generate_title is True:
        return TitleGenerationSettings(model=actor_model, instructions=None)
    model = parse_model_spec(generate_title.model) if generate_title.model is not None else actor_model
    return TitleGenerationSettings(model=model, instructions=generate_title.instructions)


def _tokens(value: float | None) -> int | None:
    """A resolved token figure as an int (absolute values are taken as written; fractions are already rounded)."""
    return None if value is None else int(value) if float(value).is_integer() else math.floor(value + 0.5)


def _fmt(value: float) -> str:
    """A number as the reference prints it: `5000`, not `5000.0`."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


def load_config(*, path: str | None = None, env: Mapping[str, str] | None = None) -> OMConfig:
    """Find and validate the configuration document; the first source found wins.

    Order: `path` (the `--config FILE` option), the file named by `OM_CONFIG_FILE`, the JSON in `OM_CONFIG`;
    with none of them, every default (`OMConfig.model_validate(True)`).

    Args:
        path: An explicit configuration file.
        env: The environment to read (defaults to `os.environ`).

    Returns:
        The validated document.

    Raises:
        ConfigError: The source cannot be read, is not JSON, or is not a valid document. The message names the
            source and, for validation errors, each field path (camelCase, dotted) and the rule.
    """
    environ = os.environ if env is None else env
    if path:
        return _load_file(path, f'config file {path}')
    env_file = environ.get('OM_CONFIG_FILE')
    if env_file:
        return _load_file(env_file, f'config file {env_file} (OM_CONFIG_FILE)')
    env_json = environ.get('OM_CONFIG')
    if env_json is not None and env_json.strip():
        return _parse(env_json, 'OM_CONFIG')
    return OMConfig.model_validate(True)


def _load_file(path: str, source: str) -> OMConfig:
    try:
        text = Path(path).read_text(encoding='utf-8')
    except OSError as exc:
        raise ConfigError(f'{source}: cannot read it ({exc.strerror or exc})') from exc
    return _parse(text, source)


def _parse(text: str, source: str) -> OMConfig:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f'{source}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})') from exc
    try:
        return OMConfig.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(f'{source}: invalid configuration\n{format_validation_error(exc)}') from exc


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: `  - observation.bufferTokens: must be ...` (root-level rules name their own fields).

    Args:
        exc: The pydantic error of `OMConfig` validation.

    Returns:
        The readable, multi-line description.
    """
    lines = []
    for error in exc.errors():
        loc = '.'.join(to_camel(part) if isinstance(part, str) else f'[{part}]' for part in error['loc'])
        loc = loc.replace('.[', '[')
        message = error['msg']
        for prefix in ('Value error, ', 'Assertion failed, '):
            message = message.removeprefix(prefix)
        if error['type'] == 'extra_forbidden':
            message = 'unknown key (not a configuration option)'
        lines.append(f'  - {loc}: {message}' if loc else f'  - {message}')
    return '\n'.join(lines)
