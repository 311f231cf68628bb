// The demo page: a real client of the public API (the same contract and API
// keys as curl), plus the demo-only /demo endpoints when DEMO_MODE is on.
// Plain ES module, no build step: `make run` needs no Node.

const API_KEYS = { acme: "sk_test_acme", globex: "sk_test_globex" };

// The retry policy of the Go client (client.DefaultPolicy and package
// retry), the same numbers: the same key on every attempt; retries only of
// what may succeed later (a lost connection, 409 in progress, 429, 502,
// 503, 504); Retry-After honoured, unless it asks for more than 5 minutes;
// otherwise full jitter, random(0, min(5s, 100ms·2^retry)); at most 5
// attempts; and a retry budget shared by every call of the page: each
// first try earns a tenth of a retry, each retry spends one, at most 10
// saved up. During an outage the retries stop instead of piling on.
const POLICY = { maxAttempts: 5, baseMs: 100, capMs: 5000, maxRetryAfterMs: 5 * 60 * 1000 };
const RETRYABLE = new Set([429, 502, 503, 504]);

// budget is retry.Budget, in thousandths of a token as there.
const budget = {
  tokens: 10 * 1000, earn: 100, max: 10 * 1000,
  earnOne() { this.tokens = Math.min(this.max, this.tokens + this.earn); },
  spend() {
    if (this.tokens < 1000) return false;
    this.tokens -= 1000;
    return true;
  },
};

const $ = (id) => document.getElementById(id);
const store = window.localStorage;

const state = {
  caller: store.getItem("demo.caller") || "acme",
  orderId: store.getItem("demo.orderId") || "",
  chargeId: store.getItem("demo.chargeId") || "",
  // The last operation sent, for "Send again" and "Same key, different body".
  last: JSON.parse(store.getItem("demo.last") || "null"),
};

function save() {
  store.setItem("demo.caller", state.caller);
  store.setItem("demo.orderId", state.orderId);
  store.setItem("demo.chargeId", state.chargeId);
  store.setItem("demo.last", JSON.stringify(state.last));
}

// --- keys: one per operation ------------------------------------------------
//
// Each kind of operation (order, charge, refund, payout) has its own key
// field. A key belongs to the first request sent under it, and is kept,
// across a reload too, until that operation has a final answer; the next
// operation of the kind then gets a fresh one. So a charge still waiting
// for its answer (after a crash, say) keeps its key, and a payout started
// meanwhile has its own: a key never names two operations.

const OPS = ["order", "charge", "refund", "payout"];

// slot is what the page remembers of a kind's key: the key, the request
// first sent under it, and whether that request has its final answer.
function slot(op) {
  return JSON.parse(store.getItem("demo.op." + op) || "null") || { key: "", request: null, final: false };
}

function setSlot(op, s) {
  store.setItem("demo.op." + op, JSON.stringify(s));
}

function newKey(op) {
  const key = crypto.randomUUID();
  $(op + "-key").value = key;
  setSlot(op, { key, request: null, final: false });
  return key;
}

const sameRequest = (a, b) => a.method === b.method && a.path === b.path && JSON.stringify(a.body) === JSON.stringify(b.body);

// keyFor is the key the next request of kind op goes out under: the
// field's key, unless its operation is over (a final answer) or was
// another request (a different operation), in which case a fresh one.
function keyFor(op, request) {
  const field = $(op + "-key");
  const s = slot(op);
  if (field.value && field.value === s.key) {
    if (s.final) {
      newKey(op);
    } else if (s.request && !sameRequest(s.request, request)) {
      say(`The ${op} under key ${s.key} has no final answer yet. This ${op} is another operation, so it gets a key of its own; the server's reconciler finishes the first one.`, op + "-status");
      newKey(op);
    }
  } else if (!field.value) {
    newKey(op);
  }
  const key = field.value;
  const now = slot(op);
  if (now.key !== key) setSlot(op, { key, request, final: false }); // a key typed in by hand
  else if (!now.request) setSlot(op, { ...now, request });
  return key;
}

// markFinal records that the operation under key has its final answer, so
// that its kind's next operation gets a fresh key.
function markFinal(key) {
  for (const op of OPS) {
    const s = slot(op);
    if (s.key === key) setSlot(op, { ...s, final: true });
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// jitter is retry.FullJitter for retry number n (0 for the first retry).
function jitter(n) {
  return Math.random() * Math.min(POLICY.capMs, POLICY.baseMs * 2 ** n);
}

function retryAfterMs(res) {
  const v = res.headers.get("Retry-After");
  if (!v) return null;
  const s = Number(v);
  return Number.isFinite(s) ? s * 1000 : Math.max(0, Date.parse(v) - Date.now());
}

// send makes one attempt. Its row is in the timeline before the request
// leaves, so an attempt that never gets an answer (the server was killed
// under it) is still there, marked "connection lost".
async function send(method, path, { key, body } = {}) {
  const headers = { Authorization: "Bearer " + API_KEYS[state.caller] };
  if (key) {
    headers["Idempotency-Key"] = JSON.stringify(key); // a Structured Field string
    store.setItem("demo.sent." + key, "1");
  }
  if (body !== undefined) headers["Content-Type"] = "application/json";
  // In the demo each attempt is a trace of its own, started here as any
  // traced client would (W3C traceparent): the server continues it, and
  // keeps it for the sequence drawn beside the attempt (/demo/traces).
  const traceId = demoMode ? randomHex(16) : null;
  if (traceId) headers.traceparent = `00-${traceId}-${randomHex(8)}-01`;
  const row = addAttempt(method, path, key);
  try {
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    let json = null;
    try { json = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
    fillAttempt(row, res, json);
    if (traceId) showTrace(row, traceId);
    return { res, json, row };
  } catch (err) {
    fillAttempt(row, null, null, err);
    // A crashed server took its spans with it: nothing to draw but that.
    row.children[7].textContent = "✕ no answer: if the server died, its trace died with it";
    return { res: null, json: null, row, err };
  }
}

function randomHex(bytes) {
  return [...crypto.getRandomValues(new Uint8Array(bytes))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// --- the sequence -----------------------------------------------------------

// What the sequence draws of an attempt's trace, and in which words. Each
// mark is one thing that happened, on the lane where it happened: the
// server's handling of the request; in PostgreSQL, the claim of the key
// (a waiting duplicate's repeated claims are one mark, the wait), then each
// phase, a transaction named after the recovery point it starts from; at
// the processor, the call under its downstream key. A phase a retry skipped
// (an earlier attempt committed it) is simply not there.
const LANES = ["client", "server", "PostgreSQL", "processor"];

function marks(spans) {
  const t = (v) => Date.parse(v);
  const out = [];
  const sorted = [...spans].sort((a, b) => t(a.start) - t(b.start));
  const ids = new Set(spans.map((s) => s.span_id));
  for (const s of sorted) {
    const a = s.attributes || {};
    const m = { start: t(s.start), end: t(s.end), failed: s.failed };
    if (!ids.has(s.parent_span_id)) { // the request's own span: its parent is the client's
      out.push({ ...m, lane: 1, label: `handled ${s.name}` });
    } else if (s.name === "idempotency.claim") {
      const outcome = a["idempotency.outcome"] || "in_progress";
      const prev = out[out.length - 1];
      if (outcome === "in_progress" && prev && prev.wait) { prev.end = m.end; continue; }
      const words = { new: "claimed the key", replayed: "found the answer: replay", resumed: "resumed",
        taken_over: "took over from a dead owner", mismatch: "another request's key: 422", dead: "dead: left for a person" }[outcome];
      const attempt = a["idempotency.attempt"] !== undefined && outcome !== "replayed" ? `, attempt ${a["idempotency.attempt"]}` : "";
      out.push({ ...m, lane: 2, wait: outcome === "in_progress", label: (words || outcome) + attempt });
    } else if (s.name.startsWith("phase ")) {
      const reached = a["idempotency.reached_point"];
      out.push({ ...m, lane: 2, failed: !reached || s.failed, label: `${s.name.slice(6)} → ${reached || "rolled back"}` });
    } else if (s.name.startsWith("processor ")) {
      const key = a["processor.downstream_key"] ? ` under ${a["processor.downstream_key"]}` : "";
      out.push({ ...m, lane: 3, label: `call ${s.name.slice(10)}${key}: ${a["processor.outcome"] || "no answer"}` });
    } else if (s.name.startsWith("fake processor ")) {
      out.push({ ...m, lane: 3, label: `the processor's side: ${s.name.slice(15)}` });
    }
  }
  for (const m of out) {
    if (m.wait) m.label = `waited ${((m.end - m.start) / 1000).toFixed(1)} s for the original's answer`;
  }
  return out;
}

// drawSequence draws the attempt as lanes (client, server, PostgreSQL,
// processor) on the attempt's time scale, each mark numbered, and lists
// the marks in words below it.
function drawSequence(cell, spans) {
  const ms = marks(spans);
  cell.textContent = ms.length ? "" : "no trace";
  if (!ms.length) return;
  const start = Math.min(...ms.map((m) => m.start)), end = Math.max(...ms.map((m) => m.end));
  const W = 220, X0 = 58, LANE = 16, ns = "http://www.w3.org/2000/svg";
  const x = (v) => X0 + ((v - start) / Math.max(end - start, 1)) * (W - X0 - 8);
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${LANE * LANES.length + 4}`);
  svg.setAttribute("class", "sequence");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", ms.map((m) => m.label).join("; "));
  const el = (name, attrs, text) => {
    const e = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  LANES.forEach((name, i) => {
    el("text", { x: 0, y: i * LANE + 12, class: "lane" }, name);
    el("line", { x1: X0, x2: W - 4, y1: i * LANE + 8, y2: i * LANE + 8, class: "lifeline" });
  });
  // The client's request and its answer: the attempt's whole span.
  el("line", { x1: x(start), x2: x(end), y1: 8, y2: 8, class: "request" });
  ms.forEach((m, i) => {
    const y = m.lane * LANE + 2;
    const r = el("rect", { x: x(m.start), y, width: Math.max(x(m.end) - x(m.start), 3), height: 12, rx: 2,
      class: m.failed ? "failed" : m.wait ? "wait" : "" });
    const title = document.createElementNS(ns, "title");
    title.textContent = m.label;
    r.append(title);
    el("text", { x: x(m.start) + 2, y: y + 10, class: "num" }, String(i + 1));
  });
  const list = document.createElement("ol");
  list.className = "marks";
  for (const m of ms) {
    const li = document.createElement("li");
    li.textContent = `${m.label} (${LANES[m.lane]}, ${(m.end - m.start).toFixed(0)} ms)`;
    if (m.failed) li.className = "bad";
    list.append(li);
  }
  const wrap = document.createElement("div");
  wrap.className = "trace";
  wrap.dataset.traceId = spans[0].trace_id || "";
  wrap.append(svg, list);
  cell.append(wrap);
}

// showTrace fetches the attempt's trace and draws it in the row's last
// cell. The request's span ends just after its answer is written, so the
// trace is asked for again, a few times, until it is there.
async function showTrace(row, traceId) {
  let spans = [];
  for (let i = 0; i < 5; i++) {
    try {
      const res = await fetch(`/demo/traces?trace_id=${traceId}`);
      if (res.ok) {
        spans = (await res.json()).spans || [];
        if (spans.some((s) => !s.parent_span_id)) break;
      }
    } catch { /* the server restarted: try again */ }
    await sleep(200);
  }
  drawSequence(row.children[7], spans);
}

function retryable(res, json) {
  if (!res) return true; // the connection was lost: the request may or may not have run
  if (res.status === 409) return json && json.code === "idempotency_key_in_use";
  return RETRYABLE.has(res.status);
}

// call is one logical operation: attempts with the same key until a final
// answer, or until the policy says stop (attempts, budget, a Retry-After
// too long to wait). Each row says what came next.
async function call(method, path, { key, body } = {}) {
  budget.earnOne();
  let out;
  for (let attempt = 1; ; attempt++) {
    out = await send(method, path, { key, body });
    if (!retryable(out.res, out.json)) break;
    const hint = out.res ? retryAfterMs(out.res) : null;
    if (attempt >= POLICY.maxAttempts) { setNext(out.row, `none: ${POLICY.maxAttempts} attempts made`); break; }
    if (hint !== null && hint > POLICY.maxRetryAfterMs) { setNext(out.row, "none: Retry-After is over 5 minutes"); break; }
    if (!budget.spend()) { setNext(out.row, "none: the retry budget is spent"); break; }
    const wait = hint ?? jitter(attempt - 1);
    setNext(out.row, `${(wait / 1000).toFixed(1)}s`);
    await sleep(wait);
  }
  if (key && out.res && !retryable(out.res, out.json)) markFinal(key);
  refreshSoon();
  return out;
}

// --- the timeline ---------------------------------------------------------

// What Idempotency-Outcome says, in the timeline's words.
const OUTCOMES = {
  new: "new",
  replayed: "replayed",
  resumed: "resumed",
  taken_over: "taken over",
  in_progress: "in flight",
  mismatch: "other request",
  dead: "dead",
};

// An attempt's row: time, request, status, outcome, Retry-After, next try,
// key and trace. The trace is drawn on a line of its own under the others
// (style.css).
function addAttempt(method, path, key) {
  const tr = document.createElement("tr");
  const cells = [new Date().toLocaleTimeString([], { hour12: false }), "", "sending…", "", "", "", key || "", ""];
  for (const c of cells) {
    const td = document.createElement("td");
    td.textContent = c;
    tr.appendChild(td);
  }
  tr.children[0].className = "time";
  showPath(tr.children[1], `${method} ${path}`);
  // The key, short: its first characters tell the attempts of one
  // operation apart; the whole key is its title.
  tr.children[6].className = "key";
  tr.children[6].title = key || "";
  tr.children[6].textContent = key ? key.slice(0, 8) + "…" : "";
  tr.children[7].className = "trace-cell";
  $("attempts").tBodies[0].prepend(tr);
  return tr;
}

// showPath shows a request in few lines: an id by its first characters
// (the whole request is the cell's title), and a line may end after a "/",
// never inside a segment.
function showPath(td, request) {
  td.title = request;
  const parts = request.split(/(?<=\/)/).map((p) => p.replace(/^([a-z]+_[a-z0-9]{4})[a-z0-9]{8,}/, "$1…"));
  td.replaceChildren(...parts.flatMap((p, i) => (i ? [document.createElement("wbr"), p] : [p])));
}

function fillAttempt(tr, res, json, err) {
  const [, , status, outcome, retryAfter] = tr.children;
  if (!res) {
    status.innerHTML = `<span class="badge bad">connection lost</span>`;
    status.title = `No answer: ${err}. The request may or may not have reached the server; a retry with the same key is safe either way.`;
    outcome.textContent = "unknown";
    return;
  }
  // The status in a badge, and the problem's code, if any, after it.
  const badge = document.createElement("span");
  badge.className = "badge " + (res.ok ? "ok" : RETRYABLE.has(res.status) || res.status === 409 ? "warn" : "bad");
  badge.textContent = res.status;
  status.replaceChildren(badge);
  if (json && json.code) status.append(" ", Object.assign(document.createElement("small"), { textContent: json.code }));
  const o = res.headers.get("Idempotency-Outcome");
  outcome.textContent = o ? OUTCOMES[o] || o : "";
  retryAfter.textContent = res.headers.get("Retry-After") || "";
}

function setNext(tr, text) {
  tr.children[5].textContent = text;
}

// --- operations -----------------------------------------------------------

function orderBody() {
  const body = { amount: Number($("amount").value), currency: $("currency").value };
  if ($("description").value) body.description = $("description").value;
  return body;
}

async function operation(op, method, path, body) {
  clearSaid();
  const key = keyFor(op, { method, path, body });
  state.last = { method, path, body, key };
  save();
  const out = await call(method, path, { key, body });
  remember(out);
  return out;
}

function remember(out) {
  const j = out.json;
  if (!out.res || !out.res.ok || !j) return;
  if (j.id && j.id.startsWith("ord_")) state.orderId = j.id;
  if (j.id && j.id.startsWith("ch_")) state.chargeId = j.id;
  if (j.charge_id) state.chargeId = j.charge_id;
  save();
  showIds();
}

function showIds() {
  $("order-id").textContent = state.orderId || "none yet";
  $("charge-id").textContent = state.chargeId || "none yet";
}

$("order-form").addEventListener("submit", (e) => {
  e.preventDefault();
  operation("order", "POST", "/v1/orders", orderBody());
});

$("charge-form").addEventListener("submit", (e) => {
  e.preventDefault();
  clearSaid();
  if (!state.orderId) return say("Create an order first.", "charge-status");
  operation("charge", "POST", `/v1/orders/${state.orderId}/charges`, { payment_method: $("payment-method").value });
});

$("refund-form").addEventListener("submit", (e) => {
  e.preventDefault();
  clearSaid();
  if (!state.chargeId) return say("Charge an order first.", "refund-status");
  const amount = $("refund-amount").value;
  operation("refund", "POST", `/v1/charges/${state.chargeId}/refunds`, amount ? { amount: Number(amount) } : {});
});

// A payout is answered 202 Accepted (the payout as accepted, pending): a
// River job carries it out. The page then polls its Location, waiting as
// each answer's Retry-After says, until it is paid or failed. The polls are
// safe GETs, shown in the timeline with their Retry-After.
$("payout-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const body = { amount: Number($("payout-amount").value), currency: $("currency").value, destination: $("destination").value };
  const out = await operation("payout", "POST", "/v1/payouts", body);
  if (!out.res || out.res.status !== 202) {
    showPayout(null, out.json && out.json.code);
    return;
  }
  await followPayout(out.res.headers.get("Location"), out.json);
});

const PAYOUT_STATES = ["pending", "in_transit", "paid or failed"];

function showPayout(po, problem) {
  $("payout-id").textContent = po ? po.id : "none yet";
  $("payout-status").textContent = po
    ? po.status + (po.failure_code ? ` (${po.failure_code})` : "")
    : problem ? `refused: ${problem}` : "";
  $("payout-states").replaceChildren(...(po ? PAYOUT_STATES : []).map((p) => {
    const li = document.createElement("li");
    li.textContent = p;
    if (p === po.status || (p === "paid or failed" && (po.status === "paid" || po.status === "failed"))) {
      li.setAttribute("aria-current", "step");
    }
    return li;
  }));
}

async function followPayout(location, po) {
  showPayout(po);
  for (;;) {
    const out = await send("GET", location);
    if (out.res && out.res.ok) {
      po = out.json;
      showPayout(po);
      if (po.status === "paid" || po.status === "failed") break;
    }
    await sleep((out.res && retryAfterMs(out.res)) ?? 1000);
  }
  refreshSoon();
}

for (const op of OPS) {
  $(op + "-new-key").addEventListener("click", () => newKey(op));
}

// say shows text next to the control it is about: a form's status line,
// or the break section's. Every new request clears them all first
// (clearSaid), so that no line outlives what it described.
function say(text, where = "break-result") {
  $(where).textContent = text;
}

function clearSaid() {
  for (const el of document.querySelectorAll(".status, #break-result")) el.textContent = "";
}

// --- break things on purpose ----------------------------------------------

$("send-again").addEventListener("click", async () => {
  clearSaid();
  if (!state.last) return say("Make a request first.");
  const { method, path, body, key } = state.last;
  const out = await call(method, path, { key, body });
  const replayed = out.res && out.res.headers.get("Idempotent-Replayed") === "true";
  say(replayed
    ? "The same key and body: the stored answer, byte for byte, marked Idempotent-Replayed. Nothing ran twice."
    : "Not a replay yet: the first request has no final answer (see the attempts).");
});

// Five concurrent identical requests under one key: of the last kind of
// operation made (an order, or a charge of a fresh order).
$("send-five").addEventListener("click", async () => {
  clearSaid();
  let what = "order", path = "/v1/orders", body = orderBody(), also = "";
  if (state.last && state.last.path.endsWith("/charges")) {
    const order = await call("POST", "/v1/orders", { key: crypto.randomUUID(), body: orderBody() });
    if (!order.res || !order.res.ok) return say("Could not create an order to charge.");
    remember(order);
    what = "charge";
    also = ` (of a new order, ${state.orderId}: the last one was charged already)`;
    path = `/v1/orders/${state.orderId}/charges`;
    body = { payment_method: $("payment-method").value };
  }
  const key = newKey(what);
  setSlot(what, { key, request: { method: "POST", path, body }, final: false });
  state.last = { method: "POST", path, body, key };
  save();
  const outs = await Promise.all(Array.from({ length: 5 }, () => {
    budget.earnOne(); // five first tries
    return send("POST", path, { key, body });
  }));
  markFinal(key);
  const replayed = (o) => o.res && o.res.headers.get("Idempotent-Replayed") === "true";
  const first = outs.filter((o) => o.res && (o.res.status === 201 || o.res.status === 402) && !replayed(o)).length;
  const replays = outs.filter(replayed).length;
  const busy = outs.filter((o) => o.res && o.res.status === 409).length;
  outs.forEach(remember);
  say(`5 requests, one key: ${first} ran the ${what}${also}, ${replays} got its replay, ${busy} were told 409 (in progress). One ${what} exists.`);
  refreshSoon();
});

$("different-body").addEventListener("click", async () => {
  clearSaid();
  if (!state.last || !state.last.body) return say("Make a request first.");
  const { method, path, key } = state.last;
  const body = { ...state.last.body };
  if (typeof body.amount === "number") body.amount += 1;
  else body.payment_method = body.payment_method === "pm_card_visa" ? "pm_card_mastercard" : "pm_card_visa";
  const out = await send(method, path, { key, body });
  say(out.res && out.res.status === 422
    ? "422: this key was first used for a different request. A key names one operation; reusing it for another is a client bug, never silently answered with the first request's result."
    : "Unexpected: see the attempts.");
});

// --- demo mode ------------------------------------------------------------

async function demo(method, path, body) {
  const res = await fetch(path, { method, headers: { "Content-Type": "application/json" }, body: body && JSON.stringify(body) });
  return res.ok ? res.json() : null;
}

async function setChaos(chaos, said) {
  const out = await demo("PUT", "/demo/chaos", chaos);
  $("demo-hint").textContent = out ? `${said}: ${JSON.stringify(out)}` : "Could not set the chaos.";
}

$("apply-chaos").addEventListener("click", () => setChaos({
  error_rate: Number($("error-rate").value),
  latency_ms: Number($("latency").value),
  timeout_rate: Number($("lost-rate").value),
}, "Processor chaos set"));

// Off: every rate and the latency back to 0, on the page and at the processor.
$("chaos-off").addEventListener("click", () => {
  for (const id of ["error-rate", "latency", "lost-rate"]) $(id).value = "0";
  setChaos({ error_rate: 0, latency_ms: 0, timeout_rate: 0 }, "Processor chaos off");
});

// armed is the crash point armed from this page, until the server that
// was armed dies there (its successor starts unarmed).
let armed = "";

$("arm-crash").addEventListener("click", async () => {
  const point = $("crash-point").value;
  const out = await demo("PUT", "/demo/crash", { point });
  armed = out ? point : "";
  $("demo-hint").textContent = out
    ? `Armed: the next charge kills the server ${point.replaceAll("_", " ")}. Watch it go away and come back.`
    : "Could not arm the crash.";
});

// crashed tells the story once the armed crash has happened.
function crashed(at) {
  if (!armed) return;
  $("demo-hint").textContent = `The server was killed ${armed.replaceAll("_", " ")} and started again at ${at.toLocaleTimeString()}. ` +
    `The attempt it killed is marked "connection lost". The retries find the key's record where the dead server left it: ` +
    `409 while its lease has not lapsed; then a retry takes the charge over and resumes it from its recovery point ` +
    `(or the server's reconciler gets there first, and the retry gets its answer, replayed). The ledger shows one effect.`;
  armed = "";
}

// --- the panels -------------------------------------------------------------

const POINTS = {
  "/charges": ["started", "charge_created", "finished"],
  "/refunds": ["started", "refund_created", "finished"],
  "": ["started", "finished"],
};

// The key record panel shows the record of the last operation sent.
async function refreshRecord() {
  const key = state.last && state.last.key;
  $("record-key").textContent = key || "none yet";
  const dl = $("record");
  if (!key || !store.getItem("demo.sent." + key)) {
    // Never sent: the server has no record (asking would only log a 404).
    dl.replaceChildren(...term("status", "not used yet"));
    $("points").replaceChildren();
    showState(null);
    return;
  }
  let rec = null;
  try {
    const res = await fetch(`/v1/idempotency-keys/${encodeURIComponent(key)}`, {
      headers: { Authorization: "Bearer " + API_KEYS[state.caller] },
    });
    if (res.ok) rec = await res.json();
  } catch { return; }
  dl.replaceChildren();
  if (!rec) {
    dl.append(...term("status", "not used yet"));
    $("points").replaceChildren();
    showState(null);
    return;
  }
  const left = rec.locked_until ? Math.max(0, (Date.parse(rec.locked_until) - Date.now()) / 1000) : null;
  dl.append(
    ...term("status", rec.status),
    ...term("recovery point", rec.recovery_point),
    ...term("attempt", String(rec.attempt)),
    ...term("lease", left === null ? "none (nobody is working on it)" : `${left.toFixed(1)}s left`),
    ...term("response", rec.response_status ? String(rec.response_status) : "none stored yet"),
    ...term("expires at", new Date(rec.expires_at).toLocaleString()),
  );
  showState(rec);
  const kind = Object.keys(POINTS).find((k) => k && rec.request_path.endsWith(k)) || "";
  $("points").replaceChildren(...POINTS[kind].map((p) => {
    const li = document.createElement("li");
    li.textContent = p;
    if (p === rec.recovery_point) li.setAttribute("aria-current", "step");
    return li;
  }));
}

// showState lights the record's state on the diagram (index.html's
// #states, docs/learn.md's states): its status once final (completed or
// dead), its recovery point while in progress; a refund's refund_created
// is where a charge's charge_created is.
function showState(rec) {
  const now = !rec ? "" : rec.status === "in_progress" ? rec.recovery_point : rec.status;
  const drawn = now === "refund_created" ? "charge_created" : now;
  for (const g of document.querySelectorAll("#states [data-state]")) {
    g.classList.toggle("now", g.dataset.state === drawn);
  }
  $("state-now").textContent = !rec ? "no record yet" : drawn === now ? now : `${now}, drawn as ${drawn}`;
}

function term(name, value) {
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  dd.textContent = value;
  return [dt, dd];
}

function fillTable(id, rows, cells) {
  const tbody = $(id).tBodies[0];
  tbody.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    for (const c of cells(r)) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.appendChild(td);
    }
    return tr;
  }));
}

let demoMode = false;

async function refreshPanels() {
  await refreshRecord();
  try {
    const headers = { Authorization: "Bearer " + API_KEYS[state.caller] };
    const balance = await (await fetch("/v1/balance", { headers })).json();
    const cur = $("currency").value;
    const amount = (list) => ((list || []).find((b) => b.currency === cur) || { amount: 0 }).amount;
    $("balance").textContent = `${amount(balance.available)} ${cur} available, ${amount(balance.pending)} pending`;
    const entries = await (await fetch("/v1/ledger_entries?limit=10", { headers })).json();
    fillTable("entries", entries.data || [], (e) => [e.object_id, `${e.amount} ${e.currency}`, `${e.from_account} → ${e.to_account}`]);
    const ev = await (await fetch("/v1/events?limit=10", { headers })).json();
    let deliveries = {};
    if (demoMode) {
      const d = await demo("GET", `/demo/deliveries?caller=${state.caller}`);
      for (const x of (d && d.data) || []) deliveries[x.event_id] = x.deliveries;
    }
    fillTable("events", ev.data || [], (e) => [e.id, e.type, demoMode ? String(deliveries[e.id] ?? "not yet") : "n/a"]);
    if (demoMode) {
      const ledger = await demo("GET", "/demo/ledger");
      const mine = ((ledger && ledger.data) || []).filter((e) => e.idempotency_key.startsWith(state.caller + "-"));
      fillTable("ledger", mine.slice(-15).reverse(), (e) => [e.object, String(e.amount), e.status, e.idempotency_key]);
    }
  } catch { /* the server may be restarting; the next refresh will tell */ }
}

let refreshTimer = null;
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refreshPanels, 100);
}

// The server's start time (demo mode): when it changes, the server was
// restarted, after a demo crash say.
let startedAt = null;
let restartedAt = null;

async function checkServer() {
  const badge = $("server-status");
  try {
    const res = await fetch("/healthz", { cache: "no-store" });
    if (demoMode && res.ok) {
      const info = await demo("GET", "/demo/crash");
      if (info && startedAt && info.started_at !== startedAt) {
        restartedAt = new Date();
        crashed(restartedAt);
      }
      if (info) startedAt = info.started_at;
    }
    const restarted = restartedAt && Date.now() - restartedAt < 15000
      ? ` (restarted at ${restartedAt.toLocaleTimeString()} after a crash)` : "";
    badge.textContent = res.ok ? "server: up" + restarted : `server: ${res.status}`;
    badge.className = "badge " + (res.ok ? (restarted ? "warn" : "ok") : "bad");
  } catch {
    // The demo's supervisor keeps the socket open across a restart, so
    // requests usually just wait; a refused one means the server is gone.
    badge.textContent = "server: down (restarting?)";
    badge.className = "badge bad";
  }
}

async function detectDemo() {
  try {
    demoMode = (await fetch("/demo/crash")).ok;
  } catch { demoMode = false; }
  $("chaos").disabled = !demoMode;
  if (!demoMode) {
    $("demo-hint").textContent = "Demo mode is off on this server: chaos, crashes and the processor's ledger need DEMO_MODE (make run).";
  }
}

// --- start ------------------------------------------------------------------

$("caller").value = state.caller;
$("caller").addEventListener("change", () => {
  state.caller = $("caller").value;
  state.orderId = state.chargeId = "";
  state.last = null;
  save();
  showIds();
  OPS.forEach(newKey);
  refreshPanels();
});
for (const op of OPS) {
  const s = slot(op);
  if (s.key && !s.final) $(op + "-key").value = s.key; // still pending: kept
  else newKey(op);
}
showIds();
await detectDemo();
await checkServer();
await refreshPanels();
setInterval(checkServer, 1000);
setInterval(refreshPanels, 1500);
