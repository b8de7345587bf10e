// Drives the run inspector (/ui/) in Debian's chromium, headless, with every request to
// anything but this machine refused. The Rust test sends one JSON command per line on
// stdin and reads one JSON answer per line on stdout, so it can kill and restart the
// service, append events and look again while the same page stays open.
// usage: node inspector.mjs   (commands: open, wait, eval, click, press, hover, select, file, items,
// shot, viewport, report, quit)
import { createInterface } from 'node:readline';
import { offlineBrowser } from './offline.mjs';

const { context, offsite, close } = await offlineBrowser('agent-stream-inspector-');
const errors = [];
// Long tasks (main thread blocked for more than 50 ms): the "does not freeze" measure.
await context.addInitScript(() => {
  window.__longest = 0;
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) window.__longest = Math.max(window.__longest, e.duration);
    }).observe({ type: 'longtask', buffered: true });
  } catch {}
});
const page = context.pages()[0] ?? (await context.newPage());
page.on('pageerror', (e) => errors.push(String(e)));
page.on('console', (m) => {
  if (m.type() === 'error' && !/Failed to load resource|WebSocket connection/.test(m.text())) errors.push(`console: ${m.text()}`);
});
page.on('dialog', (d) => d.accept());

// What a reader sees of each timeline item, lane by lane.
function items() {
  const text = (n, sel) => {
    const x = n.querySelector(sel);
    return x ? x.textContent : null;
  };
  const all = (n, sel) => [...n.querySelectorAll(sel)].map((x) => x.textContent);
  const out = [];
  for (const lane of document.querySelectorAll('.lane')) {
    for (const li of lane.querySelectorAll(':scope > li.item')) {
      const it = { lane: lane.dataset.lane, key: li.dataset.key, kind: li.dataset.kind, seq: Number(li.dataset.seq) };
      switch (it.kind) {
        case 'message':
          Object.assign(it, {
            role: text(li, '.role'),
            status: text(li, '.head .status'),
            stop: text(li, '.stop'),
            text: all(li, '.bubble > .text').join(''),
            reasoning: all(li, '.thinking').join(''),
            reasoningOpen: li.querySelector('details.reasoning[open]') !== null,
          });
          break;
        case 'tool':
          Object.assign(it, {
            tool: text(li, '.tool-name'),
            status: text(li, '.head .status'),
            spinner: li.querySelector('.spinner') !== null,
            output: text(li, ':scope > pre.output'),
            error: text(li, ':scope > pre.error'),
            progress: text(li, '.progress .count'),
          });
          break;
        case 'step':
          it.text = text(li, '.step-text');
          break;
        case 'transition':
          Object.assign(it, { to: text(li, '.to'), reason: text(li, '.reason') });
          break;
        case 'child':
          it.prompt = text(li, '.prompt');
          break;
        case 'plan':
          Object.assign(it, {
            steps: all(li, '.plan-step .title'),
            decision: text(li, '.decision'),
            buttons: all(li, '.decide button'),
          });
          break;
        case 'compaction':
          it.text = text(li, '.compaction-text');
          break;
        default:
          break;
      }
      out.push(it);
    }
  }
  return out;
}

async function run(cmd) {
  switch (cmd.cmd) {
    case 'open':
      await page.goto(cmd.url, { waitUntil: 'load' });
      return { url: page.url() };
    case 'wait':
      await page.waitForFunction(cmd.expr, null, { timeout: cmd.timeout ?? 30000, polling: 100 });
      return true;
    case 'eval':
      return await page.evaluate(cmd.expr);
    case 'click':
      await page.locator(cmd.selector).first().click({ timeout: cmd.timeout ?? 10000 });
      return true;
    case 'press':
      // Keyboard only: focus the element, then press the key.
      await page.locator(cmd.selector).first().focus();
      await page.keyboard.press(cmd.key);
      return true;
    case 'hover':
      await page.locator(cmd.selector).first().hover({ timeout: cmd.timeout ?? 10000 });
      return true;
    case 'select':
      await page.selectOption(cmd.selector, cmd.value);
      return true;
    case 'file':
      await page.setInputFiles(cmd.selector, cmd.path);
      return true;
    case 'items':
      return await page.evaluate(items);
    case 'shot':
      await page.screenshot({ path: cmd.path, fullPage: cmd.fullPage ?? false });
      return true;
    case 'viewport':
      await page.setViewportSize({ width: cmd.width, height: cmd.height });
      return true;
    case 'report':
      return { offsite, errors, longest: await page.evaluate(() => window.__longest ?? 0) };
    default:
      throw new Error(`unknown command ${cmd.cmd}`);
  }
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch (e) {
    console.log(JSON.stringify({ ok: false, error: `bad command: ${e}` }));
    continue;
  }
  if (cmd.cmd === 'quit') break;
  try {
    console.log(JSON.stringify({ ok: true, value: (await run(cmd)) ?? null }));
  } catch (e) {
    console.log(JSON.stringify({ ok: false, error: String(e) }));
  }
}
await close();
