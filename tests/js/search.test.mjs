// The page's forgiving model search (web/search.js) over the real bundled ids: names the way
// people type them resolve to one model; a family name lists its models; nothing else matches.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { ROOT } from './load.mjs';
import { searchModels } from '../../web/search.js';

const files = await readdir(path.join(ROOT, 'data/configs'));
const ids = files.filter((f) => f.endsWith('.json') && f.includes('--')).map((f) => f.slice(0, -5).replace('--', '/'));

test('names typed the way people say them resolve to their model', () => {
  assert.equal(searchModels('llama 3.1 8b', ids).exact, 'meta-llama/Llama-3.1-8B');
  assert.equal(searchModels('Qwen2.5-7B', ids).exact, 'Qwen/Qwen2.5-7B');
  assert.equal(searchModels('QWEN/qwen2.5-7b', ids).exact, 'Qwen/Qwen2.5-7B');
  assert.equal(searchModels('  meta-llama/Llama-3.1-8B ', ids).exact, 'meta-llama/Llama-3.1-8B');
});

test('a family name lists every match, shortest first, and resolves none', () => {
  const { exact, matches } = searchModels('mixtral', ids);
  assert.equal(exact, null);
  assert.ok(matches.length >= 2 && matches.every((id) => /mixtral/i.test(id)), matches.join());
  assert.deepEqual(matches, [...matches].sort((a, b) => a.length - b.length || a.localeCompare(b)));
});

test('no match, and an empty query, give nothing', () => {
  assert.deepEqual(searchModels('no such model 9000', ids), { exact: null, matches: [] });
  assert.deepEqual(searchModels('', ids), { exact: null, matches: [] });
});

test('a full Hub id that is not bundled is offered its bundled look-alikes but never resolved to one', () => {
  // only the Instruct model is bundled: the base model's id must go to the Hub, not load the Instruct
  const { exact, matches } = searchModels('allenai/OLMo-2-1124-7B', ids);
  assert.equal(exact, null);
  assert.deepEqual(matches, ['allenai/OLMo-2-1124-7B-Instruct']);
  // without an org the same words name the bundled model
  assert.equal(searchModels('olmo 2 1124 7b', ids).exact, 'allenai/OLMo-2-1124-7B-Instruct');
});
