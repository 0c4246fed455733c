// Test harness: serves the built site (build/wasm/site) on 127.0.0.1, drives the system
// Chromium through playwright-core, and answers every huggingface.co request from fixtures so
// that no test touches the network.
import { createServer } from 'node:http';
import { readFile, mkdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { before, after } from 'node:test';
import { chromium } from 'playwright-core';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const SITE = path.resolve(process.env.MEMFIT_SITE ?? path.join(ROOT, 'build/wasm/site'));
export const SHOTS = path.resolve(process.env.MEMFIT_SCREENSHOTS ?? path.join(ROOT, 'build/screenshots'));
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const FIXTURES = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures');

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.css': 'text/css',
  '.wasm': 'application/wasm', '.svg': 'image/svg+xml', '.json': 'application/json' };

/**
 * A static file server over `root`; resolves to {url, port, close}. It sends CORS headers, as
 * GitHub Pages does: a host page on another site loads memfit-calculator.js as a module script.
 * `pages` maps extra paths to HTML (host pages for the embed tests).
 */
export function serve(root = SITE, pages = {}) {
  const server = createServer(async (req, res) => {
    const pathname = new URL(req.url, 'http://x').pathname;
    if (pages[pathname]) return res.writeHead(200, { 'content-type': 'text/html', 'cache-control': 'no-store' }).end(pages[pathname]);
    const rel = decodeURIComponent(pathname).replace(/\/$/, '/index.html');
    const file = path.join(root, path.normalize(rel));
    if (!file.startsWith(root)) return res.writeHead(403).end();
    try {
      const body = await readFile(file);
      res.writeHead(200, { 'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream', 'cache-control': 'no-store',
        'access-control-allow-origin': '*' });
      res.end(body);
    } catch {
      res.writeHead(404).end('not found');
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    url: `http://127.0.0.1:${server.address().port}/`, port: server.address().port, close: () => new Promise((r) => server.close(r)),
  })));
}

/**
 * The site server and one Chromium for a whole test file: started before its first test, closed
 * after its last. The returned object's `server` ({url, port, close}) and `browser` are set by then.
 */
export function siteSession() {
  const session = { server: null, browser: null };
  before(async () => {
    session.server = await serve();
    session.browser = await launch();
  });
  after(async () => {
    await session.browser?.close();
    await session.server?.close();
  });
  return session;
}

export const fixture = (name) => readFile(path.join(FIXTURES, name), 'utf8');

export async function launch() {
  return chromium.launch({
    executablePath: CHROMIUM, headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run', '--disable-quic'],
  });
}

/**
 * A browser context whose huggingface.co traffic is answered by `hub(request)`:
 * a function returning {status, body} (or 'abort' for a network failure). Anything that is
 * neither the local server nor huggingface.co is aborted. Records every Hub request.
 */
export async function hermeticContext(browser, base, hub, { allow = [], ...options } = {}) {
  const context = await browser.newContext({ acceptDownloads: true, ...options });
  const hubRequests = [];
  const leaks = [];
  const local = [base, ...allow];
  await context.route((u) => !local.some((b) => u.href.startsWith(b)) && !u.href.startsWith('https://huggingface.co/'), (route) => {
    leaks.push(route.request().url());
    return route.abort();
  });
  await context.route('https://huggingface.co/**', async (route) => {
    const request = route.request();
    hubRequests.push({ url: request.url(), headers: await request.allHeaders() });
    const answer = await hub(new URL(request.url()), request);
    if (answer === 'abort') return route.abort('internetdisconnected');
    return route.fulfill({ status: answer.status ?? 200, contentType: 'application/json',
      headers: { 'access-control-allow-origin': '*' }, body: answer.body ?? '' });
  });
  return { context, hubRequests, leaks };
}

export async function openPage(context, url) {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => m.type() === 'error' && !/Failed to load resource/.test(m.text()) && errors.push(m.text()));
  await page.goto(url);
  await page.waitForSelector('body[data-ready="true"], #model-status.error, #error:not([hidden])', { timeout: 20000 });
  return { page, errors };
}

export async function screenshot(page, name, fullPage = true) {
  await mkdir(SHOTS, { recursive: true });
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage });
  return file;
}
