// The memory middleware around a mock model, its API calls answered by a scripted fetch: the prompt the model gets,
// what is saved and when, and what a failed save does. Run with each AI SDK major (the mock and its shapes are that
// version's).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { simulateReadableStream, wrapLanguageModel } from 'ai';
import { MemoryClient } from 'om-client';
import { observationalMemory, type OmProviderMetadata } from 'om-client/ai';
import { apiError, finishReason, json, mockModel, ScriptedFetch, usage } from './helpers.js';

const AT = '2026-11-28T10:00:00Z';
const STATUS_PART = { type: 'data-om-status', data: { threadId: 't1' } };
const USAGE = usage(3, 2);

function stepAnswer(messages: unknown[]) {
  return json(200, {
    threadId: 't1',
    resourceId: 'me',
    system: 'OBSERVATIONS: lives in Lisbon',
    messages,
    tools: [],
    parts: [STATUS_PART],
  });
}

function setup(...answers: ConstructorParameters<typeof ScriptedFetch>) {
  return setupWith({}, ...answers);
}

function setupWith(
  options: Partial<Parameters<typeof observationalMemory>[0]>,
  ...answers: ConstructorParameters<typeof ScriptedFetch>
) {
  const fetch = new ScriptedFetch(...answers);
  const client = new MemoryClient({ apiUrl: 'http://127.0.0.1:9', resourceId: 'me', fetch: fetch.fetch, retries: 0 });
  const parts: string[] = [];
  const memory = observationalMemory({
    client,
    threadId: 't1',
    onParts: (ps, event) => void parts.push(...ps.map((p) => `${event.phase}:${p.type}`)),
    ...options,
  });
  return { fetch, memory, parts };
}

const PROMPT = [
  { role: 'system' as const, content: 'Be brief.' },
  { role: 'user' as const, content: [{ type: 'text' as const, text: 'old question the app kept' }] },
  { role: 'assistant' as const, content: [{ type: 'text' as const, text: 'old answer' }] },
  { role: 'user' as const, content: [{ type: 'text' as const, text: 'Where do I live?' }] },
  { role: 'system' as const, content: 'Answer in English.' },
];

test('generate: the new input is saved, the model sees system messages first then memory, the reply is saved', async () => {
  const stored = { id: 'm0', role: 'user', createdAt: AT, parts: [{ type: 'text', text: 'Where do I live?' }] };
  const { fetch, memory, parts } = setup(
    stepAnswer([stored]),
    json(200, { saved: ['r1'], parts: [{ type: 'data-om-scheduled', data: { operations: ['observe'] } }] }),
  );
  const model = await mockModel({
    doGenerate: {
      content: [{ type: 'text', text: 'In Lisbon.' }],
      finishReason: finishReason('stop'),
      usage: USAGE,
      warnings: [],
    },
  });

  const result = await wrapLanguageModel({ model, middleware: memory }).doGenerate({ prompt: PROMPT });

  const [step, turn] = fetch.bodies() as { messages: { role: string; parts: unknown[] }[] }[];
  assert.deepEqual(
    step!.messages.map((m) => [m.role, m.parts]),
    [['user', [{ type: 'text', text: 'Where do I live?' }]]],
  );
  assert.deepEqual(model.doGenerateCalls[0]!.prompt, [
    { role: 'system', content: 'Be brief.' },
    { role: 'system', content: 'Answer in English.' },
    { role: 'system', content: 'OBSERVATIONS: lives in Lisbon' },
    { role: 'user', content: [{ type: 'text', text: 'Where do I live?' }] },
  ]);
  assert.deepEqual(
    turn!.messages.map((m) => [m.role, m.parts]),
    [['assistant', [{ type: 'text', text: 'In Lisbon.' }]]],
  );
  const om = result.providerMetadata?.om as unknown as OmProviderMetadata;
  assert.deepEqual(om.saved, ['r1']);
  assert.deepEqual(
    om.parts.map((p) => p.type),
    ['data-om-status', 'data-om-scheduled'],
  );
  assert.deepEqual(parts, ['step:data-om-status', 'turn:data-om-scheduled']);
});

test("each step names the wrapped model as the Actor's (provider/modelId), or the actorModel given", async () => {
  const generate = { content: [], finishReason: finishReason('stop'), usage: USAGE, warnings: [] };
  const model = await mockModel({ provider: 'openai.chat', modelId: 'gpt-4o-mini', doGenerate: generate });
  const other = await mockModel({ provider: 'anthropic.messages', modelId: 'claude-sonnet-4-5', doGenerate: generate });
  const served = await mockModel({ provider: 'vllm.chat', modelId: '/models/llama 3', doGenerate: generate });
  const named = await mockModel({ modelId: 'x'.repeat(300), doGenerate: generate });
  const unnamed = await mockModel({ modelId: '', doGenerate: generate });
  const { fetch, memory } = setup(stepAnswer([]));
  const given = setupWith({ actorModel: 'openai/gpt-5.5' }, stepAnswer([]));

  for (const wrapped of [model, other, served, named, unnamed]) {
    await wrapLanguageModel({ model: wrapped, middleware: memory }).doGenerate({ prompt: PROMPT });
  }
  await wrapLanguageModel({ model, middleware: given.memory }).doGenerate({ prompt: PROMPT });

  assert.deepEqual(
    (fetch.bodies() as { actorModel?: string }[]).map((b) => b.actorModel),
    // A model served from a path loses its leading slash and spaces; a name the route would refuse (past 200
    // characters, or no model id) is left out, since every step would be refused.
    [
      'openai.chat/gpt-4o-mini',
      'anthropic.messages/claude-sonnet-4-5',
      'vllm.chat/models/llama-3',
      undefined,
      undefined,
    ],
  );
  assert.equal((given.fetch.bodies()[0] as { actorModel?: string }).actorModel, 'openai/gpt-5.5');
  assert.throws(() => setupWith({ actorModel: 'gpt 4o' }, stepAnswer([])), /actorModel must be `provider\/model`/);
});

test('a call retried with the same prompt re-sends the same message ids', async () => {
  const { fetch, memory } = setup(stepAnswer([])); // no output, so no turn: only steps are sent
  const model = await mockModel({
    doGenerate: { content: [], finishReason: finishReason('stop'), usage: USAGE, warnings: [] },
  });
  const wrapped = wrapLanguageModel({ model, middleware: memory });

  await wrapped.doGenerate({ prompt: PROMPT }); // the AI SDK retries with the same prompt messages
  await wrapped.doGenerate({ prompt: PROMPT });
  await wrapped.doGenerate({
    prompt: [...PROMPT.slice(0, 3), { role: 'user', content: [{ type: 'text', text: 'Where do I live?' }] }],
  });

  const ids = (fetch.bodies() as { messages?: { id: string }[] }[])
    .filter((b) => b.messages?.length)
    .map((b) => b.messages![0]!.id);
  assert.equal(ids.length, 3);
  assert.equal(ids[0], ids[1]);
  assert.notEqual(ids[1], ids[2]); // a new prompt message (the same words said again) is a new message
});

test('stream: the reply is saved before finish goes on; a failed save is an error part, the finish still comes', async () => {
  const chunks = [
    { type: 'stream-start' as const, warnings: [] },
    { type: 'text-start' as const, id: 'a' },
    { type: 'text-delta' as const, id: 'a', delta: 'In ' },
    { type: 'text-delta' as const, id: 'a', delta: 'Lisbon.' },
    { type: 'text-end' as const, id: 'a' },
    { type: 'tool-call' as const, toolCallId: 'c1', toolName: 'recall', input: '{"mode":"threads"}' },
    { type: 'finish' as const, finishReason: finishReason('tool-calls'), usage: USAGE },
  ];
  const model = () => mockModel({ doStream: async () => ({ stream: simulateReadableStream({ chunks }) }) });
  const read = async (memory: ReturnType<typeof setup>['memory']) => {
    const { stream } = await wrapLanguageModel({ model: await model(), middleware: memory }).doStream({
      prompt: PROMPT,
    });
    const parts: { type: string; providerMetadata?: unknown; error?: unknown }[] = [];
    for await (const part of stream as unknown as AsyncIterable<(typeof parts)[number]>) parts.push(part);
    return parts;
  };

  const saved = setup(stepAnswer([]), json(200, { saved: ['r1'], parts: [] }));
  const ok = await read(saved.memory);
  const failed = setup(stepAnswer([]), apiError(503, 'storage_unavailable', 'the store is unavailable'));
  const broken = await read(failed.memory);
  // A model that fails mid-stream: its half reply is not saved as a turn.
  const midway = setup(stepAnswer([]));
  const erroring = chunks.slice(0, 3).concat({ type: 'error', error: new Error('overloaded') } as never);
  const errored = await mockModel({
    doStream: async () => ({ stream: simulateReadableStream({ chunks: erroring }) }),
  });
  const { stream } = await wrapLanguageModel({ model: errored, middleware: midway.memory }).doStream({
    prompt: PROMPT,
  });
  for await (const _ of stream as unknown as AsyncIterable<unknown>);

  const turn = saved.fetch.bodies()[1] as { messages: { role: string; parts: unknown[] }[] };
  assert.deepEqual(turn.messages[0]!.parts, [
    { type: 'text', text: 'In Lisbon.' },
    { type: 'tool-call', toolCallId: 'c1', toolName: 'recall', args: { mode: 'threads' } },
  ]);
  const finish = ok.at(-1)!;
  assert.equal(finish.type, 'finish');
  assert.deepEqual((finish.providerMetadata as { om: OmProviderMetadata }).om.saved, ['r1']);
  assert.deepEqual(
    broken.slice(-2).map((p) => p.type),
    ['error', 'finish'],
  );
  assert.match(String((broken.at(-2)!.error as Error).message), /store is unavailable/);
  assert.deepEqual(
    midway.fetch.requests.map((r) => new URL(r.request.url).pathname),
    ['/threads/t1/steps'],
  );
});

test('a step that fails fails the model call: the model is not asked without memory', async () => {
  const { memory } = setup(apiError(404, 'thread_not_found', 'no thread t1 for this resource'));
  const model = await mockModel({
    doGenerate: { content: [], finishReason: finishReason('stop'), usage: USAGE, warnings: [] },
  });

  await assert.rejects(async () => wrapLanguageModel({ model, middleware: memory }).doGenerate({ prompt: PROMPT }), {
    code: 'thread_not_found',
  });
  assert.equal(model.doGenerateCalls.length, 0);
});
