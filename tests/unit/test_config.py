"""The configuration document: defaults, resolution, validation, models, loading (spec §3, §5, §10-§11, §21, §25)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from om_lib.config import (
    MessageRange,
    OMConfig,
    ResolvedOMConfig,
    RetrievalSettings,
    SemanticRecallSettings,
    format_validation_error,
    load_config,
    parse_model_spec,
)
from om_lib.context.thresholds import (
    ThresholdRange,
    calculate_dynamic_threshold,
    calculate_projected_message_removal,
    get_max_threshold,
    resolve_activation_ratio,
    resolve_retention_floor,
    select_chunks_to_activate,
    should_trigger_async_observation,
    should_trigger_async_reflection_tokens,
)
from om_lib.errors import ConfigError
from om_lib.models.model_spec import ModelByInputTokens, ModelFallbacks, ModelRef, ModelRoutingError

DEFAULT = ModelRef('google', 'gemini-2.5-flash')


def resolve(document: Any) -> ResolvedOMConfig:
    return OMConfig.model_validate(document).resolved()


def om(model: Any = 'default', **observation_reflection: Any) -> dict[str, Any]:
    """A document with a model, plus `observation=`/`reflection=`/other top-level keys."""
    return {'model': model, **observation_reflection}


def refused(document: Any, *fragments: str) -> str:
    """Validate, expect refusal, and check each fragment appears in the error text as `om` shows it."""
    with pytest.raises(ValidationError) as info:
        OMConfig.model_validate(document)
    text = format_validation_error(info.value)
    for fragment in fragments:
        assert fragment in text, f'{fragment!r} not in {text!r}'
    return text


# ---------------------------------------------------------------------------------------------------------------------
# A1-A4: defaults and resolution
# ---------------------------------------------------------------------------------------------------------------------


def test_config_a1_defaults_with_default_model_and_custom_thresholds() -> None:
    # Given the reference's scenario A1
    settings = resolve(om(observation={'messageTokens': 50000}, reflection={'observationTokens': 20000}))

    # Then fractions and multipliers resolve against the thresholds
    assert settings.buffer_tokens == 10000
    assert settings.buffer_activation == 0.8
    assert settings.block_after == 60000
    assert settings.reflection_buffer_activation == 0.5
    assert settings.reflection_block_after == 24000
    assert settings.async_observation_enabled is True
    assert settings.async_reflection_enabled is True
    assert settings.observer_max_output_tokens == 100000
    assert settings.reflector_max_output_tokens == 100000
    assert settings.observer_model == settings.reflector_model == DEFAULT


def test_config_true_is_every_default() -> None:
    config = OMConfig.model_validate(True)
    settings = config.resolved()

    assert config.enabled is True
    assert config.to_json_dict() == {}
    assert settings.enabled is True
    assert settings.scope == 'thread'
    assert settings.message_tokens == 30000
    assert settings.observation_tokens == 40000
    assert settings.buffer_tokens == 6000
    assert settings.buffer_activation == 0.8
    assert settings.block_after == 36000
    assert settings.reflection_buffer_activation == 0.5
    assert settings.reflection_block_after == 48000
    assert settings.previous_observer_tokens == 2000
    assert settings.max_tokens_per_batch == 10000
    assert settings.observer_temperature == 0.3
    assert settings.reflector_temperature == 0
    assert settings.observer_thinking_budget == 215
    assert settings.reflector_thinking_budget == 1024
    assert settings.observer_model == settings.reflector_model == settings.actor_model == DEFAULT
    assert settings.retrieval is None
    assert settings.share_token_budget is False
    assert settings.obscure_thread_ids is False
    assert settings.thread_title is False
    assert settings.working_memory is None
    assert settings.semantic_recall is None
    assert settings.title_generation is None
    assert settings.max_message_threshold() == 30000
    assert settings.dynamic_message_threshold(12345) == 30000


def test_config_empty_object_and_wider_options_only_use_the_default_model() -> None:
    assert resolve({}).observer_model == DEFAULT
    settings = resolve({'actorModel': 'offline', 'workingMemory': {'enabled': True}, 'obscureThreadIds': True})
    assert settings.observer_model == DEFAULT
    assert settings.actor_model == ModelRef('offline')


@pytest.mark.parametrize('document', [False, {'enabled': False}])
def test_config_false_turns_observational_memory_off(document: Any) -> None:
    config = OMConfig.model_validate(document)
    assert config.enabled is False
    assert config.resolved().enabled is False
    assert config.to_json_dict() == {'enabled': False}


def test_config_a2_non_default_model_leaves_max_output_tokens_unset() -> None:
    settings = resolve(om('google/gemini-2.5-pro'))
    assert settings.observer_max_output_tokens is None
    assert settings.reflector_max_output_tokens is None
    assert settings.observer_model == ModelRef('google', 'gemini-2.5-pro')
    # Google models keep their thinking budgets.
    assert (settings.observer_thinking_budget, settings.reflector_thinking_budget) == (215, 1024)


def test_config_offline_model_has_no_thinking_budget_and_user_settings_win() -> None:
    settings = resolve(
        {
            'observation': {'model': 'offline', 'modelSettings': {'temperature': 0.9, 'maxOutputTokens': 5000}},
            'reflection': {'model': 'offline/echo', 'modelSettings': {'temperature': 0.1}},
        }
    )
    assert settings.observer_model == ModelRef('offline')
    assert settings.reflector_model == ModelRef('offline', 'echo')
    assert settings.observer_thinking_budget is None
    assert settings.reflector_thinking_budget is None
    assert settings.observer_temperature == 0.9
    assert settings.observer_max_output_tokens == 5000
    assert settings.reflector_temperature == 0.1
    assert settings.reflector_max_output_tokens is None


def test_config_a3_fractional_values() -> None:
    assert resolve(om(observation={'messageTokens': 100000, 'bufferTokens': 0.1})).buffer_tokens == 10000
    settings = resolve(om(observation={'messageTokens': 20000, 'blockAfter': 1.25, 'bufferTokens': 0.25}))
    assert settings.block_after == 25000
    assert settings.buffer_tokens == 5000


@pytest.mark.parametrize(
    ('block_after', 'expected'),
    [(1, 20000), (1.5, 30000), (99, 1980000), (100000, 100000), (25000, 25000)],
)
def test_config_block_after_multiplier_from_1_to_100_else_absolute(block_after: float, expected: int) -> None:
    settings = resolve(om(observation={'messageTokens': 20000, 'blockAfter': block_after}))
    assert settings.block_after == expected


def test_config_a4_buffer_tokens_false_disables_all_async() -> None:
    settings = resolve(om(observation={'bufferTokens': False}))
    assert settings.buffer_tokens is None
    assert settings.buffer_activation is None
    assert settings.block_after is None
    assert settings.reflection_buffer_activation is None
    assert settings.reflection_block_after is None
    assert settings.async_observation_enabled is False
    assert settings.async_reflection_enabled is False


# ---------------------------------------------------------------------------------------------------------------------
# A5-A6: resource scope and shared budget
# ---------------------------------------------------------------------------------------------------------------------


def test_config_a5_resource_scope_without_async_knobs_disables_async() -> None:
    config = OMConfig.model_validate(om(scope='resource', retrieval=True))
    settings = config.resolved()
    assert settings.scope == 'resource'
    assert settings.async_observation_enabled is False
    assert settings.async_reflection_enabled is False
    assert settings.buffer_tokens is None and settings.block_after is None
    # Unset obscureThreadIds means "on" in resource scope; retrieval is kept (cross-thread recall is supported).
    assert config.obscure_thread_ids_resolved is True
    assert settings.obscure_thread_ids is True
    assert settings.retrieval == RetrievalSettings(vector=False, scope='resource')


@pytest.mark.parametrize(
    'knobs',
    [
        {'observation': {'bufferTokens': 10000}},
        {'observation': {'bufferActivation': 0.7}},
        {'reflection': {'bufferActivation': 0.5}},
    ],
)
def test_config_a5_resource_scope_refuses_explicit_async_knobs(knobs: dict[str, Any]) -> None:
    refused(om(scope='resource', **knobs), "Async buffering is not yet supported with scope: 'resource'")


def test_config_resource_scope_with_buffering_switched_off_is_accepted() -> None:
    settings = resolve(om(scope='resource', observation={'bufferTokens': False, 'bufferActivation': 0.7}))
    assert settings.async_observation_enabled is False
    assert settings.buffer_activation is None


def test_config_obscure_thread_ids_explicit_values_win() -> None:
    assert OMConfig.model_validate(om(scope='resource', obscureThreadIds=False)).obscure_thread_ids_resolved is False
    assert resolve({'obscureThreadIds': True}).obscure_thread_ids is True


def test_config_a6_share_token_budget_needs_buffering_off() -> None:
    refused(om(shareTokenBudget=True), 'shareTokenBudget requires', 'Async buffering is enabled by default')
    refused(
        om(shareTokenBudget=True, observation={'bufferTokens': 5000}),
        'shareTokenBudget requires',
        'Remove any other async buffering settings',
    )
    settings = resolve(
        om(shareTokenBudget=True, observation={'bufferTokens': False, 'messageTokens': 30000}, reflection={})
    )
    assert settings.share_token_budget is True
    assert settings.message_tokens == ThresholdRange(min=30000, max=70000)
    assert settings.max_message_threshold() == 70000
    assert settings.dynamic_message_threshold(0) == 70000
    assert settings.dynamic_message_threshold(10000) == 60000
    assert settings.dynamic_message_threshold(45000) == 30000


def test_config_share_token_budget_in_resource_scope_without_knobs_is_accepted() -> None:
    assert resolve(om(shareTokenBudget=True, scope='resource')).message_tokens == ThresholdRange(30000, 70000)


# ---------------------------------------------------------------------------------------------------------------------
# A7: invalid values
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ('observation', 'reflection', 'fragment'),
    [
        ({'bufferActivation': 0}, {}, 'observation.bufferActivation must be > 0'),
        ({'bufferActivation': 1.5}, {}, 'must be <= 1 (ratio) or >= 1000 (absolute token retention)'),
        ({'bufferActivation': 50000, 'messageTokens': 50000}, {}, 'as absolute retention (50000)'),
        ({'bufferTokens': 15000, 'messageTokens': 10000}, {}, 'observation.bufferTokens (15000) must be less than'),
        ({'bufferTokens': 0}, {}, 'observation.bufferTokens must be > 0'),
        ({'bufferTokens': -5}, {}, 'observation.bufferTokens must be > 0'),
        ({'blockAfter': 0.5}, {}, 'observation.blockAfter (0.5) must be >= messageTokens (30000)'),
        ({'blockAfter': 20000}, {}, 'observation.blockAfter (20000) must be >= messageTokens (30000)'),
        ({}, {'bufferActivation': 0}, 'reflection.bufferActivation must be in range (0, 1]'),
        ({}, {'bufferActivation': 1.5}, 'reflection.bufferActivation must be in range (0, 1]'),
        ({}, {'blockAfter': 30000}, 'reflection.blockAfter (30000) must be >= reflection.observationTokens (40000)'),
    ],
)
def test_config_a7_invalid_values_are_refused(
    observation: dict[str, Any], reflection: dict[str, Any], fragment: str
) -> None:
    refused(om(observation=observation, reflection=reflection), fragment)


def test_config_a7_absolute_buffer_activation_is_accepted() -> None:
    assert resolve(om(observation={'bufferActivation': 3000})).buffer_activation == 3000


def test_config_block_after_without_buffer_tokens_is_refused() -> None:
    # bufferTokens: 0 resolves to 0 with an explicit blockAfter: the "requires bufferTokens" rule is never reached
    # because 0 already fails "> 0"; the reference's order is kept.
    refused(om(observation={'bufferTokens': 0, 'blockAfter': 40000}), 'observation.bufferTokens must be > 0')


# ---------------------------------------------------------------------------------------------------------------------
# A8: models
# ---------------------------------------------------------------------------------------------------------------------


def test_config_a8_model_with_observation_model_is_refused() -> None:
    refused(om(observation={'model': 'default'}), 'Cannot set both `model` and `observation.model`')
    refused(om(reflection={'model': 'default'}), 'Cannot set both `model` and `reflection.model`')


@pytest.mark.parametrize(
    'document',
    [
        {'observation': {'messageTokens': 20000}},
        {'scope': 'thread'},
        {'reflection': {}},
        {'shareTokenBudget': True, 'observation': {'bufferTokens': False}},
        {'retrieval': True},
    ],
)
def test_config_a8_om_options_without_a_model_run_on_the_default_model(document: dict[str, Any]) -> None:
    # The seed asks a config object to name a model; issue 21 relaxes it: the default model, as `true` does.
    settings = resolve(document)
    assert settings.observer_model == settings.reflector_model == DEFAULT


def test_config_last_messages_seed_003() -> None:
    assert resolve({}).last_messages == 10
    assert resolve({'lastMessages': 3}).last_messages == 3
    assert resolve({'lastMessages': False}).last_messages == 0
    refused({'lastMessages': -1}, 'lastMessages: must be a whole number >= 0 or false')
    refused({'lastMessages': True}, 'lastMessages: must be a whole number >= 0 or false')


def test_config_a8_a_disabled_document_needs_no_model() -> None:
    assert resolve({'enabled': False, 'observation': {'messageTokens': 5000}}).enabled is False


def test_config_a8_observation_model_alone_is_used_for_both_agents() -> None:
    settings = resolve({'observation': {'model': 'google/gemini-2.5-pro'}})
    assert settings.observer_model == settings.reflector_model == ModelRef('google', 'gemini-2.5-pro')
    settings = resolve({'reflection': {'model': 'offline'}})
    assert settings.observer_model == settings.reflector_model == ModelRef('offline')


def test_config_role_models_resolve_in_the_reference_order() -> None:
    settings = resolve({'observation': {'model': 'offline/a'}, 'reflection': {'model': 'offline/b'}})
    assert settings.observer_model == ModelRef('offline', 'a')
    assert settings.reflector_model == ModelRef('offline', 'b')


def test_config_a8_model_default_is_accepted() -> None:
    assert resolve({'model': 'default'}).observer_model == DEFAULT
    assert resolve({'model': 'google/gemini-2.5-flash'}).observer_max_output_tokens == 100000


@pytest.mark.parametrize(
    ('field', 'document'),
    [
        ('model', {'model': 'mistral/mistral-large'}),
        ('observation.model', {'observation': {'model': 'anthropic/claude'}}),
        ('actorModel', {'actorModel': 'azure/gpt-4o'}),
        ('generateTitle.model', {'generateTitle': {'model': 'cohere/command-r'}}),
    ],
)
def test_config_unknown_provider_is_refused_naming_field_and_known_providers(
    field: str, document: dict[str, Any]
) -> None:
    text = refused(document, 'unknown model provider', 'google, bedrock, openai, offline')
    assert field in text


def test_config_bedrock_and_openai_models_are_accepted_for_every_role() -> None:
    # Given a different provider per role, in every form a model setting takes
    document = {
        'observation': {'model': 'bedrock/us.amazon.nova-lite-v1:0'},
        'reflection': {'model': {'upTo': {'20000': 'bedrock/amazon.nova-micro-v1:0', '200000': 'openai/gpt-4.1'}}},
        'actorModel': [{'model': 'openai/gpt-4o-mini', 'maxRetries': 1}, {'model': 'bedrock/arn:aws:bedrock:x'}],
        'generateTitle': {'model': 'openai/llama3.1:8b'},
    }
    settings = resolve(document)
    # Then every model id is kept unchanged after the provider, and no Google thinking budget is set
    assert settings.observer_model == ModelRef('bedrock', 'us.amazon.nova-lite-v1:0')
    assert isinstance(settings.reflector_model, ModelByInputTokens)
    assert settings.reflector_model.resolve(50000) == ModelRef('openai', 'gpt-4.1')
    assert settings.actor_model == ModelFallbacks(
        entries=((ModelRef('openai', 'gpt-4o-mini'), 1), (ModelRef('bedrock', 'arn:aws:bedrock:x'), 0))
    )
    assert settings.title_generation is not None
    assert settings.title_generation.model == ModelRef('openai', 'llama3.1:8b')
    assert settings.observer_thinking_budget is None and settings.reflector_thinking_budget is None
    refused({'model': 'bedrock'}, 'needs a model id')


def test_config_provider_without_model_id_is_refused() -> None:
    refused({'model': 'google'}, 'needs a model id')
    refused({'model': 'google/'}, 'needs a model id')


def test_config_fallback_list() -> None:
    document = {'model': [{'model': 'google/gemini-2.5-pro', 'maxRetries': 2}, {'model': 'default'}]}
    settings = resolve(document)
    assert settings.observer_model == ModelFallbacks(entries=((ModelRef('google', 'gemini-2.5-pro'), 2), (DEFAULT, 0)))
    assert settings.observer_max_output_tokens is None
    assert OMConfig.model_validate(document).to_json_dict() == document
    refused({'model': []}, 'at least one entry')
    refused({'model': [{'model': 'default', 'maxRetries': -1}]}, 'greater than or equal to 0')
    refused({'model': [{'model': 'default', 'retries': 1}]}, 'retries')


def test_config_m65_model_by_input_tokens() -> None:
    # Given thresholds {10000: A, 40000: B} written as upTo
    document = {'model': {'upTo': {'40000': 'google/gemini-2.5-pro', '10000': 'offline'}}}
    spec = resolve(document).observer_model
    assert isinstance(spec, ModelByInputTokens)
    assert spec.thresholds == (10000, 40000)
    assert spec.resolve(5000) == ModelRef('offline')
    assert spec.resolve(10000) == ModelRef('offline')
    assert spec.resolve(10001) == ModelRef('google', 'gemini-2.5-pro')
    with pytest.raises(ModelRoutingError, match='exceeds the largest configured threshold'):
        spec.resolve(50000)
    refused({'model': {'upTo': {}}}, 'requires at least one threshold in "upTo"')
    refused({'model': {'upTo': {'0': 'default'}}}, 'threshold keys must be positive numbers. Got: 0')
    refused({'model': {'upTo': {'-1': 'default'}}}, 'threshold keys must be positive numbers. Got: -1')
    refused({'model': {'upTo': {'lots': 'default'}}}, 'threshold keys must be positive numbers')
    refused({'model': {'upTo': {'10': 'vertex/x'}}}, 'unknown model provider')


def test_parse_model_spec_forms() -> None:
    assert parse_model_spec('default') == DEFAULT
    assert parse_model_spec('offline') == ModelRef('offline')
    assert parse_model_spec('google/gemini-2.5-flash-lite').name == 'google/gemini-2.5-flash-lite'


# ---------------------------------------------------------------------------------------------------------------------
# A9: previousObserverTokens
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('value', [-100, math.inf, math.nan])
def test_config_a9_previous_observer_tokens_invalid(value: float) -> None:
    refused(om(observation={'previousObserverTokens': value}), 'must be false or a finite number >= 0')


@pytest.mark.parametrize(('value', 'expected'), [(False, None), (0, 0), (1, 1), (5000, 5000)])
def test_config_a9_previous_observer_tokens_valid(value: Any, expected: int | None) -> None:
    assert resolve(om(observation={'previousObserverTokens': value})).previous_observer_tokens == expected


def test_config_a9_previous_observer_tokens_default() -> None:
    assert resolve(om()).previous_observer_tokens == 2000


def test_config_true_is_refused_where_a_number_or_false_is_expected() -> None:
    refused(om(observation={'bufferTokens': True}), 'observation.bufferTokens', 'must be false or a number')
    refused(om(observation={'messageTokens': True}), 'observation.messageTokens', 'must be a number')


# ---------------------------------------------------------------------------------------------------------------------
# Document shape: names, unknown keys, immutability
# ---------------------------------------------------------------------------------------------------------------------


def test_config_contract_example() -> None:
    config = OMConfig.model_validate({'model': 'default', 'observation': {'messageTokens': 20000}})
    assert config.observation.message_tokens == 20000
    assert config.resolved().buffer_tokens == 4000


def test_config_camel_and_snake_case_both_validate_to_the_same_config() -> None:
    camel = {
        'model': 'default',
        'shareTokenBudget': False,
        'obscureThreadIds': True,
        'observation': {'messageTokens': 20000, 'bufferTokens': 0.25, 'previousObserverTokens': False},
        'reflection': {'observationTokens': 30000, 'modelSettings': {'maxOutputTokens': 9000}},
        'actorModel': 'offline',
        'workingMemory': {'enabled': True, 'readOnly': True, 'schema': {'type': 'object'}},
        'semanticRecall': {'topK': 3, 'messageRange': {'before': 2, 'after': 1}},
        'generateTitle': {'model': 'offline', 'instructions': 'one word'},
    }
    snake = {
        'model': 'default',
        'share_token_budget': False,
        'obscure_thread_ids': True,
        'observation': {'message_tokens': 20000, 'buffer_tokens': 0.25, 'previous_observer_tokens': False},
        'reflection': {'observation_tokens': 30000, 'model_settings': {'max_output_tokens': 9000}},
        'actor_model': 'offline',
        'working_memory': {'enabled': True, 'read_only': True, 'json_schema': {'type': 'object'}},
        'semantic_recall': {'top_k': 3, 'message_range': {'before': 2, 'after': 1}},
        'generate_title': {'model': 'offline', 'instructions': 'one word'},
    }
    from_camel, from_snake = OMConfig.model_validate(camel), OMConfig.model_validate(snake)
    assert from_camel == from_snake
    assert from_camel.resolved() == from_snake.resolved()
    assert from_snake.to_json_dict() == camel
    assert from_camel.working_memory is not None and from_camel.working_memory.json_schema == {'type': 'object'}


@pytest.mark.parametrize(
    ('document', 'path'),
    [
        ({'model': 'default', 'bufferTokens': 5000}, 'bufferTokens'),
        ({'model': 'default', 'observation': {'messageTokenz': 1}}, 'observation.messageTokenz'),
        ({'model': 'default', 'reflection': {'modelSettings': {'topP': 1}}}, 'reflection.modelSettings.topP'),
        ({'workingMemory': {'enabled': True, 'tmpl': 'x'}}, 'workingMemory.tmpl'),
    ],
)
def test_config_unknown_keys_are_refused_naming_the_key(document: dict[str, Any], path: str) -> None:
    refused(document, f'{path}: unknown key (not a configuration option)')
    with pytest.raises(ConfigError, match=path.replace('.', r'\.')):
        load_config(env={'OM_CONFIG': json.dumps(document)})


def test_config_is_frozen() -> None:
    config = OMConfig.model_validate(True)
    with pytest.raises(ValidationError):
        config.scope = 'resource'  # type: ignore[misc]
    with pytest.raises(ValidationError):
        config.observation.message_tokens = 1  # type: ignore[misc]


def test_config_retrieval_object() -> None:
    assert resolve(om(retrieval={'vector': True, 'scope': 'thread'})).retrieval == RetrievalSettings(True, 'thread')
    assert resolve(om(retrieval=False)).retrieval is None
    refused(om(retrieval=3), 'retrieval: must be true, false or')


# ---------------------------------------------------------------------------------------------------------------------
# Wider memory options
# ---------------------------------------------------------------------------------------------------------------------


def test_config_working_memory() -> None:
    settings = resolve({'workingMemory': {'enabled': True, 'template': '# User\n- Name:'}})
    assert settings.working_memory is not None
    assert settings.working_memory.scope == 'resource'
    assert settings.working_memory.template == '# User\n- Name:'
    assert settings.working_memory.read_only is False
    assert resolve({'workingMemory': {'enabled': False, 'template': 'x'}}).working_memory is None
    refused({'workingMemory': {'enabled': True, 'template': 'x', 'schema': {}}}, 'workingMemory', 'not both')
    refused({'workingMemory': {'template': 'x'}}, 'workingMemory.enabled')


def test_config_semantic_recall() -> None:
    assert resolve({'semanticRecall': False}).semantic_recall is None
    assert resolve({}).semantic_recall is None
    assert resolve({'semanticRecall': True}).semantic_recall == SemanticRecallSettings(4, 1, 1, 'resource')
    assert resolve(
        {'semanticRecall': {'topK': 3, 'messageRange': 2, 'scope': 'thread'}}
    ).semantic_recall == SemanticRecallSettings(3, 2, 2, 'thread')
    config = OMConfig.model_validate({'semanticRecall': {'messageRange': {'before': 3, 'after': 0}}})
    assert config.semantic_recall is not False
    assert config.semantic_recall.message_range == MessageRange(before=3, after=0)
    assert config.resolved().semantic_recall == SemanticRecallSettings(4, 3, 0, 'resource')
    refused({'semanticRecall': {'topK': 0}}, 'semanticRecall.topK')
    refused({'semanticRecall': 'yes'}, 'semanticRecall: must be false, true or')


def test_config_generate_title() -> None:
    assert resolve({}).title_generation is None
    settings = resolve({'generateTitle': True, 'actorModel': 'offline'})
    assert settings.title_generation is not None
    assert settings.title_generation.model == ModelRef('offline')
    settings = resolve({'generateTitle': {'model': 'google/gemini-2.5-flash-lite', 'instructions': 'one word'}})
    assert settings.title_generation is not None
    assert settings.title_generation.model == ModelRef('google', 'gemini-2.5-flash-lite')
    assert settings.title_generation.instructions == 'one word'


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


def test_load_config_precedence(tmp_path: Any) -> None:
    explicit = tmp_path / 'explicit.json'
    explicit.write_text(json.dumps({'model': 'default', 'observation': {'messageTokens': 1111}}))
    from_env_file = tmp_path / 'env.json'
    from_env_file.write_text(json.dumps({'model': 'default', 'observation': {'messageTokens': 2222}}))
    env = {
        'OM_CONFIG_FILE': str(from_env_file),
        'OM_CONFIG': json.dumps({'model': 'default', 'observation': {'messageTokens': 3333}}),
    }

    assert load_config(path=str(explicit), env=env).observation.message_tokens == 1111
    assert load_config(env=env).observation.message_tokens == 2222
    assert load_config(env={'OM_CONFIG': env['OM_CONFIG']}).observation.message_tokens == 3333
    assert load_config(env={}) == OMConfig.model_validate(True)
    assert load_config(env={'OM_CONFIG': 'false'}).enabled is False


@pytest.mark.parametrize(
    ('document', 'line'),
    [
        ({'activateAfterIdle': '5x'}, "activateAfterIdle: '5x' is not a duration"),
        ({'activateAfterIdle': True}, 'activateAfterIdle: must be a number of seconds, a duration'),
        ({'observation': {'activateAfterIdle': '5x'}}, "observation.activateAfterIdle: '5x' is not a duration"),
        ({'reflection': {'activateAfterIdle': '5x'}}, "reflection.activateAfterIdle: '5x' is not a duration"),
        ({'activateAfterIdle': {'default': '5x'}}, "activateAfterIdle.default: '5x' is not a duration"),
        (
            {'observation': {'activateAfterIdle': {'providers': {'anthropic': '5x'}}}},
            "observation.activateAfterIdle.providers.anthropic: '5x' is not a duration",
        ),
        (
            {'activateAfterIdle': {'providers': {'openai': None}}},
            'activateAfterIdle.providers.openai: needs an idle time',
        ),
        ({'activateAfterIdle': {'providers': 3}}, 'activateAfterIdle.providers: must be an object of provider'),
        ({'observation': {'observeAttachments': 3}}, 'observation.observeAttachments: must be true, false, "auto"'),
        ({'observation': {'observeAttachments': ['x']}}, "observation.observeAttachments: 'x' is not a media type"),
        ({'temporalMarkers': 3}, 'temporalMarkers: must be true, false or {"minGap": "30m"}'),
        ({'temporalMarkers': {'minGap': True}}, 'temporalMarkers.minGap: must be seconds or a duration'),
        (
            {'observation': {'temporalMarkers': {'minGap': '5x'}}},
            "observation.temporalMarkers.minGap: '5x' is not a duration",
        ),
        ({'semanticRecall': {'messageRange': -1}}, 'semanticRecall.messageRange: must be >= 0'),
        ({'generateTitle': 3}, 'generateTitle: must be true, false or {model, instructions}'),
        (
            {'workingMemory': {'enabled': True, 'schema': {'type': 'string'}}},
            'workingMemory.schema: must describe a JSON object',
        ),
        (
            {'workingMemory': {'enabled': True, 'schema': {'$ref': 'https://example.com/s.json'}}},
            'workingMemory.schema: only local references',
        ),
        (
            {'observation': {'archive': {'keepTokens': 100_000}}},
            'observation.archive: keepTokens (100000) must be less than afterTokens (60000)',
        ),
    ],
)
def test_a_config_error_names_its_field_once(tmp_path: Any, document: dict[str, Any], line: str) -> None:
    # What `om serve --config bad.json` prints: each problem's field once, in front, then the rule.
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as info:
        load_config(path=str(bad))
    problems = str(info.value).splitlines()[1:]
    assert len(problems) == 1 and problems[0].startswith(f'  - {line}'), problems
    field = line.split(':', 1)[0]
    assert problems[0].count(field) == 1, problems


def test_load_config_validation_error_names_source_field_and_rule(tmp_path: Any) -> None:
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps({'model': 'default', 'observation': {'bufferTokens': 50000, 'messageTokens': 10000}}))
    with pytest.raises(ConfigError) as info:
        load_config(path=str(bad))
    message = str(info.value)
    assert str(bad) in message
    assert 'observation.bufferTokens (50000) must be less than messageTokens (10000)' in message

    with pytest.raises(ConfigError) as info:
        load_config(env={'OM_CONFIG': json.dumps({'observation': {'bufferActivation': 'high', 'messageTokens': -1}})})
    message = str(info.value)
    assert 'OM_CONFIG' in message
    assert 'observation.bufferActivation: must be a number' in message
    assert 'observation.messageTokens: Input should be greater than 0' in message

    with pytest.raises(ConfigError, match=r'model\[0\]\.model: unknown model provider'):
        load_config(env={'OM_CONFIG': json.dumps({'model': [{'model': 'vertex/x'}]})})


def test_load_config_bad_json_and_missing_file(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match='OM_CONFIG: not valid JSON'):
        load_config(env={'OM_CONFIG': '{model: default}'})
    missing = tmp_path / 'missing.json'
    with pytest.raises(ConfigError, match='OM_CONFIG_FILE.*cannot read it'):
        load_config(env={'OM_CONFIG_FILE': str(missing)})
    with pytest.raises(ConfigError, match='cannot read it'):
        load_config(path=str(missing))


# ---------------------------------------------------------------------------------------------------------------------
# Threshold math (§5, B11-B12)
# ---------------------------------------------------------------------------------------------------------------------


def test_thresholds_max_and_dynamic() -> None:
    shared = ThresholdRange(min=30000, max=70000)
    assert get_max_threshold(30000) == 30000
    assert get_max_threshold(shared) == 70000
    assert [calculate_dynamic_threshold(shared, x) for x in (0, 10000, 45000)] == [70000, 60000, 30000]
    assert calculate_dynamic_threshold(30000, 99999) == 30000


def test_thresholds_retention_floor_and_activation_ratio() -> None:
    assert resolve_retention_floor(0.8, 30000) == pytest.approx(6000)
    assert resolve_retention_floor(2000, 30000) == 2000
    assert resolve_activation_ratio(10000, 50000) == pytest.approx(0.8)
    assert resolve_activation_ratio(0.7, 50000) == 0.7
    assert resolve_activation_ratio(60000, 50000) == 0


@pytest.mark.parametrize(
    ('chunks', 'buffer_activation', 'threshold', 'pending', 'expected'),
    [
        # §11.1 example: absolute floor 2000, every boundary is under the 28000 target.
        ((3000, 3000, 3000), 2000, 30000, 30000, 9000),
        ((3000, 3000, 4000), 0.5, 10000, 10000, 6000),
        ((5000, 5000), 0.5, 10000, 10000, 5000),
        ((3000, 7000), 0.8, 10000, 10000, 3000),
        ((3000, 6000), 0.8, 10000, 10000, 9000),
        ((10000,), 0.8, 10000, 10000, 10000),
        ((2000, 2800), 0.9, 5000, 5000, 2000),
        ((400, 450, 142), 0.96875, 1024, 1024, 992),
        # Already within the retention floor: the spec's rule has no early exit, the first boundary counts (§5).
        ((5000,), 0.8, 30000, 5000, 5000),
        ((500, 500), 0.8, 10000, 1500, 500),
        # No chunks at all.
        ((), 0.8, 30000, 30000, 0),
        # No boundary over or (non-empty) under the target: the first chunk.
        ((0, 0), 0.8, 30000, 30000, 0),
    ],
)
def test_thresholds_projected_message_removal(
    chunks: tuple[int, ...], buffer_activation: float, threshold: int, pending: int, expected: int
) -> None:
    assert calculate_projected_message_removal(chunks, buffer_activation, threshold, pending) == expected


_EIGHT_FIFTEEN = (8000, 15000, 12000, 7000, 6000)


@pytest.mark.parametrize(
    ('chunks', 'threshold', 'ratio', 'pending', 'force_max', 'expected'),
    [
        ((3000, 3000, 4000), 10000, 0.5, None, False, 2),
        ((5000, 5000), 10000, 0.5, None, False, 1),
        ((50000,), 100000, 0.1, None, False, 1),
        ((10000,) * 5, 50000, 0.6, None, False, 3),
        (_EIGHT_FIFTEEN, 50000, 0.6, None, False, 3),
        (_EIGHT_FIFTEEN, 50000, 0.4, None, False, 2),
        (_EIGHT_FIFTEEN, 50000, 0.9, None, False, 5),
        (_EIGHT_FIFTEEN, 50000, 1.0, None, False, 5),
        ((35000, 5000, 5000, 3000), 50000, 0.3, None, False, 1),
        ((1000,) * 4, 4000, 0.5, None, False, 2),
        ((10000,) * 5, 50000, 0.8, None, False, 4),
        ((12000,), 50000, 0.3, None, False, 1),
        ((3000, 7000), 10000, 0.8, None, False, 1),
        ((3000, 6000), 10000, 0.8, None, False, 2),
        ((10000,), 10000, 0.8, None, False, 1),
        ((2000, 46000), 30000, 1 - 1000 / 30000, 48000, False, 1),
        ((2000, 46000), 30000, 1 - 1000 / 30000, 48000, True, 1),
        ((2000, 2800), 5000, 0.9, None, False, 1),
        ((400, 450, 142), 1024, 0.96875, None, False, 3),
        ((30000, 30000, 40000), 100000, 1.0, 100000, False, 3),
        ((), 10000, 0.5, None, False, 0),
    ],
)
def test_thresholds_storage_activation_table(
    chunks: tuple[int, ...], threshold: int, ratio: float, pending: int | None, force_max: bool, expected: int
) -> None:
    pending_tokens = threshold if pending is None else pending
    assert select_chunks_to_activate(chunks, ratio, threshold, pending_tokens, force_max) == expected


def test_thresholds_force_max_takes_the_over_boundary_despite_overshoot() -> None:
    # T 100000, ratio 0.5: floor 50000, target 50000. The over boundary (98000) overshoots by 48000 > 47500.
    assert select_chunks_to_activate((10000, 88000), 0.5, 100000, 100000, False) == 1
    assert select_chunks_to_activate((10000, 88000), 0.5, 100000, 100000, True) == 2
    # Forced, but the over boundary would leave less than min(1000, floor): fall through to the normal rule.
    assert select_chunks_to_activate((3000, 7000), 0.8, 10000, 10000, True) == 1


@pytest.mark.parametrize(
    ('current', 'last', 'buffer_tokens', 'threshold', 'expected'),
    [
        (5000, 0, 10000, None, False),
        (10000, 0, 10000, None, True),
        (12000, 10000, 10000, None, False),
        (20000, 10000, 10000, None, True),
        (35000, 32000, 4000, 40000, False),
        (36000, 32000, 4000, 40000, True),
        (37000, 36000, 4000, 40000, False),
        (38000, 36000, 4000, 40000, True),
        # With no threshold the interval never halves.
        (38000, 36000, 4000, None, False),
    ],
)
def test_thresholds_async_observation_trigger(
    current: int, last: int, buffer_tokens: int, threshold: int | None, expected: bool
) -> None:
    assert should_trigger_async_observation(current, last, buffer_tokens, threshold) is expected


def test_thresholds_async_reflection_trigger() -> None:
    assert should_trigger_async_reflection_tokens(5000, 20000, 0.5) is False
    assert should_trigger_async_reflection_tokens(10000, 20000, 0.5) is True


def test_the_config_model_is_importable_from_the_package_as_the_contract_names_it() -> None:
    import om_lib

    config = om_lib.OMConfig.model_validate({'model': 'default', 'observation': {'messageTokens': 5000}})
    assert config is not None
    with pytest.raises(AttributeError, match='no attribute'):
        _ = om_lib.NotAThing  # type: ignore[attr-defined]
