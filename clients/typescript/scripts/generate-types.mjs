#!/usr/bin/env node
// Generates src/generated/openapi.ts from a running server's OpenAPI document with openapi-typescript.
//
//   node scripts/generate-types.mjs [--url http://127.0.0.1:8787] [--check]
//
// --url defaults to $OM_API_URL, then the local stack's default address. --check writes nothing: it exits 1 when
// the checked-in file differs from a fresh generation (the test suite runs it against `om serve`).
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import openapiTS, { COMMENT_HEADER, astToString } from 'openapi-typescript';

const TARGET = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'generated', 'openapi.ts');

const { values } = parseArgs({
  options: {
    url: { type: 'string', default: process.env.OM_API_URL ?? 'http://127.0.0.1:8787' },
    check: { type: 'boolean', default: false },
  },
});

async function generate(apiUrl) {
  const address = `${apiUrl.replace(/\/+$/, '')}/openapi.json`;
  let response;
  try {
    response = await fetch(address, { headers: { accept: 'application/json' } });
  } catch (error) {
    throw new Error(`could not reach ${address} (${error.cause?.code ?? error.message}): start the server (om serve)`);
  }
  if (!response.ok) throw new Error(`GET ${address} answered ${response.status}`);
  const document = await response.json();
  // A field with a default is optional in a request body (the server fills it in), not required.
  const ast = await openapiTS(document, { silent: true, defaultNonNullable: false });
  return COMMENT_HEADER + astToString(ast);
}

const fresh = await generate(values.url);
if (values.check) {
  const current = await readFile(TARGET, 'utf8').catch(() => '');
  if (current !== fresh) {
    console.error(
      `src/generated/openapi.ts differs from the types generated from ${values.url}/openapi.json: ` +
        'run `npm run generate` against the current server and commit the result',
    );
    process.exit(1);
  }
  console.log('src/generated/openapi.ts is up to date');
} else {
  await writeFile(TARGET, fresh);
  console.log(`wrote ${TARGET}`);
}
