// The launch-config box (web/intake.js): each example in tests/intake/, pasted into the page,
// gives the request `memfit intake FILE --gpu GPU` gives (the native CLI, yaml-cpp), and the page
// shows where each field came from. A bad file gets a message, not a broken page.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { siteSession, hermeticContext, openPage, screenshot, ROOT } from './harness.mjs';

const CLI = path.resolve(process.env.MEMFIT_CLI ?? path.join(ROOT, 'build/native/cli/memfit'));
const EXAMPLES = path.join(ROOT, 'tests/intake');

const session = siteSession();

async function fresh() {
  const env = await hermeticContext(session.browser, session.server.url, () => ({ status: 404, body: '{}' }), { viewport: { width: 1366, height: 900 } });
  const { page, errors } = await openPage(env.context, session.server.url);
  await page.click('#launch-box summary');
  return { ...env, page, errors };
}

/** Pastes `text` and waits for the recomputation the applied request causes. */
async function paste(page, text) {
  const before = Number(await page.evaluate(() => document.body.dataset.computed));
  await page.fill('#launch-text', text);
  await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before, { timeout: 20000 });
}

const cliIntake = (file, gpu) => JSON.parse(execFileSync(CLI, ['intake', file, '--gpu', gpu], { encoding: 'utf8' }));
const withoutModel = ({ model, ...rest }) => rest;

for (const name of (await readdir(EXAMPLES)).sort()) {
  test(`${name}: the page's request is memfit intake's`, async () => {
    const { page, errors, leaks, context } = await fresh();
    const startModel = await page.evaluate(() => window.memfit.result.request.model);
    const gpu = await page.locator('#gpu').inputValue();
    const file = path.join(EXAMPLES, name);
    const cli = cliIntake(file, gpu);
    await paste(page, await readFile(file, 'utf8'));
    const sent = await page.evaluate(() => window.memfit.result.request);
    assert.deepEqual(withoutModel(sent), withoutModel(cli.request));
    assert.deepEqual(sent.model, cli.request.model ?? startModel); // a file without a model keeps the page's
    // The report names the key and line of every field the file gave.
    const report = await page.locator('#launch-report').innerText();
    for (const [field, src] of Object.entries(cli.sources)) {
      assert.ok(report.includes(field), `${field} in the report`);
      if (src.line) assert.match(report, new RegExp(`${src.key.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} · line ${src.line}\\b`));
    }
    if (name === 'axolotl-qlora.yml') {
      assert.equal(await page.locator('#task').inputValue(), 'qlora');
      assert.equal(await page.locator('#seq').inputValue(), '4096');
      assert.match(report, /Axolotl/);
      await screenshot(page, 'desktop-launch-config');
      // An edit after the paste changes only that field of the request.
      const before = Number(await page.evaluate(() => document.body.dataset.computed));
      await page.fill('#seq', '2048');
      await page.waitForFunction((b) => Number(document.body.dataset.computed) > b, before);
      const edited = await page.evaluate(() => window.memfit.result.request);
      assert.deepEqual(edited, { ...sent, sequence_length: 2048 });
    }
    assert.deepEqual(errors, []);
    assert.deepEqual(leaks, []);
    await context.close();
  });
}

test('a launch config that is not YAML, JSON or flags gets a message and leaves the form', async () => {
  const { page, errors, context } = await fresh();
  const task = await page.locator('#task').inputValue();
  await page.fill('#launch-text', 'base_model: [unclosed');
  await page.waitForSelector('#launch-report .error');
  assert.match(await page.locator('#launch-report').innerText(), /could not be read: not valid YAML or JSON/);
  assert.equal(await page.locator('#task').inputValue(), task);
  await page.fill('#launch-text', '- a\n- b\n');
  await page.waitForFunction(() => /neither a YAML\/JSON mapping nor a command line/.test(document.querySelector('#launch-report').textContent));
  await page.fill('#launch-text', '{"foo": 1}'); // the core's own error: no format matches
  await page.waitForFunction(() => /none of the launch configs memfit reads/.test(document.querySelector('#launch-report').textContent));
  assert.equal(await page.locator('#task').inputValue(), task);
  assert.deepEqual(errors, []);
  await context.close();
});
