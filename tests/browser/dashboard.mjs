// The dashboard in a real browser (Debian's Chromium driven by
// playwright-core), against a real kernel the calling test started.
//
// Environment: DASHBOARD_URL, ADMIN_TOKEN, READ_TOKEN, HIVEKERNEL_BIN,
// HIVEKERNEL_DATA_DIR, HIVEKERNEL_ADDR (for the CLI), SHOTS (where the
// screenshots go), CHROMIUM (the browser), PLAYWRIGHT (playwright-core's
// directory). Prints one line per step; exits 1 at the first failure.

import { execFileSync, spawn } from 'node:child_process';
import { join } from 'node:path';
import { expect, launch, newPage as openPage, step } from './harness.mjs';

const env = process.env;

function cli(...args) {
  return execFileSync(env.HIVEKERNEL_BIN, [...args, '--addr', env.HIVEKERNEL_ADDR, '--data-dir', env.HIVEKERNEL_DATA_DIR], { encoding: 'utf8' });
}

// A CLI command left running; resolves with its stdout when it exits.
function cliInBackground(...args) {
  const child = spawn(env.HIVEKERNEL_BIN, [...args, '--addr', env.HIVEKERNEL_ADDR, '--data-dir', env.HIVEKERNEL_DATA_DIR]);
  let out = '';
  let err = '';
  child.stdout.on('data', (chunk) => { out += chunk; });
  child.stderr.on('data', (chunk) => { err += chunk; });
  return new Promise((resolve, reject) => {
    child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${args.join(' ')}: exit ${code}: ${err}`))));
  });
}

function pidOf(name) {
  const found = JSON.parse(cli('ps', '--json')).find((p) => p.name === name);
  if (!found) throw new Error(`no process ${name}`);
  return found.pid;
}

const browser = await launch();
const problems = [];
const newPage = (viewport) => openPage(browser, problems, viewport);

async function login(page, token) {
  await page.goto(env.DASHBOARD_URL);
  await page.fill('#login-token', token);
  await page.click('#login-submit');
  await page.waitForSelector('#logout');
}

const row = (pid) => `[data-testid="proc-row"][data-pid="${pid}"]`;
// A page's fetch of an action, as a script on it (or a forger) would send it.
async function post(page, method, body, csrf) {
  return page.evaluate(async ({ method, body, csrf }) => {
    const headers = { 'Content-Type': 'application/json' };
    if (csrf) headers['X-CSRF-Token'] = csrf;
    const response = await fetch(`/api/rpc/${method}`, { method: 'POST', headers, body: JSON.stringify(body) });
    return { status: response.status, body: await response.text() };
  }, { method, body, csrf });
}

let failed = false;
try {
  const page = await newPage();
  const writer = pidOf('writer');
  const ops = pidOf('ops');

  await step('a wrong token is refused', async () => {
    await page.goto(env.DASHBOARD_URL);
    await page.fill('#login-token', `${env.ADMIN_TOKEN}x`);
    await page.click('#login-submit');
    await page.waitForFunction(() => /invalid token/.test(document.querySelector('#login-error')?.textContent || ''));
    expect(!(await page.locator('#logout').isVisible()), 'logged in with a wrong token');
  });

  await step('the admin token logs in and the tree shows the config agents', async () => {
    await page.fill('#login-token', env.ADMIN_TOKEN);
    await page.click('#login-submit');
    await page.waitForSelector(row(writer));
    await page.waitForSelector(row(ops));
    const text = await page.locator(row(writer)).innerText();
    expect(/writer/.test(text) && /idle/i.test(text), `the writer's row: ${text}`);
    await page.screenshot({ path: join(env.SHOTS, 'tree.png') });
  });

  let scout;
  let scoutChild;
  await step('a process spawned through the CLI appears without a reload', async () => {
    await page.evaluate(() => { window.__notReloaded = true; });
    scout = Number(cli('spawn', '--parent', String(writer), '--name', 'scout').trim());
    scoutChild = Number(cli('spawn', '--parent', String(scout), '--name', 'scout-helper').trim());
    await page.waitForSelector(row(scout));
    await page.waitForSelector(row(scoutChild));
    expect(await page.evaluate(() => window.__notReloaded === true), 'the page was reloaded');
  });

  await step('a process page shows the transcript as a turn runs', async () => {
    await page.goto(`${env.DASHBOARD_URL}#/proc/${writer}`);
    await page.waitForSelector('#transcript');
    const running = cliInBackground('exec', String(writer), 'slow: compile the weekly report');
    await page.waitForSelector('[data-testid="transcript-entry"]:has-text("compile the weekly report")');
    const answered = '[data-testid="transcript-entry"]:has-text("answer: slow: compile the weekly report")';
    // The task's input shows before its answer exists (the model takes 3 s).
    expect(await page.locator(answered).count() === 0, 'the answer came with the input');
    await page.waitForSelector(answered);
    const output = await running;
    expect(output.includes('answer: slow: compile the weekly report'), `exec printed ${output}`);
    await page.screenshot({ path: join(env.SHOTS, 'process.png'), fullPage: true });
  });

  await step('exec from the page returns the answer', async () => {
    await page.fill('#exec-input', 'count the open tickets');
    await page.click('#exec-submit');
    await page.waitForFunction(() => /answer: count the open tickets/.test(document.querySelector('#exec-result')?.textContent || ''));
  });

  await step('an action without the session key is refused', async () => {
    const refused = await post(page, 'Kill', { pid: scout, reason: 'forged' }, null);
    expect(refused.status === 401 && /X-CSRF-Token/.test(refused.body), `status ${refused.status}: ${refused.body}`);
    expect(JSON.parse(cli('ps', '--json')).some((p) => p.pid === scout), 'the forged kill killed');
  });

  await step('kill from the page removes the subtree', async () => {
    await page.goto(`${env.DASHBOARD_URL}#/proc/${scout}`);
    page.once('dialog', (dialog) => dialog.accept());
    await page.click('#action-kill');
    await page.goto(`${env.DASHBOARD_URL}#/tree`);
    await page.waitForSelector(row(writer));
    await page.waitForSelector(row(scout), { state: 'detached' });
    await page.waitForSelector(row(scoutChild), { state: 'detached' });
    const left = JSON.parse(cli('ps', '--json')).filter((p) => p.pid === scout || p.pid === scoutChild);
    expect(left.every((p) => /zombie|dead/i.test(p.state)), `still there: ${JSON.stringify(left)}`);
  });

  await step('an approval is approved from the inbox', async () => {
    await page.goto(`${env.DASHBOARD_URL}#/inbox`);
    const running = cliInBackground('exec', String(ops), 'write the marker');
    const item = page.locator('[data-testid="inbox-item"]').first();
    await item.waitFor();
    expect(/shell_exec/.test(await item.innerText()), 'the request does not name its tool');
    await page.screenshot({ path: join(env.SHOTS, 'inbox.png') });
    await item.locator('[data-action="approve"]').click();
    const output = await running;
    expect(output.includes('ran:') && output.includes('approved-run'), `exec printed ${output}`);
    await page.waitForSelector('[data-testid="inbox-item"]', { state: 'detached' });
  });

  await step('the events, usage and cron views render', async () => {
    await page.goto(`${env.DASHBOARD_URL}#/events`);
    await page.waitForFunction(() => /spawned/.test(document.querySelector('#view')?.textContent || ''));
    await page.screenshot({ path: join(env.SHOTS, 'events.png') });
    await page.goto(`${env.DASHBOARD_URL}#/usage`);
    await page.waitForFunction(() => /test-model/.test(document.querySelector('#view')?.textContent || ''));
    await page.screenshot({ path: join(env.SHOTS, 'usage.png') });
    await page.goto(`${env.DASHBOARD_URL}#/cron`);
    await page.waitForSelector('#cron-add-form');
  });

  await step('a cron entry is added, disabled, run now and enabled again from the page', async () => {
    const cronEntry = () => JSON.parse(cli('cron', 'ls', '--json')).find((e) => e.name === 'digest');
    await page.fill('#cron-name', 'digest');
    await page.fill('#cron-schedule', '0 0 3 * * *');
    await page.fill('#cron-target', String(writer));
    await page.fill('#cron-task', 'the daily digest');
    await page.click('#cron-submit');
    const entryRow = '[data-testid="cron-row"][data-name="digest"]';
    await page.waitForSelector(entryRow);
    await page.click(`${entryRow} [data-action="disable-cron"]`);
    await page.waitForSelector(`${entryRow} [data-action="enable-cron"]`);
    expect(cronEntry().enabled === false && !cronEntry().next_run_unix_ms, `after disable: ${JSON.stringify(cronEntry())}`);
    await page.click(`${entryRow} [data-action="run-cron"]`);
    // The view follows cron_run events: the run's result shows without a reload.
    await page.waitForSelector(`${entryRow} details summary:has-text("ok")`);
    const ran = cronEntry();
    expect(ran.runs === 1 && ran.history[0].output.includes('answer: the daily digest'), `after run now: ${JSON.stringify(ran)}`);
    await page.screenshot({ path: join(env.SHOTS, 'cron.png'), fullPage: true });
    await page.click(`${entryRow} [data-action="enable-cron"]`);
    await page.waitForSelector(`${entryRow} [data-action="disable-cron"]`);
    expect(cronEntry().enabled === true && cronEntry().next_run_unix_ms > 0, `after enable: ${JSON.stringify(cronEntry())}`);
  });

  await step('the trace view shows the events of one trace, read by the kernel', async () => {
    const reply = JSON.parse(cli('exec', String(writer), 'trace this task', '--json'));
    expect(/^[0-9a-f]{32}$/.test(reply.trace_id), `exec printed ${JSON.stringify(reply)}`);
    await page.goto(`${env.DASHBOARD_URL}#/trace/${reply.trace_id}`);
    await page.waitForFunction(() => /Replay complete/.test(document.querySelector('#trace-status')?.textContent || ''));
    const rows = page.locator('[data-testid="trace-row"]');
    await rows.filter({ hasText: 'task_finished' }).first().waitFor();
    await rows.filter({ hasText: 'llm_call' }).first().waitFor();
    // Only this trace: the earlier tasks' model calls are not in it.
    const calls = await rows.filter({ hasText: 'llm_call' }).count();
    expect(calls === 1, `${calls} model calls in a one-call trace`);
    await page.screenshot({ path: join(env.SHOTS, 'trace.png'), fullPage: true });
  });

  await step('a narrow window still shows the tree', async () => {
    const narrow = await newPage({ width: 420, height: 800 });
    await login(narrow, env.ADMIN_TOKEN);
    await narrow.waitForSelector(row(writer));
    const overflow = await narrow.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    expect(overflow <= 1, `the page is ${overflow}px wider than the window`);
    await narrow.screenshot({ path: join(env.SHOTS, 'narrow.png') });
    await narrow.context().close();
  });

  await step('a read token sees no action controls, and a forged action is refused', async () => {
    const reader = await newPage();
    await login(reader, env.READ_TOKEN);
    await reader.waitForSelector(row(writer));
    await reader.goto(`${env.DASHBOARD_URL}#/proc/${writer}`);
    await reader.waitForSelector('#transcript');
    expect(await reader.locator('.action, #exec-form, #send-form, #action-kill, #action-restart').count() === 0,
      'a read session shows action controls');
    // Events from before the page was opened are shown: the kernel replays the newest.
    await reader.goto(`${env.DASHBOARD_URL}#/events`);
    await reader.waitForSelector(`[data-testid="event-row"]:has-text("scout exit code")`);
    await reader.goto(`${env.DASHBOARD_URL}#/cron`);
    await reader.waitForSelector('[data-testid="cron-row"][data-name="digest"]');
    expect(await reader.locator('#cron-add-form, .action').count() === 0, 'a read session may add cron entries');
    const csrf = await reader.evaluate(() => sessionStorage.getItem('hivekernel.session-key'));
    const forged = await post(reader, 'Kill', { pid: writer, reason: 'forged' }, csrf);
    expect(forged.status === 403 && /operate/.test(forged.body), `status ${forged.status}: ${forged.body}`);
    expect(JSON.parse(cli('ps', '--json')).some((p) => p.pid === writer && !/zombie|dead/i.test(p.state)),
      'the read token killed');
  });

  await step('logout returns to the login form', async () => {
    await page.click('#logout');
    await page.waitForSelector('#login-token');
    const after = await page.evaluate(async () => (await fetch('/api/session')).status);
    expect(after === 401, `the session still answers ${after}`);
  });

  expect(problems.length === 0, `the page reported: ${problems.join('; ')}`);
} catch (err) {
  failed = true;
  if (problems.length) console.log(`page problems: ${problems.join('; ')}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
