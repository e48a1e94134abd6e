#!/usr/bin/env node
// `npm test`: every test with the AI SDK this package is built with (7), then the tests that use the AI SDK again
// with each earlier major the package supports (5 and 6, installed as the aliases ai-v5 / ai-v6), so the middleware,
// the tools and the chat transport are checked on every version the peer dependency allows.
//
// Each run is Node's test runner with the spec reporter; its summary lines (`ℹ pass N`, ...) come after a heading
// naming the AI SDK version.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), '..');
const TESTS = join(PACKAGE, 'build-test', 'clients', 'typescript', 'test');
// The tests that use the AI SDK (the others use only this package's client).
const AI_SDK_TESTS = ['agent.test.js', 'middleware.test.js', 'stream.test.js'];
const EARLIER_MAJORS = [
  { major: '5', alias: 'ai-v5' },
  { major: '6', alias: 'ai-v6' },
];

function version(name) {
  return JSON.parse(readFileSync(join(PACKAGE, 'node_modules', name, 'package.json'), 'utf8')).version;
}

function run(heading, files, env) {
  console.log(`\n# ${heading}`);
  const done = spawnSync(process.execPath, ['--test', '--test-reporter=spec', ...files], {
    cwd: PACKAGE,
    env: { ...process.env, ...env },
    stdio: 'inherit',
  });
  return done.status === 0;
}

const all = readdirSync(TESTS)
  .filter((name) => name.endsWith('.test.js'))
  .sort()
  .map((name) => join(TESTS, name));
const results = [run(`AI SDK ${version('ai')}: every test`, all, { OM_TEST_AI_MAJOR: '7' })];
const hook = new URL('../test/ai-sdk-version.mjs', import.meta.url).href;
for (const { major, alias } of EARLIER_MAJORS) {
  const files = AI_SDK_TESTS.map((name) => join(TESTS, name));
  const env = {
    OM_TEST_AI_MAJOR: major,
    NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import=${hook}`.trim(),
  };
  results.push(run(`AI SDK ${version(alias)}: the tests that use the AI SDK`, files, env));
}
process.exit(results.every(Boolean) ? 0 : 1);
