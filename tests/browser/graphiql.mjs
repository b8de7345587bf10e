// Opens GraphiQL in Debian's chromium, headless, with every request to anything but this
// machine refused, and checks that the IDE is there and runs a query.
// usage: node graphiql.mjs <http://127.0.0.1:PORT/graphql> <screenshot.png>
// Prints one JSON line: {"editor": true, "answer": ..., "offsite": [...], "errors": [...]}.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [url, screenshot] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), 'agent-stream-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
  viewport: { width: 1280, height: 800 },
});
const offsite = [];
const errors = [];
const result = { editor: false, answer: null, offsite, errors };
try {
  // No network: only this machine answers; anything else is refused and recorded.
  await context.route('**/*', (route) => {
    const { hostname, protocol } = new URL(route.request().url());
    const local = ['127.0.0.1', 'localhost', '[::1]'].includes(hostname) || protocol === 'data:';
    if (local) return route.continue();
    offsite.push(route.request().url());
    return route.abort('internetdisconnected');
  });
  const page = context.pages()[0] ?? (await context.newPage());
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(url, { waitUntil: 'load' });
  // The query editor (GraphiQL's CodeMirror) replaces "Loading...".
  const editor = page.locator('.graphiql-query-editor .CodeMirror');
  await editor.waitFor({ state: 'visible', timeout: 20000 });
  result.editor = true;
  // Type a query and run it: the answer comes from the service, through the page.
  await editor.click();
  await page.keyboard.press('Control+A');
  await page.keyboard.type('{ __typename }');
  await page.locator('.graphiql-execute-button').click();
  const response = page.locator('.graphiql-response .CodeMirror');
  await page.waitForFunction(
    () => document.querySelector('.graphiql-response')?.textContent?.includes('__typename'),
    null,
    { timeout: 20000 },
  );
  result.answer = (await response.textContent()) ?? '';
  await page.screenshot({ path: screenshot });
} catch (e) {
  errors.push(String(e));
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(result));
