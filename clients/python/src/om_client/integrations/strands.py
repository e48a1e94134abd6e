"""Observational Memory for Strands Agents (`pip install 'om-client[strands]'`).

    from strands import Agent
    from om_client import MemoryClient
    from om_client.integrations.strands import ObservationalMemoryHooks

    memory = ObservationalMemoryHooks(MemoryClient('http://127.0.0.1:8787'), thread_id='t1', resource_id='me')
    agent = Agent(model=..., system_prompt='You are helpful.', hooks=[memory], tools=[memory.recall_tool()])
    # With working memory on, add memory.working_memory_tool() so the model can keep it up to date.
    agent('What did I say about Lisbon?')

Before each invocation the hooks save the new input as a step (`POST /threads/{id}/steps`) and load what the model
should see: `agent.system_prompt` becomes your prompt plus the memory system message, and `agent.messages` the
unobserved messages (observed turns leave it). After the invocation the turn's outputs (assistant messages, tool
uses and tool results) are saved (`POST /threads/{id}/turns`). Memory owns the history: `agent.messages` is
replaced on every invocation, so no conversation manager needs to trim it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from strands.hooks import (
    AfterInvocationEvent,
    AgentInitializedEvent,
    BeforeInvocationEvent,
    HookProvider,
    HookRegistry,
    MessageAddedEvent,
)
from strands.tools.tools import PythonAgentTool

from om_client.integrations._shared import AnyClient, ThreadBinding, actor_model_name
from om_client.models import (
    DataPart,
    FilePart,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
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

__all__ = ['ObservationalMemoryHooks', 'from_strands', 'to_strands']

StrandsMessage = dict[str, Any]
_IMAGE_FORMATS = {'png', 'jpeg', 'gif', 'webp'}


# -- Strands messages → ours ----------------------------------------------------------------------------------------
def _b64(raw: Any) -> str | None:
    if isinstance(raw, bytes | bytearray):
        return base64.b64encode(bytes(raw)).decode('ascii')
    return None


def _image(block: Mapping[str, Any]) -> ImagePart | TextPart:
    fmt = str(block.get('format') or 'png')
    source = block.get('source') or {}
    data = _b64(source.get('bytes'))
    media_type = f'image/{"jpeg" if fmt == "jpg" else fmt}'
    if data:
        return ImagePart(media_type=media_type, data=data)
    location = source.get('location') or source.get('s3Location') or {}
    url = location.get('uri') if isinstance(location, Mapping) else None
    return ImagePart(media_type=media_type, url=url) if url else TextPart(text='[image]')


def _document(block: Mapping[str, Any]) -> FilePart | TextPart:
    fmt = str(block.get('format') or 'txt')
    source = block.get('source') or {}
    data = _b64(source.get('bytes'))
    name = block.get('name')
    media_type = {'pdf': 'application/pdf', 'txt': 'text/plain', 'md': 'text/markdown', 'csv': 'text/csv'}.get(fmt)
    if data:
        return FilePart(media_type=media_type, data=data, filename=f'{name}.{fmt}' if name else None)
    return TextPart(text=f'[document {name or ""}]')


def _tool_result_value(content: Sequence[Mapping[str, Any]]) -> Any:
    """A toolResult's content as one value: the text, the JSON, or a list of both."""
    values: list[Any] = []
    for block in content:
        if 'text' in block:
            values.append(str(block['text']))
        elif 'json' in block:
            values.append(block['json'])
        else:
            values.append(f'[{next(iter(block), "content")}]')
    if len(values) == 1:
        return values[0]
    if all(isinstance(v, str) for v in values):
        return '\n'.join(values)
    return values


def from_strands(message: Mapping[str, Any], tool_names: dict[str, str]) -> Message | None:
    """A Strands message as ours: a user message of tool results becomes a `tool` message.

    `tool_names` maps tool-use ids to tool names (filled by tool uses, read by tool results).
    """
    parts: list[Part] = []
    has_results = False
    for block in message.get('content') or []:
        if 'text' in block:
            parts.append(TextPart(text=str(block['text'])))
        elif 'image' in block:
            parts.append(_image(block['image']))
        elif 'document' in block:
            parts.append(_document(block['document']))
        elif 'toolUse' in block:
            use = block['toolUse']
            tool_names[str(use['toolUseId'])] = str(use['name'])
            parts.append(
                ToolCallPart(tool_call_id=str(use['toolUseId']), tool_name=str(use['name']), args=use.get('input'))
            )
        elif 'toolResult' in block:
            result = block['toolResult']
            use_id = str(result['toolUseId'])
            has_results = True
            parts.append(
                ToolResultPart(
                    tool_call_id=use_id,
                    tool_name=tool_names.get(use_id, 'tool'),
                    result=_tool_result_value(result.get('content') or []),
                    is_error=result.get('status') == 'error',
                )
            )
        elif 'reasoningContent' in block:
            text = ((block['reasoningContent'] or {}).get('reasoningText') or {}).get('text')
            if text:
                parts.append(ReasoningPart(text=str(text)))
        # cachePoint, guardContent and other markers carry no conversation content.
    if not parts:
        return None
    role = 'tool' if has_results else ('assistant' if message.get('role') == 'assistant' else 'user')
    return Message(role=role, parts=parts)


# -- ours → Strands messages ----------------------------------------------------------------------------------------
def _image_block(part: ImagePart) -> dict[str, Any] | None:
    fmt = (part.media_type or 'image/png').split('/')[-1].lower()
    fmt = 'jpeg' if fmt == 'jpg' else fmt
    if part.data and fmt in _IMAGE_FORMATS:
        payload = part.data.split(',', 1)[1] if part.data.startswith('data:') else part.data
        return {'image': {'format': fmt, 'source': {'bytes': base64.b64decode(payload)}}}
    return None


def _result_content(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{'text': value}]
    if isinstance(value, list):
        return [{'text': v} if isinstance(v, str) else {'json': v} for v in value]
    return [{'json': value}]


def _block(part: Part) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {'text': part.text}
    if isinstance(part, ImagePart):
        return _image_block(part) or {'text': f'[image {part.filename or ""} at {part.url or "inline"}]'}
    if isinstance(part, FilePart):
        return {'text': f'[file {part.filename or ""} at {part.url or "inline"}]'}
    if isinstance(part, ToolCallPart):
        args = part.args if isinstance(part.args, Mapping) else {'input': part.args}
        return {'toolUse': {'toolUseId': part.tool_call_id, 'name': part.tool_name, 'input': dict(args)}}
    if isinstance(part, ToolResultPart):
        status = 'error' if part.is_error else 'success'
        content = _result_content(part.result)
        return {'toolResult': {'toolUseId': part.tool_call_id, 'status': status, 'content': content}}
    return None  # reasoning: kept for the Observer; providers want their own signed blocks back, not ours


def to_strands(messages: Iterable[Message]) -> tuple[list[StrandsMessage], list[str]]:
    """Our messages as Strands messages (adjacent messages of one role merged, as Bedrock requires), plus the text
    of `system` messages (Strands keeps those in the system prompt)."""
    converted: list[StrandsMessage] = []
    system: list[str] = []
    for message in messages:
        if message.role == 'system':
            system.append(message.text())
            continue
        role = 'assistant' if message.role == 'assistant' else 'user'
        blocks = [b for b in (_block(p) for p in message.parts) if b is not None]
        if not blocks:
            continue
        if converted and converted[-1]['role'] == role:
            converted[-1]['content'].extend(blocks)
        else:
            converted.append({'role': role, 'content': blocks})
    return converted, system


def strands_model_name(model: Any) -> str | None:
    """A Strands model as `provider/model`: its provider module (`strands.models.openai` is `openai`) and the
    `model_id` of its configuration; None when it reports no model id."""
    try:
        config = model.get_config()
    except Exception:  # noqa: BLE001 - a custom model may not implement it: memory then sees no model
        return None
    model_id = config.get('model_id') if isinstance(config, Mapping) else None
    if not isinstance(model_id, str) or not model_id.strip():
        return None
    return actor_model_name(type(model).__module__.rsplit('.', 1)[-1], model_id)


# -- the hook provider ----------------------------------------------------------------------------------------------
class ObservationalMemoryHooks(ThreadBinding, HookProvider):
    """Loads memory into a Strands agent before each invocation and saves the turn after it.

    Args:
        client: A `MemoryClient` (called from a worker thread) or an `AsyncMemoryClient`.
        thread_id: The conversation.
        resource_id: Whose memory (default: the client's `resource_id`).
        read_only: Show working memory without offering to change it.
        on_parts: Called with the `data-om-*` parts of every step and turn.
        actor_model: The Actor's model as each step names it (`provider/model`), for `activateAfterIdle: "auto"` and
            `activateOnProviderChange`; default: the agent's model as Strands reports it (`openai/gpt-4o-mini`,
            `bedrock/us.anthropic.claude-sonnet-4-5-...`), read at every invocation, so swapping `agent.model` is seen.
    """

    def __init__(
        self,
        client: AnyClient,
        *,
        thread_id: str,
        resource_id: str | None = None,
        read_only: bool | None = None,
        on_parts: Callable[[list[DataPart]], Any] | None = None,
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
        self.last_turn: TurnResult | None = None
        self._base_prompt: list[dict[str, Any]] | None = None
        self._added: list[StrandsMessage] | None = None
        self._input_count = 0

    @property
    def parts(self) -> list[DataPart]:
        """The `data-om-*` parts of the last step and turn."""
        return [*(self.last_step.parts if self.last_step else []), *(self.last_turn.parts if self.last_turn else [])]

    def register_hooks(self, registry: HookRegistry, **_: Any) -> None:
        """Subscribe to the agent's lifecycle."""
        registry.add_callback(AgentInitializedEvent, self._remember_prompt)
        registry.add_callback(BeforeInvocationEvent, self._load)
        registry.add_callback(MessageAddedEvent, self._record)
        registry.add_callback(AfterInvocationEvent, self._save)

    def _remember_prompt(self, event: AgentInitializedEvent) -> None:
        content = event.agent.system_prompt_content
        self._base_prompt = [dict(block) for block in content] if content else None

    async def _load(self, event: BeforeInvocationEvent) -> None:
        agent = event.agent
        inputs = [from_strands(m, self._tool_names) for m in event.messages or []]
        new = [m for m in inputs if m is not None]
        step = await self._step(new, actor_model=strands_model_name(agent.model))
        self.last_step, self.last_turn = step, None
        self._publish(step.parts)
        new_ids = {m.id for m in new}
        history, system_texts = to_strands(m for m in step.messages if m.id not in new_ids)
        memory = '\n\n'.join(t for t in [step.system, *system_texts] if t.strip())
        base = [dict(block) for block in self._base_prompt or []]
        prompt: Any = [*base, {'text': memory}] if memory else (base or None)
        agent.system_prompt = prompt
        incoming: list[Any] = [dict(m) for m in event.messages or []]
        if history and incoming and history[-1]['role'] == incoming[0].get('role'):
            # Keep roles alternating: the history's last turn (e.g. the continuation reminder) joins the input.
            last = history.pop()
            incoming[0] = {**incoming[0], 'content': [*last['content'], *incoming[0].get('content', [])]}
            event.messages = incoming
        agent.messages[:] = cast(Any, history)
        self._added, self._input_count = [], len(incoming)

    def _record(self, event: MessageAddedEvent) -> None:
        if self._added is not None:
            self._added.append(cast(StrandsMessage, event.message))

    async def _save(self, event: AfterInvocationEvent) -> None:
        added, self._added = self._added or [], None
        outputs = [from_strands(m, self._tool_names) for m in added[self._input_count :]]
        messages = [m for m in outputs if m is not None]
        if not messages:
            return
        turn = await self._turn(messages)
        self.last_turn = turn
        self._publish(turn.parts)

    def recall_tool(self) -> PythonAgentTool:
        """The recall tool as a Strands tool for this thread (`POST /recall`; needs `retrieval` on the server)."""

        async def recall(tool_use: Mapping[str, Any], **_: Any) -> dict[str, Any]:
            answer = await self._recall(tool_use.get('input'))
            status = 'error' if answer.startswith('{"error"') else 'success'
            return {'toolUseId': tool_use['toolUseId'], 'status': status, 'content': [{'text': answer}]}

        spec = {'name': RECALL_NAME, 'description': RECALL_DESCRIPTION, 'inputSchema': {'json': RECALL_PARAMETERS}}
        return PythonAgentTool(RECALL_NAME, cast(Any, spec), cast(Any, recall))

    def working_memory_tool(self) -> PythonAgentTool:
        """`updateWorkingMemory` as a Strands tool (`PUT .../working-memory`; needs `workingMemory` on the server)."""

        async def update(tool_use: Mapping[str, Any], **_: Any) -> dict[str, Any]:
            answer, failed = await self._update_working_memory(tool_use.get('input'))
            status = 'error' if failed else 'success'
            return {'toolUseId': tool_use['toolUseId'], 'status': status, 'content': [{'text': answer}]}

        spec = {
            'name': WORKING_MEMORY_NAME,
            'description': WORKING_MEMORY_DESCRIPTION,
            'inputSchema': {'json': WORKING_MEMORY_PARAMETERS},
        }
        return PythonAgentTool(WORKING_MEMORY_NAME, cast(Any, spec), cast(Any, update))
