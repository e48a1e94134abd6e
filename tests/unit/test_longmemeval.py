"""The LongMemEval harness's parts (bench/lme): the file reader, the judges and their prompts, resuming, the report's
arithmetic, cost and the estimate. The whole run is tests/e2e/test_longmemeval_offline.py."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.lme import data, judge, report, runner, usage
from om_lib.llm import ModelRequest
from tests.fakes.scripted_model import ScriptedModel

MINI = Path(__file__).resolve().parents[1] / 'data' / 'longmemeval_mini.json'


def raw_questions() -> list[dict[str, Any]]:
    return json.loads(MINI.read_text())


def write(tmp_path: Path, questions: object) -> Path:
    path = tmp_path / 'longmemeval_test.json'
    path.write_text(json.dumps(questions))
    return path


# -- the reader ------------------------------------------------------------------------------------------------------
def test_the_test_file_is_in_longmemevals_format_with_every_type() -> None:
    questions = data.load_questions(MINI)
    assert len(questions) == 12
    assert set(data.type_counts(questions)) == {*data.QUESTION_TYPES, data.ABSTENTION}
    assert 200 <= sum(q.turn_count for q in questions) < 400
    first = questions[0]
    assert first.sessions[0].date == datetime(2023, 5, 1, 9, 30, tzinfo=UTC)
    assert any(t.has_answer for s in first.sessions for t in s.turns)
    # A numeric answer (a count) is graded as its text
    assert next(q for q in questions if q.question_id == 'mini_ms_2').answer == '12'


def test_dates_in_the_published_form_and_sessions_in_time_order(tmp_path: Path) -> None:
    assert data.parse_date('2023/05/20 (Sat) 02:21', 'x') == datetime(2023, 5, 20, 2, 21, tzinfo=UTC)
    assert data.parse_date('2023/05/20', 'x') == datetime(2023, 5, 20, tzinfo=UTC)
    # The oracle file lists sessions unsorted: the replay order is by date, the file's order breaking ties
    question = raw_questions()[0]
    question['haystack_session_ids'].reverse()
    question['haystack_dates'].reverse()
    question['haystack_sessions'].reverse()
    [parsed] = data.load_questions(write(tmp_path, [question]))
    ordered = [s.date for s in parsed.in_time_order()]
    assert ordered == sorted(ordered) and [s.date for s in parsed.sessions] != ordered


def broken(change: Any) -> list[dict[str, Any]]:
    questions = raw_questions()[:3]
    change(questions[1])
    return questions


@pytest.mark.parametrize(
    ('change', 'message'),
    [
        (lambda q: q.pop('question_date'), 'question mini_ssu_2: question_date is missing'),
        (lambda q: q.update(question_type='single-session'), "question mini_ssu_2: question_type 'single-session'"),
        (lambda q: q['haystack_dates'].__setitem__(1, '2023-13-40'), r'question mini_ssu_2: haystack_dates\[1\]'),
        (lambda q: q['haystack_dates'].append('2023/05/01 (Mon) 10:00'), 'question mini_ssu_2: .* one entry per'),
        (lambda q: q['haystack_sessions'][0][0].update(role='bot'), 'question mini_ssu_2: session 0, turn 0: role'),
        (lambda q: q['haystack_sessions'][0][1].pop('content'), 'question mini_ssu_2: session 0, turn 1: content'),
        (lambda q: q.update(answer=None), 'question mini_ssu_2: answer must be a string'),
        (lambda q: q.update(haystack_sessions='none'), 'question mini_ssu_2: haystack_sessions must be a list'),
        (lambda q: q.update(question_id='mini_ssu_1'), 'question mini_ssu_1 appears twice'),
        (lambda q: q.pop('question_id'), 'question #1 has no question_id'),
    ],
)
def test_a_malformed_question_is_refused_by_its_id(tmp_path: Path, change: Any, message: str) -> None:
    with pytest.raises(data.DatasetError, match=message):
        data.load_questions(write(tmp_path, broken(change)))


def test_a_file_that_is_not_a_list_of_questions_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / 'bad.json'
    bad.write_text('{"question_id": ')
    with pytest.raises(data.DatasetError, match='not a JSON array'):
        data.load_questions(bad)
    with pytest.raises(data.DatasetError, match='holds no questions'):
        data.load_questions(write(tmp_path, []))
    with pytest.raises(data.DatasetError, match='does not exist: download'):
        data.load_questions(tmp_path / 'missing.json')


def test_types_and_limit_choose_questions() -> None:
    picked = data.load_questions(MINI, types=['temporal-reasoning', 'abstention'])
    assert [q.question_id for q in picked] == ['mini_tr_1', 'mini_tr_2', 'mini_ssu_3_abs']
    assert [q.question_id for q in data.load_questions(MINI, limit=2)] == ['mini_ssu_1', 'mini_ssu_2']
    with pytest.raises(data.DatasetError, match='unknown question type temporal'):
        data.load_questions(MINI, types=['temporal'])


# -- the judges ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ('qtype', 'abstention', 'template', 'phrase'),
    [
        ('single-session-user', False, 'default', 'contains all the intermediate steps'),
        ('single-session-assistant', False, 'default', 'Correct Answer: A'),
        ('multi-session', False, 'default', 'only contains a subset'),
        ('temporal-reasoning', False, 'temporal-reasoning', 'do not penalize off-by-one errors'),
        ('knowledge-update', False, 'knowledge-update', 'along with an updated answer'),
        ('single-session-preference', False, 'single-session-preference', 'Rubric: A'),
        ('knowledge-update', True, 'abstention', 'correctly identifies the question as unanswerable'),
        ('temporal-reasoning', True, 'abstention', 'Explanation: A'),
    ],
)
def test_each_question_type_gets_longmemevals_prompt(qtype: str, abstention: bool, template: str, phrase: str) -> None:
    assert judge.template_name(qtype, abstention=abstention) == template
    prompt = judge.judge_prompt(qtype, 'Q?', 'A', 'R {braces}', abstention=abstention)
    assert phrase in prompt
    assert prompt.startswith('I will give you')
    assert 'Question: Q?' in prompt and 'Model Response: R {braces}' in prompt
    assert prompt.endswith('Answer yes or no only.')
    with pytest.raises(ValueError, match='no judge prompt'):
        judge.template_name('open-domain', abstention=False)


def test_the_model_judge_sends_the_prompt_alone_and_reads_yes() -> None:
    model = ScriptedModel()
    model.script('actor', 'Yes.', 'no')
    grader = judge.ModelJudge('google/judge-model', {'google': model})
    right = grader.grade('temporal-reasoning', 'How many days?', '10 days', 'About 11 days.', abstention=False)
    wrong = grader.grade('single-session-user', 'Breed?', 'golden retriever', 'A poodle.', abstention=False)
    assert (right.correct, right.template, right.raw) == (True, 'temporal-reasoning', 'Yes.')
    assert wrong.correct is False
    request: ModelRequest = model.calls[0].request
    assert request.system == '' and request.temperature == 0.0 and request.max_output_tokens == 10
    [content] = request.contents
    assert (
        content.role == 'user' and 'off-by-one' in str(content.parts[0]) and 'About 11 days.' in str(content.parts[0])
    )


def test_the_exact_judge_matches_the_answers_words_in_order() -> None:
    exact = judge.ExactJudge()
    assert exact.grade(
        'single-session-user', 'q', 'Golden Retriever', 'It is a golden-retriever!', abstention=False
    ).correct
    assert not exact.grade(
        'single-session-user', 'q', 'golden retriever', 'a retriever, golden', abstention=False
    ).correct
    assert not exact.grade('single-session-user', 'q', '', 'anything', abstention=False).correct
    assert exact.grade(
        'single-session-user', 'q', 'never said', "I don't know your cat's name.", abstention=True
    ).correct
    assert not exact.grade('single-session-user', 'q', 'never said', 'Your cat is Tom.', abstention=True).correct


# -- resuming --------------------------------------------------------------------------------------------------------
def test_a_rerun_skips_graded_questions_and_retries_failed_ones(tmp_path: Path) -> None:
    questions = data.load_questions(MINI)
    results = runner.ResultsFile(tmp_path)
    seen: list[str] = []

    def flaky(question: data.Question) -> dict[str, Any]:
        seen.append(question.question_id)
        failed = question.question_id in ('mini_ms_1', 'mini_tr_2') and len(seen) <= 12
        return {
            'question_id': question.question_id,
            'question_type': question.question_type,
            'correct': None if failed else True,
            **({'error': 'model unavailable'} if failed else {}),
        }

    first = runner.run_all(questions, results, flaky, parallel=3)
    assert len(first) == 12 and len(seen) == 12
    assert results.done() == {q.question_id for q in questions} - {'mini_ms_1', 'mini_tr_2'}
    # A run killed mid-write leaves half a line: it is ignored
    with results.path.open('a') as handle:
        handle.write('{"question_id": "mini_ku_1", "corr')
    second = runner.run_all(questions, results, flaky, parallel=2)
    assert sorted(r['question_id'] for r in second) == ['mini_ms_1', 'mini_tr_2']
    assert len(seen) == 14
    records = results.records()
    assert len(records) == 12 and all(r['correct'] is True for r in records)  # the newest record wins
    assert runner.run_all(questions, results, flaky, parallel=2) == [] and len(seen) == 14


def test_a_run_directory_refuses_results_of_other_settings(tmp_path: Path) -> None:
    run = {'dataset': 'a.json', 'stack': 'local', 'scope': 'resource', 'models': {'actor': 'openai/gpt-4o'},
           'judge': 'openai/gpt-4o', 'thresholds': {}, 'config': {}, 'started': 'then'}  # fmt: skip
    runner.check_resumable(tmp_path, run)
    runner.check_resumable(tmp_path, {**run, 'started': 'now'})  # the same settings resume
    assert json.loads((tmp_path / runner.RUN_FILE).read_text())['started'] == 'then'
    with pytest.raises(runner.ResumeError, match="judge: 'openai/gpt-4o' then, 'exact' now"):
        runner.check_resumable(tmp_path, {**run, 'judge': 'exact'})
    (tmp_path / runner.RESULTS).write_text('[1, 2]\n')
    with pytest.raises(runner.ResumeError, match='is not a result record'):
        runner.ResultsFile(tmp_path).records()


class RecordingClient:
    """Stands in for om_client.MemoryClient: records what the replay sends."""

    def __init__(self, readings: list[tuple[int, int, int, str]] | None = None) -> None:
        self.sent: list[tuple[str, str, list[Any]]] = []
        self.readings = readings or []

    def step(self, thread: str, messages: list[Any], *, resource_id: str) -> Any:
        self.sent.append(('step', thread, messages))
        return type('Answer', (), {'failures': []})()

    def turn(self, thread: str, messages: list[Any], *, resource_id: str) -> Any:
        self.sent.append(('turn', thread, messages))
        return type('Answer', (), {'failures': []})()

    def memory(self, thread: str, *, resource_id: str) -> Any:
        tokens, pending, generations, status = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        stage = type('Stage', (), {'status': status})()
        buffered = type('Buffered', (), {'observations': stage, 'reflection': stage})()
        return type('Status', (), {'observation_tokens': tokens, 'pending_message_tokens': pending,
                                   'generation_count': generations, 'buffered': buffered})()  # fmt: skip


def test_the_replay_sends_each_session_in_time_order_with_its_dates(tmp_path: Path) -> None:
    question = raw_questions()[0]
    question['haystack_sessions'][1][1]['content'] = '   '  # a blank turn is left out
    question['haystack_sessions'][2] = [{'role': 'user', 'content': f'line {i}'} for i in range(150)]
    question['haystack_session_ids'].reverse()  # the file's order is not the time order
    question['haystack_dates'].reverse()
    question['haystack_sessions'].reverse()
    [parsed] = data.load_questions(write(tmp_path, [question]))
    client = RecordingClient()
    done = runner.replay(client, parsed, 'lme-r', 'resource')
    ordered = parsed.in_time_order()
    # One thread per session, in time order; user runs through steps, assistant answers through turns
    threads = list(dict.fromkeys(thread for _, thread, _ in client.sent))
    assert threads == [f's{i:03d}-{runner.safe_id(s.session_id)}' for i, s in enumerate(ordered)]
    first_kind, _, first_batch = client.sent[0]
    assert first_kind == 'step' and first_batch[0].role == 'user'
    assert [kind for kind, thread, _ in client.sent if thread == threads[0]][:2] == ['step', 'turn']
    # Every turn is dated from its session's date, a second apart, with a stable id
    for number, session in enumerate(ordered):
        sent = [m for _, thread, batch in client.sent if thread == threads[number] for m in batch]
        assert sent[0].created_at == session.date and sent[0].id == f'm{number:03d}-000'
        assert all(m.created_at >= session.date for m in sent)
    # 150 user lines in a row go as two requests (the API takes 100 messages a request)
    assert sorted(len(b) for _, t, b in client.sent if t == threads[2])[-2:] == [50, 100]
    assert done.skipped_turns == 1 and done.turns == parsed.turn_count - 1 and done.last_thread == threads[-1]
    # In thread scope everything goes to one thread
    single = RecordingClient()
    runner.replay(single, parsed, 'lme-r', 'thread')
    assert {thread for _, thread, _ in single.sent} == {'history'}


def test_waiting_for_background_work_ends_when_the_memory_stops_changing() -> None:
    client = RecordingClient([(0, 900, 0, 'idle'), (300, 100, 0, 'running'), (300, 100, 0, 'running'),
                              (400, 0, 1, 'idle')])  # fmt: skip
    runner.settle_by_polling(client, 'r', 't', timeout_s=5, interval_s=0.001)
    assert client.readings == [(400, 0, 1, 'idle')]  # read until three equal, idle readings


def test_session_ids_become_thread_ids_in_the_apis_grammar() -> None:
    assert runner.safe_id('sharegpt_yywfLJp_0') == 'sharegpt_yywfLJp_0'
    assert runner.safe_id('a b/c?d#e%f') == 'a_b_c_d_e_f'
    assert len(runner.safe_id('x' * 500)) == 90


# -- the report and cost ---------------------------------------------------------------------------------------------
def record(qid: str, qtype: str, correct: bool | None, **extra: Any) -> dict[str, Any]:
    return {'question_id': qid, 'question_type': qtype, 'correct': correct, **extra}


def test_accuracy_is_reported_overall_task_averaged_and_for_abstention() -> None:
    use = {'actor': {'openai/gpt-4o': {'calls': 1, 'input_tokens': 1000, 'output_tokens': 10, 'cache_read_tokens': 0}}}
    results = [
        record('a', 'single-session-user', True, usage=use, cost_usd={'actor': 0.0026}),
        record('b', 'single-session-user', True, usage=use, cost_usd={'actor': 0.0026}),
        record('c', 'single-session-user', False, usage=use, cost_usd={'actor': 0.0026}),
        record('d_abs', 'temporal-reasoning', True, usage=use, cost_usd={'actor': 0.0026}),
        record('e', 'temporal-reasoning', None, error='boom'),
    ]
    summary = report.summarize(results, {'judge': 'openai/gpt-4o', 'models': {'actor': 'openai/gpt-4o'}})
    acc = summary['accuracy']
    assert summary['questions'] == 4 and summary['not_graded'] == [{'question_id': 'e', 'error': 'boom'}]
    assert acc['overall'] == 75.0  # 3 of 4
    assert acc['task_averaged'] == pytest.approx((200 / 3 + 100) / 2, abs=0.01)  # mean of 66.67 and 100
    assert acc['abstention'] == 100.0 and acc['by_type']['abstention']['total'] == 1
    assert summary['tokens_per_question']['actor']['input_tokens'] == 1000
    assert summary['cost_usd']['per_question_total'] == pytest.approx(0.0026)
    assert report.comparable(summary['run']) is None
    text = report.render_markdown(summary, None)
    assert '| **overall** (every question once) | | 4 | **75.00%** |' in text and 'Mastra' in text


def test_offline_or_exact_runs_are_marked_not_comparable() -> None:
    run = {'judge': 'exact', 'models': {'observer': 'offline', 'actor': 'openai/gpt-4o'}}
    why = report.comparable(run)
    assert why is not None and 'exact match' in why and 'offline model played observer' in why
    summary = report.summarize([record('a', 'multi-session', True)], run)
    assert 'Not comparable with published figures' in report.render_markdown(summary, None)


def test_every_published_figure_has_a_date_and_a_source() -> None:
    figures = report.published()
    assert {(f['system'], f['reader'], f['overall']) for f in figures} >= {
        ('Mastra Observational Memory', 'gpt-4o', 84.23),
        ('Mastra Observational Memory', 'gpt-5-mini', 94.87),
    }
    for figure in figures:
        assert figure['date'] and figure['source'] and figure['judge'] and 0 < figure['overall'] <= 100
        assert set(figure.get('per_type', {})) <= set(data.QUESTION_TYPES)


def test_cost_comes_from_prices_json_per_model() -> None:
    prices = usage.model_prices()
    assert usage.price_of('openai/gpt-4o', prices) == prices['openai/gpt-4o']
    assert usage.price_of('bedrock/us.amazon.nova-lite-v1:0', prices) == prices['bedrock/amazon.nova-lite-v1:0']
    assert usage.price_of('offline', prices) == {'input': 0.0, 'output': 0.0}
    assert usage.price_of('openai/unknown-model', prices) is None
    one_million = {'calls': 1, 'input_tokens': 1_000_000, 'output_tokens': 100_000, 'cache_read_tokens': 200_000}
    costs, unpriced = usage.cost_of(
        {'actor': {'openai/gpt-4o': one_million}, 'judge': {'openai/mystery': one_million}}, prices
    )
    # 800k fresh input at $2.50, 200k cached at $1.25, 100k output at $10
    assert costs['actor'] == pytest.approx(0.8 * 2.5 + 0.2 * 1.25 + 0.1 * 10)
    assert costs['judge'] is None and unpriced == ['openai/mystery']


def test_the_meter_attributes_calls_to_the_question_they_serve() -> None:
    from om_lib.llm import Content, Usage
    from om_lib.messages import Message

    class Model:
        def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> Any:
            from om_lib.llm import ModelResponse

            return ModelResponse(text='ok', model=model_id, usage=Usage(input_tokens=100, output_tokens=5))

    class Service:
        def run_job(self, job: Any) -> Any:
            return model.generate('m', ModelRequest(purpose='reflector', system='', contents=()), timeout_s=1)

    model, service, meter = Model(), Service(), usage.ModelMeter()
    meter.install({'google': model, 'alias': model}, service)
    said = Message.model_validate(
        {'id': 'm1', 'role': 'user', 'createdAt': '2023-05-01T00:00:00Z', 'content': 'hi', 'resourceId': 'lme-q1'}
    )
    observe = ModelRequest(purpose='observer', system='', contents=(Content(role='user', parts=('x',)),),
                           source_messages=(said,))  # fmt: skip
    model.generate('flash', observe, timeout_s=1)
    service.run_job(type('Job', (), {'resource_id': 'lme-q2'})())
    meter.uninstall()
    model.generate('flash', observe, timeout_s=1)  # not counted after uninstall
    counted = {'calls': 1, 'input_tokens': 100, 'output_tokens': 5, 'cache_read_tokens': 0}
    assert meter.take('lme-q1') == {'observer': {'google/flash': counted}}
    assert meter.take('lme-q2')['reflector']['google/m']['calls'] == 1
    assert meter.take('lme-q1') == {}


def test_the_estimate_prices_the_reference_setting() -> None:
    from bench.longmemeval import REFERENCE_JUDGE, REFERENCE_MODELS, estimate

    result = estimate(
        questions=500,
        tokens_per_question=115_000,
        models=REFERENCE_MODELS,
        judge=REFERENCE_JUDGE,
        message_tokens=30_000,
        observation_tokens=40_000,
        compression=5.0,
    )
    tokens = result['tokens_per_question']
    assert tokens['observer']['calls'] == 3 and tokens['observer']['input_tokens'] > 90_000
    assert tokens['actor']['input_tokens'] > 25_000  # the unobserved tail plus the memory
    assert result['cost_per_question_total'] > 0
    assert result['cost_total'] == pytest.approx(result['cost_per_question_total'] * 500, rel=0.01)
    assert copy.deepcopy(result['models']) == {**REFERENCE_MODELS, 'judge': REFERENCE_JUDGE}
