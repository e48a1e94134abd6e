// The AI SDK with the memory middleware against the local stack, the model an OpenAI-compatible provider talking to
// the fake OpenAI server: a 20-turn streamText conversation (memory observes and reflects, facts come back through the
// recall tool), generateText with a retried model call, and the example agent.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import {
  createUIMessageStream,
  generateText,
  readUIMessageStream,
  stepCountIs,
  streamText,
  wrapLanguageModel,
} from 'ai';
import { MemoryClient, type OmPart, partsOf, textOf } from 'om-client';
import { type MemoryUIMessage, observationalMemory, type OmProviderMetadata } from 'om-client/ai';
import { FakeModel, servers, texts, uid } from './helpers.js';

const run = promisify(execFile);
const EXAMPLE = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'examples', 'typescript', 'agent.js');

function fact(n: number): string {
  return `Fact ${n}: my friend number ${n} is called Person${n}, lives in City${n} and collects stamps of colour${n}.`;
}

function fakeProvider(fake: FakeModel) {
  return createOpenAICompatible({ name: 'fake', baseURL: fake.baseURL, apiKey: 'test', includeUsage: true });
}

test('20 turns through streamText: memory observes and reflects, the prompt stays short, recall brings a fact back', async (t) => {
  const env = servers(t);
  if (!env) return;
  const fake = new FakeModel(env.openai);
  await fake.reset();
  const client = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const threadId = uid('t');
  const seen: OmPart[] = [];
  const memory = observationalMemory({ client, threadId, onParts: (parts) => void seen.push(...parts) });
  const model = wrapLanguageModel({ model: fakeProvider(fake).chatModel('fake-model'), middleware: memory });
  const streamed: string[] = [];
  let lastMetadata: OmProviderMetadata | undefined;

  for (let n = 0; n < 20; n += 1) {
    if (n === 8) {
      const update = { memory: '# User\n- has many friends who collect stamps' };
      await fake.script({ toolCalls: [{ name: 'updateWorkingMemory', arguments: update }] }, { text: 'Saved.' });
    }
    if (n === 19) {
      const search = { mode: 'search', query: 'friend number 3 Person3 City3 stamps colour3' };
      await fake.script({ toolCalls: [{ name: 'recall', arguments: search }] }, { text: 'Person3 lives in City3.' });
    }
    const result = streamText({
      model,
      system: 'Be brief.',
      prompt: fact(n),
      tools: memory.tools(),
      stopWhen: stepCountIs(3),
    });
    streamed.push(await result.text);
    lastMetadata = (await result.providerMetadata)?.om as unknown as OmProviderMetadata | undefined;
  }
  const requests = await fake.requests();
  const status = await client.memory(threadId);
  const generations = await client.memoryGenerations(threadId);
  const stored = [];
  for await (const message of client.iterMessages(threadId)) stored.push(message);

  const last = requests.at(-1)!;
  const beforeRecall = requests.at(-2)!;
  assert.ok(requests.every((r) => r.stream === true)); // streamText streams: the fake speaks SSE
  // The app's system prompt, then the memory system message with what earlier turns said (the oldest observations
  // may be archived by now: recall still reaches them, see below)...
  const system = texts(last, 'system');
  assert.equal(system[0], 'Be brief.');
  assert.match(system.slice(1).join('\n'), /<observations>[^]*Person\d+\b[^]*<\/observations>/);
  assert.match(system.join('\n'), /has many friends who collect stamps/); // working memory, set by the tool
  // ...while the observed turns left the messages: the prompt stays short.
  assert.ok(![...texts(last, 'user'), ...texts(last, 'assistant')].some((text) => text.includes('Fact 0:')));
  assert.equal(texts(beforeRecall, 'user').at(-1), fact(19));
  assert.ok(last.messages.length < 20, String(last.messages.length));
  // Memory observed, and reflected (offline Observer and Reflector, small thresholds).
  assert.ok(status.observationTokens > 0);
  assert.ok(
    generations.generations.some((g) => g.trigger === 'reflection'),
    JSON.stringify(generations.generations),
  );
  // The recall tool read the raw history behind the observations: the fact came back to the model.
  const recalled = last.messages
    .filter((m) => m.role === 'tool')
    .map((m) => String(m.content))
    .join('\n');
  assert.match(recalled, /City3/);
  assert.equal(streamed.at(-1), 'Person3 lives in City3.');
  // Everything said was stored once, in order, with the tool rounds as parts.
  assert.deepEqual(
    stored.filter((m) => m.role === 'user').map(textOf),
    Array.from({ length: 20 }, (_, n) => fact(n)),
  );
  assert.equal(textOf(stored.at(-1)!), 'Person3 lives in City3.');
  const kinds = stored.flatMap((m) => m.parts.map((p) => p.type));
  assert.equal(kinds.filter((k) => k === 'tool-call').length, 2);
  assert.equal(kinds.filter((k) => k === 'tool-result').length, 2);
  // The data-om-* parts reached the app: through onParts, and on the result.
  const types = new Set(seen.map((p) => p.type));
  assert.ok(types.has('data-om-status') && types.has('data-om-observation-end'), [...types].join());
  assert.ok(lastMetadata?.parts.some((p) => p.type === 'data-om-status'));
  assert.equal(lastMetadata?.threadId, threadId);
});

test('generateText: a model call the AI SDK retries stores the user message once; the reply lands in memory', async (t) => {
  const env = servers(t);
  if (!env) return;
  const fake = new FakeModel(env.openai);
  await fake.reset();
  const resourceId = uid('r');
  const client = new MemoryClient({ apiUrl: env.api, resourceId });
  const threadId = uid('t');
  const memory = observationalMemory({ client, threadId });
  const model = wrapLanguageModel({ model: fakeProvider(fake).chatModel('fake-model'), middleware: memory });
  await client.step(threadId, ['Earlier: I live in Lisbon.']);
  await client.turn(threadId, ['Noted.']);
  await fake.script(
    { status: 503, message: 'overloaded', headers: { 'retry-after-ms': '10' } },
    { text: 'Hello Ana!' },
  );

  // The app passes its own history too: memory replaces it with what it holds.
  const result = await generateText({
    model,
    messages: [
      { role: 'user', content: 'An old message the app kept.' },
      { role: 'assistant', content: 'An old reply.' },
      { role: 'user', content: 'I am Ana.' },
    ],
  });

  const requests = await fake.requests();
  const stored = [];
  for await (const message of client.iterMessages(threadId)) stored.push(`${message.role}: ${textOf(message)}`);
  assert.equal(result.text, 'Hello Ana!');
  assert.equal(requests.length, 2); // the 503, then the retry
  assert.deepEqual(requests[0]!.messages, requests[1]!.messages);
  assert.deepEqual(texts(requests[1]!, 'user'), ['Earlier: I live in Lisbon.', 'I am Ana.']);
  assert.deepEqual(stored, [
    'user: Earlier: I live in Lisbon.',
    'assistant: Noted.',
    'user: I am Ana.',
    'assistant: Hello Ana!',
  ]);
  const om = result.providerMetadata?.om as unknown as OmProviderMetadata;
  assert.equal(om.saved.length, 1);
  assert.ok(memory.lastStep?.messages.some((m) => textOf(m) === 'I am Ana.'));
});

test("switching the app's model activates what memory buffered: each step names the wrapped model", async (t) => {
  const env = servers(t);
  if (!env) return;
  const fake = new FakeModel(env.openai);
  await fake.reset();
  const client = new MemoryClient({ apiUrl: env.buffered, resourceId: uid('r') });
  const threadId = uid('t');
  const seen: OmPart[] = [];
  const memory = observationalMemory({ client, threadId, onParts: (parts) => void seen.push(...parts) });
  const provider = fakeProvider(fake);
  const usual = wrapLanguageModel({ model: provider.chatModel('fake-model'), middleware: memory });
  const other = wrapLanguageModel({ model: provider.chatModel('fake-model-large'), middleware: memory });

  await generateText({ model: usual, prompt: 'My sister lives in Porto and loves trams.' });
  const buffered = await client.buffer(threadId); // now, below bufferTokens
  const afterBuffer = (await client.messages(threadId)).messages.map((m) => m.omStatus);
  await generateText({ model: usual, prompt: 'I am visiting her in June.' }); // the same model: the chunk waits
  const waiting = await client.memory(threadId);
  const activationsBefore = partsOf(seen, 'data-om-activation').length;
  await generateText({ model: other, prompt: 'Which city does my sister live in?' });

  assert.equal(buffered.status, 'done', JSON.stringify(buffered.parts));
  assert.equal(partsOf(buffered.parts, 'data-om-buffering-end').length, 1);
  assert.deepEqual(afterBuffer, ['buffered', 'buffered']);
  assert.doesNotMatch(waiting.observations, /Porto/);
  assert.equal(activationsBefore, 0);
  const [activation] = partsOf(seen, 'data-om-activation');
  assert.deepEqual(
    [activation?.data.triggeredBy, activation?.data.previousModel, activation?.data.currentModel],
    ['provider_change', 'fake.chat/fake-model', 'fake.chat/fake-model-large'],
  );
  // The new model got the activated observations in its memory system message; memory shows them too.
  const system = texts((await fake.requests()).at(-1)!, 'system').join('\n');
  assert.match(system, /<observations>[^]*Porto[^]*<\/observations>/);
  assert.match((await client.memory(threadId)).observations, /Porto/);
});

test("the data-om-* parts go to the app's UI message stream, before the reply, as they happen", async (t) => {
  const env = servers(t);
  if (!env) return;
  const fake = new FakeModel(env.openai);
  await fake.reset();
  await fake.script({ text: 'Hi Ana.' });
  const client = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const threadId = uid('t');

  // What a route handler does: memory writes its parts to the stream that carries the reply.
  const stream = createUIMessageStream<MemoryUIMessage>({
    execute: ({ writer }) => {
      const memory = observationalMemory({
        client,
        threadId,
        onParts: (parts) => parts.forEach((part) => writer.write(part)),
      });
      const model = wrapLanguageModel({ model: fakeProvider(fake).chatModel('fake-model'), middleware: memory });
      writer.merge(streamText({ model, prompt: 'I am Ana.' }).toUIMessageStream());
    },
  });
  let last: MemoryUIMessage | undefined;
  for await (const message of readUIMessageStream<MemoryUIMessage>({ stream })) last = message;

  const types = (last?.parts ?? []).map((part) => part.type);
  assert.ok(types.includes('text'), types.join());
  assert.ok(types.indexOf('data-om-status') < types.indexOf('text'), types.join());
  const status = last?.parts.find((part) => part.type === 'data-om-status');
  assert.equal(status?.type === 'data-om-status' && status.data.threadId, threadId);
});

test('a call may name its thread and a message its id (providerOptions.om)', async (t) => {
  const env = servers(t);
  if (!env) return;
  const fake = new FakeModel(env.openai);
  await fake.reset();
  const resourceId = uid('r');
  const client = new MemoryClient({ apiUrl: env.api, resourceId });
  const model = wrapLanguageModel({
    model: fakeProvider(fake).chatModel('fake-model'),
    middleware: observationalMemory({ client }),
  });
  const threadId = uid('t');
  const message = {
    role: 'user' as const,
    content: 'Book the 9:00 train.',
    providerOptions: { om: { messageId: 'msg_booking_1' } },
  };

  await generateText({ model, messages: [message], providerOptions: { om: { threadId } } });
  await generateText({ model, messages: [message], providerOptions: { om: { threadId } } }); // the app retries

  const stored = (await client.messages(threadId)).messages;
  assert.deepEqual(stored.map((m) => m.id).slice(0, 1), ['msg_booking_1']);
  assert.equal(stored.filter((m) => m.role === 'user').length, 1);
  const sent = (await fake.requests()).at(-1)!;
  assert.ok(!JSON.stringify(sent).includes('"om"'), 'providerOptions.om is not passed on to the provider');
});

test('the example agent answers, streaming or not, and remembers', async (t) => {
  const env = servers(t);
  if (!env) return;
  const fake = new FakeModel(env.openai);
  await fake.reset();
  await fake.script({ text: 'Hello Ana, noted.' }, { text: 'You are Ana.' });
  const resourceId = uid('r');
  const threadId = uid('t');
  const args = ['--api-url', env.api, '--resource-id', resourceId, '--thread-id', threadId, '--model', 'fake-model'];
  const options = { env: { ...process.env, OPENAI_BASE_URL: fake.baseURL, OPENAI_API_KEY: 'test' }, timeout: 60_000 };

  const streamedRun = await run(process.execPath, [EXAMPLE, ...args, '--message', 'I am Ana.'], options);
  const generatedRun = await run(process.execPath, [EXAMPLE, ...args, '--generate', '--message', 'Who am I?'], options);

  assert.match(streamedRun.stdout, /assistant: Hello Ana, noted\./);
  assert.match(streamedRun.stderr, /\[memory: /);
  assert.match(generatedRun.stdout, /assistant: You are Ana\./);
  const stored = [];
  for await (const message of new MemoryClient({ apiUrl: env.api, resourceId }).iterMessages(threadId))
    stored.push(textOf(message));
  assert.deepEqual(stored, ['I am Ana.', 'Hello Ana, noted.', 'Who am I?', 'You are Ana.']);
});
