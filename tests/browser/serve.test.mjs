// The Serve panel (web/serve.js, issue 11) in headless Chromium: the context x concurrency
// grid of the default model and GPU, and how engine and KV dtype change it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { siteSession, hermeticContext, openPage, screenshot } from './harness.mjs';

const session = siteSession();

const fitting = (page) => page.locator('#serve-grid td[data-fits="1"]').count();

test('the Serve panel shows which contexts and concurrencies fit, and reacts to its controls', async () => {
  const env = await hermeticContext(session.browser, session.server.url, async () => ({ status: 404, body: '{}' }), { viewport: { width: 1366, height: 900 } });
  const { page, errors } = await openPage(env.context, session.server.url);
  // the panel follows the main form's model once the page has set it
  await page.waitForFunction(() => {
    const card = document.querySelector('#serve-card');
    return card.dataset.ready === '1' && card.dataset.model === document.querySelector('#model').value;
  });
  assert.equal(await page.locator('#serve-grid tbody tr').count(), 7);
  assert.equal(await page.locator('#serve-grid tbody tr:first-child td').count(), 9);
  const auto = await fitting(page);
  assert.ok(auto > 0, 'something fits on the default GPU');
  assert.ok(auto < 63, 'not everything fits: 256 requests of 128K tokens do not');
  assert.match(await page.locator('#serve-summary').innerText(), /GPU KV cache size: [0-9,]+ tokens/);
  // smaller rows fit more: every column is monotone in context
  const cells = await page.locator('#serve-grid tbody td').evaluateAll((tds) => tds.map((td) => td.dataset.fits === '1'));
  for (let col = 0; col < 9; ++col)
    for (let row = 1; row < 7; ++row) assert.ok(!cells[row * 9 + col] || cells[(row - 1) * 9 + col], `row ${row} col ${col}`);
  // an FP8 KV cache holds about twice the tokens: at least as many cells fit
  await page.locator('#serve-card').evaluate((c) => { c.dataset.ready = ''; });
  await page.locator('#serve-kv').selectOption('fp8');
  await page.waitForSelector('#serve-card[data-ready="1"]');
  assert.ok((await fitting(page)) > auto);
  await page.locator('#serve-engine').selectOption('sglang');
  assert.equal(await page.locator('#serve-util').inputValue(), '0.88');
  await page.waitForFunction(() => /SGLang/.test(document.querySelector('#serve-summary').textContent));
  await screenshot(page.locator('#serve-card').page(), 'serve-panel');
  // the summary names the GPU it sized, and follows the main form's GPU
  const gpu = await page.locator('#gpu option:checked').innerText();
  assert.ok((await page.locator('#serve-summary').innerText()).includes(` on ${gpu.trim()}:`));
  const other = await page.locator('#gpu option').evaluateAll((os, now) => os.find((o) => o.value !== 'custom' && o.textContent.trim() !== now.trim())?.value, gpu);
  await page.locator('#gpu').selectOption(other);
  const otherName = (await page.locator('#gpu option:checked').innerText()).trim();
  await page.waitForFunction((n) => document.querySelector('#serve-summary').textContent.includes(` on ${n}:`), otherName);
  assert.deepEqual(errors, []);
  await env.context.close();
});
