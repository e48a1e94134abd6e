"""Writes tests/data/longmemeval_mini.json: a small LongMemEval-format file written for this project's tests.

Twelve questions, every question type and an abstention question, each with its own dated history (evidence sessions
among filler sessions, a few hundred turns in all), in the published format: `question_id`, `question_type`,
`question`, `answer`, `question_date` and the parallel `haystack_session_ids` / `haystack_dates` /
`haystack_sessions` lists of `{role, content, has_answer?}` turns, dates like `2023/05/20 (Sat) 02:21`. The content
is invented here; nothing is taken from the published data set.

    python tests/data/make_longmemeval_mini.py    # rewrite the file after changing this script
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

OUT = Path(__file__).with_name('longmemeval_mini.json')

FILLERS = {
    'cooking': [
        ('user', 'I want to cook something new this weekend. Any ideas for a vegetarian main course?'),
        (
            'assistant',
            "A mushroom and lentil shepherd's pie is hearty and easy to prepare ahead. You could also try a "
            'chickpea curry with spinach, or stuffed peppers with rice, black beans and smoked paprika.',
        ),
        ('user', 'The curry sounds good. How long does it take?'),
        (
            'assistant',
            'About forty minutes in total: ten minutes to chop onions, garlic and ginger, fifteen to build the '
            'sauce with tomatoes and spices, and fifteen more to simmer the chickpeas before the spinach goes in.',
        ),
        ('user', 'Should I use canned or dried chickpeas?'),
        (
            'assistant',
            'Canned chickpeas are perfectly fine for a weeknight. Dried ones taste a little nuttier but need '
            'soaking overnight and an hour of cooking, so they suit a slow weekend better.',
        ),
        ('user', 'Thanks, I will go with canned ones.'),
        ('assistant', 'Good choice. Rinse them well and add a squeeze of lemon at the end to brighten the sauce.'),
    ],
    'travel': [
        ('user', 'What should I pack for a three day hiking trip in the mountains?'),
        (
            'assistant',
            'Layers matter most: a base layer, a fleece and a waterproof shell. Add a hat, gloves, a head '
            'torch, a first aid kit, water purification tablets and enough snacks for each day.',
        ),
        ('user', 'Do I need trekking poles?'),
        (
            'assistant',
            'They help a lot on steep descents and save your knees, though they are optional on gentle '
            'trails. Collapsible ones fit on the side of a pack when you do not need them.',
        ),
        ('user', 'How heavy should my backpack be?'),
        (
            'assistant',
            'A common guideline is no more than a fifth of your body weight for a multi day trip, water '
            'included. Lighter is more comfortable, so leave anything you would not miss at home.',
        ),
    ],
    'fitness': [
        ('user', 'Can you give me a short stretching routine for after work?'),
        (
            'assistant',
            'Try five minutes: neck rolls, shoulder circles, a standing hamstring stretch, a hip flexor '
            'lunge on each side and a gentle spinal twist while seated. Hold each stretch for about thirty seconds.',
        ),
        ('user', 'Is it better to stretch before or after exercise?'),
        (
            'assistant',
            'Dynamic movements such as leg swings suit the warm up. Longer static stretches are better after '
            'exercise or in the evening, when the muscles are already warm.',
        ),
        ('user', 'Got it, thank you.'),
        ('assistant', 'You are welcome. Consistency helps more than intensity, so a few minutes every day is plenty.'),
    ],
    'garden': [
        ('user', 'My basil keeps wilting on the windowsill. What am I doing wrong?'),
        (
            'assistant',
            'Basil likes six hours of sun, warmth and evenly moist soil with good drainage. Wilting often '
            'means the pot dries out too fast or the roots sit in water, so check the saucer after watering.',
        ),
        ('user', 'It gets afternoon sun only.'),
        (
            'assistant',
            'Afternoon sun through glass can be hot. Water in the morning, pinch off the flower buds so the '
            'plant keeps making leaves, and consider a slightly bigger pot.',
        ),
        ('user', 'I will repot it this weekend.'),
        ('assistant', 'Use a pot with drainage holes and a light potting mix; basil does not like heavy garden soil.'),
    ],
    'code': [
        ('user', 'How do I reverse a list in Python without changing the original?'),
        (
            'assistant',
            'Use slicing: reversed_copy = items[::-1]. It returns a new list. If you only need to iterate, '
            'reversed(items) gives an iterator without copying anything.',
        ),
        ('user', 'And to sort a list of dictionaries by one key?'),
        (
            'assistant',
            'sorted(rows, key=lambda row: row["age"]) returns a new sorted list. Add reverse=True for '
            'descending order, or use operator.itemgetter("age") instead of the lambda.',
        ),
        ('user', 'Perfect, that is what I needed.'),
        ('assistant', 'Glad it helps. Both approaches leave the original list untouched.'),
    ],
    'movies': [
        ('user', 'Can you recommend a good science fiction film for a quiet evening?'),
        (
            'assistant',
            'Arrival is thoughtful and moving, about language and time. Moon is a small, tense story with a '
            'single actor. If you want something lighter, The Martian is funny and optimistic.',
        ),
        ('user', 'I have seen The Martian already.'),
        ('assistant', 'Then Arrival is a great pick. It is slow in a good way and rewards attention to detail.'),
    ],
}


def session(topic: str) -> list[dict[str, object]]:
    return [{'role': role, 'content': text} for role, text in FILLERS[topic]]


def evidence(*turns: tuple[str, str, bool]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for role, text, answer in turns:
        turn: dict[str, object] = {'role': role, 'content': text}
        if answer:
            turn['has_answer'] = True
        out.append(turn)
    return out


def stamp(moment: datetime) -> str:
    return moment.strftime('%Y/%m/%d (%a) %H:%M')


def question(
    qid: str,
    qtype: str,
    text: str,
    answer: str | int,
    asked: datetime,
    sessions: list[tuple[str, datetime, list[dict[str, object]]]],
) -> dict[str, object]:
    return {
        'question_id': qid,
        'question_type': qtype,
        'question': text,
        'answer': answer,
        'question_date': stamp(asked),
        'haystack_session_ids': [sid for sid, _, _ in sessions],
        'haystack_dates': [stamp(when) for _, when, _ in sessions],
        'haystack_sessions': [turns for _, _, turns in sessions],
        'answer_session_ids': [sid for sid, _, turns in sessions if any(t.get('has_answer') for t in turns)],
    }


def build() -> list[dict[str, object]]:
    d = datetime(2023, 5, 1, 9, 30)
    day = timedelta(days=1)
    qs = [
        question(
            'mini_ssu_1',
            'single-session-user',
            'What breed is my dog?',
            'golden retriever',
            d + 20 * day,
            [
                ('filler_cooking_1', d, session('cooking')),
                (
                    'answer_ssu_1',
                    d + 3 * day,
                    evidence(
                        (
                            'user',
                            'I just adopted a golden retriever puppy named Biscuit. Any tips for the first week?',
                            True,
                        ),
                        (
                            'assistant',
                            'Congratulations on Biscuit! Keep a steady routine for meals, naps and short walks, and '
                            'start crate training gently with treats.',
                            False,
                        ),
                        ('user', 'He chews everything in the house.', False),
                        (
                            'assistant',
                            'Puppies explore with their mouths. Offer chew toys and swap them in whenever he grabs '
                            'something he should not have.',
                            False,
                        ),
                    ),
                ),
                ('filler_code_1', d + 9 * day, session('code')),
            ],
        ),
        question(
            'mini_ssu_2',
            'single-session-user',
            'Where did I spend my spring vacation?',
            'Kyoto',
            d + 30 * day,
            [
                ('filler_garden_2', d + 2 * day, session('garden')),
                (
                    'answer_ssu_2',
                    d + 8 * day,
                    evidence(
                        ('user', 'We spent ten days of our spring vacation in Kyoto and loved the temples.', True),
                        (
                            'assistant',
                            'That sounds wonderful. Did you visit Fushimi Inari early in the morning to avoid the '
                            'crowds?',
                            False,
                        ),
                        ('user', 'Yes, we went at sunrise. It was magical.', False),
                        (
                            'assistant',
                            'Sunrise is the best time there: quiet paths and soft light through the gates.',
                            False,
                        ),
                    ),
                ),
                ('filler_movies_2', d + 15 * day, session('movies')),
            ],
        ),
        question(
            'mini_ssa_1',
            'single-session-assistant',
            'Which pasta dish did you recommend when I asked for a quick dinner?',
            'cacio e pepe',
            d + 25 * day,
            [
                (
                    'answer_ssa_1',
                    d + 4 * day,
                    evidence(
                        ('user', 'I need a quick pasta dinner with almost no ingredients.', False),
                        (
                            'assistant',
                            'Try cacio e pepe. You only need spaghetti, pecorino romano and black pepper, and it is '
                            'ready in fifteen minutes.',
                            True,
                        ),
                        ('user', 'How do I keep the cheese from clumping?', False),
                        (
                            'assistant',
                            'Take the pan off the heat and add the cheese with a splash of starchy pasta water, '
                            'stirring quickly.',
                            False,
                        ),
                    ),
                ),
                ('filler_fitness_1', d + 11 * day, session('fitness')),
            ],
        ),
        question(
            'mini_ssa_2',
            'single-session-assistant',
            'What book did you suggest to me about building habits?',
            'Atomic Habits',
            d + 40 * day,
            [
                ('filler_travel_1', d + 5 * day, session('travel')),
                (
                    'answer_ssa_2',
                    d + 12 * day,
                    evidence(
                        (
                            'user',
                            'I keep failing to stick with new routines. Is there a good book on building habits?',
                            False,
                        ),
                        (
                            'assistant',
                            'Atomic Habits by James Clear is practical: it shows how tiny changes and a good '
                            'environment make habits stick.',
                            True,
                        ),
                        ('user', 'I will order it today.', False),
                        ('assistant', 'Great. Try one small change from the first chapters before reading on.', False),
                    ),
                ),
                ('filler_cooking_2', d + 20 * day, session('cooking')),
            ],
        ),
        question(
            'mini_ssp_1',
            'single-session-preference',
            'Can you suggest something fun for me to do this weekend?',
            'The user would prefer suggestions involving climbing, such as a new bouldering gym or an outdoor '
            'climbing trip, since they said bouldering is their favourite hobby.',
            d + 33 * day,
            [
                (
                    'answer_ssp_1',
                    d + 6 * day,
                    evidence(
                        (
                            'user',
                            'Bouldering is my favourite hobby; I go to the climbing gym three times a week.',
                            True,
                        ),
                        (
                            'assistant',
                            'That is a great way to stay strong. Are you working on any particular problem at the '
                            'moment?',
                            False,
                        ),
                        ('user', 'A purple overhang route I cannot finish yet.', False),
                        ('assistant', 'Overhangs reward core tension. Try keeping your hips close to the wall.', False),
                    ),
                ),
                ('filler_garden_1', d + 18 * day, session('garden')),
            ],
        ),
        question(
            'mini_ms_1',
            'multi-session',
            'What is the name of my sister who moved to Lisbon?',
            'Ana',
            d + 45 * day,
            [
                (
                    'answer_ms_1a',
                    d + 2 * day,
                    evidence(
                        ('user', 'My sister moved to Lisbon for a new job in design.', True),
                        ('assistant', 'How exciting for her! Lisbon has a lively design scene.', False),
                    ),
                ),
                ('filler_code_2', d + 10 * day, session('code')),
                (
                    'answer_ms_1b',
                    d + 21 * day,
                    evidence(
                        (
                            'user',
                            'Ana called me yesterday; my sister says the Lisbon apartment finally has furniture.',
                            True,
                        ),
                        ('assistant', 'Good news for Ana. Settling in takes a while in a new city.', False),
                    ),
                ),
                ('filler_movies_1', d + 30 * day, session('movies')),
            ],
        ),
        question(
            'mini_ms_2',
            'multi-session',
            'How many hours did I volunteer at the food bank in total?',
            12,
            d + 50 * day,
            [
                (
                    'answer_ms_2a',
                    d + 7 * day,
                    evidence(
                        ('user', 'I volunteered at the food bank for 4 hours on Saturday, sorting donations.', True),
                        ('assistant', 'That is generous of you. Sorting donations keeps everything running.', False),
                    ),
                ),
                ('filler_fitness_2', d + 14 * day, session('fitness')),
                (
                    'answer_ms_2b',
                    d + 28 * day,
                    evidence(
                        ('user', 'Another 8 hours at the food bank this week, this time packing boxes.', True),
                        ('assistant', 'Packing boxes is hard work. Thank you for giving your time.', False),
                    ),
                ),
            ],
        ),
        question(
            'mini_ku_1',
            'knowledge-update',
            'What is my current job title?',
            'senior data engineer',
            d + 60 * day,
            [
                (
                    'answer_ku_1a',
                    d + 3 * day,
                    evidence(
                        ('user', 'I work as a data analyst at a logistics company.', True),
                        (
                            'assistant',
                            'Logistics has lots of interesting data problems, from routing to demand.',
                            False,
                        ),
                    ),
                ),
                ('filler_travel_2', d + 16 * day, session('travel')),
                (
                    'answer_ku_1b',
                    d + 40 * day,
                    evidence(
                        ('user', 'Big news: I was promoted to senior data engineer last week.', True),
                        ('assistant', 'Congratulations on the promotion! That is a big step.', False),
                    ),
                ),
            ],
        ),
        question(
            'mini_ku_2',
            'knowledge-update',
            'How many kilometres do I run each week now?',
            '20 kilometres',
            d + 55 * day,
            [
                (
                    'answer_ku_2a',
                    d + 5 * day,
                    evidence(
                        ('user', 'I run 10 kilometres each week, mostly on weekends.', True),
                        ('assistant', 'A solid base. Adding a short midweek run would spread the load.', False),
                    ),
                ),
                ('filler_cooking_3', d + 20 * day, session('cooking')),
                (
                    'answer_ku_2b',
                    d + 35 * day,
                    evidence(
                        ('user', 'I now run 20 kilometres each week since I joined a running club.', True),
                        ('assistant', 'Doubling your distance is impressive. Keep most runs easy.', False),
                    ),
                ),
            ],
        ),
        question(
            'mini_tr_1',
            'temporal-reasoning',
            'How many days ago did I buy my road bike?',
            '10 days',
            datetime(2023, 6, 10, 18, 0),
            [
                ('filler_garden_3', datetime(2023, 5, 20, 10, 0), session('garden')),
                (
                    'answer_tr_1',
                    datetime(2023, 5, 31, 17, 45),
                    evidence(
                        ('user', 'I bought a new road bike today, a light aluminium frame.', True),
                        (
                            'assistant',
                            'Enjoy it! Check the tyre pressure before every ride for the first weeks.',
                            False,
                        ),
                    ),
                ),
                ('filler_code_3', datetime(2023, 6, 5, 9, 0), session('code')),
            ],
        ),
        question(
            'mini_tr_2',
            'temporal-reasoning',
            'Which did I do first, the pottery class or the jazz concert?',
            'the pottery class',
            d + 45 * day,
            [
                (
                    'answer_tr_2a',
                    d + 9 * day,
                    evidence(
                        ('user', 'I took my first pottery class tonight and made a wobbly bowl.', True),
                        ('assistant', 'Every potter starts with a wobbly bowl. Did you enjoy the wheel?', False),
                    ),
                ),
                ('filler_fitness_3', d + 13 * day, session('fitness')),
                (
                    'answer_tr_2b',
                    d + 24 * day,
                    evidence(
                        ('user', 'The jazz concert last night was fantastic, the saxophonist was brilliant.', True),
                        ('assistant', 'Live jazz is special. Was it a big venue or a small club?', False),
                    ),
                ),
            ],
        ),
        question(
            'mini_ssu_3_abs',
            'single-session-user',
            'What is the name of my cat?',
            'The user never mentioned having a cat; they talked about their dog Biscuit only.',
            d + 22 * day,
            [
                ('filler_movies_3', d + 1 * day, session('movies')),
                (
                    'answer_ssu_3',
                    d + 4 * day,
                    evidence(
                        ('user', 'Biscuit, my golden retriever, finally sleeps through the night.', False),
                        ('assistant', 'That is a relief for everyone. A tired puppy is a happy puppy.', False),
                    ),
                ),
                ('filler_travel_3', d + 12 * day, session('travel')),
            ],
        ),
    ]
    # One more filler session per question, two days before it is asked, to make the histories longer (the
    # sessions stay in time order, as in longmemeval_s).
    topics = list(FILLERS)
    for index, q in enumerate(qs):
        asked = datetime.strptime(str(q['question_date']), '%Y/%m/%d (%a) %H:%M')
        extra = (
            f'filler_{topics[index % len(topics)]}_x{index}',
            stamp(asked - 2 * day),
            session(topics[index % len(topics)]),
        )
        rows = sorted(
            [*zip(q['haystack_session_ids'], q['haystack_dates'], q['haystack_sessions'], strict=True), extra],
            key=lambda row: datetime.strptime(row[1], '%Y/%m/%d (%a) %H:%M'),
        )
        q['haystack_session_ids'] = [r[0] for r in rows]
        q['haystack_dates'] = [r[1] for r in rows]
        q['haystack_sessions'] = [r[2] for r in rows]
    return qs


if __name__ == '__main__':
    data = build()
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + '\n')
    turns = sum(len(s) for q in data for s in q['haystack_sessions'])  # type: ignore[union-attr]
    print(f'{OUT}: {len(data)} questions, {turns} turns')
