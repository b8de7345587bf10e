// Opens GraphiQL in Debian's chromium, headless, with every request to anything but this
// machine refused, and checks that the IDE is there and runs a query.
// usage: node graphiql.mjs <http://127.0.0.1:PORT/graphql> <screenshot.png>
// Prints one JSON line: {"editor": true, "answer": ..., "offsite": [...], "errors": [...]}.
import { offlineBrowser } from './offline.mjs';

const [url, screenshot] = process.argv.slice(2);
// No network: only this machine answers; anything else is refused and recorded.
const { context, offsite, close } = await offlineBrowser('agent-stream-chromium-');
const errors = [];
const result = { editor: false, answer: null, offsite, errors };
try {
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
  await close();
}
console.log(JSON.stringify(result));
