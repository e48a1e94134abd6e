"""The built-in offline model: Observer format, real condensing by the Reflector, Actor answering from memory."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from om_lib.llm import Content, FunctionDeclaration, ModelRequest
from om_lib.messages import Message
from om_lib.models.offline_model import (
    STARTUP_NOTICE,
    OfflineLanguageModel,
    condense,
    format_observation_date,
    make_title,
)
from om_lib.ports import LanguageModel

T0 = datetime(2025, 1, 1, 14, 30, tzinfo=UTC)
SKIP_HINTS = (
    'IMPORTANT: Do NOT include <current-task> or <suggested-response> sections in your output. '
    'Only output <observations>.'
)


def msg(n: int, role: str, text: str, at: datetime, **extra: object) -> Message:
    return Message.model_validate({'id': f'm{n}', 'role': role, 'createdAt': at, 'content': text, **extra})


def observe(messages: list[Message], *, prompt: str = '## Your Task', system: str = 'observer prompt') -> str:
    request = ModelRequest(
        purpose='observer', system=system, contents=(Content('user', (prompt,)),), source_messages=tuple(messages)
    )
    return OfflineLanguageModel().generate('', request, timeout_s=5).text


def observations_block(text: str) -> list[str]:
    m = re.search(r'^<observations>\n(.*?)\n^</observations>', text, re.DOTALL | re.MULTILINE)
    assert m, text
    return m.group(1).splitlines()


def assert_parseable(text: str) -> None:
    for line in observations_block(text):
        assert line.startswith('Date: ') or line.startswith('* '), line


def reflect(observations: str, level: int = 0) -> str:
    guidance = {
        0: '',
        1: '\n\n## COMPRESSION REQUIRED\n\nLets aim for a 8/10 detail level.',
        2: '\n\n## AGGRESSIVE COMPRESSION REQUIRED\n\nAim for 6/10.',
        3: '\n\n## CRITICAL COMPRESSION REQUIRED\n\nAim for 4/10.',
    }[level]
    prompt = (
        f'## OBSERVATIONS TO REFLECT ON\n\n{observations}\n\n---\n\nPlease analyze these observations and produce a '
        f'refined, condensed version.{guidance}'
    )
    request = ModelRequest(
        purpose='reflector',
        system='reflector',
        contents=(Content('user', (prompt,)),),
        source_observations=observations,
    )
    return OfflineLanguageModel().generate('', request, timeout_s=5).text


def inner(reflection: str) -> str:
    return '\n'.join(observations_block(reflection))


def actor(system: str, question: str, tools: tuple[FunctionDeclaration, ...] = ()) -> str:
    request = ModelRequest(
        purpose='actor',
        system=system,
        contents=(
            Content('user', ('<system-reminder>not from the user</system-reminder>',)),
            Content('user', (question,)),
        ),
        tools=tools,
    )
    response = OfflineLanguageModel().generate('', request, timeout_s=5)
    assert response.function_calls == ()
    return response.text


def test_is_a_language_model_and_announces_itself() -> None:
    assert isinstance(OfflineLanguageModel(), LanguageModel)
    assert 'offline model' in STARTUP_NOTICE and 'GEMINI_API_KEY' in STARTUP_NOTICE


def test_response_names_the_model_and_counts_tokens() -> None:
    request = ModelRequest(
        purpose='observer', system='x' * 400, contents=(), source_messages=(msg(1, 'user', 'hi', T0),)
    )
    model = OfflineLanguageModel()
    response = model.generate('tiny', request, timeout_s=1)
    assert response.model == 'offline/tiny'
    assert model.generate('', request, timeout_s=1).model == 'offline'
    assert response.usage.input_tokens == 100
    assert response.usage.output_tokens == len(response.text) // 4 > 0


def test_date_format_has_no_leading_zero() -> None:
    assert format_observation_date(datetime(2025, 1, 1, tzinfo=UTC)) == 'Jan 1, 2025'
    assert format_observation_date(datetime(2024, 12, 25, 23, 59, tzinfo=UTC)) == 'Dec 25, 2024'


def test_observer_writes_dated_prioritised_lines_from_message_times() -> None:
    text = observe(
        [
            msg(1, 'user', 'I   prefer\nshort answers.', T0),
            msg(2, 'user', 'How do I rotate the API key', T0 + timedelta(minutes=1)),
            msg(3, 'assistant', 'Open the console and click rotate. ' * 10, T0 + timedelta(minutes=2)),
        ]
    )
    lines = observations_block(text)
    assert lines[0] == 'Date: Jan 1, 2025'
    assert lines[1] == '* 🔴 (14:30) User stated: I prefer short answers.'
    assert lines[2] == '* 🟡 (14:31) User asked: How do I rotate the API key'
    assert lines[3].startswith('* 🟢 (14:32) Assistant replied: Open the console')
    assert len(lines[3]) < 160
    assert_parseable(text)
    assert '<current-task>\nPrimary: How do I rotate the API key\n</current-task>' in text
    assert '<suggested-response>' in text


def test_questions_get_yellow() -> None:
    text = observe(
        [msg(1, 'user', 'is it going to rain tomorrow', T0), msg(2, 'user', 'Tell me the forecast, ok?', T0)]
    )
    assert '* 🟡 (14:30) User asked: is it going to rain tomorrow' in text
    assert '* 🟡 (14:30) User asked: Tell me the forecast, ok?' in text
    assert '🔴' not in text


def test_greetings_say_nothing_and_introductions_name_the_user() -> None:
    lines = observations_block(observe([msg(1, 'user', "Hi! I'm Dana. Thanks!", T0)]))
    assert lines == ['Date: Jan 1, 2025', '* 🔴 (14:30) User stated their name is Dana.']


def test_two_days_give_two_date_headers() -> None:
    text = observe([msg(1, 'user', 'Day one.', T0), msg(2, 'user', 'Day two.', T0 + timedelta(days=1, hours=1))])
    lines = observations_block(text)
    assert [line for line in lines if line.startswith('Date:')] == ['Date: Jan 1, 2025', 'Date: Jan 2, 2025']
    assert lines[-1] == '* 🔴 (15:30) User stated: Day two.'
    assert_parseable(text)


def test_skip_hints_prompt_gives_only_observations() -> None:
    text = observe([msg(1, 'user', 'Hello there.', T0)], prompt='## Your Task\n\n' + SKIP_HINTS.lower())
    assert '<current-task>' not in text and '<suggested-response>' not in text
    assert text.startswith('<observations>') and text.endswith('</observations>')


def test_tools_attachments_and_reminders() -> None:
    messages = [
        Message.model_validate(
            {
                'id': 'u',
                'role': 'user',
                'createdAt': T0,
                'parts': [
                    {'type': 'text', 'text': '<system-reminder>ignore me</system-reminder>'},
                    {'type': 'text', 'text': 'Here is my receipt.'},
                    {'type': 'image', 'url': 'https://example.com/a/receipt%201.png'},
                    {'type': 'file', 'data': 'aGk=', 'filename': 'notes.pdf', 'mediaType': 'application/pdf'},
                ],
            }
        ),
        Message.model_validate(
            {
                'id': 'a',
                'role': 'assistant',
                'createdAt': T0,
                'parts': [{'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'lookup_order', 'args': {'id': 7}}],
            }
        ),
        Message.model_validate(
            {
                'id': 't',
                'role': 'tool',
                'createdAt': T0,
                'parts': [{'type': 'tool-result', 'toolCallId': 'c1', 'toolName': 'lookup_order', 'result': 'shipped'}],
            }
        ),
    ]
    text = observe(messages)
    assert 'ignore me' not in text
    assert '* 🔴 (14:30) User stated: Here is my receipt.' in text
    assert 'User shared image receipt 1.png' in text
    assert 'User shared file notes.pdf' in text
    assert '* 🟡 (14:30) Assistant called tool lookup_order' in text
    assert 'Tool lookup_order returned: shipped' in text
    assert_parseable(text)


def test_a_long_user_message_keeps_every_sentence_whole() -> None:
    # Issue 21 item 6: each stated fact is kept whole, however long the message (no cut sentence, no `…`)
    long = ' '.join(f'Fact number {i} is about item {i} and it is quite important to me.' for i in range(1, 10))
    text = observe([msg(1, 'user', long + ' Do you get that?', T0)])
    lines = observations_block(text)
    assert len(lines) == 1 + 9 + 1
    for i in range(1, 10):
        assert f'* 🔴 (14:30) User stated: Fact number {i} is about item {i} and it is quite important to me.' in lines
    assert lines[-1] == '* 🟡 (14:30) User asked: Do you get that?'
    assert '…' not in text
    # The hints quote whole sentences too
    assert '<current-task>\nPrimary: Do you get that?\n</current-task>' in text


def test_the_assistant_reply_keeps_its_first_sentence_and_offline_answers_are_not_observed_again() -> None:
    reply = 'Kanazawa is worth it for the Kenroku-en garden. It is also quiet in April.'
    lines = observations_block(
        observe(
            [
                msg(1, 'assistant', reply, T0),
                msg(2, 'assistant', '(offline model) I cannot think offline, but ...\n- Jan 1: a quote', T0),
            ]
        )
    )
    first = '* 🟢 (14:30) Assistant replied: Kanazawa is worth it for the Kenroku-en garden.'
    assert lines == ['Date: Jan 1, 2025', first]


def test_nothing_to_observe_still_gives_valid_output() -> None:
    text = observe([msg(1, 'user', '<system-reminder>internal</system-reminder>', T0)])
    lines = observations_block(text)
    assert lines[0] == 'Date: Jan 1, 2025'
    assert len(lines) == 2 and lines[1].startswith('* 🟢 (14:30) ')
    assert_parseable(text)


def test_already_observed_lines_are_not_repeated() -> None:
    messages = [msg(1, 'user', 'I like tea.', T0), msg(2, 'user', 'I like coffee too.', T0 + timedelta(minutes=5))]
    first = observe(messages[:1])
    request = ModelRequest(
        purpose='observer',
        system='',
        contents=(Content('user', ('task',)),),
        source_messages=tuple(messages),
        source_observations='\n'.join(observations_block(first)),
    )
    second = OfflineLanguageModel().generate('', request, timeout_s=1).text
    assert 'I like tea' not in second and 'I like coffee too.' in second


def test_thread_title_only_when_enabled() -> None:
    messages = [msg(1, 'user', 'Can you help me plan a trip to Lisbon?', T0)]
    assert '<thread-title>' not in observe(messages)
    titled = observe(messages, system='... <thread-title> ...')
    title = re.search(r'<thread-title>(.*)</thread-title>', titled)
    assert title and 2 <= len(title.group(1).split()) <= 5
    assert 'Lisbon' in title.group(1)


def test_title_purpose_and_make_title() -> None:
    request = ModelRequest(purpose='title', system='', contents=(Content('user', ('Deploying the billing API',)),))
    assert OfflineLanguageModel().generate('', request, timeout_s=1).text == 'Deploying Billing API'
    assert make_title('hello') == 'Hello Conversation'
    assert make_title('') == 'New Conversation'
    assert len(make_title('one two three four five six seven eight').split()) == 5


def test_multi_thread_observer_output_has_thread_blocks() -> None:
    messages = [msg(1, 'user', 'Thread A fact.', T0, threadId='a'), msg(2, 'user', 'Thread B fact.', T0, threadId='b')]
    text = observe(messages, system='=== MULTI-THREAD INPUT ===')
    assert '<thread id="a">' in text and '<thread id="b">' in text
    assert text.count('<current-task>') == 2


# ------------------------------------------------------------------------------------------------------------------
# Reflector
# ------------------------------------------------------------------------------------------------------------------
def big_log() -> tuple[str, list[str]]:
    """A 200-line log over 4 days with duplicates, 🟢 chatter, 🟡 runs, ✅ and 🔴 facts."""
    lines: list[str] = []
    reds: list[str] = []
    for day in range(4):
        lines.append(f'Date: Jan {day + 1}, 2025')
        for i in range(49):
            hhmm = f'({9 + i // 6:02d}:{(i * 7) % 60:02d})'
            kind = i % 7
            if kind == 0:
                emphasis = ' and really'.join([''] * (i % 4 + 1))
                line = f'* 🔴 {hhmm} User stated fact {day}-{i}: likes item {i}{emphasis} on day {day}.'
                reds.append(line)
            elif kind == 1:
                line = f'* 🔴 {hhmm} User stated they prefer short answers.'  # the same fact, again and again
                reds.append(line)
            elif kind == 2:
                line = f'* ✅ {hhmm} Finished task {day}-{i}.'
                reds.append(line)
            elif kind in (3, 4):
                line = f'* 🟡 {hhmm} User asked about topic {day}-{i} and some details.'
            else:
                line = f'* 🟢 {hhmm} Assistant replied with a long explanation about subject {day}-{i}.'
            lines.append(line)
    return '\n'.join(lines[:200]), [r for r in reds if r in lines[:200]]


def content_words(line: str) -> list[str]:
    """The words of a line a condensed log must still hold (names, numbers, places; no filler)."""
    body = re.sub(r'^\* \S+ (\(\d\d:\d\d\) )?(User stated:?|Finished)?\s*', '', line)
    filler = {'and', 'really', 'on', 'they', 'the', 'a', 'of', 'is', 'with', 'about'}
    return [w for w in re.findall(r"[\w'-]+", body) if w.lower() not in filler]


def test_reflector_shrinks_to_its_target_and_every_fact_survives() -> None:
    # Given a 200-line log over 4 days with duplicates, 🟢 chatter, 🟡 runs, ✅ and 🔴 facts
    log, reds = big_log()
    assert len(log.splitlines()) == 200
    for level, share in enumerate((0.55, 0.45, 0.32, 0.2)):
        out = inner(reflect(log, level))
        # Then it really condenses: at most its level's share of the input
        assert len(out) <= len(log) * share, (level, len(out), len(log))
        # and every fact and finished task is still there, word for word (filler words aside), with no `…`
        for line in reds:
            for word in content_words(line):
                assert word in out, (level, word, line)
        assert '…' not in out
        # and there is no date without observations under it, no duplicate date, no hint block
        lines = out.splitlines()
        dates = [line for line in lines if line.startswith('Date:')]
        assert len(dates) == len(set(dates)) == 4
        for index, line in enumerate(lines):
            if line.startswith('Date:'):
                assert index + 1 < len(lines) and not lines[index + 1].startswith('Date:'), (level, out)
        assert out.count('prefer short answers') == 1
        assert '<current-task>' not in reflect(log, level)
    # The newest day keeps its detail at level 0, older days lose their chatter
    older, newest = inner(reflect(log, 0)).split('Date: Jan 4, 2025')
    assert '🟢' not in older and '🟢' in newest


def test_higher_levels_are_shorter() -> None:
    log, _ = big_log()
    sizes = [len(inner(reflect(log, level))) for level in range(4)]
    assert sizes[0] < len(log)
    assert sizes[0] > sizes[1] > sizes[2] > sizes[3], sizes
    older, _ = inner(reflect(log, 0)).split('Date: Jan 4, 2025')
    assert older.count('🔴') < log.split('Date: Jan 4, 2025')[0].count('🔴') // 2  # older days fold into a line each


def test_reflector_condenses_retrieval_groups_and_recall_still_reaches_every_message() -> None:
    # Retrieval mode: the Reflector sees groups as `## Group` sections; the older ones merge into one section naming
    # them all, the newest keeps its own, and the reconciled groups' ranges still cover every observed message
    from om_lib.context import context as ctx

    groups = []
    for day in range(3):
        facts = '\n'.join(f'* 🔴 (10:{i:02d}) User stated: fact {day}-{i} is a detail worth keeping.' for i in range(8))
        chatter = '\n'.join(f'* 🟢 (11:{i:02d}) Assistant replied: chatter {day}-{i}.' for i in range(8))
        first = 1 + 10 * day
        groups.append(
            ctx.wrap_in_observation_group(
                f'Date: Jan {day + 1}, 2025\n{facts}\n{chatter}',
                ctx.group_range(first, first + 9),
                group_id=ctx.group_id_for(first),
            )
        )
    source = '\n\n'.join(groups)
    shown = ctx.render_observation_groups_for_reflection(source) or ''
    for level in range(4):
        out = inner(reflect(shown, level))
        headers = [line for line in out.splitlines() if line.startswith('## Group')]
        assert headers == ['## Group `g1` `g11`', '## Group `g21`'] and '…' not in out
        assert len(out) < len(shown)
        reconciled = ctx.reconcile_observation_groups_from_reflection(out, source) or ''
        assert ctx.group_markup_problem(reconciled) is None
        ranges = [g.range for g in ctx.parse_observation_groups(reconciled)]
        assert ranges == ['#1:#20', '#21:#30']


def test_reflection_merges_boundaries_dates_and_threads() -> None:
    log = (
        'Date: Jan 1, 2025\n* 🔴 (10:00) User stated A.\n* 🟢 (10:01) Assistant replied: ok\n\n'
        '--- message boundary (2025-01-01T10:05:00.000Z) ---\n\n'
        'Date: Jan 1, 2025\n* 🔴 (10:06) user stated a\n* 🟡 (10:07) User asked B?\n'
        '<thread id="t1">\nDate: Jan 1, 2025\n* 🟡 (11:00) Thread fact.\n  -> detail\n</thread>\n'
        '<thread id="t1">\nDate: Jan 1, 2025\n* 🔴 (12:00) Later thread fact.\n</thread>'
    )
    out = inner(reflect(log))
    assert 'message boundary' not in out
    assert out.count('Date: Jan 1, 2025') == 2  # once outside threads, once inside the t1 section
    assert out.count('<thread id="t1">') == 1
    assert 'User stated A.' in out and 'user stated a' not in out
    assert '  -> detail' in out and 'Later thread fact.' in out
    assert len(out) < len(log)


def test_condense_without_droppable_content_is_unchanged() -> None:
    log = 'Date: Jan 1, 2025\n* 🔴 (10:00) User stated A.\n* ✅ (10:01) Done B.'
    assert condense(log, 0) == log
    assert inner(reflect(log)) == log


def test_reflector_never_returns_empty() -> None:
    assert observations_block(reflect('')) != []


# ------------------------------------------------------------------------------------------------------------------
# Actor
# ------------------------------------------------------------------------------------------------------------------
MEMORY = (
    'The following observations block contains your memory of past conversations with this user.\n\n'
    '- refer to specific details\n\n'
    '<observations>\n\n'
    'Date: Jan 1, 2025 (3 days ago)\n'
    '* 🔴 (14:30) User stated their dog is named Biscuit.\n'
    '* (14:31) User asked how to rotate the API key?\n'
    '* (14:32) Assistant replied: rotate API keys from the console settings page.\n'
    '* 🔴 (14:40) User stated they live in Lisbon.\n\n'
    '<current-task>\nPrimary: rotating keys\n</current-task>'
)


@pytest.mark.parametrize('question', ['How do I rotate my API key again?', 'what did I say exactly about API keys'])
def test_actor_answers_from_memory_and_says_it_is_offline(question: str) -> None:
    tool = FunctionDeclaration(name='recall', description='look up messages', parameters={'type': 'object'})
    text = actor(MEMORY, question, tools=(tool,))
    assert text.startswith('(offline model)')
    assert 'offline' in text
    assert 'rotate the API key' in text and 'console settings page' in text
    assert 'Biscuit' not in text and 'Lisbon' not in text
    assert 'Jan 1, 2025' in text


def test_actor_cites_at_most_three_lines() -> None:
    memory = '<observations>\n' + '\n'.join(f'* 🔴 (10:{i:02d}) User stated pizza fact {i}.' for i in range(10))
    text = actor(memory, 'What do you know about pizza?')
    assert text.count('\n- ') == 3
    assert 'pizza fact 9' in text  # newer lines win ties


def test_actor_says_when_nothing_matches() -> None:
    assert actor(MEMORY, 'What is the capital of Mongolia?') == (
        "(offline model) I don't remember anything about that yet."
    )
    assert actor('', 'hello?') == "(offline model) I don't remember anything about that yet."


# ------------------------------------------------------------------------------------------------------------------
# The whole loop: what a newcomer sees (issue 21 item 6)
# ------------------------------------------------------------------------------------------------------------------
TWENTY_FACTS = [
    ('My name is Priya.', 'What is my name?', 'Priya'),
    ('I live in Porto.', 'Where do I live?', 'Porto'),
    ('I work as a nurse at the city hospital.', 'What is my job?', 'nurse'),
    ('My dog is called Biscuit.', 'What is my dog called?', 'Biscuit'),
    ('My sister Ana lives in Berlin.', 'Where does my sister live?', 'Berlin'),
    ('I am allergic to peanuts.', 'What am I allergic to?', 'peanuts'),
    ('My favourite colour is teal.', 'What is my favourite colour?', 'teal'),
    ('I drive a green Volvo.', 'What car do I drive?', 'Volvo'),
    ('My birthday is on March 14.', 'When is my birthday?', 'March 14'),
    ('I play the cello in a local orchestra.', 'Which instrument do I play?', 'cello'),
    ('My son Leo is seven years old.', 'How old is my son?', 'seven'),
    ('I am learning Japanese on weekends.', 'Which language am I learning?', 'Japanese'),
    ('My favourite food is mushroom risotto.', 'What is my favourite food?', 'risotto'),
    ('I run five kilometres every morning.', 'How far do I run every morning?', 'five kilometres'),
    ("My partner's name is Tomas.", "What is my partner's name?", 'Tomas'),
    ('I was born in Goa.', 'Where was I born?', 'Goa'),
    ('I have a fear of heights.', 'What am I afraid of?', 'heights'),
    ('My flat has a balcony with tomato plants.', 'What grows on my balcony?', 'tomato'),
    ('I drink two espressos a day.', 'How many espressos do I drink?', 'two espressos'),
    ('My grandmother taught me to bake sourdough bread.', 'Who taught me to bake bread?', 'grandmother'),
]


def test_offline_actor_answers_20_stated_facts_from_the_observations_after_reflection() -> None:
    from om_lib.adapters.memory.store import InMemoryStore
    from om_lib.adapters.tiktoken_counter import get_tokenizer
    from om_lib.clock import ManualClock
    from om_lib.config import OMConfig
    from om_lib.context.tokens import TokenCounter
    from om_lib.engine.engine import MemoryEngine
    from om_lib.models.model_router import ModelRouter
    from om_lib.service import MemoryService

    # Given the offline model behind the engine, with thresholds small enough that observing and reflecting happen
    offline = OfflineLanguageModel()
    clock = ManualClock(T0, tick=timedelta(seconds=20))
    store = InMemoryStore()
    config = {'observation': {'messageTokens': 200, 'bufferTokens': False}, 'reflection': {'observationTokens': 450}}
    engine = MemoryEngine(
        OMConfig.model_validate(config),
        store=store,
        router=ModelRouter({'google': offline, 'offline': offline}, clock=clock),
        counter=TokenCounter(get_tokenizer()),
        clock=clock,
    )
    service = MemoryService(engine)

    def chat(n: str, text: str) -> str:
        message = Message.model_validate({'id': n, 'role': 'user', 'createdAt': clock.now(), 'content': text})
        reply = service.chat('me', 'facts', message).reply
        assert reply is not None
        return reply.text()

    # When the user states twenty facts (one per turn), and the worker observes what is left
    for i, (fact, _, _) in enumerate(TWENTY_FACTS):
        assert chat(f'f{i}', fact) == '(offline model) Noted: I will remember that.'
    engine.observe_now('me', 'facts')
    record = store.get_record('thread:me/facts')
    # Then every fact is in the observations, which were reflected at least once on the way (and stay under target)
    assert record.generation >= 1
    assert record.observation_tokens <= 450
    for _, _, value in TWENTY_FACTS:
        assert value.split()[-1] in record.active_observations, value
    # And asked about each fact, the offline Actor quotes the remembered line holding it, with its date
    for i, (_, question, value) in enumerate(TWENTY_FACTS):
        reply = chat(f'q{i}', question)
        assert reply.startswith('(offline model) I cannot think offline'), (question, reply)
        quoted = [line for line in reply.splitlines()[1:] if value in line]
        assert quoted and quoted[0].startswith('- Jan 1, 2025'), (question, reply)
