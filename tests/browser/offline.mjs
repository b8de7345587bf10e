// Debian's chromium, headless, in a throwaway profile, with every request to anything but
// this machine refused and recorded: what every browser test here starts from.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

// Opens the browser; `offsite` collects refused addresses; `close()` ends it and removes
// the profile.
export async function offlineBrowser(prefix) {
  const profile = mkdtempSync(join(tmpdir(), prefix));
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
  await context.route('**/*', (route) => {
    const { hostname, protocol } = new URL(route.request().url());
    const local = ['127.0.0.1', 'localhost', '[::1]'].includes(hostname) || protocol === 'data:';
    if (local) return route.continue();
    offsite.push(route.request().url());
    return route.abort('internetdisconnected');
  });
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, offsite, close };
}
