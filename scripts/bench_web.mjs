#!/usr/bin/env node
// Web benchmark: the shipped module's size (gzip -9) against the 150 KB budget, and the time of
// one plan for 8 GPUs in Node and in headless Chromium (main thread, and as the page's worker
// reports it). Needs the wasm site (cmake --build --preset wasm) and `npm ci` in tests/browser.
//   node scripts/bench_web.mjs [--runs N]
import { readFile, readdir } from 'node:fs/promises';
import { gzipSync } from 'node:zlib';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SITE = path.resolve(process.env.MEMFIT_SITE ?? path.join(ROOT, 'build/wasm/site'));
const RUNS = Number(process.argv[process.argv.indexOf('--runs') + 1]) || 20;
const BUDGET = 150 * 1000;
const REQUEST = { model: { id: 'meta-llama/Llama-2-7b-hf' }, num_gpus: 8, gpu: { name: 'A100-80GB' } };

const kb = (n) => `${(n / 1000).toFixed(1)} KB`;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// ---- Size.
const sizes = {};
for (const entry of await readdir(SITE, { withFileTypes: true })) {
  const f = entry.name;
  if (f.startsWith('.') || !entry.isFile()) continue; // vendor/: the YAML parser, loaded only by the launch-config box
  const bytes = await readFile(path.join(SITE, f));
  sizes[f] = { raw: bytes.length, gz: gzipSync(bytes, { level: 9 }).length };
}
const shipped = ['memfit.wasm', 'memfit.mjs'];
const total = shipped.reduce((s, f) => s + sizes[f].gz, 0);
console.log('size (gzip -9)');
for (const f of shipped) console.log(`  ${f.padEnd(16)} ${kb(sizes[f].raw).padStart(10)} raw  ${kb(sizes[f].gz).padStart(9)} gz`);
console.log(`  wasm + glue      ${kb(total).padStart(25)} gz  (budget ${kb(BUDGET)}: ${total <= BUDGET ? 'within' : 'OVER'})`);
if (sizes['memfit-intake.wasm'])
  console.log(`  memfit-intake    ${kb(sizes['memfit-intake.wasm'].raw + sizes['memfit-intake.mjs'].raw).padStart(10)} raw  ${kb(sizes['memfit-intake.wasm'].gz + sizes['memfit-intake.mjs'].gz).padStart(9)} gz  (the launch-config intake, loaded on the first paste)`);
if (sizes['library.json'])
  console.log(`  library.json     ${kb(sizes['library.json'].raw).padStart(10)} raw  ${kb(sizes['library.json'].gz).padStart(9)} gz  (model configs, fetched at start-up)`);
const page = Object.values(sizes).reduce((s, x) => s + x.gz, 0);
console.log(`  whole site       ${kb(page).padStart(25)} gz  (${Object.keys(sizes).length} files)`);

// ---- Node.
const { loadMemfit } = await import(pathToFileURL(path.join(SITE, 'memfit-api.mjs')).href);
const api = await loadMemfit({ wasmBinary: await readFile(path.join(SITE, 'memfit.wasm')),
  library: await readFile(path.join(SITE, 'library.json'), 'utf8') });
const time = (f) => {
  const t = performance.now();
  f();
  return performance.now() - t;
};
const nodeFirst = time(() => api.plan(REQUEST));
const nodeRuns = Array.from({ length: RUNS }, () => time(() => api.plan(REQUEST)));
const candidates = api.plan(REQUEST).candidates.length;
console.log(`plan, ${REQUEST.model.id} on 8 x A100-80GB (${candidates} layouts x ${api.plan(REQUEST).grid_batches.length} micro-batches)`);
console.log(`  node ${process.version}        first ${nodeFirst.toFixed(1)} ms, median of ${RUNS} ${median(nodeRuns).toFixed(1)} ms`);

// ---- Browser.
let harness;
try {
  harness = await import('../tests/browser/harness.mjs');
} catch (e) {
  console.log(`  chromium: skipped (${e.message.split('\n')[0]}; run npm ci in tests/browser)`);
  process.exit(0);  // a benchmark prints figures; the size gate is tests/js (boundary.test.mjs)
}
const server = await harness.serve(SITE);
const browser = await harness.launch();
try {
  const { context } = await harness.hermeticContext(browser, server.url, () => 'abort');
  const { page } = await harness.openPage(context, `${server.url}#gpus=8`);
  const version = browser.version();
  const inPage = await page.evaluate(async ({ request, runs }) => {
    const { loadMemfit } = await import('./memfit-api.mjs');
    const api = await loadMemfit();
    const time = (f) => {
      const t = performance.now();
      f();
      return performance.now() - t;
    };
    const first = time(() => api.plan(request));
    const all = Array.from({ length: runs }, () => time(() => api.plan(request)));
    return { first, median: all.sort((a, b) => a - b)[Math.floor(runs / 2)] };
  }, { request: REQUEST, runs: RUNS });
  console.log(`  chromium ${version}  first ${inPage.first.toFixed(1)} ms, median of ${RUNS} ${inPage.median.toFixed(1)} ms (main thread)`);
  // What the page itself reports: recompute on input, plan in its worker.
  const workerMs = [];
  for (let i = 0; i < Math.min(RUNS, 10); i++) {
    const before = Number(await page.evaluate(() => document.body.dataset.computed));
    await page.fill('#seq', String(2048 + (i % 2) * 16));
    await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before);
    workerMs.push(await page.evaluate(() => window.memfit.planMs));
  }
  console.log(`  page (worker)             median of ${workerMs.length} recomputations ${median(workerMs).toFixed(1)} ms`);
} finally {
  await browser.close();
  await server.close();
}
process.exit(0);  // a benchmark prints figures; the size gate is tests/js (boundary.test.mjs)
