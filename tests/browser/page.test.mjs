// The page in headless Chromium: a newcomer's flow, shared links, the Hub's failure modes
// (gated, malformed, unreachable), exports, keyboard use, and screenshots of the main views
// (build/screenshots). Every huggingface.co request is answered from fixtures/.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { siteSession, hermeticContext, openPage, screenshot, fixture, ROOT } from './harness.mjs';

const session = siteSession();
let hubMode = 'up';
const TOKEN = 'hf_test_token_123';
const llama70b = await readFile(path.join(ROOT, 'data/configs/meta-llama--Llama-3.1-70B.json'), 'utf8');

/** The fake Hub. */
async function hub(url, request) {
  if (hubMode === 'down') return 'abort';
  const p = url.pathname;
  const routes = {
    '/Qwen/Qwen2.5-Coder-7B-Instruct/resolve/main/config.json': () => fixture('qwen2.5-7b.config.json'),
    '/api/models/Qwen/Qwen2.5-Coder-7B-Instruct': () => fixture('qwen2.5-coder-7b.api.json'),
    '/TheBloke/Llama-2-7B-GPTQ/resolve/main/config.json': () => fixture('llama-2-7b-gptq.config.json'),
    '/api/models/TheBloke/Llama-2-7B-GPTQ': () => fixture('llama-2-7b-gptq.api.json'),
    '/broken/config/resolve/main/config.json': async () => '{"model_type": "llama", "hidden_size": 4096,',
    '/broken/sizes/resolve/main/config.json': async () => '{"model_type": "llama"}',
  };
  if (p.startsWith('/meta-llama/Llama-3.1-70B-Instruct/') || p === '/api/models/meta-llama/Llama-3.1-70B-Instruct') {
    const auth = (await request.allHeaders()).authorization;
    if (auth !== `Bearer ${TOKEN}`) return { status: 401, body: '{"error":"Access to model is restricted."}' };
    return { body: p.startsWith('/api/') ? '{}' : llama70b };
  }
  return routes[p] ? { body: await routes[p]() } : { status: 404, body: '{"error":"Repository not found"}' };
}


async function fresh(options = { viewport: { width: 1366, height: 900 } }, url = session.server.url) {
  const env = await hermeticContext(session.browser, session.server.url, hub, options);
  const { page, errors } = await openPage(env.context, url);
  return { ...env, page, errors };
}
const text = (page, sel) => page.locator(sel).innerText();
const gridLabels = (page) => page.locator('#grid tbody th').allInnerTexts();
const waitStatus = (page, re) => page.waitForFunction((src) => new RegExp(src, 'i').test(document.querySelector('#model-status').textContent), re.source);

async function setField(page, selector, value) {
  const el = page.locator(selector);
  if ((await el.evaluate((e) => e.tagName)) === 'SELECT') await el.selectOption(value);
  else await el.fill(String(value));
}
/** Changes a field and waits for the recomputation it causes. */
async function change(page, selector, value) {
  const before = Number(await page.evaluate(() => document.body.dataset.computed));
  await setField(page, selector, value);
  await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before);
}

test('a newcomer types a Hub id and results appear', async () => {
  hubMode = 'up';
  const { page, errors, hubRequests, leaks, context } = await fresh();
  await page.fill('#model', 'https://huggingface.co/Qwen/Qwen2.5-Coder-7B-Instruct/tree/main');
  await page.press('#model', 'Enter');
  await waitStatus(page, /From huggingface\.co · qwen2 · 7\.62B parameters/);
  await page.waitForFunction(() => document.querySelector('#recommendation').textContent.includes('Recommended'));
  assert.match(await text(page, '#model-status'), /Hub safetensors: 7\.62B stored as BF16/);
  assert.ok((await gridLabels(page)).length >= 2);
  assert.match(await text(page, '#detail'), /Allocated[\s\S]*Reserved[\s\S]*nvidia-smi/);
  assert.ok(hubRequests.some((r) => r.url === 'https://huggingface.co/Qwen/Qwen2.5-Coder-7B-Instruct/resolve/main/config.json'));
  assert.match(page.url(), /model=Qwen%2FQwen2\.5-Coder-7B-Instruct/);
  await screenshot(page, 'desktop-hub-model');
  assert.deepEqual(errors, []);
  assert.deepEqual(leaks, []);
  await context.close();
});

test('changing the GPU count changes the grid, and a shared link reproduces the result', async () => {
  const { page, errors, context } = await fresh();
  await change(page, '#model', 'meta-llama/Llama-3.1-8B');
  const one = await gridLabels(page);
  await change(page, '#gpus', 8);
  const eight = await gridLabels(page);
  assert.notDeepEqual(eight, one);
  assert.ok(eight.includes('tp 8') || eight.some((l) => l.startsWith('zero3')), eight.join(', '));
  assert.match(await text(page, '#recommendation'), /on 8 × NVIDIA A100/);
  await change(page, '#task', 'lora');
  await change(page, '#seq', 4096);
  // Pick a cell with the keyboard: focus the grid, move right, press Enter.
  await page.locator('#grid td.cell[tabindex="0"]').focus();
  await page.keyboard.press('ArrowDown');
  await page.keyboard.press('ArrowRight');
  const target = await page.evaluate(() => ({ label: document.activeElement.dataset.label, mbs: document.activeElement.dataset.mbs }));
  await page.keyboard.press('Enter');
  await page.waitForFunction((t) => document.querySelector('#detail-title')?.textContent.startsWith(`${t.label} · micro-batch ${t.mbs}`), target);
  await screenshot(page, 'desktop-8-gpus-selected');

  const shared = page.url();
  const snapshot = async (p) => ({ reco: await text(p, '#recommendation'), grid: await text(p, '#grid'), detail: await text(p, '#detail'),
    form: await p.evaluate(() => [...document.querySelectorAll('#setup [name]')].map((e) => `${e.name}=${e.type === 'checkbox' ? e.checked : e.value}`)) });
  const original = await snapshot(page);
  const other = await fresh(undefined, shared);
  assert.deepEqual(await snapshot(other.page), original);
  assert.deepEqual([...errors, ...other.errors], []);
  await other.context.close();
  await context.close();
});

test('copy link, JSON and Markdown exports', async () => {
  const { page, context } = await fresh({ viewport: { width: 1366, height: 900 }, permissions: ['clipboard-read', 'clipboard-write'] });
  await change(page, '#gpus', 4);
  await page.click('#copy-link');
  await page.waitForSelector('#toast.show');
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), page.url());
  const [json] = await Promise.all([page.waitForEvent('download'), page.click('#export-json')]);
  const exported = JSON.parse(await readFile(await json.path(), 'utf8'));
  assert.equal(exported.request.num_gpus, 4);
  assert.equal(exported.plan.num_gpus, 4);
  assert.ok(exported.estimate.per_gpu.breakdown.length > 0);
  const [md] = await Promise.all([page.waitForEvent('download'), page.click('#export-md')]);
  const markdown = await readFile(await md.path(), 'utf8');
  assert.match(markdown, /^# memfit: meta-llama\/Llama-2-7b-hf on 4 × NVIDIA A100 SXM 80GB/);
  assert.match(markdown, /\| Layout \| Max micro-batch \| GiB per GPU \| Tokens\/s \| CPU RAM GiB \|/);
  assert.match(markdown, /\[Open in memfit\]\(http:\/\/127\.0\.0\.1/);
  await context.close();
});

test('a gated model answering 401 explains the licence and the token; the token is sent only to the Hub', async () => {
  const { page, hubRequests, context } = await fresh();
  await page.fill('#model', 'meta-llama/Llama-3.1-70B-Instruct');
  await page.press('#model', 'Enter');
  await waitStatus(page, /gated or private \(HTTP 401\)/);
  const message = await text(page, '#model-status');
  assert.match(message, /Accept its licence on huggingface\.co\/meta-llama\/Llama-3\.1-70B-Instruct/);
  assert.match(message, /Hub token/);
  assert.ok(await page.locator('#error').isVisible());
  // the model page where the licence is accepted is a link
  assert.equal(await page.locator('#error a').first().getAttribute('href'), 'https://huggingface.co/meta-llama/Llama-3.1-70B-Instruct');
  // the Serve panel waits for the model instead of showing a grid of ✗ (which reads as "nothing fits")
  await page.waitForFunction(() => /wait for the model above/.test(document.querySelector('#serve-summary').textContent));
  assert.equal(await page.locator('#serve-grid td').count(), 0);
  await screenshot(page, 'desktop-gated');
  assert.ok(await page.locator('#hf-token').isVisible(), 'a gated answer opens the token field');
  await page.fill('#hf-token', TOKEN);
  await page.locator('#hf-token').press('Tab'); // change event
  await waitStatus(page, /From huggingface\.co · llama · 70\.55B parameters/);
  // ... and sizes the config fetched from the Hub once it loads (not bundled: no id would do)
  await page.waitForFunction(() => /model weights/.test(document.querySelector('#serve-summary').textContent));
  assert.ok(await page.locator('#serve-error').isHidden());
  assert.equal(await page.locator('#serve-grid td').count(), 63);  // 70B in bf16 fits no context on one 80 GB GPU
  assert.equal(await page.evaluate(() => sessionStorage.getItem('memfit.hfToken')), TOKEN);
  assert.ok(hubRequests.some((r) => r.headers.authorization === `Bearer ${TOKEN}`));
  assert.ok(!page.url().includes(TOKEN), 'the token must not be in the URL');
  await context.close();
});

test('a malformed config gives a clear error (from the Hub, pasted, and one without sizes)', async () => {
  const { page, context } = await fresh();
  await page.fill('#model', 'broken/config');
  await page.press('#model', 'Enter');
  await waitStatus(page, /config\.json for broken\/config is not valid JSON/);
  await page.fill('#model', 'broken/sizes');
  await page.press('#model', 'Enter');
  await page.waitForFunction(() => !document.querySelector('#error').hidden &&
    /hidden_size|num_hidden_layers|size/i.test(document.querySelector('#error').textContent));
  await page.click('#config-box summary');
  await page.fill('#config-text', '{"model_type": "llama", "hidden_size": 4096,,}');
  await waitStatus(page, /not valid JSON/);
  await screenshot(page, 'desktop-malformed');
  // A good pasted config works and travels in the link.
  await page.fill('#config-text', await fixture('qwen2.5-7b.config.json'));
  await waitStatus(page, /Pasted config\.json · qwen2 · 7\.62B/);
  assert.match(page.url(), /cfg=/);
  const other = await fresh(undefined, page.url());
  await waitStatus(other.page, /config\.json from the link · qwen2 · 7\.62B/);
  await other.context.close();
  await context.close();
});

test('with the Hub unreachable the page says so and bundled models still work', async () => {
  hubMode = 'down';
  try {
    const { page, context } = await fresh();
    await page.fill('#model', 'Qwen/Qwen2.5-Coder-7B-Instruct');
    await page.press('#model', 'Enter');
    await waitStatus(page, /Could not reach huggingface\.co/);
    assert.ok(await page.locator('#config-text').isVisible(), 'an unreachable Hub opens the paste/upload box');
    assert.match(await text(page, '#model-status'), /bundled model/);
    assert.match(await text(page, '#error'), /unreachable/);
    await screenshot(page, 'desktop-offline');
    await page.fill('#model', 'Qwen/Qwen2.5-7B');
    await waitStatus(page, /Bundled config · qwen2 · 7\.62B/);
    assert.ok(await page.locator('#recommendation').isVisible());
    assert.ok(await page.locator('#error').isHidden());
    // The autocomplete offers the bundled library.
    assert.ok(await page.locator('#model-list option[value="meta-llama/Llama-3.1-8B"]').count() === 1);
    await context.close();
  } finally {
    hubMode = 'up';
  }
});

test('a pre-quantized checkpoint presets its quantization', async () => {
  const { page, context } = await fresh();
  await page.fill('#model', 'TheBloke/Llama-2-7B-GPTQ');
  await page.press('#model', 'Enter');
  await waitStatus(page, /Pre-quantized checkpoint \(GPTQ 4-bit\)/);
  assert.equal(await page.inputValue('#quant'), 'gptq_int4');
  assert.equal(await page.inputValue('#task'), 'lora');
  assert.match(await text(page, '#model-status'), /stored as I32 \+ F16/);
  await context.close();
});

test('inference view: KV cache per token and the largest batch and context', async () => {
  const { page, context } = await fresh();
  await change(page, '#task', 'inference');
  await change(page, '#gpus', 2);
  const reco = await text(page, '#recommendation');
  assert.match(reco, /KV cache per token\s*256\.0 KiB/); // Llama-2-7B: 2 (K,V) x 32 layers x 4096 x 2 B, halved by tp 2
  assert.match(reco, /Largest batch/);
  assert.match(reco, /Longest context/);
  assert.ok(await page.locator('#grid-card').isHidden());
  assert.ok(await page.locator('#seq').isHidden());
  await screenshot(page, 'desktop-inference');
  await context.close();
});

test('phone width: one column, nothing overflows', async () => {
  const { page, context } = await fresh({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0, `page overflows by ${overflow}px`);
  await screenshot(page, 'phone');
  await page.locator('#recommendation').scrollIntoViewIfNeeded();
  await page.evaluate(() => document.querySelector('#recommendation').scrollIntoView());
  await screenshot(page, 'phone-results', false);
  await context.close();
});

test('dark mode', async () => {
  const { page, context } = await fresh({ viewport: { width: 1366, height: 900 }, colorScheme: 'dark' });
  await change(page, '#gpus', 8);
  const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  assert.equal(bg, 'rgb(14, 17, 22)');
  await screenshot(page, 'desktop-dark');
  await context.close();
});

test('embed mode: a compact calculator for a fixed model', async () => {
  const url = `${session.server.url}?embed=1&model=meta-llama/Llama-3.1-8B&task=qlora&gpu=RTX4090-24GB`;
  const { page, errors, context } = await fresh({ viewport: { width: 720, height: 640 } }, url);
  assert.ok(await page.locator('.model-card').isHidden());
  assert.equal(await text(page, '#embed-model'), 'meta-llama/Llama-3.1-8B');
  assert.ok(await page.locator('#open-full').isVisible());
  assert.match(await text(page, '#recommendation'), /1 × NVIDIA GeForce RTX 4090 24GB/);
  assert.ok(!(await page.getAttribute('#open-full', 'href')).includes('embed=1'));
  await change(page, '#gpus', 2);
  assert.match(await text(page, '#recommendation'), /2 × NVIDIA GeForce RTX 4090/);
  await screenshot(page, 'embed');
  assert.deepEqual(errors, []);
  await context.close();
  // the hash form works too, and a big plan says how many layouts the embed leaves out
  const hashed = await fresh({ viewport: { width: 720, height: 900 } }, `${session.server.url}#embed=1&model=meta-llama/Llama-3.1-70B&gpus=16&gpu=H100-80GB`);
  assert.ok(await hashed.page.locator('.model-card').isHidden());
  assert.equal(await hashed.page.inputValue('#gpu'), 'H100-SXM-80GB', 'a GPU alias becomes the catalog entry');
  // the recommended layout's row shows even when it is not among the first six
  const { rows, selectedAt } = await hashed.page.evaluate(() => {
    const r = window.memfit.result;
    return { rows: r.plan.candidates.length, selectedAt: r.plan.candidates.findIndex((c) => c.label === r.selected.label) };
  });
  assert.ok(selectedAt >= 0);
  assert.ok(await hashed.page.locator('#grid tbody tr.has-selected td.selected').isVisible());
  assert.match(await text(hashed.page, '#grid tfoot'), new RegExp(`\\+ ${rows - 6 - (selectedAt >= 6 ? 1 : 0)} more layouts`));
  await screenshot(hashed.page, 'embed-70b-16-gpus');
  await hashed.context.close();
});
