"""Observational Memory as an OpenAI Agents SDK `Session` (`pip install 'om-client[openai-agents]'`).

    from agents import Agent, Runner
    from om_client import AsyncMemoryClient
    from om_client.integrations.openai_agents import ObservationalMemorySession

    om = AsyncMemoryClient('http://127.0.0.1:8787')
    session = ObservationalMemorySession(om, thread_id='t1', resource_id='me')
    agent = Agent(name='assistant', instructions='...', tools=[session.recall_tool(), session.working_memory_tool()])
    result = await Runner.run(agent, 'What did I say about Lisbon?', session=session)
    print(session.parts)   # the data-om-* parts of the last step and turns

How the SDK's calls map onto the API:
- `get_items()` → `POST /threads/{id}/steps` with no new input: the memory system message (observations, working
  memory, retrieval guidance) as a `system` item, then the unobserved messages as input items. The step observes or
  activates buffered observations when due, so observed turns leave the model's input.
- `add_items(items)` → `POST /threads/{id}/turns`: the run's input and outputs, one message per item. Function calls
  and their outputs become `tool-call` / `tool-result` parts; images and files keep their data or URL; reasoning
  items become `reasoning` parts (kept for the Observer, not sent back to the model).
- `pop_item()` deletes the newest stored message; `clear_session()` clears the thread (its memory is reset).

Every message gets its id here, so a repeated `add_items` request (a retry) is a no-op on the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from om_client.errors import ThreadNotFound
from om_client.integrations._shared import AnyClient, ThreadBinding, call
from om_client.models import (
    DataPart,
    FilePart,
    ImagePart,
    MemoryStatus,
    Message,
    Part,
    ReasoningPart,
    StepResult,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    TurnResult,
)
from om_client.tools import (
    RECALL_DESCRIPTION,
    RECALL_NAME,
    RECALL_PARAMETERS,
    WORKING_MEMORY_DESCRIPTION,
    WORKING_MEMORY_NAME,
    WORKING_MEMORY_PARAMETERS,
)

if TYPE_CHECKING:
    from agents import FunctionTool

__all__ = ['ObservationalMemorySession', 'items_to_messages', 'message_to_items', 'step_to_items']

Item = dict[str, Any]
# A file the model provider holds (`file_id`) is kept as this URL scheme, so it goes back as the same `file_id`.
OPENAI_FILE_SCHEME = 'openai-file:'


# -- SDK items → messages -------------------------------------------------------------------------------------------
def _split_data_url(url: str) -> tuple[str | None, str] | None:
    """`(media type, base64 data)` of a `data:` URL, or None for other URLs."""
    if not url.startswith('data:') or ',' not in url:
        return None
    header, data = url[5:].split(',', 1)
    media_type = header.split(';', 1)[0] or None
    return media_type, data


def _image_part(entry: Mapping[str, Any]) -> ImagePart | TextPart:
    url = entry.get('image_url')
    if isinstance(url, str) and url:
        inline = _split_data_url(url)
        if inline is not None:
            return ImagePart(media_type=inline[0], data=inline[1])
        return ImagePart(url=url)
    if entry.get('file_id'):
        return ImagePart(url=f'{OPENAI_FILE_SCHEME}{entry["file_id"]}')
    return TextPart(text='[image without a source]')


def _file_part(entry: Mapping[str, Any]) -> FilePart | TextPart:
    filename = entry.get('filename')
    data = entry.get('file_data')
    if isinstance(data, str) and data:
        inline = _split_data_url(data)
        if inline is not None:
            return FilePart(media_type=inline[0], data=inline[1], filename=filename)
        return FilePart(data=data, filename=filename)
    if entry.get('file_url'):
        return FilePart(url=entry['file_url'], filename=filename)
    if entry.get('file_id'):
        return FilePart(url=f'{OPENAI_FILE_SCHEME}{entry["file_id"]}', filename=filename)
    return TextPart(text=f'[file {filename or ""} without a source]')


def _content_parts(content: Any) -> list[Part]:
    """An input item's `content` (text, or a list of input/output content entries) as message parts."""
    if isinstance(content, str):
        return [TextPart(text=content)] if content else []
    parts: list[Part] = []
    for entry in content or []:
        if not isinstance(entry, Mapping):
            continue
        kind = entry.get('type')
        if kind in ('input_text', 'output_text', 'text'):
            parts.append(TextPart(text=str(entry.get('text', ''))))
        elif kind == 'refusal':
            parts.append(TextPart(text=str(entry.get('refusal', ''))))
        elif kind == 'input_image':
            parts.append(_image_part(entry))
        elif kind == 'input_file':
            parts.append(_file_part(entry))
        else:
            parts.append(TextPart(text=f'[{kind} content]'))
    return parts


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as an object when they are JSON (they are kept as text otherwise)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return raw if raw is not None else {}


def _reasoning_text(item: Mapping[str, Any]) -> str:
    texts = [str(s.get('text', '')) for s in item.get('summary') or [] if isinstance(s, Mapping)]
    texts += [str(c.get('text', '')) for c in item.get('content') or [] if isinstance(c, Mapping)]
    return '\n'.join(t for t in texts if t)


def item_to_message(item: Mapping[str, Any], tool_names: dict[str, str]) -> Message | None:
    """One SDK input item as one message (None for an item with nothing to keep).

    `tool_names` maps call ids to function names: filled by function calls, read by their outputs.
    """
    kind = item.get('type')
    role = item.get('role')
    if kind in (None, 'message') and role in ('user', 'system', 'developer', 'assistant'):
        parts = _content_parts(item.get('content'))
        if not parts:
            return None
        return Message(role='system' if role == 'developer' else role, parts=parts)
    if kind in ('function_call', 'custom_tool_call'):
        call_id = str(item.get('call_id') or item.get('id') or '')
        name = str(item.get('name') or 'tool')
        tool_names[call_id] = name
        args = _arguments(item.get('arguments') if kind == 'function_call' else item.get('input'))
        return Message(role='assistant', parts=[ToolCallPart(tool_call_id=call_id, tool_name=name, args=args)])
    if kind in ('function_call_output', 'custom_tool_call_output'):
        call_id = str(item.get('call_id') or '')
        name = tool_names.get(call_id, 'tool')
        result = ToolResultPart(tool_call_id=call_id, tool_name=name, result=item.get('output'))
        return Message(role='tool', parts=[result])
    if kind == 'reasoning':
        text = _reasoning_text(item)
        return Message(role='assistant', parts=[ReasoningPart(text=text)]) if text else None
    if isinstance(kind, str) and kind.endswith('_call'):
        # A hosted tool (web search, file search, computer, MCP...): the whole item is kept as the call's args.
        call_id = str(item.get('call_id') or item.get('id') or kind)
        clean = {k: v for k, v in item.items() if k != 'provider_data'}
        return Message(role='assistant', parts=[ToolCallPart(tool_call_id=call_id, tool_name=kind, args=clean)])
    if isinstance(kind, str) and kind.endswith('_call_output'):
        call_id = str(item.get('call_id') or item.get('id') or kind)
        clean = {k: v for k, v in item.items() if k != 'provider_data'}
        return Message(role='tool', parts=[ToolResultPart(tool_call_id=call_id, tool_name=kind, result=clean)])
    return None


def items_to_messages(items: Iterable[Mapping[str, Any]], tool_names: dict[str, str] | None = None) -> list[Message]:
    """SDK input items as messages, one per item (so `pop_item` removes exactly one item)."""
    names = tool_names if tool_names is not None else {}
    found = (item_to_message(item, names) for item in items)
    return [m for m in found if m is not None]


# -- messages → SDK items -------------------------------------------------------------------------------------------
def _media_url(part: ImagePart | FilePart) -> str | None:
    if part.data:
        return part.data if part.data.startswith('data:') else f'data:{part.media_type or ""};base64,{part.data}'
    if part.url and part.url.startswith(('http://', 'https://', 'data:')):
        return part.url
    return None


def _placeholder(part: ImagePart | FilePart) -> dict[str, Any]:
    # An `s3://` attachment (or another URL a model cannot fetch): the model is told it is there.
    label = 'image' if isinstance(part, ImagePart) else 'file'
    return {'type': 'input_text', 'text': f'[{label} {part.filename or ""} at {part.url}]'.replace('  ', ' ')}


def _input_content(part: Part) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {'type': 'input_text', 'text': part.text}
    if isinstance(part, ImagePart):
        if part.url and part.url.startswith(OPENAI_FILE_SCHEME) and not part.data:
            return {'type': 'input_image', 'file_id': part.url[len(OPENAI_FILE_SCHEME) :], 'detail': 'auto'}
        url = _media_url(part)
        return {'type': 'input_image', 'image_url': url, 'detail': 'auto'} if url else _placeholder(part)
    if isinstance(part, FilePart):
        entry: dict[str, Any] = {'type': 'input_file'}
        if part.filename:
            entry['filename'] = part.filename
        if part.url and part.url.startswith(OPENAI_FILE_SCHEME) and not part.data:
            entry['file_id'] = part.url[len(OPENAI_FILE_SCHEME) :]
        elif part.data:
            entry['file_data'] = _media_url(part)
        elif part.url and part.url.startswith(('http://', 'https://')):
            entry['file_url'] = part.url
        else:
            return _placeholder(part)
        return entry
    return None


def _tool_output(result: Any) -> Any:
    if isinstance(result, str) or (isinstance(result, list) and all(isinstance(r, Mapping) for r in result)):
        return result
    return json.dumps(result, ensure_ascii=False)


def message_to_items(message: Message) -> list[Item]:
    """A stored message as SDK input items (an assistant message with text and tool calls gives several)."""
    if message.role in ('system', 'user'):
        content = [c for c in (_input_content(p) for p in message.parts) if c is not None]
        if not content:
            return []
        if all(c['type'] == 'input_text' for c in content):
            return [{'role': message.role, 'content': '\n'.join(c['text'] for c in content)}]
        return [{'role': message.role, 'content': content}]
    items: list[Item] = []
    texts: list[str] = []

    def flush_text() -> None:
        if texts:
            items.append({'role': 'assistant', 'content': '\n'.join(texts)})
            texts.clear()

    for part in message.parts:
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, ToolCallPart):
            flush_text()
            items.append(_tool_call_item(part))
        elif isinstance(part, ToolResultPart):
            flush_text()
            items.append(_tool_result_item(part))
        elif isinstance(part, ImagePart | FilePart):
            texts.append(_placeholder(part)['text'])
        # Reasoning stays for the Observer: chat models cannot take it back, the Responses API only by its own ids.
    flush_text()
    return items


def _tool_call_item(part: ToolCallPart) -> Item:
    args = part.args
    if part.tool_name.endswith('_call') and isinstance(args, Mapping) and args.get('type') == part.tool_name:
        return dict(args)  # a hosted tool's item, kept whole
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {'type': 'function_call', 'call_id': part.tool_call_id, 'name': part.tool_name, 'arguments': arguments}


def _tool_result_item(part: ToolResultPart) -> Item:
    result = part.result
    if part.tool_name.endswith('_call_output') and isinstance(result, Mapping) and result.get('type') == part.tool_name:
        return dict(result)  # a hosted tool's output item, kept whole
    return {'type': 'function_call_output', 'call_id': part.tool_call_id, 'output': _tool_output(result)}


def step_to_items(step: StepResult) -> list[Item]:
    """What the model should see: the memory system message, then the unobserved messages."""
    items: list[Item] = [{'role': 'system', 'content': step.system}] if step.system.strip() else []
    for message in step.messages:
        items.extend(message_to_items(message))
    return items


# -- the Session ----------------------------------------------------------------------------------------------------
class ObservationalMemorySession(ThreadBinding):
    """The Agents SDK `Session` protocol over the Observational Memory API.

    Args:
        client: An `AsyncMemoryClient` (or a `MemoryClient`, called from a worker thread).
        thread_id: The conversation; it is also the SDK's `session_id`.
        resource_id: Whose memory (default: the client's `resource_id`).
        read_only: Show working memory without offering to change it.
        on_parts: Called with the `data-om-*` parts of every step and turn (status, observation start/end/failed,
            buffering, activation...), e.g. to stream them to a UI.
        session_settings: The SDK's `SessionSettings` (None: the SDK's defaults).
        actor_model: The model your agent runs (`provider/model`, e.g. `openai/gpt-5.4`), named on every step for
            `activateAfterIdle: "auto"` and `activateOnProviderChange` (a session does not see the agent's model).
    """

    def __init__(
        self,
        client: AnyClient,
        *,
        thread_id: str,
        resource_id: str | None = None,
        read_only: bool | None = None,
        on_parts: Callable[[list[DataPart]], Any] | None = None,
        session_settings: Any = None,
        actor_model: str | None = None,
    ) -> None:
        super().__init__(
            client,
            thread_id=thread_id,
            resource_id=resource_id,
            read_only=read_only,
            on_parts=on_parts,
            actor_model=actor_model,
        )
        self.session_id = thread_id
        self.session_settings = session_settings
        self.last_turns: list[TurnResult] = []

    @property
    def parts(self) -> list[DataPart]:
        """The `data-om-*` parts of the last step (`get_items`) and of the turns saved since."""
        found = list(self.last_step.parts) if self.last_step else []
        for turn in self.last_turns:
            found.extend(turn.parts)
        return found

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The memory system message, then the unobserved messages (the newest `limit` items when given)."""
        step = await self._step([])
        self.last_step, self.last_turns = step, []
        self._publish(step.parts)
        items = step_to_items(step)
        if limit is None:
            return items
        return items[-limit:] if limit > 0 else []

    async def add_items(self, items: list[Item]) -> None:
        """Save the run's input and outputs as one turn (one message per item)."""
        messages = items_to_messages(items, self._tool_names)
        if not messages:
            return
        turn = await self._turn(messages)
        self.last_turns.append(turn)
        self._publish(turn.parts)

    async def pop_item(self) -> Item | None:
        """Delete the newest stored message and return it as an item (None when the thread is empty)."""
        newest = await self._newest_message()
        if newest is None:
            return None
        await call(self.client, 'delete_messages', self.thread_id, [newest.id], resource_id=self.resource_id)
        items = message_to_items(newest)
        return items[-1] if items else None

    async def clear_session(self) -> None:
        """Delete every message of the thread (its observational memory starts over)."""
        try:
            await call(self.client, 'delete_messages', self.thread_id, None, resource_id=self.resource_id)
        except ThreadNotFound:
            return

    async def memory(self) -> MemoryStatus:
        """The thread's observational memory (observations, token counts, current task)."""
        status: MemoryStatus = await call(self.client, 'memory', self.thread_id, resource_id=self.resource_id)
        return status

    async def _newest_message(self) -> Message | None:
        page, newest = 0, None
        while True:
            try:
                result = await call(
                    self.client, 'messages', self.thread_id, resource_id=self.resource_id, page=page, per_page=1000
                )
            except ThreadNotFound:
                return None
            if result.messages:
                newest = result.messages[-1]
            if not result.has_more:
                return newest
            page += 1

    def recall_tool(self) -> FunctionTool:
        """The recall tool as an Agents SDK `FunctionTool` for this thread (`POST /recall`; needs `retrieval`)."""
        from agents import FunctionTool

        async def invoke(_context: Any, arguments: str) -> str:
            return await self._recall(arguments)

        return FunctionTool(
            name=RECALL_NAME,
            description=RECALL_DESCRIPTION,
            params_json_schema=RECALL_PARAMETERS,
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    def working_memory_tool(self) -> FunctionTool:
        """`updateWorkingMemory` as an Agents SDK `FunctionTool` (`PUT .../working-memory`; needs `workingMemory`)."""
        from agents import FunctionTool

        async def invoke(_context: Any, arguments: str) -> str:
            answer, _ = await self._update_working_memory(arguments)
            return answer

        return FunctionTool(
            name=WORKING_MEMORY_NAME,
            description=WORKING_MEMORY_DESCRIPTION,
            params_json_schema=WORKING_MEMORY_PARAMETERS,
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )
