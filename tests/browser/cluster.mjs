// The dashboard of one node of a cluster in a real browser (Debian's
// Chromium driven by playwright-core): the whole cluster from that node.
//
// Environment: DASHBOARD_URL (node a's dashboard), ADMIN_TOKEN (node a's),
// ON_B (the PID of a process node b holds), SHOTS (where the screenshots
// go), CHROMIUM (the browser), PLAYWRIGHT (playwright-core's directory).
// Prints one line per step; exits 1 at the first failure.

import { join } from 'node:path';
import { expect, launch, newPage, step } from './harness.mjs';

const env = process.env;
const onB = Number(env.ON_B);

const browser = await launch();
const problems = [];
let failed = false;
try {
  const page = await newPage(browser, problems);

  await step('node a\'s dashboard says its node and lists b\'s process with its node', async () => {
    await page.goto(env.DASHBOARD_URL);
    await page.fill('#login-token', env.ADMIN_TOKEN);
    await page.click('#login-submit');
    await page.waitForSelector('#logout');
    const node = await page.locator('#node-name').innerText();
    expect(node === 'node a', `the header says ${JSON.stringify(node)}`);
    const row = `[data-testid="proc-row"][data-pid="${onB}"]`;
    await page.waitForSelector(row);
    const text = await page.locator(row).innerText();
    expect(/on-b/.test(text) && /@b/.test(text), `b's process row: ${text}`);
    await page.screenshot({ path: join(env.SHOTS, 'cluster-tree.png') });
  });

  await step('the Nodes view lists both nodes, this one marked', async () => {
    await page.click('#nav-nodes a');
    await page.waitForSelector('[data-testid="node-row"][data-name="a"]');
    await page.waitForSelector('[data-testid="node-row"][data-name="b"]');
    const a = await page.locator('[data-testid="node-row"][data-name="a"]').innerText();
    const b = await page.locator('[data-testid="node-row"][data-name="b"]').innerText();
    expect(/this node/.test(a) && !/this node/.test(b), `rows: ${a} | ${b}`);
    expect(/gpu=true/.test(b), `b's labels: ${b}`);
    await page.screenshot({ path: join(env.SHOTS, 'cluster-nodes.png') });
  });

  await step('a process on b opens on a, with its node', async () => {
    await page.goto(`${env.DASHBOARD_URL}#/proc/${onB}`);
    await page.waitForSelector('#proc-identity');
    const identity = await page.locator('#proc-identity').innerText();
    expect(/Node\s+b/.test(identity), `identity: ${identity}`);
  });

  await step('the events view shows b\'s events on a, with their node', async () => {
    await page.goto(`${env.DASHBOARD_URL}#/events`);
    await page.waitForSelector(`[data-testid="event-row"]:has-text("${onB}"):has-text("@b")`);
  });

  expect(problems.length === 0, `the page reported: ${problems.join('; ')}`);
} catch (err) {
  failed = true;
  if (problems.length) console.log(`page problems: ${problems.join('; ')}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
