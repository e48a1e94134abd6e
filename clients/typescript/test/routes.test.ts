// Every route against the local stack (`om serve`), over real HTTP, with typed results; SigV4 through a stand-in for
// API Gateway that checks every signature with botocore; retries after a dropped answer store once.
import assert from 'node:assert/strict';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import {
  BufferingDisabled,
  Forbidden,
  MemoryClient,
  MessageConflict,
  partsOf,
  statusOf,
  textOf,
  ThreadExists,
  ThreadNotFound,
  userMessage,
  ValidationFailed,
  type Message,
  type StepResult,
} from 'om-client';
import { iamAuth } from 'om-client/iam';
import { servers, uid } from './helpers.js';

const LONG = 'I am planning a three week trip through Portugal with my sister; we love trains, old towns and seafood. ';

async function until<T>(read: () => Promise<T>, done: (value: T) => boolean, seconds = 20): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await read();
    if (done(value) || Date.now() > deadline) return value;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

test('a conversation round-trips: steps, a tool round in a turn, a retried step stored once, a conflict refused', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const thread = uid('t');

  const question = userMessage('Which trains go from Lisbon to Porto?');
  const step: StepResult = await om.step(thread, [question]);
  const again = await om.step(thread, [question]);
  const call = {
    role: 'assistant' as const,
    parts: [{ type: 'tool-call' as const, toolCallId: 'c1', toolName: 'trains', args: { to: 'Porto' } }],
  };
  const result = {
    role: 'tool' as const,
    parts: [{ type: 'tool-result' as const, toolCallId: 'c1', toolName: 'trains', result: ['IC 521'] }],
  };
  const turn = await om.turn(thread, [call, result, 'The IC 521 leaves at 9:00.']);

  assert.equal(step.threadId, thread);
  assert.ok(statusOf(step.parts)?.windows.active.messages.threshold);
  assert.deepEqual(
    again.messages.map((m) => m.id),
    [question.id],
  );
  assert.equal(turn.saved.length, 3);
  const history = await om.messages(thread);
  assert.deepEqual(
    history.messages.map((m) => m.role),
    ['user', 'assistant', 'tool', 'assistant'],
  );
  assert.deepEqual(history.messages[2]!.parts[0], {
    type: 'tool-result',
    toolCallId: 'c1',
    toolName: 'trains',
    result: ['IC 521'],
    isError: false,
  });
  assert.equal(textOf(history.messages[3]!), 'The IC 521 leaves at 9:00.');
  assert.ok(history.messages.every((m) => ['observed', 'buffered', 'unobserved'].includes(m.omStatus)));

  await assert.rejects(om.step(thread, [userMessage('something else', { id: question.id })]), MessageConflict);
  assert.equal((await om.messages(thread)).messages.length, 4);
});

test('memory observes; queries, recall, generations and pages read it back', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const thread = uid('t');
  for (let n = 0; n < 3; n += 1) {
    await om.step(thread, [`${LONG.repeat(6)} Note ${n}.`]);
    await om.turn(thread, [`Noted ${n}.`]);
  }

  const memory = await until(
    async () => (await om.step(thread), om.memory(thread)),
    (m) => m.observations.includes('Portugal'),
  );
  const step = await om.step(thread);
  const generations = await om.memoryGenerations(thread, { limit: 5 });
  const first = await om.messages(thread, { perPage: 2 });
  const all: Message[] = [];
  for await (const message of om.iterMessages(thread, { perPage: 2 })) all.push(message);
  const newest = await om.messages(thread, { perPage: 2, direction: 'DESC' });
  const around = await om.queryMessages(thread, {
    perPage: 0,
    include: [{ id: first.messages[1]!.id, withNextMessages: 1 }],
  });
  const recalled = await om.recall(thread, { limit: 2 });
  const searched = await om.queryMessages(thread, { vectorSearchString: 'Note 2 Portugal seafood' });

  assert.match(memory.observations, /Portugal/);
  assert.equal(memory.thresholds.messageTokens, 300);
  assert.match(step.system, /Portugal/);
  assert.ok(step.tools.some((tool) => tool.name === 'recall'));
  assert.ok(generations.generations.length >= 1 && generations.generations[0]!.current);
  assert.ok(first.hasMore && first.messages.length === 2);
  assert.equal(all.length, 6);
  // Newest first: page 0 holds the two newest, newest at the top
  assert.deepEqual(
    newest.messages.map((m) => m.id),
    [all[5]!.id, all[4]!.id],
  );
  assert.ok(newest.hasMore);
  assert.deepEqual(around.messages.map((m) => m.id).slice(0, 1), [first.messages[1]!.id]);
  assert.equal(around.messages.length, 2);
  assert.equal(recalled.count, 2);
  assert.match(recalled.messages ?? '', /Portugal/);
  assert.ok(searched.messages.length >= 1);
});

test('threads, working memory, attachments, deletes and erasure', async (t) => {
  const env = servers(t);
  if (!env) return;
  const resourceId = uid('r');
  const om = new MemoryClient({ apiUrl: env.api, resourceId });

  const created = await om.createThread({ title: 'Trip', metadata: { topic: 'travel' } });
  await om.step(created.id, ['We land in Lisbon on May 3rd.', 'Then Porto.']);
  await assert.rejects(om.createThread({ threadId: created.id }), ThreadExists);
  const renamed = await om.updateThread(created.id, { title: 'Portugal trip' });
  const clone = await om.cloneThread(created.id, { title: 'Copy' });
  const listed = await om.listThreads({ metadata: { topic: 'travel' } });
  const working = await om.updateWorkingMemory('# User\n- lands in Lisbon on May 3rd', { threadId: created.id });
  const resourceWorking = await om.getWorkingMemory();
  const png = new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10, ...new Array(16).fill(0)]);
  const part = await om.uploadAttachment(created.id, png, { filename: 'pass.png', mediaType: 'image/png' });
  const withImage = await om.step(created.id, [{ role: 'user', parts: [part] }]);
  const firstId = (await om.messages(created.id)).messages[0]!.id;
  await om.deleteMessages(created.id, [firstId]);

  assert.equal(renamed.title, 'Portugal trip');
  assert.deepEqual(renamed.metadata, { topic: 'travel' });
  assert.ok(clone.thread.metadata.clonedFrom);
  assert.deepEqual(clone.clonedMessages.map(textOf), ['We land in Lisbon on May 3rd.', 'Then Porto.']);
  assert.deepEqual(new Set(listed.threads.map((th) => th.id)), new Set([created.id, clone.thread.id]));
  assert.equal(working.format, 'markdown');
  assert.match(String((await om.getWorkingMemory({ threadId: created.id })).workingMemory), /May 3rd/);
  assert.ok(['thread', 'resource'].includes(resourceWorking.scope));
  assert.equal(part.type, 'image');
  assert.match(part.url ?? '', /^s3:\/\//);
  assert.equal(withImage.messages.at(-1)!.parts[0]!.type, 'image');
  assert.ok(!(await om.messages(created.id)).messages.some((m) => m.id === firstId));

  await om.deleteThread(created.id);
  await assert.rejects(om.getThread(created.id), ThreadNotFound);
  await assert.rejects(om.memory(clone.thread.id, { resourceId: uid('someone-else') }), ThreadNotFound);
  await om.deleteResource();
  assert.deepEqual((await om.listThreads()).threads, []);
});

test('memory work on demand: imported history observed without joining the thread, reflect, buffer refused', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });
  const { id: thread } = await om.createThread();
  await om.step(thread, ['Hello again.']);
  const history = [
    userMessage('My sister moved to Porto last spring.', { createdAt: '2019-05-04T08:00:00Z' }),
    { role: 'assistant' as const, content: 'How does she like it?', createdAt: '2019-05-04T08:01:00Z' },
  ];

  const imported = await om.observe(thread, history);
  const again = await om.observe(
    thread,
    history.map((m) => ({ ...m, id: uid('m') })),
  ); // other ids, the same import
  const afterImport = await om.memory(thread);
  const listed = await om.messages(thread);
  const own = await om.observe(thread); // the thread's own unobserved message, below the threshold
  const before = await om.memoryGenerations(thread);
  const reflected = await om.reflect(thread);
  const generations = await om.memoryGenerations(thread);
  const refused = await om.buffer(thread).catch((e: unknown) => e); // this stack buffers nothing

  assert.equal(imported.status, 'done');
  assert.equal(partsOf(imported.parts, 'data-om-observation-end').length, 1);
  assert.equal(again.status, 'nothing_to_do');
  // The imported history is in memory, dated by its own times, and not among the thread's messages.
  assert.match(afterImport.observations, /Porto/);
  assert.match(afterImport.observations, /May 4, 2019/);
  assert.deepEqual(listed.messages.map(textOf), ['Hello again.']);
  assert.equal(listed.messages[0]!.omStatus, 'unobserved');
  assert.equal(own.status, 'done');
  assert.equal((await om.messages(thread)).messages[0]!.omStatus, 'observed');
  // Reflecting made a new generation whose observations still hold the imported fact.
  assert.equal(reflected.status, 'done', JSON.stringify(reflected.parts));
  assert.equal(reflected.generationCount, before.generations[0]!.generation + 1);
  assert.deepEqual(
    [generations.generations[0]!.generation, generations.generations[0]!.trigger],
    [reflected.generationCount, 'reflection'],
  );
  assert.match((await om.memory(thread)).observations, /Porto/);
  assert.ok(refused instanceof BufferingDisabled, String(refused));
  assert.equal(refused.status, 422);
  assert.match(refused.message, /observe instead/);
});

test('a title set by the app is pinned; removing it un-pins the thread', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });

  const created = await om.createThread({ title: 'Starting title' });
  const pinned = await om.updateThread(created.id, { title: 'Porto' });
  const read = await om.getThread(created.id);
  const unpinned = await om.updateThread(created.id, { title: null });

  assert.equal(created.titlePinned, false); // a title given at creation is a starting title
  assert.deepEqual([pinned.title, pinned.titlePinned], ['Porto', true]);
  assert.equal(read.titlePinned, true);
  assert.deepEqual([unpinned.title, unpinned.titlePinned], [null, false]);
  assert.ok((await om.listThreads()).threads.every((thread) => thread.titlePinned === false));
});

test('chat answers with the offline Actor; health and the OpenAPI document', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });

  const chat = await om.chat(uid('t'), userMessage('Hello, I am Ana.'));
  const health = await om.health();
  const document = await om.openapi();

  assert.equal(chat.reply?.role, 'assistant');
  assert.ok(textOf(chat.reply!).length > 0);
  assert.ok(partsOf(chat.parts, 'data-om-status').length >= 1);
  assert.equal(health.status, 'ok');
  assert.ok((document.paths as Record<string, unknown>)['/threads/{threadId}/steps']);
});

test('errors carry the code, the message that says what to fix, and the details', async (t) => {
  const env = servers(t);
  if (!env) return;
  const om = new MemoryClient({ apiUrl: env.api, resourceId: uid('r') });

  const invalid = await om.recall(uid('t'), { limit: 0 }).catch((e: unknown) => e);

  assert.ok(invalid instanceof ValidationFailed);
  assert.equal(invalid.code, 'validation_error');
  assert.equal(invalid.details[0]!.field, 'limit');
  assert.match(invalid.message, /limit/);
});

test('IAM: every call is signed with SigV4 from the credential chain, ids and queries escaped as sent', async (t) => {
  const env = servers(t);
  if (!env) return;
  // The region comes from AWS_REGION (a loopback URL names none); credentials from the environment.
  const om = new MemoryClient({ apiUrl: env.sigv4, resourceId: `acme:${uid('alice')}`, auth: iamAuth() });
  const thread = `trip(${uid('t')})*`;

  const step = await om.step(thread, ["Let's go to Óbidos!"]);
  await om.turn(thread, ['Lovely.']);
  const page = await om.messages(thread, { perPage: 10 });
  const threads = await om.listThreads({ metadata: { topic: 'day trips+más' } });

  assert.equal(step.threadId, thread);
  assert.deepEqual(page.messages.map(textOf), ["Let's go to Óbidos!", 'Lovely.']);
  assert.deepEqual(threads.threads, []);
  const forged = new MemoryClient({
    apiUrl: env.sigv4,
    resourceId: 'r',
    retries: 0,
    auth: iamAuth({
      credentials: {
        accessKeyId: process.env.AWS_ACCESS_KEY_ID!,
        secretAccessKey: 'wrong',
        sessionToken: process.env.AWS_SESSION_TOKEN!,
      },
    }),
  });
  await assert.rejects(
    forged.memory(thread),
    (error: unknown) => error instanceof Forbidden && /signature mismatch/.test(error.message),
  );
  await assert.rejects(new MemoryClient({ apiUrl: env.sigv4, resourceId: 'r' }).health(), Forbidden);
});

/** A proxy to the stack that forwards each request but drops the answer of the first matching request to each
 * path (the request reached the server and did its work; the client only sees the connection close). */
async function droppingProxy(target: string, matches: (method: string, path: string) => boolean) {
  const upstream = new URL(target);
  const dropped = new Set<string>();
  const server = createServer((incoming, outgoing) => {
    const forward = httpRequest(
      {
        host: upstream.hostname,
        port: upstream.port,
        path: incoming.url,
        method: incoming.method,
        headers: { ...incoming.headers, host: upstream.host }, // `om serve` answers only for its own name
      },
      (answer) => {
        const key = `${incoming.method} ${incoming.url}`;
        if (matches(incoming.method ?? '', incoming.url ?? '') && !dropped.has(key)) {
          dropped.add(key);
          answer.resume();
          answer.on('end', () => outgoing.socket?.destroy()); // the work is done; its answer is lost
          return;
        }
        outgoing.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(outgoing);
      },
    );
    incoming.pipe(forward);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

test('a step, a turn and a chat whose answers are dropped are retried and stored once; the chat answered once', async (t) => {
  const env = servers(t);
  if (!env) return;
  const proxy = await droppingProxy(env.api, (method, path) => method === 'POST' && /\/(steps|turns|chat)$/.test(path));
  t.after(proxy.close);
  const resourceId = uid('r');
  const om = new MemoryClient({ apiUrl: proxy.url, resourceId, retries: { backoffBaseMs: 10 } });
  const thread = uid('t');

  const step = await om.step(thread, ['Remember: my locker code is 4711.']);
  const turn = await om.turn(thread, ['Noted: 4711.']);
  const chat = await om.chat(thread, 'And my bike lock is 1234.'); // its first answer is lost: sent again

  assert.equal(step.messages.length, 1);
  assert.equal(turn.saved.length, 1);
  const direct = new MemoryClient({ apiUrl: env.api, resourceId });
  const stored = (await direct.messages(thread)).messages;
  assert.deepEqual(
    stored.slice(0, 3).map((m) => `${m.role}: ${textOf(m)}`),
    ['user: Remember: my locker code is 4711.', 'assistant: Noted: 4711.', 'user: And my bike lock is 1234.'],
  );
  // The chat ran once: its user message and one reply, the one the retry got back.
  assert.equal(stored.length, 4);
  assert.equal(chat.reply?.id, stored[3]!.id);
  assert.equal(textOf(chat.reply!), textOf(stored[3]!));
});
