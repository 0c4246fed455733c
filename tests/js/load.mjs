// Loads the built site's module in Node: the same memfit.mjs the page uses (ENVIRONMENT=web,worker),
// given its wasm bytes directly because Emscripten 3.1.6 would fetch() a file path.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const SITE = path.resolve(process.env.MEMFIT_SITE ?? path.join(ROOT, 'build/wasm/site'));
export const CLI = path.resolve(process.env.MEMFIT_CLI ?? path.join(ROOT, 'build/native/cli/memfit'));

export async function load() {
  const { loadMemfit, MemfitError } = await import(pathToFileURL(path.join(SITE, 'memfit-api.mjs')).href);
  const api = await loadMemfit({ wasmBinary: await readFile(path.join(SITE, 'memfit.wasm')),
    library: await readFile(path.join(SITE, 'library.json'), 'utf8'),
    intake: { wasmBinary: await readFile(path.join(SITE, 'memfit-intake.wasm')) } });
  return { api, MemfitError };
}
