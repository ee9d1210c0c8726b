// What the browser tests share: steps that print one line each, checks,
// Debian's Chromium launched headless through playwright-core, and a page
// whose errors are collected.
//
// Environment: CHROMIUM (the browser), PLAYWRIGHT (playwright-core's
// directory), SHOTS (where the screenshots go).

import { createRequire } from 'node:module';
import { mkdirSync } from 'node:fs';

const env = process.env;
const require = createRequire(import.meta.url);
const { chromium } = require(env.PLAYWRIGHT);

// How long a page waits for what a step expects.
export const WAIT = 20000;

export async function step(name, body) {
  const started = Date.now();
  try {
    await body();
    console.log(`ok   ${name} (${Date.now() - started} ms)`);
  } catch (err) {
    console.log(`FAIL ${name}: ${err.stack || err}`);
    throw err;
  }
}

export function expect(condition, message) {
  if (!condition) throw new Error(message);
}

// Chromium, headless, with the screenshot directory made.
export async function launch() {
  mkdirSync(env.SHOTS, { recursive: true });
  return chromium.launch({
    executablePath: env.CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
}

// A page of `browser` whose errors go to `problems`. A refused request
// the page handles (401, 403, 404: the session check before a login, a
// process gone) is no problem.
export async function newPage(browser, problems, viewport = { width: 1280, height: 800 }) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT);
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error' && !/status of 40[134]/.test(message.text())) {
      problems.push(`console error: ${message.text()}`);
    }
  });
  return page;
}
