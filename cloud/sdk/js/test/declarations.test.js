// index.d.ts is written by hand: this keeps it from drifting away from
// what index.js really exports.

import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import test from 'node:test';

import * as sdk from '../index.js';

const declarations = await readFile(new URL('../index.d.ts', import.meta.url), 'utf8');

/** The body of `export declare class NAME ... { ... }` (bodies hold no nested braces). */
function classBody(name) {
  const start = declarations.search(new RegExp(`export declare class ${name}\\b`));
  assert.ok(start >= 0, `index.d.ts declares no class ${name}`);
  const open = declarations.indexOf('{\n', start);
  const close = declarations.indexOf('\n}\n', open);
  return declarations.slice(open, close);
}

/** Members named at the start of a line of a class body: `name(`, `name<`, `readonly name:`. */
function members(body) {
  const names = new Set();
  for (const match of body.matchAll(/^ {2}(?:readonly )?([A-Za-z_$][\w$]*)\s*[(<:?]/gm)) {
    names.add(match[1]);
  }
  return names;
}

test('index.d.ts declares every export of index.js', () => {
  for (const name of Object.keys(sdk)) {
    const declared =
      name === 'default'
        ? /^export default \w+;$/m.test(declarations)
        : new RegExp(`^export declare (?:class|const|function) ${name}\\b`, 'm').test(declarations);
    assert.ok(declared, `index.d.ts does not declare the export ${name}`);
  }
});

test('index.d.ts names every method and accessor of the client', () => {
  const declared = members(classBody('Opgraph'));
  const actual = Object.getOwnPropertyNames(sdk.Opgraph.prototype).filter(
    (name) => name !== 'constructor',
  );
  assert.ok(actual.length >= 14);
  for (const name of actual) {
    assert.ok(declared.has(name), `index.d.ts does not declare Opgraph#${name}`);
  }
  for (const name of declared) {
    if (name === 'constructor') continue;
    assert.ok(actual.includes(name), `index.d.ts declares Opgraph#${name}, which index.js lacks`);
  }
});

test('index.d.ts names every field of the API error', () => {
  const error = new sdk.OpgraphApiError({ status: 400, code: 'x', message: 'm' });
  const declared = members(classBody('OpgraphApiError'));
  for (const name of Object.keys(error)) {
    assert.ok(declared.has(name), `index.d.ts does not declare OpgraphApiError#${name}`);
  }
});
