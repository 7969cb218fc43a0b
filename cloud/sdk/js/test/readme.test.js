// The README's TypeScript examples are compiled as part of types/check.ts
// (tests/tests/sdks.rs runs tsc on it), which holds a copy of each: this
// keeps the copies from drifting away from the README, so that an example
// that would not compile cannot hide there.

import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import test from 'node:test';

const readme = await readFile(new URL('../README.md', import.meta.url), 'utf8');
const check = await readFile(new URL('../types/check.ts', import.meta.url), 'utf8');

/** Lines without their indentation, blank ones left out: check.ts nests the examples in blocks. */
function lines(text) {
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '');
}

const examples = [...readme.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((match) => match[1]);

test('the README has TypeScript examples', () => {
  assert.ok(examples.length >= 5, `found ${examples.length} ts blocks in README.md`);
});

test('types/check.ts compiles every TypeScript example of the README', () => {
  const checked = lines(check);
  const joined = `\n${checked.join('\n')}\n`;
  for (const example of examples) {
    // Imports must sit at the top of a module, so check.ts has them there.
    const imports = lines(example).filter((line) => line.startsWith('import '));
    const body = lines(example).filter((line) => !line.startsWith('import '));
    for (const line of imports) {
      assert.ok(checked.includes(line), `types/check.ts lacks the README's ${line}`);
    }
    assert.ok(
      joined.includes(`\n${body.join('\n')}\n`),
      `types/check.ts lacks this README example, line for line:\n${example}`,
    );
  }
});
