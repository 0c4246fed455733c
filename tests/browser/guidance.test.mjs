// What a new user hits first: finding a model by the name people say, errors next to the
// control in the form's words, the last result kept (marked stale) while a field is invalid,
// warnings on absurd values, "nothing fits" with the closest layout and the changes that fit,
// a core error never shown as "nothing fits", and the phone layout. Hub answered from fixtures.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { siteSession, hermeticContext, openPage, screenshot, ROOT } from './harness.mjs';
import path from 'node:path';

const session = siteSession();
let hubMode = 'up';
const olmo = await readFile(path.join(ROOT, 'tests/browser/fixtures/qwen2.5-7b.config.json'), 'utf8');

async function hub(url) {
  if (hubMode === 'down') return 'abort';
  if (url.pathname === '/api/models' && url.searchParams.get('search'))
    return { body: JSON.stringify([{ id: 'allenai/OLMo-2-1124-7B' }, { id: 'allenai/OLMo-2-1124-13B' }]) };
  if (url.pathname === '/allenai/OLMo-2-1124-7B/resolve/main/config.json') return { body: olmo };
  return { status: 404, body: '{"error":"Repository not found"}' };
}


async function fresh(hash = '', options = { viewport: { width: 1366, height: 900 } }) {
  const env = await hermeticContext(session.browser, session.server.url, hub, options);
  const { page, errors } = await openPage(env.context, `${session.server.url}${hash}`);
  return { ...env, page, errors };
}
const text = (page, sel) => page.locator(sel).innerText();
const computed = (page) => page.evaluate(() => Number(document.body.dataset.computed));
const waitText = (page, sel, re) => page.waitForFunction(([s, src]) => new RegExp(src).test(document.querySelector(s)?.textContent ?? ''), [sel, re.source]);

test('model search forgives case, spaces, hyphens and a missing org; several matches list', async () => {
  const { page, errors, hubRequests, context } = await fresh();
  for (const [typed, id] of [['llama 3.1 8b', 'meta-llama/Llama-3.1-8B'], ['Qwen2.5-7B', 'Qwen/Qwen2.5-7B']]) {
    await page.fill('#model', typed);
    await waitText(page, '#model-status', /^Bundled config/);
    await page.waitForFunction((want) => decodeURIComponent(location.hash).includes(`model=${want}`), id);
    await page.locator('#model').blur();
    assert.equal(await page.inputValue('#model'), id);
  }
  await page.fill('#model', 'mixtral');
  await waitText(page, '#model-suggest', /bundled models match "mixtral"/);
  const offered = await page.locator('#model-suggest button').allInnerTexts();
  assert.ok(offered.length >= 2 && offered.every((id) => /mixtral/i.test(id)), offered.join());
  assert.ok(await page.locator('#recommendation').isVisible(), 'the last result stays while choosing');
  assert.ok(await page.locator('#error').isHidden(), 'choosing is not an error');
  await screenshot(page, 'search-mixtral');
  const before = await computed(page);
  await page.locator('#model-suggest button').first().click();
  await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before);
  assert.equal(await page.inputValue('#model'), offered[0]);
  assert.deepEqual(hubRequests.filter((r) => r.url.includes('/resolve/')), [], 'bundled names never reach the Hub');
  assert.deepEqual(errors, []);
  await context.close();
});

test('no Hub request for a half-typed id; the Hub search lists ids; Enter loads one', async () => {
  const { page, hubRequests, context } = await fresh();
  await page.locator('#model').fill('');
  await page.locator('#model').pressSequentially('allenai/OLMo-2-1124-7B', { delay: 40 });
  await page.waitForTimeout(700);
  assert.deepEqual(hubRequests.map((r) => r.url), [], 'typing an id sends nothing to the Hub');
  assert.match(await text(page, '#model-status'), /press Enter to load it from huggingface\.co/);
  // the bundled Instruct model is offered, not silently loaded in place of the typed base model
  assert.match(await text(page, '#model-suggest'), /A bundled model close to[\s\S]*OLMo-2-1124-7B-Instruct/);
  await page.press('#model', 'Enter');
  await waitText(page, '#model-status', /From huggingface\.co · qwen2/);
  assert.equal(hubRequests.filter((r) => r.url.endsWith('/allenai/OLMo-2-1124-7B/resolve/main/config.json')).length, 1);
  // a name that no bundled model has: the Hub's search API offers ids
  await page.fill('#model', 'olmo 13b');
  await waitText(page, '#model-suggest', /On huggingface\.co/);
  assert.ok(hubRequests.some((r) => r.url.startsWith('https://huggingface.co/api/models?search=olmo%2013b')));
  assert.deepEqual(await page.locator('#model-suggest button').allInnerTexts(), ['allenai/OLMo-2-1124-7B', 'allenai/OLMo-2-1124-13B']);
  await context.close();
});

test('Hub unreachable: the paste box opens, and the model field follows a pasted or uploaded config', async () => {
  hubMode = 'down';
  try {
    const { page, context } = await fresh();
    await page.fill('#model', 'allenai/OLMo-2-1124-7B');
    await page.press('#model', 'Enter');
    await waitText(page, '#model-status', /Could not reach huggingface\.co/);
    assert.ok(await page.locator('#config-text').isVisible());
    await page.setInputFiles('#config-file', { name: 'qwen-config.json', mimeType: 'application/json', buffer: Buffer.from(olmo) });
    await waitText(page, '#model-status', /Uploaded qwen-config\.json · qwen2 · 7\.62B/);
    assert.equal(await page.inputValue('#model'), 'qwen-config.json');
    const [md] = await Promise.all([page.waitForEvent('download'), page.click('#export-md')]);
    assert.equal(md.suggestedFilename(), 'memfit-qwen-config.md');
    await page.click('#config-clear');
    await waitText(page, '#model-status', /Could not reach/);
    assert.equal(await page.inputValue('#model'), 'allenai/OLMo-2-1124-7B');
    // the upload label shows keyboard focus
    await page.locator('#config-text').focus();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement.id), 'config-file');
    const outline = await page.evaluate(() => getComputedStyle(document.querySelector('label[for="config-file"]')).outlineStyle);
    assert.equal(outline, 'solid');
    await context.close();
  } finally {
    hubMode = 'up';
  }
});

test('an invalid field: the message sits next to it in the form\'s words, the last result stays marked stale', async () => {
  const { page, errors, context } = await fresh('#model=meta-llama/Llama-3.1-8B');
  const reco = await text(page, '#recommendation');
  await page.fill('#seq', '');
  await page.waitForSelector('#seq[aria-invalid="true"]');
  assert.match(await text(page, '#msg-seq'), /^Sequence length: enter a number/);
  assert.ok(await page.locator('#recommendation').isVisible());
  assert.equal(await text(page, '#recommendation'), reco);
  assert.ok(await page.locator('#results.stale').count() === 1);
  assert.match(await text(page, '#error'), /last valid setup/);
  await screenshot(page, 'invalid-field-stale');
  await page.fill('#seq', '4096');
  await page.waitForFunction(() => !document.querySelector('#results').classList.contains('stale'));
  assert.equal(await page.locator('#seq[aria-invalid]').count(), 0);
  // a limit only the core knows: its message, in the label's words, next to the field
  await page.fill('#seq', '99999999999');
  await waitText(page, '#msg-seq', /Sequence length must be a whole number from 1 to 1,073,741,824 \(not 99,999,999,999\)/);
  await page.fill('#seq', '2048');
  // absurd but valid values: a warning, and a result
  const before = await computed(page);
  await page.fill('#gpus', '1000000');
  await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before);
  assert.match(await text(page, '#msg-gpus'), /1,000,000 is more GPUs than the largest clusters hold/);
  await page.fill('#gas', '1000000000');
  await waitText(page, '#msg-gas', /typical values are 1 to 64/);
  assert.equal(await page.locator('#results.stale').count(), 0);
  assert.deepEqual(errors, []);
  await context.close();
});

test('nothing fits: the closest layout, how far it misses, and single changes that fit, each applicable', async () => {
  const { page, errors, context } = await fresh('#model=meta-llama/Llama-3.1-70B&gpu=A100-80GB&gpus=8&seq=8192');
  await waitText(page, '#recommendation', /Nothing fits/);
  const plan = await page.evaluate(() => window.memfit.result.plan);
  const nf = plan.nothing_fits;
  const closest = plan.candidates[nf.closest_index];
  assert.equal(closest.label, nf.closest);
  assert.ok(plan.candidates.every((c) => c.per_gpu.device_total_bytes >= closest.per_gpu.device_total_bytes));
  assert.match(await text(page, '#recommendation'), new RegExp(`closest: ${closest.label.replace(/[+]/g, '\\+')}`));
  assert.match(await text(page, '#recommendation'), /misses by \d/);
  assert.match(await text(page, '#detail-title'), new RegExp(`^${closest.label.replace(/[+]/g, '\\+')} · micro-batch 1`));
  const changes = nf.suggestions.map((s) => s.change);
  assert.ok(changes.includes('gradient_checkpointing') && changes.includes('qlora') && changes.includes('num_gpus'), changes.join());
  await screenshot(page, 'nothing-fits');
  // apply the first change that fits: something fits now
  const fix = nf.suggestions.find((s) => s.fits);
  assert.ok(fix, 'some single change fits');
  await page.locator('#recommendation button[data-patch]').first().click();
  await waitText(page, '#recommendation', /Recommended/);
  // and it is not suggested again
  const hash = decodeURIComponent(await page.evaluate(() => location.hash));
  for (const [k] of Object.entries(fix.request_patch)) assert.ok(hash.length > 0, k);
  assert.deepEqual(errors, []);
  await context.close();
});

test('LoRA with the automatic targets fits GPT-2, and the control says what is loaded and what trains', async () => {
  const { page, context } = await fresh('#model=openai-community/gpt2&task=lora');
  // GPT-2 learned 1,024 positions: the core refuses 2,048, and the page says so at the field
  await waitText(page, '#msg-seq', /^Sequence length 2048 exceeds the 1024 positions/);
  await page.fill('#seq', '1024');
  await waitText(page, '#recommendation', /Recommended for training/);
  assert.equal(await page.locator('#grid td.cell').count() > 0, true);
  assert.match(await text(page, '#precision-hint'), /^Automatic: base model loaded in \w+ and frozen; LoRA adapters trained on .*c_attn/);
  assert.equal(await page.evaluate(() => 'precision' in window.memfit.result.request), false, 'the core picks the precision');
  await screenshot(page, 'lora-gpt2-automatic');
  await context.close();
});

test('LoRA targets that match no layer: the core\'s message next to the field, never "nothing fits"', async () => {
  const { page, context } = await fresh('#model=openai-community/gpt2&task=lora&targets=foo_proj&seq=1024');
  await waitText(page, '#error', /LoRA target/);
  assert.doesNotMatch(await text(page, '#results'), /Nothing fits/);
  assert.match(await text(page, '#msg-targets'), /c_attn/);
  await context.close();
});

test('grid, breakdown and exports: no "tight" cell in a row that does not fit, no stray "null", a readable inference sentence', async () => {
  const { page, context } = await fresh('#model=meta-llama/Llama-3.1-8B&task=qlora&gpu=RTX4090-24GB&ckpt=1');
  const rows = await page.evaluate(() => window.memfit.result.plan.candidates.map((c) => ({ label: c.label, max: c.max_micro_batch })));
  for (const { label, max } of rows) {
    const cells = await page.locator(`#grid td.cell[data-label="${label}"]`).evaluateAll((tds) => tds.map((td) => [Number(td.dataset.mbs), td.className]));
    for (const [mbs, cls] of cells) assert.equal(mbs <= max, !cls.includes('oom'), `${label} at ${mbs}: ${cls} (max ${max})`);
  }
  await page.selectOption('#task', 'inference');
  await waitText(page, '#recommendation', /KV cache per token/);
  assert.doesNotMatch(await text(page, '#results'), /\bnull\b|undefined|NaN/);
  const [md] = await Promise.all([page.waitForEvent('download'), page.click('#export-md')]);
  const markdown = await readFile(await md.path(), 'utf8');
  assert.match(markdown, /Largest batch at [\d,]+ tokens of context: [\d,]+\. Longest context at batch \d+: [\d,]+ tokens\./);
  assert.match(markdown, /batch \d+ × context [\d,]+ tokens/);
  await context.close();
});

test('phone: the answer is pinned while the form is in view; layout names are whole', async () => {
  const { page, context } = await fresh('#model=meta-llama/Llama-3.1-8B&gpus=8',
    { viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const summary = page.locator('#summary');
  assert.ok(await summary.isVisible());
  assert.match(await summary.innerText(), /^\S.* at micro-batch \d+/);
  await screenshot(page, 'phone-top', false);
  await page.evaluate(() => document.querySelector('#grid-card').scrollIntoView());
  await page.waitForFunction(() => getComputedStyle(document.querySelector('#summary')).display === 'none');
  const names = await page.locator('#grid tbody th').evaluateAll((ths) => ths.map((th) => th.scrollWidth <= th.clientWidth + 1));
  assert.ok(names.every(Boolean), 'no layout name is cut');
  await screenshot(page, 'phone-grid', false);
  // The grid is wider than the phone: its frame shows a shadow on the side that scrolls on, drawn
  // above the coloured cells (a class on the frame, not the scroller's background).
  const edges = () => page.locator('#grid-card .scroll-frame').evaluate((f) => [...f.classList].sort().join(' '));
  assert.equal(await edges(), 'more-right scroll-frame');
  await page.locator('#grid-card .scroll').evaluate((s) => { s.scrollLeft = s.scrollWidth; });
  await page.waitForFunction(() => document.querySelector('#grid-card .scroll-frame').classList.contains('more-left'));
  assert.equal(await edges(), 'more-left scroll-frame');
  await page.locator('#grid-card .scroll').evaluate((s) => { s.scrollLeft = 0; });
  await screenshot(page, 'phone-grid-shadow', false);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0);
  await context.close();
});

test('serving on 3 or 64 GPUs: tensor parallel as far as the heads (key/value heads too) allow, replicas for the rest, said beside the answer', async () => {
  const { page, errors, context } = await fresh('#model=meta-llama/Llama-3.1-8B&task=inference&gpus=3');
  await waitText(page, '#recommendation', /^Serving on 3 × /);
  assert.ok(await page.locator('#error').isHidden());
  assert.match(await text(page, '#recommendation'), /Fits — /);
  assert.match(await text(page, '#serving-notes'), /3 GPUs run as tp 1 x 3 data-parallel replicas/);
  assert.equal(await page.locator('#detail .notes').count(), 0, 'the notes are not repeated under the breakdown');
  assert.doesNotMatch(await text(page, '#detail-title'), /tensor parallel 3/);
  await screenshot(page, 'serve-3-gpus');
  const before = await computed(page);
  await page.fill('#gpus', '64');
  await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before);
  // 32 query heads but 8 key/value heads: each GPU holds whole key/value heads, so tp 8 at most
  assert.match(await text(page, '#serving-notes'), /num_key_value_heads \(8\) divisible by tp: 64 GPUs run as tp 8 x 8 data-parallel replicas/);
  assert.doesNotMatch(await text(page, '#results'), /\bnull\b|undefined|NaN/);
  assert.deepEqual(errors, []);
  await context.close();
});

test('FlashAttention-2 over fp32 weights: refused at the Attention control, saying what runs', async () => {
  const { page, errors, context } = await fresh('#model=meta-llama/Llama-3.1-8B&task=lora&gpu=A100-80GB&precision=fp32&attn=flash_attention_2');
  await page.waitForSelector('#attn[aria-invalid="true"]');
  assert.match(await text(page, '#msg-attn'), /^FlashAttention-2 computes in fp16 \/ bf16 only: .*set Precision to bf16 mixed precision or bf16, or Attention to SDPA/);
  const before = await computed(page);
  await page.selectOption('#precision', 'amp_bf16');
  await page.waitForFunction((b) => Number(document.body.dataset.computed || 0) > b, before || 0);
  assert.equal(await page.locator('#attn[aria-invalid]').count(), 0);
  assert.match(await text(page, '#recommendation'), /^Recommended for training/);
  assert.deepEqual(errors, []);
  await context.close();
});

test('FlashAttention-2 on a GPU older than Ampere: the message sits at the Attention control and says what to pick', async () => {
  const { page, errors, context } = await fresh('#model=meta-llama/Llama-3.1-8B&task=qlora&gpu=T4-16GB&attn=flash_attention_2');
  await page.waitForSelector('#attn[aria-invalid="true"]');
  assert.match(await text(page, '#msg-attn'), /^FlashAttention-2 needs an Ampere or newer GPU .*T4.*set Attention to SDPA/);
  assert.match(await text(page, '#error'), /set Attention to SDPA/);
  // the message under Attention leaves the control beside it (Gradient accumulation) its height
  const heights = await page.evaluate(() => ['#gas', '#seq'].map((s) => document.querySelector(s).getBoundingClientRect().height));
  assert.equal(heights[0], heights[1], heights.join());
  await screenshot(page, 'flash-attention-t4');
  const before = await computed(page);
  await page.selectOption('#attn', 'sdpa');
  await page.waitForFunction((b) => Number(document.body.dataset.computed || 0) > b, before || 0);
  assert.match(await text(page, '#recommendation'), /^Training on 1 × NVIDIA T4 16GB|^Recommended for training/);
  assert.ok(await page.locator('#error').isHidden());
  assert.equal(await page.locator('#attn[aria-invalid]').count(), 0);
  assert.deepEqual(errors, []);
  await context.close();
});

test('bf16 on a GPU without it (V100): the answer stands, and the Precision control says it runs emulated and slow', async () => {
  const { page, errors, context } = await fresh('#model=meta-llama/Llama-3.1-8B&task=lora&gpu=V100-32GB&precision=amp_bf16');
  await waitText(page, '#msg-precision', /V100 SXM2 32GB has no native bf16: PyTorch emulates it \(same memory, much slower\)/);
  assert.ok(await page.locator('#recommendation').isVisible());
  assert.equal(await page.locator('#precision[aria-invalid]').count(), 0, 'a warning, not an error');
  await screenshot(page, 'bf16-on-v100');
  const before = await computed(page);
  await page.selectOption('#precision', 'amp_fp16');
  await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before);
  assert.equal(await page.locator('#msg-precision').count(), 0);
  await page.selectOption('#precision', 'amp_bf16');
  await waitText(page, '#msg-precision', /no native bf16/);
  const again = await computed(page);
  await page.selectOption('#gpu', 'A100-80GB');
  await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, again);
  assert.equal(await page.inputValue('#precision'), 'amp_bf16');
  assert.equal(await page.locator('#msg-precision').count(), 0, 'the A100 has bf16');
  assert.deepEqual(errors, []);
  await context.close();
});

test('an architecture memfit only approximates: the answer card says so before the figures, and the Markdown export too', async () => {
  hubMode = 'down';
  try {
    const { page, errors, context } = await fresh();
    await page.fill('#model', 'some-org/brand-new-lm');
    await page.press('#model', 'Enter');
    await waitText(page, '#model-status', /Could not reach huggingface\.co/);
    const config = { ...JSON.parse(olmo), model_type: 'brand_new_lm', architectures: ['BrandNewForCausalLM'] };
    await page.setInputFiles('#config-file', { name: 'brand-new.json', mimeType: 'application/json', buffer: Buffer.from(JSON.stringify(config)) });
    await waitText(page, '#answer-warnings', /is not one memfit models exactly: estimated as a Llama-style decoder/);
    // in the answer card, right under the headline
    assert.equal(await page.evaluate(() => document.querySelector('#answer-warnings').previousElementSibling.classList.contains('headline')), true);
    await screenshot(page, 'approximate-warning');
    const [md] = await Promise.all([page.waitForEvent('download'), page.click('#export-md')]);
    assert.match(await readFile(await md.path(), 'utf8'), /> \*\*Warning:\*\* model_type "brand_new_lm" is not one memfit models exactly/);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    hubMode = 'up';
  }
});

test('bf16 on a V100 is said once, at the Precision control, not again in the answer card', async () => {
  const { page, context } = await fresh('#model=meta-llama/Llama-3.1-8B&task=lora&gpu=V100-32GB&precision=amp_bf16');
  await waitText(page, '#msg-precision', /no native bf16/);
  const card = await page.locator('#answer-warnings').count() ? await text(page, '#answer-warnings') : '';
  assert.doesNotMatch(card, /no native bf16/);
  await context.close();
});

test('a recommended micro-batch between the grid\'s columns (6 between 4 and 8) is marked on its row\'s Max cell', async () => {
  const { page, context } = await fresh('#model=meta-llama/Llama-3.1-8B&gpus=8');
  const reco = await page.evaluate(() => window.memfit.result.plan.recommendation);
  const columns = await page.locator('#grid thead th').allInnerTexts();
  assert.ok(!columns.includes(String(reco.max_micro_batch)), `this setup's recommendation (${reco.max_micro_batch}) is between columns: ${columns}`);
  const marked = page.locator('#grid td.selected');
  assert.equal(await marked.count(), 1);
  assert.equal(await marked.innerText(), String(reco.max_micro_batch));
  assert.equal(await marked.evaluate((td) => td.closest('tr').querySelector('th').dataset.label), reco.label);
  await context.close();
});

test('layout names say in words what they shard, split and offload (tooltips on the grid rows and the answer)', async () => {
  const { page, context } = await fresh('#model=meta-llama/Llama-3.1-8B&gpus=8');
  const title = (label) => page.locator(`#grid th[data-label="${label}"]`).getAttribute('title');
  assert.equal(await title('zero2 + cpu optimizer offload'),
    'zero2 + cpu optimizer offload: DeepSpeed ZeRO-2: optimizer states and gradients sharded over 8 data-parallel GPUs; optimizer states in CPU RAM');
  assert.match(await title('fsdp_full_shard x tp 2'), /^fsdp_full_shard x tp 2: PyTorch FSDP FULL_SHARD: .* over 4 data-parallel GPUs; tensor parallel over 2 GPUs/);
  assert.match(await title('pp 4 x dp 2'), /pipeline parallel over 4 GPUs .*; 2 data-parallel replicas$/);
  assert.match(await title('ddp'), /^ddp: PyTorch DDP: every GPU holds a full copy/);
  const reco = await page.evaluate(() => window.memfit.result.plan.recommendation.label);
  assert.equal(await page.locator('#recommendation .headline').getAttribute('title'), await title(reco));
  await context.close();
});

test('serving offers no mixed-precision (AMP) recipe: those are for training', async () => {
  const { page, context } = await fresh('#model=meta-llama/Llama-3.1-8B');
  const amp = () => page.locator('#precision option[value^="amp_"]').evaluateAll((os) => os.map((o) => o.disabled));
  assert.deepEqual(await amp(), [false, false]);
  await page.selectOption('#task', 'inference');
  await page.waitForFunction(() => document.body.dataset.task === 'inference');
  assert.deepEqual(await amp(), [true, true]);
  await page.selectOption('#task', 'lora');
  await page.waitForFunction(() => document.body.dataset.task === 'lora');
  assert.deepEqual(await amp(), [false, false]);
  await context.close();
});
