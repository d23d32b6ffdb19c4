// Drives the console in Debian's Chromium (tests/console.rs starts the server and seeds
// it): signs in with each kind of token, opens every page, and checks that each figure the
// page shows is the API's answer to the second. Prints one JSON line of what it checked;
// exits non-zero on the first difference.
//
// Environment: BASE (the server), ADMIN, FINANCE, CONSOLE_A (bound to org_a), MEMBER_A
// (org_a's user u1), INGEST (tokens), SHOTS (a directory for screenshots), CHROMIUM (default /usr/bin/chromium).

import { chromium } from "playwright-core";
import { mkdirSync, readFileSync } from "node:fs";
import assert from "node:assert/strict";

const { BASE, ADMIN, FINANCE, CONSOLE_A, MEMBER_A, INGEST, SHOTS } = process.env;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
mkdirSync(SHOTS, { recursive: true });

const checked = { figures: 0, pages: 0, screenshots: 0 };

async function api(path, token = ADMIN, init = {}) {
  const resp = await fetch(BASE + path, { ...init, headers: { Authorization: `Bearer ${token}`, ...(init.headers || {}) } });
  const text = await resp.text();
  assert.ok(resp.ok, `${path}: ${resp.status} ${text}`);
  return { json: text && resp.headers.get("content-type")?.includes("json") ? JSON.parse(text) : null, text, resp };
}
const get = async (path, token) => (await api(path, token)).json;

/** `12 h 05 m 10 s` back to seconds. */
function seconds(text) {
  const m = /^(?:(\d+) h )?(?:(\d+) m )?(\d+) s$/.exec(text.trim());
  assert.ok(m, `not a duration: ${JSON.stringify(text)}`);
  return (Number(m[1] || 0) * 60 + Number(m[2] || 0)) * 60 + Number(m[3]);
}

/** The figure at `locator`: its text read back equals its data-seconds equals `expected`. */
async function figure(locator, expected, what) {
  const text = await locator.innerText();
  const data = Number(await locator.getAttribute("data-seconds"));
  assert.equal(seconds(text), expected, `${what}: the page says ${text}, the API ${expected}`);
  assert.equal(data, expected, `${what}: data-seconds ${data}, the API ${expected}`);
  checked.figures += 1;
}

async function shot(page, name) {
  await page.screenshot({ path: `${SHOTS}/${name}.png`, fullPage: true });
  checked.screenshots += 1;
}

/** Every control has a name a screen reader reads out. */
async function labelled(page, where) {
  const unnamed = await page.evaluate(() =>
    [...document.querySelectorAll("button, input, select, a[href], svg[role=img], progress")]
      .filter((e) => !e.closest("[hidden]"))
      .filter((e) => {
        const by = (e.getAttribute("aria-labelledby") || "").split(" ").filter(Boolean);
        const named = by.length > 0 && by.every((id) => document.getElementById(id)?.textContent.trim());
        return !(e.getAttribute("aria-label") || named || (e.labels && e.labels.length) || e.textContent.trim());
      })
      .map((e) => e.outerHTML.slice(0, 120)),
  );
  assert.deepEqual(unnamed, [], `${where}: controls without an accessible name`);
}

async function signIn(page, token) {
  await page.goto(`${BASE}/console`);
  await page.getByLabel("Token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
}

/** The page titled `title` has loaded every section. */
async function settled(page, title) {
  await page.locator("#view > div:not([aria-busy]) > h1", { hasText: title }).waitFor();
  checked.pages += 1;
}

/** Load `hash` afresh (the token stays in the tab's sessionStorage). */
async function open(page, hash) {
  await page.goto("about:blank");
  await page.goto(`${BASE}/console${hash}`);
}

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const problems = [];
let current = null;
function watch(page) {
  current = page;
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // A refused API call logs its status; the page shows it, and the test expects some.
    if (m.type() === "error" && !/status of (401|403|404)/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  return page;
}

try {
  // ---- Headers: a CSP with no inline script, nothing that holds data cached. --------------
  const html = await fetch(`${BASE}/console`);
  const csp = html.headers.get("content-security-policy");
  assert.match(csp, /script-src 'self'(;|$)/);
  assert.match(csp, /default-src 'none'/);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
  assert.doesNotMatch(await html.text(), /<script(?![^>]*\bsrc=)/, "an inline script");
  const data = await api("/v1/orgs");
  assert.equal(data.resp.headers.get("cache-control"), "no-store");
  const usageHead = await api("/v1/orgs/org_a/usage");
  assert.equal(usageHead.resp.headers.get("cache-control"), "no-store");

  // ---- Sign-in: refusals, then admin. -----------------------------------------------------
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  const page = watch(await ctx.newPage());
  await signIn(page, "not-a-token-at-all");
  await page.getByText("This service does not know that token.").waitFor();
  await signIn(page, INGEST);
  await page.getByText("cannot open the console").waitFor();
  await labelled(page, "sign-in");
  await shot(page, "sign-in");

  await signIn(page, ADMIN);
  await page.waitForURL(/#\/orgs$/);
  await settled(page, "Orgs");
  assert.ok(!page.url().includes(ADMIN), "the token is in the URL");

  // ---- Orgs: a page of 50, the rest after "More"; every row's figures; a search. --------
  const orgs = (await get("/v1/orgs")).orgs;
  assert.ok(orgs.length > 50, "the seed has more orgs than a page");
  assert.equal(await page.locator("tr[data-org]").count(), 50);
  await page.getByRole("button", { name: "More orgs" }).click();
  await page.waitForFunction((n) => document.querySelectorAll("tr[data-org]").length === n, orgs.length);
  assert.ok(await page.getByRole("button", { name: "More orgs" }).isHidden(), "More after the last page");
  for (const o of orgs) {
    const row = page.locator(`tr[data-org="${o.org_id}"]`);
    await figure(row.locator(".month .dur").nth(0), o.month.used_seconds, `${o.org_id} month used`);
    await figure(row.locator(".month .dur").nth(1), o.month.limit_seconds, `${o.org_id} month limit`);
    await figure(row.locator(".week .dur").nth(0), o.week.used_seconds, `${o.org_id} week used`);
    assert.equal(await row.locator("td").nth(1).innerText(), `${o.plan} v${o.plan_version}`);
  }
  await labelled(page, "orgs");
  await shot(page, "orgs");
  await page.getByLabel("Search orgs").fill("ORG_B");
  await page.waitForFunction(() => document.querySelectorAll("tr[data-org]").length === 1);
  assert.equal(await page.locator("tr[data-org]").getAttribute("data-org"), "org_b");
  await page.getByLabel("Search orgs").fill("");
  await page.waitForFunction(() => document.querySelectorAll("tr[data-org]").length === 50);

  // Keyboard only: Tab from the search box to org_a's link, Enter opens it.
  await page.getByLabel("Search orgs").focus();
  let reached = false;
  for (let i = 0; i < 20 && !reached; i++) {
    await page.keyboard.press("Tab");
    reached = await page.evaluate(() => document.activeElement?.textContent === "org_a" && document.activeElement.tagName === "A");
  }
  assert.ok(reached, "org_a's link is not reachable with Tab");
  await page.keyboard.press("Enter");
  await page.waitForURL(/#\/orgs\/org_a$/);
  await settled(page, "org_a");

  // ---- An org: gauges, the chart, who paid, sessions, decisions, grants, limits. ----------
  const usage = await get("/v1/orgs/org_a/usage");
  for (const w of ["month", "week"]) {
    const card = page.locator(`#${w}`);
    await figure(card.locator(".used .dur"), usage[w].used_seconds, `${w} used`);
    await figure(card.locator(".limit .dur"), usage[w].limit_seconds, `${w} limit`);
    await figure(card.locator(".remaining .dur"), usage[w].remaining_seconds, `${w} left`);
    assert.equal(await card.locator("time").getAttribute("datetime"), usage[w].resets_at);
    assert.match(await card.locator("time").getAttribute("title"), / UTC$/);
  }
  await figure(page.locator("#funding-card .remaining-all .dur"), usage.funding.remaining_seconds, "left from every source");

  const from = new Date(Math.floor(Date.parse(usage.month.start) / 3600e3) * 3600e3).toISOString().replace(".000Z", "Z");
  const to = new Date(Math.ceil(Date.parse(usage.month.end) / 3600e3) * 3600e3).toISOString().replace(".000Z", "Z");
  const byDay = await get(`/v1/orgs/org_a/usage/breakdown?from=${from}&to=${to}&group_by=day`);
  assert.equal(byDay.total.seconds, usage.month.used_seconds, "the breakdown and the usage page disagree");
  await figure(page.locator("#chart-total .dur"), byDay.total.seconds, "chart total");
  const days = byDay.rows.filter((r) => r.seconds > 0);
  assert.ok(days.length >= 3, `a seeded month has days: ${JSON.stringify(byDay.rows)}`);
  assert.equal(await page.locator("#day-chart g.bar").count(), days.length, "one bar a day with agent time");
  for (const d of days) {
    const bar = page.locator(`#day-chart g.bar[data-day="${d.key}"]`);
    assert.equal(Number(await bar.getAttribute("data-seconds")), d.seconds, `bar ${d.key}`);
    const dayEnd = new Date(Math.min(Date.parse(d.key) + 86400e3, Date.parse(to))).toISOString().replace(".000Z", "Z");
    const dayStart = new Date(Math.max(Date.parse(d.key), Date.parse(from))).toISOString().replace(".000Z", "Z");
    const agents = await get(`/v1/orgs/org_a/usage/breakdown?from=${dayStart}&to=${dayEnd}&group_by=agent`);
    const segs = await bar.locator("rect").evaluateAll((rs) => rs.map((r) => [r.dataset.agent, Number(r.dataset.seconds)]));
    assert.deepEqual(segs, agents.rows.map((a) => [a.key ?? "(no agent)", a.seconds]), `segments of ${d.key}`);
    assert.equal(segs.reduce((a, s) => a + s[1], 0), d.seconds, `segments of ${d.key} add up`);
    checked.figures += segs.length;
  }
  const agentsInChart = new Set(await page.locator("#day-chart rect").evaluateAll((rs) => rs.map((r) => r.dataset.agent)));
  assert.ok(agentsInChart.size >= 2, "stacked by agent");

  const funding = await get(`/v1/orgs/org_a/usage/breakdown?from=${from}&to=${to}&group_by=funding`);
  for (const r of funding.rows) await figure(page.locator(`#funding li[data-source="${r.key}"] .dur`), r.seconds, `paid by ${r.key}`);

  const sessions = (await get(`/v1/orgs/org_a/sessions?from=${from}&to=${to}&limit=25`)).sessions;
  assert.ok(sessions.length >= 3);
  assert.equal(await page.locator("#sessions tr[data-session]").count(), sessions.length);
  for (const s of sessions) {
    const d = await get(`/v1/sessions/${s.session_id}`);
    const row = page.locator(`#sessions tr[data-session="${s.session_id}"]`);
    await figure(row.locator(".running .dur"), d.running_seconds, `${s.session_id} running`);
    await figure(row.locator(".parked .dur"), d.parked_seconds, `${s.session_id} parked`);
    const drawn = await page.locator(`#timeline g[data-session="${s.session_id}"] rect`).evaluateAll((rs) => rs.map((r) => [r.dataset.kind, Number(r.dataset.seconds)]));
    assert.deepEqual(drawn, d.timeline.map((t) => [t.kind, (Date.parse(t.end) - Date.parse(t.start)) / 1000]), `${s.session_id}'s stretches`);
    checked.figures += drawn.length;
  }
  assert.ok((await page.locator("#timeline rect.park").count()) > 0, "parked stretches are drawn");

  const decisions = (await get(`/v1/orgs/org_a/decisions?from=${from}&to=${to}&limit=50`)).decisions;
  assert.equal(await page.locator("#decisions tr[data-decision]").count(), decisions.length);
  const denied = decisions.find((d) => d.decision === "deny");
  assert.ok(denied, "a seeded denial");
  const drow = page.locator(`#decisions tr[data-decision="${denied.decision_id}"]`);
  assert.match(await drow.innerText(), new RegExp(denied.rule));
  await figure(drow.locator(".month .dur").nth(0), denied.usage.month.used_seconds, "the denial's month");

  const grants = (await get("/v1/orgs/org_a/grants")).grants;
  assert.ok(grants.length >= 1);
  for (const g of grants) {
    const row = page.locator(`#grants tr[data-grant="${g.grant_id}"]`);
    await figure(row.locator(".used .dur"), g.used_seconds, `${g.grant_id} used`);
    await figure(row.locator(".remaining .dur"), g.remaining_seconds, `${g.grant_id} left`);
  }
  const limits = (await get("/v1/orgs/org_a/limits")).limits;
  assert.ok(limits.length >= 1);
  for (const l of limits) {
    const row = page.locator(`#limits tr[data-limit="${l.kind}/${l.member_id}"]`);
    await figure(row.locator(".month .dur").nth(0), l.month.used_seconds, `${l.member_id} month used`);
    await figure(row.locator(".week .dur").nth(0), l.week.used_seconds, `${l.member_id} week used`);
  }
  const prompt = await get("/v1/orgs/org_a/upgrade-prompt");
  assert.equal(await page.locator("#prompt .prompt").count(), prompt.show ? 1 : 0);
  const bill = await get("/v1/orgs/org_a/invoice-preview");
  const money = (m) => `${m} ${bill.currency.toUpperCase()}`;
  assert.equal(await page.locator("#bill .due").innerText(), money(bill.due));
  assert.equal(await page.locator("#bill .projected").innerText(), money(bill.projected));
  assert.equal(await page.locator("#bill tr[data-line]").count(), bill.lines.length);
  for (const [i, l] of bill.lines.entries()) {
    assert.equal(await page.locator("#bill tr[data-line] .money").nth(i).innerText(), money(l.amount), `bill line ${l.kind}`);
    checked.figures += 1;
  }
  await labelled(page, "org");
  await shot(page, "org");

  // ---- Billing: a quarantined event and its retry; closed periods and an export. -----------
  await page.getByRole("link", { name: "Billing" }).click();
  await settled(page, "Billing");
  const events = (await get("/v1/admin/stripe/events")).events;
  assert.equal(await page.locator("#events tr[data-event]").count(), events.length);
  const bad = events.find((e) => e.state === "quarantined");
  assert.ok(bad, "a seeded quarantined event");
  const erow = page.locator(`#events tr[data-event="${bad.event_id}"]`);
  assert.ok((await erow.innerText()).includes(bad.last_error), "the quarantined event's error is shown");
  const periods = (await get("/v1/periods")).periods;
  assert.ok(periods.length >= 1);
  for (const p of periods) await figure(page.locator(`#periods tr[data-period="${p.period}"] .agent .dur`), p.agent_seconds, `${p.period} agent time`);
  await labelled(page, "billing");
  await shot(page, "billing");
  await erow.getByRole("button", { name: `Retry ${bad.event_id}` }).click();
  await page.getByText(`${bad.event_id} is queued again.`).waitFor();
  const after = (await get("/v1/admin/stripe/events")).events.find((e) => e.event_id === bad.event_id);
  assert.equal(after.state, "pending", "the retry put it back in the queue");

  const period = periods[0].period;
  const [download] = await Promise.all([
    page.waitForEvent("download"),
    page.getByRole("button", { name: `Download ${period} by org as CSV` }).click(),
  ]);
  const saved = readFileSync(await download.path(), "utf8");
  const expected = (await api(`/v1/exports/usage?period=${period}&by=org&format=csv`, FINANCE)).text;
  assert.equal(saved, expected, "the downloaded export is the API's");
  assert.ok(saved.split("\n").length > 1);

  // ---- Phone width: nothing wider than the screen. ----------------------------------------
  await page.setViewportSize({ width: 390, height: 844 });
  await open(page, "#/orgs/org_a");
  await settled(page, "org_a");
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 1, `the page is ${overflow}px wider than a phone`);
  // Charts keep a readable width and scroll inside their box instead of shrinking.
  const chartWidth = await page.locator("#day-chart").evaluate((c) => c.getBoundingClientRect().width);
  assert.ok(chartWidth >= 600, `the chart is squeezed to ${chartWidth}px`);
  await shot(page, "org-phone");

  // Sign out forgets the token.
  await page.getByRole("button", { name: "Sign out" }).click();
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await ctx.close();

  // ---- Finance: orgs and periods, not Stripe's queue. -------------------------------------
  // In Tokyo: times in the viewer's zone, UTC on hover.
  const fctx = await browser.newContext({ viewport: { width: 1280, height: 900 }, timezoneId: "Asia/Tokyo", locale: "en-US" });
  const fpage = watch(await fctx.newPage());
  await signIn(fpage, FINANCE);
  await fpage.waitForURL(/#\/orgs$/);
  await settled(fpage, "Orgs");
  await fpage.getByRole("link", { name: "Billing" }).click();
  await settled(fpage, "Billing");
  assert.equal(await fpage.locator("#events").count(), 0, "finance sees Stripe's queue");
  assert.equal(await fpage.locator("#periods tr[data-period]").count(), periods.length);
  const closed = fpage.locator(`#periods tr[data-period="${periods[0].period}"] time`);
  const at = new Date(periods[0].closed_at);
  assert.equal(await closed.getAttribute("datetime"), periods[0].closed_at);
  assert.equal(await closed.getAttribute("title"), `${periods[0].closed_at.replace("T", " ").replace("Z", "")} UTC`);
  // Formatted by the browser's own ICU for Tokyo, to compare like with like.
  const tokyo = await fpage.evaluate((t) => new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium", timeZone: "Asia/Tokyo" }).format(new Date(t)), at.getTime());
  assert.equal(await closed.innerText(), tokyo, "a time in the viewer's zone");
  assert.notEqual(tokyo, await fpage.evaluate((t) => new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium", timeZone: "UTC" }).format(new Date(t)), at.getTime()));
  assert.match(await fpage.locator("#who").innerText(), /times in Asia\/Tokyo/);
  await fctx.close();

  // ---- A console token: its org, and nothing of another. -----------------------------------
  const cctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const cpage = watch(await cctx.newPage());
  await signIn(cpage, CONSOLE_A);
  await cpage.waitForURL(/#\/orgs\/org_a$/);
  await settled(cpage, "org_a");
  await figure(cpage.locator("#month .used .dur"), usage.month.used_seconds, "console: month used");
  assert.equal(await cpage.getByRole("link", { name: "Orgs" }).count(), 0);
  assert.equal(await cpage.getByRole("link", { name: "Billing" }).count(), 0);
  await shot(cpage, "console-org");
  for (const [hash, code] of [["#/orgs/org_b", "org_not_found"], ["#/billing", "forbidden"]]) {
    await open(cpage, hash);
    const alert = cpage.locator("#view > div:not([aria-busy]) [role=alert]:not(:empty)").first();
    await alert.waitFor();
    assert.match(await alert.innerText(), new RegExp(code));
    assert.equal(await cpage.locator("#view .dur").count(), 0, `${hash}: a console token of org_a sees figures`);
  }
  await shot(cpage, "console-other-org");
  await cctx.close();

  // ---- A member token: the user's own page, and nothing of the org's. ---------------------
  const mctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const mpage = watch(await mctx.newPage());
  const mine = await get("/v1/me/usage", MEMBER_A);
  await signIn(mpage, MEMBER_A);
  await mpage.waitForURL(/#\/me$/);
  await settled(mpage, "u1 in org_a");
  await figure(mpage.locator("#time-left .remaining .dur"), mine.time_left_seconds, "member: time left");
  await figure(mpage.locator("#month .used .dur"), mine.month.used_seconds, "member: month used");
  await figure(mpage.locator("#week .used .dur"), mine.week.used_seconds, "member: week used");
  assert.ok(mine.days.length > 0, "u1 has days");
  for (const d of mine.days) await figure(mpage.locator(`tr[data-day="${d.day}"] .dur`), d.seconds, `member: ${d.day}`);
  assert.equal(await mpage.locator("tr[data-session]").count(), mine.sessions.length);
  assert.equal(await mpage.getByRole("link", { name: "Orgs" }).count(), 0);
  await labelled(mpage, "member");
  await shot(mpage, "member");
  // Another page asked for is still the user's own: the org's page is not a member's.
  await open(mpage, "#/orgs/org_a");
  await settled(mpage, "u1 in org_a");
  await mctx.close();

  assert.deepEqual(problems, [], "errors in the page");
  console.log(JSON.stringify(checked));
} catch (e) {
  // What the page showed when it went wrong, for whoever reads the failure.
  if (current) {
    await current.screenshot({ path: `${SHOTS}/failure.png`, fullPage: true }).catch(() => {});
    console.error(`the page at ${current.url()}:\n${await current.locator("body").innerText().catch(() => "?")}`);
  }
  console.error("problems in the page:", problems);
  throw e;
} finally {
  await browser.close();
}
