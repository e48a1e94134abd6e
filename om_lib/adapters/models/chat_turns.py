"""Conversation shaping shared by the chat-style providers (Bedrock Converse, OpenAI Chat Completions).

Gemini takes any sequence of turns; these two refuse a request whose tool calls and tool results do not pair up (a call
with no result in the very next turn, a result whose call is not in the turn before) and Bedrock also wants turns to
alternate, starting with the user. A conversation can legitimately contain such loose ends: a client's own tool call
that the client never answered, or history that starts with an assistant reply because the turn before it was observed.
Rather than fail the request, loose calls and results are sent as plain text, which every model reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from om_lib.llm import Content, ContentPart, FunctionCall, FunctionResponse

# What a conversation that starts with the assistant is given as its first user turn (Bedrock requires one).
CONTINUATION = '(The conversation so far is summarised in the system prompt; it continues here.)'


def call_as_text(call: FunctionCall) -> str:
    """A tool call written out for a model that is not shown it as a call."""
    return f'[called tool {call.name} with {json.dumps(call.args, default=str, ensure_ascii=False)}]'


def result_as_text(result: FunctionResponse) -> str:
    """A tool result written out for a model that is not shown it as a result."""
    return f'[tool {result.name} returned {json.dumps(result.response, default=str, ensure_ascii=False)}]'


def paired_turns(contents: Sequence[Content], *, tools: bool = True) -> list[Content]:
    """`contents` with every unpaired tool call or result turned into text, consecutive same-role turns merged.

    A model turn's call is paired when the next turn is the user's and holds a result with the call's id; a result is
    paired when its call is in the turn just before. With `tools=False` every call and result becomes text (Bedrock
    refuses tool blocks in a request that offers no tools).
    """
    merged: list[Content] = []
    for content in contents:
        if not content.parts:
            continue
        if merged and merged[-1].role == content.role:
            merged[-1] = Content(content.role, (*merged[-1].parts, *content.parts))
        else:
            merged.append(content)
    # (index of the model turn, call id) for every call answered in the turn right after it.
    answered: set[tuple[int, str]] = set()
    if tools:
        for index, content in enumerate(merged[:-1]):
            following = merged[index + 1]
            if content.role != 'model' or following.role != 'user':
                continue
            call_ids = {p.id for p in content.parts if isinstance(p, FunctionCall) and p.id}
            result_ids = {p.id for p in following.parts if isinstance(p, FunctionResponse) and p.id}
            answered |= {(index, call_id) for call_id in call_ids & result_ids}
    shaped: list[Content] = []
    for index, content in enumerate(merged):
        parts: list[ContentPart] = []
        for part in content.parts:
            if isinstance(part, FunctionCall) and (index, part.id) not in answered:
                parts.append(call_as_text(part))
            elif isinstance(part, FunctionResponse) and (index - 1, part.id) not in answered:
                parts.append(result_as_text(part))
            else:
                parts.append(part)
        shaped.append(Content(content.role, tuple(parts)))
    return shaped
