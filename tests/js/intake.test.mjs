// The launch-config intake module (memfit-intake.wasm, loaded on the first call): byte-identical
// to the native CLI's intake for the JSON examples (JSON needs no YAML parser here; the YAML ones
// go through the page in tests/browser/intake.test.mjs), and the core's error as a MemfitError.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { load, CLI, ROOT } from './load.mjs';

const { api, MemfitError } = await load();

for (const name of ['trl-sft-args.json', 'deepspeed-zero3-offload.json']) {
  test(`intake of ${name}: the same request as memfit intake`, async () => {
    const file = path.join(ROOT, 'tests/intake', name);
    const cli = JSON.parse(execFileSync(CLI, ['intake', file, '--gpu', 'A100-80GB'], { encoding: 'utf8' }));
    const wasm = await api.intake({ config: JSON.parse(await readFile(file, 'utf8')), format: 'auto', base: { gpu: { name: 'A100-80GB' } } });
    assert.deepEqual(wasm.request, cli.request);
    assert.equal(wasm.format, cli.format);
    assert.deepEqual(Object.keys(wasm.sources).sort(), Object.keys(cli.sources).sort());
  });
}

test('intake of a tree no format matches: the core says so', async () => {
  await assert.rejects(api.intake({ config: { foo: 1 } }), (e) => e instanceof MemfitError && /none of the launch configs/.test(e.message));
});
