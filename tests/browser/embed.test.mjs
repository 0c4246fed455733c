// The two embed forms on another origin and on another site: an <iframe> of index.html?embed=1
// and the <memfit-calculator> element. The host pages are served by a second server, reached
// as 127.0.0.1 (same site, other origin: another port) and as localhost (another site: the
// browser then denies the frame its storage, which once hung the page).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { serve, launch, hermeticContext, screenshot } from './harness.mjs';

let memfit;
let host;
let browser;
const SETUP = 'model=meta-llama/Llama-3.1-8B&task=qlora&gpu=RTX4090-24GB';

before(async () => {
  memfit = await serve();
  const base = memfit.url;
  host = await serve(undefined, {
    '/iframe.html': `<!doctype html><meta charset="utf-8"><title>Docs</title><h1>Fine-tuning guide</h1>
      <iframe src="${base}?embed=1&${SETUP}" width="720" height="900" title="memfit"></iframe>`,
    '/element.html': `<!doctype html><meta charset="utf-8"><title>Docs</title>
      <style>body { font-family: Georgia, serif; } memfit-calculator { --memfit-accent: #c2185b; --memfit-radius: 4px; max-width: 760px; }</style>
      <script type="module" src="${base}memfit-calculator.js"></script>
      <h1>Fine-tuning guide</h1><p>How much memory does QLoRA need?</p>
      <memfit-calculator model="meta-llama/Llama-3.1-8B" task="qlora" gpu="RTX4090-24GB"></memfit-calculator><p id="after">Next section</p>`,
  });
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await memfit?.close();
  await host?.close();
});

const hosts = () => [['cross-origin', `http://127.0.0.1:${host.port}/`], ['cross-site', `http://localhost:${host.port}/`]];

async function hostPage(hostBase, file) {
  const env = await hermeticContext(browser, memfit.url, () => 'abort', { allow: [hostBase], viewport: { width: 900, height: 1000 } });
  const page = await env.context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${hostBase}${file}`);
  const frame = await waitForFrame(page);
  await frame.waitForSelector('body[data-ready="true"]', { timeout: 20000 });
  return { ...env, page, frame, errors };
}

async function waitForFrame(page, re = /embed=1/) {
  for (let i = 0; i < 200; i++) {
    const frame = page.frames().find((f) => re.test(f.url()));
    if (frame) return frame;
    await page.waitForTimeout(50);
  }
  throw new Error('no memfit frame');
}

for (const [kind, hostBaseOf] of [['cross-origin', 0], ['cross-site', 1]]) {
  test(`iframe embed, ${kind}: loads, and "Open in memfit" opens the full calculator with the same setup`, async () => {
    const hostBase = hosts()[hostBaseOf][1];
    const { page, frame, errors, context } = await hostPage(hostBase, 'iframe.html');
    assert.match(await frame.locator('#recommendation').innerText(), /1 × NVIDIA GeForce RTX 4090 24GB/);
    assert.equal(await frame.locator('#embed-model').innerText(), 'meta-llama/Llama-3.1-8B');
    if (kind === 'cross-site') {
      // the condition that once hung the page: this frame may not touch its storage
      assert.equal(await frame.evaluate(() => { try { return typeof sessionStorage; } catch { return 'denied'; } }), 'denied');
    }
    const href = await frame.getAttribute('#open-full', 'href');
    assert.ok(href.startsWith(memfit.url) && !href.includes('embed') && href.includes('#'), href);
    const full = await context.newPage();
    const response = await full.goto(href);
    assert.equal(response.status(), 200);
    await full.waitForSelector('body[data-ready="true"]');
    assert.equal(await full.inputValue('#model'), 'meta-llama/Llama-3.1-8B');
    assert.equal(await full.inputValue('#task'), 'qlora');
    assert.equal(await full.inputValue('#gpu'), 'RTX4090-24GB');
    assert.ok(await full.locator('.model-card').isVisible(), 'the full calculator, not the embed');
    await screenshot(page, `embed-iframe-${kind}`);
    assert.deepEqual(errors, []);
    await context.close();
  });

  test(`<memfit-calculator> element, ${kind}: one module script, sized to its content, themed by custom properties`, async () => {
    const hostBase = hosts()[hostBaseOf][1];
    const { page, frame, errors, context } = await hostPage(hostBase, 'element.html');
    assert.match(await frame.locator('#recommendation').innerText(), /RTX 4090/);
    assert.equal(await frame.inputValue('#task'), 'qlora');
    // the host's --memfit-accent reached the calculator
    assert.equal(await frame.evaluate(() => getComputedStyle(document.documentElement).getPropertyValue('--accent').trim()), '#c2185b');
    // sized to its content: the frame is as tall as the page inside it, with no inner scrollbar
    await page.waitForFunction(() => {
      const f = document.querySelector('memfit-calculator').shadowRoot.querySelector('iframe');
      return f.getBoundingClientRect().height !== 640;
    });
    const [outer, inner] = await Promise.all([
      page.evaluate(() => document.querySelector('memfit-calculator').shadowRoot.querySelector('iframe').getBoundingClientRect().height),
      frame.evaluate(() => document.documentElement.scrollHeight)]);
    assert.ok(Math.abs(outer - inner) <= 2, `frame ${outer}px, content ${inner}px`);
    // a change inside resizes it: 4 GPUs add rows to the grid
    await frame.fill('#gpus', '4');
    await frame.waitForFunction(() => document.querySelector('#recommendation').textContent.includes('4 ×'));
    await page.waitForFunction((before) => {
      const f = document.querySelector('memfit-calculator').shadowRoot.querySelector('iframe');
      return Math.abs(f.getBoundingClientRect().height - before) > 1;
    }, outer);
    await screenshot(page, `embed-element-${kind}`);
    // attributes drive the setup
    await page.evaluate(() => document.querySelector('memfit-calculator').setAttribute('task', 'lora'));
    await page.waitForFunction(() => [...document.querySelector('memfit-calculator').shadowRoot.querySelector('iframe').src.matchAll(/task=lora/g)].length === 1);
    const reloaded = await waitForFrame(page, /task=lora/);
    await reloaded.waitForSelector('body[data-ready="true"]');
    assert.equal(await reloaded.inputValue('#task'), 'lora');
    assert.deepEqual(errors, []);
    await context.close();
  });
}
