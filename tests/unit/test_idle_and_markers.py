"""Activation on idle and on a change of the Actor's model, and temporal gap markers: the pure rules (the reference's
`"auto"` table, durations, model comparison, gap wording) and the engine over the in-memory store with a clock the
test moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from om_lib.config import OMConfig
from om_lib.context import temporal
from om_lib.context.idle import (
    GEMINI_TTL_S,
    GROQ_TTL_S,
    HOUR,
    SHORT_TTL_S,
    IdleActivation,
    IdleTTLMap,
    activation_trigger,
    auto_ttl_s,
    model_changed,
    parse_duration,
    resolve_ttl_s,
)
from om_lib.messages import Message
from om_lib.prompts.observer import format_messages_for_observer
from tests.unit.test_buffering import Harness, buffering_config, words

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


# -- the rules --------------------------------------------------------------------------------------------------------
def test_auto_idle_times_follow_the_reference_table() -> None:
    assert auto_ttl_s(None) == SHORT_TTL_S
    assert auto_ttl_s('anthropic/claude-sonnet-4-5') == SHORT_TTL_S
    assert auto_ttl_s('google/gemini-2.5-flash') == GEMINI_TTL_S == 24 * HOUR
    assert auto_ttl_s('openai/gpt-4.1') == SHORT_TTL_S
    assert auto_ttl_s('openai/gpt-5-mini') == SHORT_TTL_S
    assert auto_ttl_s('openai/gpt-5.4-pro') == SHORT_TTL_S
    assert auto_ttl_s('openai/gpt-5.5') == HOUR
    assert auto_ttl_s('groq/openai/gpt-oss-120b') == GROQ_TTL_S
    assert auto_ttl_s('bedrock/anthropic.claude-3-haiku') == SHORT_TTL_S


def test_a_per_provider_map_matches_the_provider_before_its_first_dot_never_a_substring() -> None:
    setting = IdleTTLMap(default='auto', providers={'anthropic': HOUR, 'openai': False})
    assert resolve_ttl_s(setting, 'Anthropic.Messages/claude-sonnet-4-5') == HOUR
    assert resolve_ttl_s(setting, 'openai/gpt-5.5') is None  # false: never for that provider
    assert resolve_ttl_s(setting, 'google/gemini-2.5-pro') == GEMINI_TTL_S  # default "auto", by that provider
    assert resolve_ttl_s(IdleTTLMap(default=90.0, providers={'openai': HOUR}), 'openai-compatible/x') == 90.0
    assert resolve_ttl_s(IdleTTLMap(providers={'anthropic': HOUR}), 'openai/gpt-4o') is None
    assert resolve_ttl_s(None, 'openai/gpt-4o') is None


def test_durations_and_model_changes() -> None:
    assert parse_duration('90s') == 90 and parse_duration('5m') == 300 and parse_duration('1hr') == 3600
    assert parse_duration('2 days') == 2 * 24 * 3600 and parse_duration('500ms') == 0.5
    for bad in ('5', 'five minutes', '0s', '-1m'):
        with pytest.raises(ValueError, match='duration'):
            parse_duration(bad)
    assert model_changed('anthropic/claude-sonnet-4-5', 'openai/gpt-5.5')
    assert model_changed('openai/gpt-5.5', 'openai/gpt-5-mini')
    assert not model_changed('openai.responses/gpt-5.5', 'openai/gpt-5.5')
    assert not model_changed('openai/gpt-5.5', 'gpt-5.5')  # a bare id on one side: ids compared only
    assert not model_changed('openai/gpt-5.5', None) and not model_changed(None, 'openai/gpt-5.5')


def test_a_model_change_is_reported_before_idle_time() -> None:
    setting = IdleActivation(after_idle=300.0, on_provider_change=True)
    changed = activation_trigger(
        setting, now=T0, last_reply_at=T0 - timedelta(hours=1), current_model='a/x', previous_model='b/y'
    )
    assert changed is not None and changed.triggered_by == 'provider_change'
    assert changed.part_fields() == {'triggered_by': 'provider_change', 'previous_model': 'b/y', 'current_model': 'a/x'}
    idle = activation_trigger(
        setting, now=T0, last_reply_at=T0 - timedelta(seconds=301), current_model='a/x', previous_model='a/x'
    )
    assert idle is not None and idle.part_fields()['ttl_expired_ms'] == 301_000
    assert idle.part_fields()['activate_after_idle'] == 300_000
    assert (
        activation_trigger(
            setting, now=T0, last_reply_at=T0 - timedelta(seconds=299), current_model='a/x', previous_model='a/x'
        )
        is None
    )


def test_the_options_are_checked_where_they_are_written() -> None:
    nested = OMConfig.model_validate({'observation': {'temporalMarkers': {'minGap': '30m'}}}).resolved()
    assert nested.temporal_gap_s == 1800
    assert OMConfig.model_validate({'temporalMarkers': True}).resolved().temporal_gap_s == temporal.DEFAULT_MIN_GAP_S
    with pytest.raises(ValidationError, match='set it in one place'):
        OMConfig.model_validate({'temporalMarkers': True, 'observation': {'temporalMarkers': True}})
    # The observation's own setting wins over the top level's (as in the reference); false turns it off there.
    resolved = OMConfig.model_validate(
        {
            'activateAfterIdle': '5m',
            'observation': {'activateAfterIdle': False},
            'reflection': {'activateAfterIdle': 60},
        }
    ).resolved()
    assert resolved.observation_idle.after_idle is None and resolved.reflection_idle.after_idle == 60
    # Reflections do not inherit the top-level setting.
    assert OMConfig.model_validate({'activateAfterIdle': 'auto'}).resolved().reflection_idle.enabled is False
    with pytest.raises(ValidationError, match='buffers none'):
        OMConfig.model_validate({'activateOnProviderChange': True, 'observation': {'bufferTokens': False}})
    with pytest.raises(ValidationError, match='"auto" or false'):
        OMConfig.model_validate({'activateAfterIdle': True})
    with pytest.raises(ValidationError, match='media type pattern'):
        OMConfig.model_validate({'observation': {'observeAttachments': ['images']}})


# -- temporal gap markers ---------------------------------------------------------------------------------------------
def message(mid: str, at: datetime, text: str = 'hello', role: str = 'user') -> Message:
    return Message.model_validate({'id': mid, 'role': role, 'createdAt': at.isoformat(), 'content': text})


def test_gaps_are_worded_in_the_reference_steps() -> None:
    assert temporal.format_gap(11 * 60) == '5 minutes later'
    assert temporal.format_gap(2 * 3600 + 120) == '2 hours later'
    assert temporal.format_gap(3 * 24 * 3600) == '3 days later'
    assert temporal.format_gap(15 * 24 * 3600) == '2 weeks later'
    assert temporal.marker_text(7200, T0) == '2 hours later — 03/02/2026, 9:00 AM UTC'


def test_markers_come_before_messages_after_the_gap_and_never_below_it() -> None:
    messages = [message('m1', T0), message('m2', T0 + timedelta(minutes=9)), message('m3', T0 + timedelta(hours=3))]
    marked = temporal.with_markers(messages, 600)
    assert [m.id for m in marked] == ['m1', 'm2', '__temporal_gap_m3', 'm3']
    assert marked[2].text() == (
        '<system-reminder type="temporal-gap">2 hours later — 03/02/2026, 12:00 PM UTC</system-reminder>'
    )
    assert temporal.with_markers(messages, None) == messages
    assert [m.id for m in temporal.with_markers(messages, 4 * 3600)] == ['m1', 'm2', 'm3']
    # A marker a client sends back is never stored as if someone had said it.
    assert temporal.is_marker(marked[2]) and not temporal.is_marker(messages[0])
    echoed = marked[2].model_copy(update={'id': 'client-id'})
    assert temporal.is_marker(echoed)


def test_the_observer_transcript_carries_the_gap() -> None:
    messages = [message('m1', T0, 'first'), message('m2', T0 + timedelta(days=2, hours=1), 'second')]
    text = format_messages_for_observer(messages, temporal_gap_s=600).text
    assert 'system-reminder (10:00): 2 days later — 03/04/2026, 10:00 AM UTC' in text
    assert text.index('2 days later') < text.index('second')
    assert 'later' not in format_messages_for_observer(messages).text


def test_a_step_shows_the_actor_the_gap_marker() -> None:
    h = Harness({**buffering_config(), 'temporalMarkers': {'minGap': '1h'}})
    h.engine.prepare_step('r1', 't1', [h.user('Planning the Lisbon trip.')])
    h.engine.complete_turn('r1', 't1', [h.assistant('Great, when do you leave?')])
    h.clock.advance(3 * 3600)
    step = h.engine.prepare_step('r1', 't1', [h.user('Back again: we leave in May.')])
    texts = [m.text() for m in step.messages]
    assert any('3 hours later' in t for t in texts), texts
    assert texts.index(next(t for t in texts if '3 hours later' in t)) == len(texts) - 2
    h.clock.advance(30 * 60)
    step = h.engine.prepare_step('r1', 't1', [h.user('And in June.')])
    assert sum('later' in m.text() for m in step.messages) == 1  # 30 minutes is below the gap: no new marker


# -- activation on idle ------------------------------------------------------------------------------------------------
def _buffered(h: Harness, turns: int = 2) -> None:
    for _ in range(turns):
        h.turn(100, 100)
        h.run_jobs()
    assert h.record().buffered_chunks, 'the test needs buffered chunks below the threshold'


def test_buffered_chunks_activate_after_the_idle_time_below_the_threshold() -> None:
    h = Harness({**buffering_config(), 'activateAfterIdle': '10m'})
    _buffered(h)
    h.clock.advance(5 * 60)
    quiet = h.engine.prepare_step('r1', 't1', [h.user(words(5))])
    assert not [p for p in quiet.parts.to_json() if p['type'] == 'data-om-activation']
    h.clock.advance(11 * 60)
    calls = len(h.model.calls)
    step = h.engine.prepare_step('r1', 't1', [h.user(words(5))])
    assert len(h.model.calls) == calls  # activation calls no model
    activations = [p['data'] for p in step.parts.to_json() if p['type'] == 'data-om-activation']
    assert activations and {a['triggeredBy'] for a in activations} == {'ttl'}
    assert activations[0]['activateAfterIdle'] == 600_000 and activations[0]['ttlExpiredMs'] >= 16 * 60 * 1000
    assert h.record().buffered_chunks == () and h.record().active_observations.strip()
    assert 'User talked about' in step.system


def test_a_change_of_the_actors_model_activates_what_is_buffered() -> None:
    h = Harness({**buffering_config(), 'activateOnProviderChange': True})
    h.engine.prepare_step('r1', 't1', [h.user(words(5))], actor_model='openai/gpt-5.5')
    _buffered(h)
    same = h.engine.prepare_step('r1', 't1', [h.user(words(5))], actor_model='openai/gpt-5.5')
    assert not [p for p in same.parts.to_json() if p['type'] == 'data-om-activation']
    step = h.engine.prepare_step('r1', 't1', [h.user(words(5))], actor_model='anthropic/claude-sonnet-4-5')
    activations = [p['data'] for p in step.parts.to_json() if p['type'] == 'data-om-activation']
    assert activations and activations[0]['triggeredBy'] == 'provider_change'
    assert activations[0]['previousModel'] == 'openai/gpt-5.5'
    assert activations[0]['currentModel'] == 'anthropic/claude-sonnet-4-5'
    assert h.record().actor_model == 'anthropic/claude-sonnet-4-5'
