// How the middleware maps the AI SDK's prompt and output to the API's messages and back.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Message } from 'om-client';
import { fromModelMessage, fromModelOutput, specOf, toModelPrompt } from 'om-client/ai';

const AT = '2026-11-28T10:00:00Z';
const stored = (id: string, role: Message['role'], parts: Message['parts']): Message => ({
  id,
  role,
  createdAt: AT,
  parts,
});

test('a user message keeps its text and files, in the shapes of every AI SDK: bytes as base64, data URLs split', () => {
  const expected = [
    { type: 'text', text: 'look' },
    { type: 'image', mediaType: 'image/png', data: 'iVBORw==' },
    { type: 'file', mediaType: 'application/pdf', data: 'JVBERg==', filename: 'a.pdf' },
    { type: 'image', mediaType: 'image/jpeg', url: 'https://example.com/cat.jpg' },
  ];
  // AI SDK 7 (specification v4) tags a file's data...
  const v4 = fromModelMessage(
    {
      role: 'user',
      content: [
        { type: 'text', text: 'look' },
        { type: 'file', mediaType: 'image/png', data: { type: 'data', data: new Uint8Array([137, 80, 78, 71]) } },
        {
          type: 'file',
          mediaType: 'application/pdf',
          data: { type: 'url', url: new URL('data:application/pdf;base64,JVBERg==') },
          filename: 'a.pdf',
        },
        { type: 'file', mediaType: 'image/jpeg', data: { type: 'url', url: new URL('https://example.com/cat.jpg') } },
        { type: 'file', mediaType: 'text/plain', data: { type: 'text', text: 'héllo' }, filename: 'note.txt' },
        { type: 'file', mediaType: 'application/pdf', data: { type: 'reference', reference: { openai: 'file-1' } } },
      ],
    },
    'm1',
  );
  // ...AI SDK 5 and 6 (v2, v3) give the bytes, base64 text or URL itself.
  const v2 = fromModelMessage(
    {
      role: 'user',
      content: [
        { type: 'text', text: 'look' },
        { type: 'file', mediaType: 'image/png', data: new Uint8Array([137, 80, 78, 71]) as never },
        {
          type: 'file',
          mediaType: 'application/pdf',
          data: new URL('data:application/pdf;base64,JVBERg==') as never,
          filename: 'a.pdf',
        },
        { type: 'file', mediaType: 'image/jpeg', data: new URL('https://example.com/cat.jpg') as never },
      ],
    },
    'm1',
  );

  assert.deepEqual(v4, {
    id: 'm1',
    role: 'user',
    parts: [
      ...expected,
      { type: 'file', mediaType: 'text/plain', data: 'aMOpbGxv', filename: 'note.txt' },
      { type: 'text', text: "[file: a provider's file reference]" },
    ],
  });
  assert.deepEqual(v2, { id: 'm1', role: 'user', parts: expected });
  assert.equal(fromModelMessage({ role: 'system', content: 'app rules' }, 'm2'), undefined); // the app's, never stored
});

test('tool results keep their value and whether they failed', () => {
  const message = fromModelMessage(
    {
      role: 'tool',
      content: [
        {
          type: 'tool-result',
          toolCallId: 'c1',
          toolName: 'trains',
          output: { type: 'json', value: { train: 'IC 521' } },
        },
        {
          type: 'tool-result',
          toolCallId: 'c2',
          toolName: 'trains',
          output: { type: 'error-text', value: 'no trains' },
        },
        {
          type: 'tool-result',
          toolCallId: 'c3',
          toolName: 'book',
          output: { type: 'execution-denied', reason: 'the user said no' },
        },
      ],
    },
    'm3',
  );

  assert.deepEqual(message?.parts, [
    { type: 'tool-result', toolCallId: 'c1', toolName: 'trains', result: { train: 'IC 521' } },
    { type: 'tool-result', toolCallId: 'c2', toolName: 'trains', result: 'no trains', isError: true },
    { type: 'tool-result', toolCallId: 'c3', toolName: 'book', result: 'the user said no', isError: true },
  ]);
});

test('a call output becomes one assistant message: text, reasoning, tool calls with their JSON arguments, files', () => {
  const [message, ...rest] = fromModelOutput([
    { type: 'reasoning', text: 'the user wants trains' },
    { type: 'text', text: 'Checking.' },
    { type: 'tool-call', toolCallId: 'c1', toolName: 'trains', input: '{"to":"Porto"}' },
    { type: 'source', sourceType: 'url', id: 's1', url: 'https://cp.pt' },
    { type: 'file', mediaType: 'image/png', data: { type: 'data', data: 'iVBORw==' } }, // AI SDK 7's shape
    { type: 'file', mediaType: 'image/png', data: 'iVBORw==' as never }, // 5's and 6's
  ]);

  assert.equal(rest.length, 0);
  assert.equal(message?.role, 'assistant');
  assert.match(message?.id ?? '', /^msg_/);
  assert.deepEqual(message?.parts, [
    { type: 'reasoning', text: 'the user wants trains' },
    { type: 'text', text: 'Checking.' },
    { type: 'tool-call', toolCallId: 'c1', toolName: 'trains', args: { to: 'Porto' } },
    { type: 'image', mediaType: 'image/png', data: 'iVBORw==' },
    { type: 'image', mediaType: 'image/png', data: 'iVBORw==' },
  ]);
  assert.deepEqual(fromModelOutput([{ type: 'text', text: '' }]), []);
});

test('what memory shows the model keeps tool calls and results in pairs and files it can read', () => {
  const messages = [
    stored('m1', 'user', [
      { type: 'text', text: 'Here is my boarding pass.' },
      { type: 'image', mediaType: 'image/png', url: 's3://bucket/k/pass.png', filename: 'pass.png' },
      { type: 'image', mediaType: 'image/png', url: 'https://example.com/map.png' },
      { type: 'file', mediaType: 'application/pdf', data: 'JVBERg==', filename: 'ticket.pdf' },
    ]),
    // An observation covered this call's pair partly: the result of c0 is gone, the call of c9 too.
    stored('m2', 'assistant', [
      { type: 'reasoning', text: 'hmm' },
      { type: 'text', text: 'Let me check.' },
      { type: 'tool-call', toolCallId: 'c0', toolName: 'gates', args: {} },
      { type: 'tool-call', toolCallId: 'c1', toolName: 'gates', args: { flight: 'TP1' } },
    ]),
    stored('m3', 'tool', [
      { type: 'tool-result', toolCallId: 'c1', toolName: 'gates', result: { gate: 'B4' } },
      { type: 'tool-result', toolCallId: 'c9', toolName: 'gates', result: 'orphan' },
    ]),
    stored('m4', 'system', [{ type: 'text', text: 'similar earlier messages: ...' }]),
  ];
  const rest = [
    {
      role: 'assistant',
      content: [
        { type: 'text', text: 'Let me check.' },
        { type: 'tool-call', toolCallId: 'c1', toolName: 'gates', input: { flight: 'TP1' } },
      ],
    },
    {
      role: 'tool',
      content: [
        { type: 'tool-result', toolCallId: 'c1', toolName: 'gates', output: { type: 'json', value: { gate: 'B4' } } },
      ],
    },
    { role: 'system', content: 'similar earlier messages: ...' },
  ];
  const placeholder = { type: 'text', text: '[image pass.png at s3://bucket/k/pass.png]' };

  // AI SDK 7 (specification v4): file data tagged.
  assert.deepEqual(toModelPrompt(messages, 'v4'), [
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Here is my boarding pass.' },
        placeholder,
        { type: 'file', mediaType: 'image/png', data: { type: 'url', url: new URL('https://example.com/map.png') } },
        {
          type: 'file',
          mediaType: 'application/pdf',
          data: { type: 'data', data: 'JVBERg==' },
          filename: 'ticket.pdf',
        },
      ],
    },
    ...rest,
  ]);
  // AI SDK 5 and 6 (v2, v3): the URL or base64 text itself.
  assert.deepEqual(toModelPrompt(messages, 'v3'), [
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Here is my boarding pass.' },
        placeholder,
        { type: 'file', mediaType: 'image/png', data: new URL('https://example.com/map.png') },
        { type: 'file', mediaType: 'application/pdf', data: 'JVBERg==', filename: 'ticket.pdf' },
      ],
    },
    ...rest,
  ]);
  assert.equal(specOf({ specificationVersion: 'v2' }), 'v2');
  assert.equal(specOf({ specificationVersion: 'v4' }), 'v4');
});
