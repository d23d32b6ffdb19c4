// The rush-meter console: a page on the JSON API, nothing more. Every figure shown is the
// API's, to the second; the token lives in this tab's sessionStorage and goes out only as
// an `Authorization` header to this origin. No framework: the page is small, and a build
// step would break "cargo run serves it on a fresh machine" (docs/console.md).

const TOKEN_KEY = "rush-meter-token";
const SVG = "http://www.w3.org/2000/svg";
const DAY = 86400;
const HOUR = 3600;

const state = { token: null, me: null };

// ---- DOM -------------------------------------------------------------------------------

/** An element with attributes and children; text is always text (no HTML is parsed). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  setAttrs(node, attrs);
  node.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined));
  return node;
}

function setAttrs(node, attrs) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
}

const $ = (id) => document.getElementById(id);

function say(text) {
  $("status").textContent = text;
}

// ---- Figures ---------------------------------------------------------------------------

/** Seconds as the page shows them, exact: `12 h 05 m 10 s`, `4 m 09 s`, `7 s`. */
function duration(total) {
  const s = Math.trunc(total);
  const sign = s < 0 ? "−" : "";
  const a = Math.abs(s);
  const h = Math.floor(a / HOUR);
  const m = Math.floor((a % HOUR) / 60);
  const sec = a % 60;
  const two = (n) => String(n).padStart(2, "0");
  if (h > 0) return `${sign}${h} h ${two(m)} m ${two(sec)} s`;
  if (m > 0) return `${sign}${m} m ${two(sec)} s`;
  return `${sign}${sec} s`;
}

/** A duration in the page: its text, and the API's seconds for machines and tests. */
function dur(seconds) {
  if (seconds === null || seconds === undefined) return el("span", { class: "muted" }, "no limit");
  return el("span", { class: "dur", "data-seconds": seconds }, duration(seconds));
}

const localTime = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });
const localClock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
const localDay = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", timeZone: "UTC" });
const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";

/** A time in the viewer's zone, UTC on hover. */
function time(iso) {
  if (!iso) return el("span", { class: "muted" }, "—");
  const d = new Date(iso);
  const utc = `${iso.replace("T", " ").replace("Z", "")} UTC`;
  return el("time", { datetime: iso, title: utc }, localTime.format(d));
}

function pill(text, kind) {
  return el("span", { class: `pill ${kind || ""}` }, text);
}

const secs = (iso) => Date.parse(iso) / 1000;
const iso = (s) => new Date(s * 1000).toISOString().replace(".000Z", "Z");

// ---- The API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "error";
    this.field = e.field;
  }
  toString() {
    return `${this.message} (${this.code}, HTTP ${this.status})`;
  }
}

async function api(path, { method = "GET", body, token = state.token } = {}) {
  // Signed out meanwhile (a late timer, a page left behind): ask nothing.
  if (!token) throw new ApiError(401, null);
  const headers = { Authorization: `Bearer ${token}`, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  const text = await resp.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!resp.ok) throw refused(resp.status, json, token);
  return json;
}

/** The error for a refused call; a 401 on the signed-in token signs out. */
function refused(status, body, token) {
  if (status === 401 && token === state.token) signOut("This token is no longer accepted; sign in again.");
  return new ApiError(status, body);
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

/** `fn` over `items`, at most `width` at once (a browser opens six connections a host). */
async function pool(items, width, fn) {
  const out = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, worker));
  return out;
}

const can = (scope) => !!state.me && (state.me.scopes.includes("admin") || state.me.scopes.includes(scope));

// ---- Sign-in ---------------------------------------------------------------------------

async function signIn(token) {
  const me = await api("/v1/me", { token });
  if (!["admin", "finance", "console", "member"].some((s) => me.scopes.includes(s))) {
    throw new Error(`This token's scopes (${me.scopes.join(", ")}) cannot open the console: use an admin, finance, console or member token.`);
  }
  state.token = token;
  state.me = me;
  sessionStorage.setItem(TOKEN_KEY, token);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  state.me = null;
  showSignIn(message || "");
}

function showSignIn(message) {
  $("signin").hidden = false;
  $("view").replaceChildren();
  $("nav").hidden = true;
  $("signout").hidden = true;
  $("who").textContent = "";
  $("signin-error").textContent = message;
  $("token").value = "";
  $("token").focus();
}

function showChrome() {
  $("signin").hidden = true;
  $("signout").hidden = false;
  const me = state.me;
  $("who").textContent = `${me.label || me.token_id} · ${me.scopes.join(", ")}${me.org_id ? ` · ${me.org_id}` : ""} · times in ${zone}, UTC on hover`;
  const links = [];
  if (can("finance")) links.push(["#/orgs", "Orgs"]);
  if (isMember()) links.push(["#/me", "My usage"]);
  else if (me.org_id && !can("finance")) links.push([`#/orgs/${encodeURIComponent(me.org_id)}`, "Usage"]);
  if (can("finance")) links.push(["#/billing", "Billing"]);
  const here = location.hash.split("?")[0];
  $("nav").replaceChildren(
    ...links.map(([href, text]) => el("a", { href, "aria-current": here === href || (href === "#/orgs" && here === "") ? "page" : null }, text)),
  );
  $("nav").hidden = false;
}

// ---- Router ----------------------------------------------------------------------------

function parseHash() {
  const [path, q] = location.hash.replace(/^#/, "").split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(q || "") };
}

let renderSeq = 0;

async function route() {
  if (!state.token) return showSignIn("");
  showChrome();
  const seq = ++renderSeq;
  const view = el("div", { "aria-busy": "true" });
  $("view").replaceChildren(view);
  window.scrollTo(0, 0);
  say("Loading…");
  try {
    const { parts, params } = parseHash();
    if (isMember()) await memberPage(view);
    else if (parts[0] === "orgs" && parts[1]) await orgPage(view, parts[1], params);
    else if (parts[0] === "billing") await billingPage(view);
    else if (can("finance")) await orgsPage(view, params);
    else if (state.me.org_id) await orgPage(view, state.me.org_id, params);
    else view.append(el("p", {}, "This token has no page here."));
    if (seq === renderSeq) say("");
  } catch (e) {
    if (seq !== renderSeq) return;
    if (e instanceof ApiError && e.status === 401) return;
    view.append(el("p", { class: "error", role: "alert" }, String(e)));
    say("");
  }
  view.removeAttribute("aria-busy");
  // A screen reader starts at the new page's heading, unless the reader has already
  // moved into the page (a control of it) while it loaded.
  const h1 = view.querySelector("h1");
  const at = document.activeElement;
  if (h1 && seq === renderSeq && (!at || at === document.body || !view.contains(at))) {
    h1.setAttribute("tabindex", "-1");
    h1.focus({ preventScroll: true });
  }
}

function table(caption, headers, rows, { numeric = [] } = {}) {
  return el(
    "div",
    { class: "table-wrap" },
    el(
      "table",
      {},
      el("caption", {}, caption),
      el("thead", {}, el("tr", {}, headers.map((h, i) => el("th", { scope: "col", class: numeric.includes(i) ? "num" : null }, h)))),
      el(
        "tbody",
        {},
        rows.length
          ? rows.map((r) =>
              el("tr", r.attrs || {}, (r.cells || r).map((c, i) => el(i === 0 ? "th" : "td", { scope: i === 0 ? "row" : null, class: numeric.includes(i) ? "num" : null }, c))),
            )
          : el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "None.")),
      ),
    ),
  );
}

function usedOf(used, limit) {
  return el("span", {}, dur(used), " of ", dur(limit));
}

/**
 * A listing read a page at a time: `read(cursor)` answers `{ rows, next }` (`cursor` null:
 * the first page); `draw(rows, more)` shows every row read so far in `holder`; the "More
 * …" button (`bar`) reads the next page. `load(true)` starts over: an answer it overtakes
 * is dropped, and "More" waits while it runs. Errors show in the listing's own slot.
 */
function pager(label, read, draw) {
  const holder = el("div");
  const error = el("p", { class: "error", role: "alert" });
  const more = el("button", { type: "button", hidden: true }, `More ${label}`);
  let cursor = null;
  let rows = [];
  let seq = 0;
  let restarting = false;
  const load = async (reset) => {
    if (!reset && restarting) return;
    const mine = ++seq;
    restarting = reset;
    more.disabled = true;
    try {
      const page = await read(reset ? null : cursor);
      if (mine !== seq) return;
      rows = reset ? page.rows : rows.concat(page.rows);
      cursor = page.next;
      more.hidden = !cursor;
      error.textContent = "";
      holder.replaceChildren(...[draw(rows, !!cursor)].flat());
    } catch (e) {
      if (mine === seq && !(e instanceof ApiError && e.status === 401)) error.textContent = String(e);
    } finally {
      if (mine === seq) {
        more.disabled = false;
        restarting = false;
      }
    }
  };
  more.addEventListener("click", async () => {
    await load(false);
    // The button is gone after the last page: keep the reader in the listing.
    if (more.hidden) focusQuietly(holder.querySelector("caption") || holder);
  });
  return { holder, bar: el("div", { class: "toolbar" }, error, more), load };
}

/** Focus an element that is not a control (a caption, a note) for screen readers. */
function focusQuietly(node) {
  node.setAttribute("tabindex", "-1");
  node.focus();
}

// ---- Orgs ------------------------------------------------------------------------------

async function orgsPage(view, params) {
  const q = params.get("q") || "";
  const input = el("input", { id: "orgs-q", type: "search", value: q, "aria-controls": "orgs-table", placeholder: "id or name" });
  const list = el("div", { id: "orgs-table" });
  // The search the rows shown answer: "More" goes on with it, not with what is typed.
  let searched = q;
  const orgs = pager(
    "orgs",
    async (cursor) => {
      if (cursor === null) searched = input.value.trim();
      const page = await api(`/v1/orgs${query({ q: searched, cursor, limit: 50 })}`);
      return { rows: page.orgs, next: page.next_cursor };
    },
    (rows, more) => {
      const caption = `${rows.length} org${rows.length === 1 ? "" : "s"}${searched ? ` matching “${searched}”` : ""}${more ? ", more below" : ""}`;
      say(caption);
      return table(
        caption,
        ["Org", "Name", "Plan", "Status", "Month used", "Week used"],
        rows.map((o) => ({
          attrs: { "data-org": o.org_id },
          cells: [
            el("a", { href: `#/orgs/${encodeURIComponent(o.org_id)}` }, o.org_id),
            o.name,
            planName(o.plan, o.plan_version),
            status(o.suspended, o.subscription_status),
            el("span", { class: "month" }, usedOf(o.month.used_seconds, o.month.limit_seconds)),
            el("span", { class: "week" }, usedOf(o.week.used_seconds, o.week.limit_seconds)),
          ],
        })),
      );
    },
  );
  list.append(orgs.holder);
  view.append(
    el("h1", {}, "Orgs"),
    el("form", { role: "search", onsubmit: (e) => e.preventDefault() }, el("label", { for: "orgs-q" }, "Search orgs"), input),
    list,
    orgs.bar,
  );
  let timer = null;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      // The page was left (or the tab signed out) meanwhile.
      if (!input.isConnected || !state.token) return;
      history.replaceState(null, "", `#/orgs${query({ q: input.value.trim() })}`);
      orgs.load(true);
    }, 250);
  });
  await orgs.load(true);
}

function status(suspended, subscription) {
  const parts = [suspended ? pill("suspended", "bad") : pill("active", "ok")];
  if (subscription) parts.push(" ", pill(`Stripe: ${subscription}`, subscription === "active" || subscription === "trialing" ? "ok" : "warn"));
  return el("span", {}, parts);
}

function showError(where) {
  return (e) => {
    if (e instanceof ApiError && e.status === 401) return;
    where.append(el("p", { class: "error", role: "alert" }, String(e)));
  };
}

// ---- An org ----------------------------------------------------------------------------

/** The window the page shows: the usage page's month or week, as whole hours. */
function windowOf(usage, which) {
  const w = which === "week" ? usage.week : usage.month;
  const from = Math.floor(secs(w.start) / HOUR) * HOUR;
  const to = Math.ceil(secs(w.end) / HOUR) * HOUR;
  return { from: iso(from), to: iso(to), name: which === "week" ? "week" : "month" };
}

/** A member token reads its user's own page and nothing else. */
const isMember = () => !!state.me && state.me.scopes.includes("member");

/** A Team member's own page (`GET /v1/me/usage`): their use, their limits, the time left to
 * them; never the org's totals. */
async function memberPage(view) {
  const u = await api("/v1/me/usage");
  const win = (w, title, id) =>
    el(
      "div",
      { class: "card", id },
      el("h3", {}, title),
      dl([
        ["Used", el("span", { class: "used" }, dur(w.used_seconds))],
        ["Your limit", el("span", { class: "limit" }, dur(w.limit_seconds))],
        ["Resets", time(w.end)],
      ]),
    );
  const left = el(
    "div",
    { class: "card", id: "time-left" },
    el("h3", {}, "Time left to you"),
    el("p", { class: "big" }, el("span", { class: "remaining" }, dur(u.time_left_seconds))),
    el("p", { class: "muted" }, "The least of your own limits and what your org has left."),
  );
  const days = table(
    `${u.days.length} day${u.days.length === 1 ? "" : "s"} with agent time`,
    ["Day", "Agent time"],
    u.days.map((d) => ({ attrs: { "data-day": d.day }, cells: [el("time", { datetime: d.day, title: d.day }, localDay.format(new Date(d.day))), dur(d.seconds)] })),
    { numeric: [1] },
  );
  const sessions = table(
    `${u.sessions.length} running or parked session${u.sessions.length === 1 ? "" : "s"}`,
    ["Session", "Agent", "Project", "State", "Running (billed)", "Last heard"],
    u.sessions.map((s) => ({
      attrs: { "data-session": s.session_id },
      cells: [s.session_id, s.agent ?? "—", s.project_id ?? "—", s.state, el("span", { class: "running" }, dur(s.billed_seconds)), time(s.last_seen_at)],
    })),
    { numeric: [4] },
  );
  view.append(
    el("h1", {}, `${u.user_id} in ${u.org_id}`),
    el("p", { class: "muted" }, `On ${planName(u.plan, u.plan_version)}. `, time(u.from), " to ", time(u.to)),
    el("div", { class: "cards" }, left, win(u.month, "Your month", "month"), win(u.week, "Your week", "week")),
    el("section", { id: "my-days", "aria-labelledby": "my-days-h" }, el("h2", { id: "my-days-h" }, "Your agent time by day"), days),
    el("section", { id: "my-sessions", "aria-labelledby": "my-sessions-h" }, el("h2", { id: "my-sessions-h" }, "Your sessions"), sessions),
  );
}

async function orgPage(view, orgId, params) {
  const base = `/v1/orgs/${encodeURIComponent(orgId)}`;
  const [org, usage] = await Promise.all([api(base), api(`${base}/usage`)]);
  const which = params.get("window") === "week" ? "week" : "month";
  const win = windowOf(usage, which);
  const select = el(
    "select",
    { id: "window", onchange: (e) => (location.hash = `#/orgs/${encodeURIComponent(orgId)}${query({ window: e.target.value })}`) },
    el("option", { value: "month", selected: which === "month" }, "This month"),
    el("option", { value: "week", selected: which === "week" }, "This week"),
  );
  view.append(
    el("h1", {}, org.name === org.org_id ? org.org_id : `${org.name} (${org.org_id})`),
    el("div", { class: "toolbar" }, el("label", { for: "window" }, "Window"), select, el("span", { class: "muted" }, time(win.from), " to ", time(win.to))),
    el("div", { class: "cards" }, planCard(org, usage), gauge("Month", "month", usage.month), gauge("Week", "week", usage.week), fundingCard(usage)),
  );
  const sections = {
    prompt: el("section", { id: "prompt", "aria-label": "Upgrade prompt" }),
    chart: el("section", { id: "by-day", "aria-labelledby": "by-day-h" }, el("h2", { id: "by-day-h" }, "Agent time by day, by agent")),
    funding: el("section", { id: "funding", "aria-labelledby": "funding-h" }, el("h2", { id: "funding-h" }, "Who paid")),
    sessions: el("section", { id: "sessions", "aria-labelledby": "sessions-h" }, el("h2", { id: "sessions-h" }, "Sessions")),
    decisions: el("section", { id: "decisions", "aria-labelledby": "decisions-h" }, el("h2", { id: "decisions-h" }, "Gate decisions")),
    grants: el("section", { id: "grants", "aria-labelledby": "grants-h" }, el("h2", { id: "grants-h" }, "Grants")),
    limits: el("section", { id: "limits", "aria-labelledby": "limits-h" }, el("h2", { id: "limits-h" }, "Limits inside the org")),
    bill: el("section", { id: "bill", "aria-labelledby": "bill-h" }, el("h2", { id: "bill-h" }, "Bill preview")),
    autoTopup: el("section", { id: "auto-topup", "aria-labelledby": "auto-topup-h" }, el("h2", { id: "auto-topup-h" }, "Auto top-up")),
  };
  view.append(...Object.values(sections));
  const guard = (name, p) => p.catch(showError(sections[name]));
  await Promise.all([
    guard("prompt", promptSection(sections.prompt, base)),
    guard("chart", dayChart(sections.chart, base, win)),
    guard("funding", fundingSplit(sections.funding, base, win)),
    guard("sessions", sessionsSection(sections.sessions, base, win)),
    guard("decisions", decisionsSection(sections.decisions, base, win)),
    guard("grants", grantsSection(sections.grants, base)),
    guard("limits", limitsSection(sections.limits, base)),
    guard("bill", billSection(sections.bill, base)),
    guard("autoTopup", autoTopupSection(sections.autoTopup, base)),
  ]);
}

function planCard(org, usage) {
  const sub = org.subscription;
  const rows = [
    ["Plan", planName(org.plan, org.plan_version)],
    ["Status", status(org.suspended, sub && sub.status)],
    ["Running", `${usage.running_sessions} running, ${usage.parked_sessions} parked`],
  ];
  if (org.moving) rows.push(["Moves to", el("span", {}, `version ${org.moving.to_version} on `, time(org.moving.at))]);
  if (sub) {
    rows.push(["Period", el("span", {}, time(sub.current_period_start), " to ", time(sub.current_period_end))]);
    if (sub.cancel_at_period_end) rows.push(["Cancels", "at the period's end"]);
    if (sub.scheduled_plan) rows.push(["Moves to", sub.scheduled_plan]);
    if (sub.past_due_since) rows.push(["Past due since", time(sub.past_due_since)]);
    rows.push(["Customer", sub.stripe_customer_id || "—"], ["Subscription", sub.stripe_subscription_id || "—"]);
  } else rows.push(["Stripe", "no subscription"]);
  return el("div", { class: "card", id: "plan" }, el("h3", {}, "Plan"), dl(rows));
}

/** A plan and the version of its terms the org is on: "pro v2". */
function planName(plan, version) {
  return `${plan} v${version}`;
}

function dl(rows) {
  return el("dl", {}, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function gauge(title, id, w) {
  const pid = `gauge-${id}`;
  return el(
    "div",
    { class: "card gauge", id },
    el("h3", { id: `${pid}-h` }, title),
    el("progress", { id: pid, max: Math.max(w.limit_seconds, 1), value: Math.min(w.plan_seconds ?? w.used_seconds, w.limit_seconds), "aria-labelledby": `${pid}-h`, "aria-describedby": `${pid}-d` }),
    el(
      "div",
      { id: `${pid}-d` },
      dl([
        ["Used", el("span", { class: "used" }, dur(w.used_seconds))],
        ["Plan limit", el("span", { class: "limit" }, dur(w.limit_seconds))],
        ["Plan left", el("span", { class: "remaining" }, dur(w.remaining_seconds))],
        ["Resets", time(w.resets_at)],
      ]),
    ),
  );
}

function fundingCard(usage) {
  const f = usage.funding;
  const rows = [
    ["Left, every source", el("span", { class: "remaining-all" }, dur(f.remaining_seconds))],
    ["Next second paid by", f.funded_by || "nothing: runs are refused"],
  ];
  const o = f.overage;
  if (!o.offered) rows.push(["Pay-as-you-go", "not offered on this plan"]);
  else if (!o.enabled) rows.push(["Pay-as-you-go", "off"]);
  else rows.push(["Pay-as-you-go", `on: ${o.spent} of a ${o.monthly_cap} ${o.currency.toUpperCase()} cap spent (${o.unit_price} an hour)`], ["Paid as it went", dur(o.overage_seconds)]);
  rows.push(["Grants in force", String(f.grants.length)]);
  return el("div", { class: "card", id: "funding-card" }, el("h3", {}, "Past the plan"), dl(rows));
}

async function promptSection(section, base) {
  const p = await api(`${base}/upgrade-prompt`);
  if (!p.show) {
    section.append(el("p", { class: "muted" }, "No upgrade prompt: usage is below the plan's thresholds."));
    return;
  }
  const reasons = p.reasons.map((r) =>
    r.kind === "usage" ? `${r.percent}% of the ${r.window}'s plan hours used` : `${r.count} run${r.count === 1 ? "" : "s"} refused for concurrency in the last 24 hours`,
  );
  const body = [el("h2", {}, "Upgrade prompt"), el("ul", {}, reasons.map((r) => el("li", {}, r)))];
  for (const w of ["month", "week"]) {
    const pr = p.projection[w];
    body.push(
      el("p", {}, `${w === "month" ? "Month" : "Week"} at this pace: `, dur(pr.projected_seconds), " of ", dur(pr.limit_seconds), pr.ceiling_at ? el("span", {}, "; ceiling reached ", time(pr.ceiling_at)) : ""),
    );
  }
  if (p.suggested_plan) {
    const s = p.suggested_plan;
    body.push(el("p", {}, `Suggested: ${s.name}, ${s.price} ${s.currency.toUpperCase()} a month, ${s.monthly_agent_hours} h a month, ${s.weekly_agent_hours} h a week.`));
    if (p.checkout && (can("console") || can("admin"))) {
      const out = el("p", { class: "error", role: "alert" });
      const go = el("button", { type: "button" }, `Upgrade to ${s.name}`);
      go.addEventListener("click", async () => {
        out.textContent = "";
        try {
          const r = await api(p.checkout.path, { method: "POST", body: p.checkout.body });
          if (r.action === "checkout") return location.assign(r.url);
          say(r.action === "changed" ? `Moved to ${r.plan}.` : `Moves to ${r.plan} at the period's end.`);
          await route();
        } catch (e) {
          out.textContent = String(e);
        }
      });
      body.push(go, out);
    }
  }
  section.append(el("div", { class: "card prompt" }, body));
}

// The stacked chart: one bar a UTC day, one segment an agent.
async function dayChart(section, base, win) {
  const days = await api(`${base}/usage/breakdown${query({ from: win.from, to: win.to, group_by: "day" })}`);
  const from = secs(days.from);
  const to = secs(days.to);
  const byDay = await pool(
    days.rows.filter((r) => r.seconds > 0),
    4,
    async (r) => {
      const start = Math.max(secs(r.key), from);
      const end = Math.min(secs(r.key) + DAY, to);
      const agents = await api(`${base}/usage/breakdown${query({ from: iso(start), to: iso(end), group_by: "agent" })}`);
      return { day: r.key, seconds: r.seconds, agents: agents.rows };
    },
  );
  const totals = new Map();
  for (const d of byDay) for (const a of d.agents) totals.set(a.key ?? "(no agent)", (totals.get(a.key ?? "(no agent)") || 0) + a.seconds);
  const agents = [...totals.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([k]) => k);
  const color = (agent) => `s${Math.min(agents.indexOf(agent), 6)}`;
  const allDays = [];
  for (let d = Math.floor(from / DAY) * DAY; d < to; d += DAY) allDays.push(d);
  const found = new Map(byDay.map((d) => [secs(d.day), d]));
  section.append(
    el("p", {}, "Total in the window: ", el("span", { id: "chart-total" }, dur(days.total.seconds))),
    chartBox(stackedBars(allDays, found, color, days.total.seconds)),
    el("ul", { class: "legend", "aria-label": "Agents" }, agents.map((a) => el("li", {}, el("span", { class: `swatch ${color(a)}`, "aria-hidden": "true" }), `${a}: `, dur(totals.get(a))))),
    el(
      "details",
      {},
      el("summary", {}, "The chart as a table"),
      table(
        "Agent time by UTC day and agent",
        ["Day (UTC)", ...agents, "Total"],
        byDay.map((d) => [d.day.slice(0, 10), ...agents.map((a) => dur((d.agents.find((x) => (x.key ?? "(no agent)") === a) || { seconds: 0 }).seconds)), dur(d.seconds)]),
        { numeric: [...agents.map((_, i) => i + 1), agents.length + 1] },
      ),
    ),
  );
}

function stackedBars(allDays, found, color, total) {
  const W = 760;
  const H = 240;
  const left = 48;
  const bottom = 24;
  const top = 8;
  const plotH = H - top - bottom;
  const maxDay = Math.max(HOUR, ...[...found.values()].map((d) => d.seconds));
  const stepH = niceStep(maxDay / HOUR / 4);
  const yMax = Math.ceil(maxDay / HOUR / stepH) * stepH * HOUR;
  const band = (W - left - 4) / Math.max(allDays.length, 1);
  const y = (s) => top + plotH - (s / yMax) * plotH;
  const chart = svg("svg", {
    class: "chart",
    id: "day-chart",
    viewBox: `0 0 ${W} ${H}`,
    role: "img",
    "aria-label": `Agent time by day, stacked by agent: ${duration(total)} over ${allDays.length} days; the table below gives every figure`,
  });
  for (let v = 0; v <= yMax; v += stepH * HOUR) {
    chart.append(svg("line", { class: "axis", x1: left, x2: W - 4, y1: y(v), y2: y(v) }), svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, `${v / HOUR} h`));
  }
  const labelEvery = Math.ceil(allDays.length / 10);
  allDays.forEach((day, i) => {
    const x = left + i * band;
    if (i % labelEvery === 0) chart.append(svg("text", { x: x + band / 2, y: H - 6, "text-anchor": "middle" }, localDay.format(new Date(day * 1000))));
    const d = found.get(day);
    if (!d) return;
    const g = svg("g", { class: "bar", "data-day": d.day, "data-seconds": d.seconds });
    let acc = 0;
    for (const a of d.agents) {
      const name = a.key ?? "(no agent)";
      const h = (a.seconds / yMax) * plotH;
      g.append(
        svg(
          "rect",
          { class: `segment ${color(name)}`, x: x + band * 0.15, width: band * 0.7, y: y(acc + a.seconds), height: Math.max(h, 0.5), "data-agent": name, "data-seconds": a.seconds },
          svg("title", {}, `${d.day.slice(0, 10)} · ${name}: ${duration(a.seconds)}`),
        ),
      );
      acc += a.seconds;
    }
    chart.append(g);
  });
  return chart;
}

/** A chart that keeps a readable width on a phone, scrolling inside its box. */
function chartBox(chart) {
  return el("div", { class: "chart-box" }, chart);
}

/** 1, 2 or 5 times a power of ten, at least `raw`. */
function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(Math.max(raw, 1e-9)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return Math.max(m * p, 0.25);
  return 10 * p;
}

async function fundingSplit(section, base, win) {
  const b = await api(`${base}/usage/breakdown${query({ from: win.from, to: win.to, group_by: "funding" })}`);
  const colors = { plan: "s0", grant: "s2", overage: "s1", grace: "s4" };
  const W = 760;
  const total = Math.max(b.total.seconds, 1);
  const bar = svg("svg", { class: "chart", id: "funding-chart", viewBox: `0 0 ${W} 28`, role: "img", "aria-label": `Who paid for ${duration(b.total.seconds)}: ${b.rows.map((r) => `${r.key} ${duration(r.seconds)}`).join(", ") || "nothing yet"}` });
  let x = 0;
  for (const r of b.rows) {
    const w = (r.seconds / total) * W;
    bar.append(svg("rect", { class: `segment ${colors[r.key] || "s6"}`, x, y: 2, width: Math.max(w, 0.5), height: 24, "data-source": r.key, "data-seconds": r.seconds }, svg("title", {}, `${r.key}: ${duration(r.seconds)}`)));
    x += w;
  }
  section.append(
    bar,
    el("ul", { class: "legend", "aria-label": "Sources" }, b.rows.map((r) => el("li", { "data-source": r.key }, el("span", { class: `swatch ${colors[r.key] || "s6"}`, "aria-hidden": "true" }), `${r.key}: `, dur(r.seconds)))),
  );
}

// Sessions: a page at a time, each drawn as its running and parked stretches.
async function sessionsSection(section, base, win) {
  const sessions = pager(
    "sessions",
    async (cursor) => {
      const page = await api(`${base}/sessions${query({ from: win.from, to: win.to, cursor, limit: 25 })}`);
      // The list has no timelines: each session's is read as `GET …/sessions/{id}`.
      const rows = await pool(page.sessions, 4, (s) => api(`${base}/sessions/${encodeURIComponent(s.session_id)}`));
      return { rows, next: page.next_cursor };
    },
    (rows) => [timelineChart(rows), sessionTable(rows)],
  );
  section.append(el("p", { class: "muted" }, "Sessions created in the window, oldest first: running stretches are billed, parked ones are free."), sessions.holder, sessions.bar);
  await sessions.load(true);
}

/** The sessions' stretches, one chart a UTC day the sessions started on: a month on one
 * axis would draw a 40-minute session as a hairline. */
function timelineChart(details) {
  if (!details.length) return el("p", { class: "muted" }, "No sessions in this window.");
  const days = new Map();
  for (const d of details) {
    const day = d.created_at.slice(0, 10);
    if (!days.has(day)) days.set(day, []);
    days.get(day).push(d);
  }
  return el(
    "div",
    { id: "timeline" },
    [...days.entries()].map(([day, group]) => el("figure", { class: "timeline-day" }, el("figcaption", {}, `Started ${localDay.format(new Date(`${day}T00:00:00Z`))} (UTC)`), chartBox(dayTimeline(group)))),
    el("ul", { class: "legend" }, el("li", {}, el("span", { class: "swatch run", "aria-hidden": "true" }), "running (billed)"), el("li", {}, el("span", { class: "swatch park", "aria-hidden": "true" }), "parked (free)")),
  );
}

function dayTimeline(details) {
  const stretches = details.flatMap((d) => d.timeline);
  const t0 = Math.min(...details.map((d) => secs(d.created_at)), ...stretches.map((s) => secs(s.start)));
  const t1 = Math.max(t0 + 60, ...stretches.map((s) => secs(s.end)));
  const W = 760;
  const left = 150;
  const row = 20;
  const H = details.length * row + 24;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (W - left - 30);
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `Running and parked stretches of ${details.length} session${details.length === 1 ? "" : "s"}; the table below gives each one's figures` });
  details.forEach((d, i) => {
    const y = i * row + 4;
    const id = d.session_id;
    const g = svg("g", { class: "session-row", "data-session": id });
    g.append(svg("text", { x: 4, y: y + 13 }, id.length > 22 ? `${id.slice(0, 21)}…` : id));
    for (const s of d.timeline) {
      const a = secs(s.start);
      const b = secs(s.end);
      g.append(
        svg(
          "rect",
          { class: `stretch ${s.kind === "running" ? "run" : "park"}${s.open ? " open-stretch" : ""}`, x: x(a), y, width: Math.max(x(b) - x(a), 1), height: row - 6, "data-kind": s.kind, "data-seconds": b - a },
          svg("title", {}, `${id} ${s.kind}${s.open ? " (now)" : ""}: ${s.start} to ${s.end} UTC, ${duration(b - a)}`),
        ),
      );
    }
    chart.append(g);
  });
  const ticks = 4;
  for (let k = 0; k <= ticks; k++) {
    const t = t0 + ((t1 - t0) * k) / ticks;
    chart.append(svg("text", { x: x(t), y: H - 6, "text-anchor": k === 0 ? "start" : "middle" }, localClock.format(new Date(t * 1000))));
  }
  return chart;
}

function sessionTable(details) {
  return table(
    `${details.length} session${details.length === 1 ? "" : "s"}`,
    ["Session", "Agent", "Project", "User", "State", "Running (billed)", "Parked (free)", "Started", "Last heard"],
    // Each session as `GET /v1/orgs/{org}/sessions/{id}` answers it (its fields and its timeline's).
    details.map((s) => ({
      attrs: { "data-session": s.session_id },
      cells: [
        s.session_id,
        s.agent ?? "—",
        s.project_id ?? "—",
        s.started_by ?? "—",
        el("span", {}, s.state, ...(s.flags || []).map((f) => [" ", pill(f, "warn")])),
        el("span", { class: "running" }, dur(s.running_seconds)),
        el("span", { class: "parked" }, dur(s.parked_seconds)),
        time(s.created_at),
        time(s.last_seen_at),
      ],
    })),
    { numeric: [5, 6] },
  );
}

async function decisionsSection(section, base, win) {
  const decisions = pager(
    "decisions",
    async (cursor) => {
      const page = await api(`${base}/decisions${query({ from: win.from, to: win.to, cursor, limit: 50 })}`);
      return { rows: page.decisions, next: page.next_cursor };
    },
    (shown) =>
      table(
        `${shown.length} decision${shown.length === 1 ? "" : "s"} in the window`,
        ["Decided", "Decision", "Rule", "Session", "Key", "Month used", "Week used", "Running / limit", "Paid by"],
        shown.map((d) => ({
          attrs: { "data-decision": d.decision_id },
          cells: [
            time(d.as_of),
            pill(d.decision, d.decision === "allow" ? "ok" : "bad"),
            d.limit ? `${d.rule} (${d.limit.kind} ${d.limit.member_id})` : d.rule,
            d.session_id,
            d.key_id,
            el("span", { class: "month" }, usedOf(d.usage.month.used_seconds, d.usage.month.limit_seconds)),
            el("span", { class: "week" }, usedOf(d.usage.week.used_seconds, d.usage.week.limit_seconds)),
            `${d.concurrency.running} / ${d.concurrency.limit}`,
            d.funded_by ?? "—",
          ],
        })),
      ),
  );
  section.append(decisions.holder, decisions.bar);
  await decisions.load(true);
}

async function grantsSection(section, base) {
  const { grants } = await api(`${base}/grants`);
  section.append(
    table(
      `${grants.length} grant${grants.length === 1 ? "" : "s"}`,
      ["Grant", "Kind", "Status", "Hours", "Used", "Left", "Priority", "Starts", "Expires", "Note"],
      grants.map((g) => ({
        attrs: { "data-grant": g.grant_id },
        cells: [g.grant_id, g.kind, g.status, el("span", { class: "seconds" }, dur(g.seconds)), el("span", { class: "used" }, dur(g.used_seconds)), el("span", { class: "remaining" }, dur(g.remaining_seconds)), String(g.priority), time(g.starts_at), time(g.expires_at), g.note ?? ""],
      })),
      { numeric: [3, 4, 5, 6] },
    ),
  );
}

/** The current period's bill as it will be invoiced, and where the pace takes it. */
async function billSection(section, base) {
  const p = await api(`${base}/invoice-preview`);
  const money = (m) => el("span", { class: "money" }, `${m} ${p.currency.toUpperCase()}`);
  section.append(
    el("p", { class: "muted" }, "The period ", time(p.period_start), " to ", time(p.period_end), `. Not included (Stripe adds them): ${p.not_included.join(", ")}.`),
    table(
      `${p.lines.length} line${p.lines.length === 1 ? "" : "s"}`,
      ["Line", "From", "To", "Agent time", "Price an hour", "Amount", "On the invoice"],
      p.lines.map((l) => ({
        attrs: { "data-line": l.kind },
        cells: [l.description, time(l.from), time(l.to), l.seconds ? dur(l.seconds) : "—", l.unit_price ?? "—", money(l.amount), l.invoiced ? "yes" : "no"],
      })),
      { numeric: [3, 4, 5] },
    ),
    dl([
      ["Due now", el("span", { class: "due" }, `${p.due} ${p.currency.toUpperCase()}`)],
      ["At the period's end, at this pace", el("span", { class: "projected" }, `${p.projected} ${p.currency.toUpperCase()}`)],
    ]),
  );
}

/** Auto top-up as set, and the packs it bought: what was charged, declined or is in flight. */
async function autoTopupSection(section, base) {
  const a = await api(`${base}/auto-topup`);
  const cur = a.currency.toUpperCase();
  const state = a.enabled
    ? pill(`on: a ${a.pack_hours} h pack (${a.pack_amount} ${cur}) below ${dur(Math.round(Number(a.below_hours) * 3600))}`, "ok")
    : pill("off", "muted");
  section.append(
    dl([
      ["Auto top-up", el("span", { class: "state" }, state)],
      ["Plan and grant time now", dur(Math.round(Number(a.usable_hours) * 3600))],
      ["Packs this month", el("span", { class: "this-month" }, a.monthly_max_packs > 0 ? `${a.packs_this_month} of at most ${a.monthly_max_packs}` : String(a.packs_this_month))],
      ["A pack in flight", a.pending ? "yes" : "no"],
    ]),
    table(
      `${a.packs.length} pack${a.packs.length === 1 ? "" : "s"}`,
      ["Pack", "Opened", "Hours", "Amount", "Status", "Declined", "Next charge", "Last error"],
      a.packs.map((p) => ({
        attrs: { "data-pack": String(p.seq) },
        cells: [String(p.seq), time(p.created_at), String(p.hours), el("span", { class: "money" }, `${p.amount} ${p.currency.toUpperCase()}`), p.status, String(p.attempts), time(p.next_attempt_at), p.last_error ?? ""],
      })),
      { numeric: [2, 3, 5] },
    ),
  );
}

async function limitsSection(section, base) {
  const { limits } = await api(`${base}/limits`);
  section.append(
    table(
      `${limits.length} limit${limits.length === 1 ? "" : "s"} on users, projects and keys`,
      ["Member", "Kind", "Month used", "Week used", "Spent"],
      limits.map((l) => ({
        attrs: { "data-limit": `${l.kind}/${l.member_id}` },
        cells: [
          l.member_id,
          l.kind,
          el("span", { class: "month" }, usedOf(l.month.used_seconds, l.month.limit_seconds)),
          el("span", { class: "week" }, usedOf(l.week.used_seconds, l.week.limit_seconds)),
          l.spent ? pill("spent: runs refused", "bad") : pill("within", "ok"),
        ],
      })),
    ),
  );
}

// ---- Billing ---------------------------------------------------------------------------

async function billingPage(view) {
  view.append(el("h1", {}, "Billing"));
  const jobs = [];
  if (can("admin")) {
    const s = el("section", { id: "events", "aria-labelledby": "events-h" }, el("h2", { id: "events-h" }, "Stripe events"));
    view.append(s);
    jobs.push(eventsSection(s).catch(showError(s)));
  }
  const p = el("section", { id: "periods", "aria-labelledby": "periods-h" }, el("h2", { id: "periods-h" }, "Closed periods and exports"));
  view.append(p);
  jobs.push(periodsSection(p).catch(showError(p)));
  await Promise.all(jobs);
}

async function eventsSection(section) {
  const filter = el(
    "select",
    { id: "event-state" },
    ["", "quarantined", "pending", "processed", "ignored"].map((s) => el("option", { value: s }, s || "every state")),
  );
  const note = el("p", { role: "status", class: "status" });
  const events = pager(
    "events",
    async (cursor) => {
      const page = await api(`/v1/admin/stripe/events${query({ state: filter.value, cursor, limit: 50 })}`);
      return { rows: page.events, next: page.next_cursor };
    },
    (shown) =>
      table(
        `${shown.length} event${shown.length === 1 ? "" : "s"}${filter.value ? `, ${filter.value}` : ""}, newest first`,
        ["Event", "Type", "State", "Tries", "Received", "Org", "Error", ""],
        shown.map((e) => ({
          attrs: { "data-event": e.event_id, "data-state": e.state },
          cells: [
            e.event_id,
            e.type,
            pill(e.state, e.state === "quarantined" ? "bad" : e.state === "processed" ? "ok" : ""),
            String(e.attempts),
            time(e.received_at),
            e.org_id ?? "—",
            e.last_error ? el("span", { class: "error-text" }, e.last_error) : "",
            e.state === "quarantined" ? retryButton(e.event_id, note, () => events.load(true)) : "",
          ],
        })),
      ),
  );
  section.append(el("div", { class: "toolbar" }, el("label", { for: "event-state" }, "State"), filter), note, events.holder, events.bar);
  filter.addEventListener("change", () => events.load(true));
  await events.load(true);
}

function retryButton(eventId, note, reload) {
  return el(
    "button",
    {
      type: "button",
      "aria-label": `Retry ${eventId}`,
      onclick: async () => {
        try {
          await api(`/v1/admin/stripe/events/${encodeURIComponent(eventId)}/retry`, { method: "POST" });
          note.textContent = `${eventId} is queued again.`;
          await reload();
        } catch (e) {
          note.textContent = String(e);
        }
        // The button is gone with the redrawn table: the note says what happened.
        focusQuietly(note);
      },
    },
    "Retry",
  );
}

async function periodsSection(section) {
  const { periods } = await api("/v1/periods");
  const note = el("p", { role: "status", class: "status" });
  section.append(
    table(
      `${periods.length} closed period${periods.length === 1 ? "" : "s"}`,
      ["Period", "Closed", "Orgs", "Sessions", "Agent time", "Late adjustments", "Exports"],
      periods.map((p) => ({
        attrs: { "data-period": p.period },
        cells: [
          p.period,
          time(p.closed_at),
          String(p.orgs),
          String(p.sessions),
          el("span", { class: "agent" }, dur(p.agent_seconds)),
          dur(p.adjustment_seconds),
          el("span", {}, downloadButton(p.period, "org", "csv", note), " ", downloadButton(p.period, "session", "csv", note)),
        ],
      })),
      { numeric: [2, 3, 4, 5] },
    ),
  );
  const month = el("input", { id: "export-month", type: "month", required: true, value: new Date().toISOString().slice(0, 7) });
  const by = el("select", { id: "export-by" }, el("option", { value: "org" }, "by org"), el("option", { value: "session" }, "by session"));
  const format = el("select", { id: "export-format" }, el("option", { value: "csv" }, "CSV"), el("option", { value: "jsonl" }, "JSON lines"));
  section.append(
    el(
      "form",
      {
        "aria-label": "Export a month",
        onsubmit: (e) => {
          e.preventDefault();
          download(month.value, by.value, format.value, note);
        },
      },
      el("label", { for: "export-month" }, "Export month"),
      month,
      el("label", { for: "export-by", class: "sr-only" }, "Rows"),
      by,
      el("label", { for: "export-format", class: "sr-only" }, "Format"),
      format,
      el("button", { type: "submit" }, "Download"),
    ),
    note,
  );
}

function downloadButton(period, by, format, note) {
  return el("button", { type: "button", onclick: () => download(period, by, format, note), "aria-label": `Download ${period} by ${by} as ${format.toUpperCase()}` }, `${by}s ${format.toUpperCase()}`);
}

/** An export fetched with the token (never put in a link) and saved as a file. */
async function download(period, by, format, note) {
  note.textContent = `Exporting ${period} by ${by}…`;
  try {
    const resp = await fetch(`/v1/exports/usage${query({ period, by, format })}`, {
      headers: { Authorization: `Bearer ${state.token}` },
      cache: "no-store",
      credentials: "omit",
    });
    if (!resp.ok) throw refused(resp.status, await resp.json().catch(() => null), state.token);
    const blob = await resp.blob();
    const url = URL.createObjectURL(blob);
    const a = el("a", { href: url, download: `rush-meter-${period}-by-${by}.${format}` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
    note.textContent = `${period} by ${by} saved (${resp.headers.get("Rush-Period-State") || "?"} period, ${blob.size} bytes).`;
  } catch (e) {
    note.textContent = `The export failed: ${e}`;
  }
}

// ---- Start -----------------------------------------------------------------------------

async function start() {
  $("signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = $("token").value.trim();
    $("signin-error").textContent = "";
    try {
      await signIn(token);
      $("token").value = "";
      if (!location.hash) location.hash = isMember() ? "#/me" : can("finance") ? "#/orgs" : `#/orgs/${encodeURIComponent(state.me.org_id || "")}`;
      else await route();
    } catch (err) {
      $("signin-error").textContent = err instanceof ApiError && err.status === 401 ? "This service does not know that token." : String(err.message || err);
    }
  });
  $("signout").addEventListener("click", () => signOut("Signed out."));
  // The skip link moves focus, not the route (`#main` is no page).
  document.querySelector(".skip").addEventListener("click", (e) => {
    e.preventDefault();
    focusQuietly($("main"));
  });
  window.addEventListener("hashchange", () => {
    if (location.hash === "" || location.hash.startsWith("#/")) route();
  });
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) {
    try {
      await signIn(saved);
    } catch {
      sessionStorage.removeItem(TOKEN_KEY);
    }
  }
  await route();
}

start();
