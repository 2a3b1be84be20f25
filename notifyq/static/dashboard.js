// notifyq dashboard: plain JavaScript, no dependencies, no build step.
//
// It short-polls the HTTP API (GET /queues, GET /queues/states, GET /jobs, GET /jobs/{id},
// GET /workflows/{id}, GET /workers, GET /scheduled, GET /periodic) and draws what it gets; the job in the detail pane is followed through its event stream
// (GET /jobs/{id}/events) while it runs. Every value from the API reaches the page through text
// nodes or attribute values, never as HTML, so payloads, errors and names are shown verbatim and
// cannot inject markup.
"use strict";

(() => {
  const POLL_MS = 1500;
  const HIDDEN_POLL_MS = 5000;
  const CHART_WINDOW_S = 180;
  const CHART_MIN_SPAN_S = 30;
  const PAGE_SIZE = 50;
  const MAX_LIVE_ROWS = 500; // GET /jobs answers at most 500 a page
  const TASKS_EVERY = 20; // polls between refreshes of the task names
  const HOUR_EVERY = 7; // polls between reads of the last hour's minutes (about 10 s)
  const TOKEN_KEY = "notifyq.apiToken";
  const STATUSES = ["waiting", "queued", "processing", "completed", "failed", "cancelled"];
  const FINAL = new Set(["completed", "failed", "cancelled"]);
  const WORKFLOW_POLL_MS = 1000;
  const STREAM_RETRY_MS = 10000; // after a stream that broke off (not one that ended)
  const STREAM_MAX_BUFFER = 16 * 1024 * 1024; // one event's text; a job's data is bounded
  const REFUSED_PROPS = /^(on|style$|innerhtml$|outerhtml$|srcdoc$|href$|src$|action$|formaction$)/i;

  const $ = (id) => document.getElementById(id);

  // -- building DOM safely -----------------------------------------------------------------

  /** An element; props are attributes (values only), "class", "text" or "data". */
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (REFUSED_PROPS.test(key)) throw new Error(`h(): refusing to set ${key}`);
      if (key === "class") el.className = value;
      else if (key === "text") el.textContent = String(value);
      else if (key === "data") {
        for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v);
      } else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  /** An SVG element; attrs are attribute values only (names are this script's own). */
  function svg(tag, attrs) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (REFUSED_PROPS.test(key)) throw new Error(`svg(): refusing to set ${key}`);
      el.setAttribute(key, String(value));
    }
    return el;
  }

  /** Sets an element's text (and data-value) only when it changed. */
  function setText(el, text, value) {
    const s = String(text);
    if (el.textContent !== s) el.textContent = s;
    if (value !== undefined && el.dataset.value !== String(value)) el.dataset.value = String(value);
  }

  // -- formatting --------------------------------------------------------------------------

  const numbers = new Intl.NumberFormat();
  const fmtInt = (n) => numbers.format(n);

  function fmtRate(r) {
    if (r === null || r === undefined || !Number.isFinite(r)) return "–";
    if (r >= 100) return fmtInt(Math.round(r));
    if (r >= 10) return r.toFixed(1);
    return r.toFixed(2);
  }

  function fmtDuration(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return "—";
    s = Math.max(0, s);
    if (s < 10) return `${s.toFixed(1)} s`;
    if (s < 60) return `${Math.round(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function fmtAgo(iso) {
    if (!iso) return "";
    const s = (Date.now() - Date.parse(iso)) / 1000;
    if (!Number.isFinite(s)) return "";
    if (Math.abs(s) < 1) return "just now";
    return s > 0 ? `${fmtDuration(s)} ago` : `in ${fmtDuration(-s)}`;
  }

  function fmtTime(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    const p = (n, w = 2) => String(n).padStart(w, "0");
    return (
      `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
      `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`
    );
  }

  // Job ids are time-ordered (UUID version 7): they begin with the clock, the same for every
  // job of the same minute, and a workflow's ids differ only in their last digits. So an id is
  // shown by its end, as many digits as tell it from every other id this page has shown (git's
  // rule for short hashes, read from the other end), at least ID_DIGITS. The count only grows,
  // so a text shown once never comes to stand for another job.
  const ID_DIGITS = 8;
  const MAX_IDS_KEPT = 100000; // a page open for days forgets the oldest (the count stays)
  const ids = { digits: ID_DIGITS, byEnd: new Map() }; // the end of each id shown -> the id

  function shortId(id) {
    const full = String(id).toLowerCase();
    const end = (x) => x.slice(-ids.digits);
    const other = ids.byEnd.get(end(full));
    if (other !== undefined && other !== full) {
      while (end(other) === end(full)) ids.digits += 1;
      ids.byEnd = new Map([...ids.byEnd.values()].map((x) => [end(x), x]));
    }
    if (ids.byEnd.size >= MAX_IDS_KEPT) ids.byEnd.clear();
    ids.byEnd.set(end(full), full);
    return `…${end(full)}`;
  }

  function badge(status) {
    const known = STATUSES.includes(status) || ["paused", "active", "running"].includes(status);
    return h("span", { class: `badge badge-${known ? status : "other"}`, text: status });
  }

  /** The progress worth a bar: a running job's report with a fraction or at least a message. */
  function barProgress(job) {
    const p = job && job.status === "processing" ? job.progress : null;
    if (!p || (p.fraction === null && !p.message)) return null;
    return p;
  }

  function fmtProgress(p) {
    const parts = [];
    if (p.fraction !== null && p.fraction !== undefined) parts.push(`${Math.round(p.fraction * 100)} %`);
    if (p.message) parts.push(p.message);
    return parts.join(" · ");
  }

  /** A <progress>: determinate with a fraction, indeterminate (no value) with only a message. */
  function progressBar(p, cls) {
    const bar = h("progress", { class: `bar ${cls || ""}`.trim(), max: "1" });
    updateBar(bar, p);
    return bar;
  }

  function updateBar(bar, p) {
    const fraction = p.fraction === null || p.fraction === undefined ? "" : String(p.fraction);
    if (bar.dataset.fraction !== fraction) {
      if (fraction === "") bar.removeAttribute("value");
      else bar.setAttribute("value", fraction);
      bar.dataset.fraction = fraction;
    }
    const text = fmtProgress(p);
    if (bar.title !== text) {
      bar.title = text;
      bar.setAttribute("aria-label", `Progress: ${text}`);
    }
  }

  /** An error's first line, cut at 200 characters: a list row or a timeline's line of it. */
  function firstLine(text) {
    const line = String(text ?? "").trim().split("\n", 1)[0];
    return line.length > 200 ? `${line.slice(0, 200)}…` : line;
  }

  function json(value) {
    try {
      return JSON.stringify(value, null, 2);
    } catch {
      return String(value);
    }
  }

  // -- token -------------------------------------------------------------------------------

  let memoryToken = null; // when sessionStorage is unavailable
  function getToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY);
    } catch {
      return memoryToken;
    }
  }
  function setToken(token) {
    memoryToken = token;
    try {
      if (token === null) sessionStorage.removeItem(TOKEN_KEY);
      else sessionStorage.setItem(TOKEN_KEY, token);
    } catch {
      /* memoryToken serves */
    }
    $("forget-token").hidden = token === null;
  }

  // -- the API -----------------------------------------------------------------------------

  /** The app's root: /dashboard is served next to /queues and /jobs (also behind a prefix). */
  const API_BASE = new URL(location.pathname.replace(/\/dashboard\/?$/, "/"), location.origin);

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status; // 0: no answer at all
      this.detail = detail;
    }
  }

  function detailOf(body) {
    if (!body || body.detail === undefined) return null;
    const d = body.detail;
    if (typeof d === "string") return d;
    if (Array.isArray(d)) {
      return d.map((e) => (e && e.msg ? `${(e.loc || []).join(".")}: ${e.msg}` : json(e))).join("; ");
    }
    return json(d);
  }

  async function api(method, path, params, json) {
    const url = new URL(path, API_BASE);
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
    }
    const headers = { Accept: "application/json" };
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(json);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch {
      throw new ApiError(0, "the notifyq API does not answer");
    }
    let body = null;
    try {
      const text = await response.text();
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    if (!response.ok) {
      throw new ApiError(response.status, detailOf(body) || `HTTP ${response.status}`);
    }
    return body;
  }

  const segment = (s) => encodeURIComponent(String(s));

  // -- state -------------------------------------------------------------------------------

  const state = {
    authNeeded: false,
    timer: null,
    ticks: 0,
    lastOk: null, // Date.now() of the last complete poll
    queues: [],
    samples: [], // {t, completed|null, lastMinute, failedLastMinute}
    filters: { status: "", queue: "", task: "", group: "", payload: "" },
    view: "jobs", // or one of VIEWS
    sched: { filters: { queue: "", task: "" }, jobs: [], nextCursor: null, gen: 0, loaded: false, skew: 0 },
    cron: null, // GET /periodic, while the cron page is shown
    queueStates: new Map(), // queue -> GET /queues/states row
    workers: null, // GET /workers, while the workers page is shown
    bulkBusy: false,
    jobs: [],
    nextCursor: null,
    listGen: 0, // bumps on every filter change; stale answers are dropped
    listLoaded: false,
    selectedId: null,
    selectedJob: null,
    selectedMissing: false,
    detailJson: null,
    stream: null, // {id, controller, live}: the selected job's event stream, while it runs
    streamRetryAt: 0,
    wf: null, // the open workflow view: {id, data, missing, timer, busy, done, layoutKey, nodes}
    zoom: 1,
  };

  // -- polling -----------------------------------------------------------------------------

  function schedule() {
    clearTimeout(state.timer);
    state.timer = setTimeout(tick, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
  }

  async function tick() {
    clearTimeout(state.timer);
    if (state.authNeeded) return;
    state.ticks += 1;
    const work = [refreshQueues()];
    if (state.view === "workers") work.push(refreshWorkers());
    else if (state.view === "scheduled") work.push(refreshScheduled());
    else if (state.view === "cron") work.push(refreshCron());
    else if (!state.wf) work.push(refreshJobs()); // the list is hidden behind the workflow view
    // A live stream pushes the detail's changes; without one, the detail is polled.
    if (streaming()) renderDetail();
    else work.push(refreshDetail());
    resumeWorkflow();
    if (state.ticks % TASKS_EVERY === 1) work.push(refreshTasks());
    if (state.ticks % HOUR_EVERY === 1) work.push(refreshHour());
    const results = await Promise.allSettled(work);
    const errors = results.filter((r) => r.status === "rejected").map((r) => r.reason);
    if (errors.length === 0) connected();
    else trouble(errors);
    if (!state.authNeeded) schedule();
  }

  function connected() {
    state.lastOk = Date.now();
    $("banner").hidden = true;
    document.body.classList.remove("stale");
    $("app").hidden = false;
    $("auth").hidden = true;
    setConn("live", "live");
  }

  /** Routes poll failures: 401/403 ask for a token, 503 and no answer show a banner. */
  function trouble(errors) {
    const auth = errors.find((e) => e.status === 401 || e.status === 403);
    if (auth) return needToken(auth);
    const db = errors.find((e) => e.status === 503);
    const net = errors.find((e) => e.status === 0);
    const since = state.lastOk ? ` Showing data from ${fmtDuration((Date.now() - state.lastOk) / 1000)} ago.` : "";
    const banner = $("banner");
    if (db || net) {
      banner.dataset.kind = db ? "database" : "network";
      banner.textContent = db
        ? `Database unavailable: ${db.detail}.${since} Retrying every few seconds…`
        : `Cannot reach the notifyq API.${since} Retrying every few seconds…`;
      banner.hidden = false;
      document.body.classList.add("stale");
      setConn("down", db ? "database unavailable" : "offline");
      return;
    }
    // Anything else (a 422 of a filter, a 500) is shown where it happened; polling goes on.
    connected();
    for (const e of errors) if (!(e instanceof ApiError)) console.error(e);
  }

  function setConn(kind, text) {
    $("conn").dataset.state = kind;
    setText($("conn-text"), text);
  }

  function needToken(err) {
    state.authNeeded = true;
    clearTimeout(state.timer);
    stopStream();
    if (state.wf) {
      clearTimeout(state.wf.timer);
      state.wf.timer = null;
    }
    const had = getToken();
    $("app").hidden = true;
    $("banner").hidden = true;
    $("auth").hidden = false;
    const message = $("auth-message");
    if (err.status === 403 && had) {
      message.className = "auth-error";
      message.textContent = `The API refused this token (${err.detail}). Enter the right one.`;
    } else {
      message.className = "";
      message.textContent = "This notifyq API requires a token (its NOTIFYQ_API_TOKEN).";
    }
    setConn("down", "token needed");
    const input = $("token-input");
    input.value = "";
    input.focus();
  }

  // -- queues ------------------------------------------------------------------------------

  /** Queue states in which due jobs do not move at all until someone acts. */
  const STUCK_STATES = new Set(["paused", "unregistered", "breaker_open", "no_workers"]);
  const QUEUE_COLS = ["waiting", "queued", "due", "processing", "completed", "failed", "cancelled", "completed_last_minute", "oldest_due_seconds"];

  async function refreshQueues() {
    const sent = performance.now();
    const [rows, states] = await Promise.all([api("GET", "queues"), api("GET", "queues/states").catch(() => null)]);
    const t = (sent + performance.now()) / 2; // about when the server counted
    state.queues = rows;
    if (Array.isArray(states)) state.queueStates = new Map(states.map((q) => [q.queue, q]));
    addSample(rows, t);
    renderQueues(rows);
    drawChart();
    fillDatalist($("queue-names"), rows.map((q) => q.queue));
  }

  async function refreshTasks() {
    const tasks = await api("GET", "tasks");
    fillDatalist($("task-names"), tasks.map((t) => t.name));
  }

  function fillDatalist(list, names) {
    const key = names.join("\u0000");
    if (list.dataset.key === key) return;
    list.dataset.key = key;
    list.replaceChildren(...names.map((name) => h("option", { value: name })));
  }

  function makeQueueRow(name) {
    const tr = h("tr", { data: { queue: name } });
    tr.append(h("th", { scope: "row", title: name }, h("span", { class: "qname", text: name })));
    for (const col of QUEUE_COLS) tr.append(h("td", { class: "num", data: { col } }));
    const pause = h("button", { type: "button", class: "small" });
    pause.addEventListener("click", () => togglePause(name, pause));
    const stateCell = h("td", { data: { col: "state" } }, h("div", { class: "state-cell" }, h("span", { class: "badge" }), pause), h("div", { class: "why small" }));
    tr.append(stateCell);
    return tr;
  }

  function updateCount(td, n, { estimated = false, failedQueue = null } = {}) {
    td.classList.toggle("zero", n === 0);
    const text = (estimated ? "~" : "") + fmtInt(n);
    td.dataset.value = String(n);
    td.title = estimated ? "Estimated from a sample of the table" : "";
    if (failedQueue !== null && n > 0) {
      let button = td.querySelector("button");
      if (!button) {
        button = h("button", { type: "button", class: "linkish", "aria-label": `Show the failed jobs of queue ${failedQueue}` });
        button.addEventListener("click", () => setFilters({ status: "failed", queue: failedQueue, task: "" }));
        td.replaceChildren(button);
      }
      setText(button, text);
    } else if (td.firstChild && td.firstChild.nodeType !== Node.TEXT_NODE) {
      td.replaceChildren(text);
    } else {
      setText(td, text);
    }
  }

  function updateQueueRow(tr, q) {
    const cell = (col) => tr.querySelector(`[data-col="${col}"]`);
    for (const col of ["queued", "due", "processing", "cancelled"]) updateCount(cell(col), q[col]);
    updateCount(cell("waiting"), q.waiting ?? 0); // an older API has no waiting count
    updateCount(cell("completed"), q.completed, { estimated: q.completed_estimated });
    updateCount(cell("failed"), q.failed, { failedQueue: tr.dataset.queue });
    const last = cell("completed_last_minute");
    updateCount(last, q.completed_last_minute);
    last.title = q.failed_last_minute ? `${q.failed_last_minute} failed in the last minute` : "";
    const wait = cell("oldest_due_seconds");
    setText(wait, fmtDuration(q.oldest_due_seconds), q.oldest_due_seconds ?? "");
    wait.classList.toggle("zero", q.oldest_due_seconds === null);
    wait.classList.toggle("warn", q.oldest_due_seconds >= 30 && q.oldest_due_seconds < 300);
    wait.classList.toggle("bad", q.oldest_due_seconds >= 300);
    const reason = state.queueStates.get(tr.dataset.queue);
    wait.title = reason && !["ok", "idle"].includes(reason.state) ? reason.reasons.join("; ") : "";
    const stateCell = cell("state");
    stateCell.dataset.value = q.paused ? "paused" : "active";
    const label = stateCell.querySelector(".badge");
    setText(label, q.paused ? "paused" : "active");
    label.className = `badge badge-${q.paused ? "paused" : "active"}`;
    // Why its due jobs do not move (GET /queues/states), when something holds them back.
    const why = state.queueStates.get(tr.dataset.queue);
    const held = why && !["ok", "idle"].includes(why.state);
    stateCell.dataset.why = why ? why.state : "";
    // The worst reason in the cell when jobs are stuck, every one in its tooltip; a queue that
    // is only busy, rate-limited or polled gets a badge that says so, without alarm.
    const stuck = held && STUCK_STATES.has(why.state);
    setText(stateCell.querySelector(".why"), stuck ? why.reasons[0] : "");
    stateCell.querySelector(".why").hidden = !stuck;
    stateCell.title = held ? why.reasons.join("; ") : "";
    if (held && !q.paused) {
      setText(label, why.state.replace("_", " "));
      label.className = `badge ${stuck ? "badge-held" : why.state === "busy" ? "badge-running" : "badge-paused"}`;
    }
    const button = stateCell.querySelector("button");
    if (!button.dataset.busy) {
      setText(button, q.paused ? "Resume" : "Pause");
      button.setAttribute("aria-label", `${q.paused ? "Resume" : "Pause"} queue ${tr.dataset.queue}`);
      button.dataset.paused = q.paused ? "1" : "";
    }
  }

  function renderQueues(rows) {
    const body = $("queues-body");
    const existing = new Map([...body.rows].map((tr) => [tr.dataset.queue, tr]));
    rows.forEach((q, i) => {
      const tr = existing.get(q.queue) || makeQueueRow(q.queue);
      existing.delete(q.queue);
      updateQueueRow(tr, q);
      if (body.rows[i] !== tr) body.insertBefore(tr, body.rows[i] || null);
    });
    for (const tr of existing.values()) tr.remove();
    $("queues-empty").hidden = rows.length > 0;
    renderQueueTotals(rows);
    const estimated = rows.some((q) => q.completed_estimated);
    setText($("queues-note"), estimated ? "~ completed counts are estimated on this large table" : "");
  }

  function renderQueueTotals(rows) {
    const sum = (k) => rows.reduce((a, q) => a + (q[k] ?? 0), 0);
    const waits = rows.map((q) => q.oldest_due_seconds).filter((s) => s !== null);
    const oldest = waits.length ? Math.max(...waits) : null;
    const tile = (name) => document.querySelector(`#tiles [data-tile="${name}"]`);
    for (const name of ["waiting", "due", "processing", "completed_last_minute", "failed"]) {
      const n = sum(name);
      setText(tile(name), fmtInt(n), n);
    }
    const failed = tile("failed");
    failed.classList.toggle("bad", sum("failed") > 0);
    const wait = tile("oldest_due_seconds");
    setText(wait, oldest === null ? "–" : fmtDuration(oldest), oldest ?? "");
    wait.classList.toggle("warn", oldest !== null && oldest >= 30);
  }

  async function togglePause(queue, button) {
    const pausing = !button.dataset.paused;
    button.disabled = true;
    button.dataset.busy = "1";
    try {
      const q = await api("POST", `queues/${segment(queue)}/${pausing ? "pause" : "resume"}`);
      delete button.dataset.busy;
      const tr = $("queues-body").querySelector(`tr[data-queue="${CSS.escape(queue)}"]`);
      if (tr) updateQueueRow(tr, q);
      toast(`Queue ${queue} ${pausing ? "paused" : "resumed"}.`);
    } catch (err) {
      actionFailed(err, `Could not ${pausing ? "pause" : "resume"} queue ${queue}`);
    } finally {
      delete button.dataset.busy;
      button.disabled = false;
    }
  }

  // -- throughput chart --------------------------------------------------------------------
  //
  // "completed / s" is the difference of the summed exact completed counts between two polls,
  // divided by the time between them: the rate of that interval. A negative difference
  // (retention or DELETE removed completed jobs) or an estimated count (large table) leaves a
  // gap instead of a wrong value. "last-minute average" is completed_last_minute / 60, exact
  // whatever the table's size, but smoothed over a minute.

  function addSample(rows, t) {
    const sum = (k) => rows.reduce((a, q) => a + q[k], 0);
    const estimated = rows.some((q) => q.completed_estimated);
    state.samples.push({
      t,
      completed: estimated ? null : sum("completed"),
      lastMinute: sum("completed_last_minute"),
      failedLastMinute: sum("failed_last_minute"),
    });
    const cutoff = t - (CHART_WINDOW_S + 10) * 1000;
    while (state.samples.length > 2 && state.samples[1].t < cutoff) state.samples.shift();
  }

  function series() {
    const s = state.samples;
    return s.map((cur, i) => {
      const prev = s[i - 1];
      let rate = null;
      if (prev && cur.completed !== null && prev.completed !== null && cur.t - prev.t > 200) {
        const done = cur.completed - prev.completed;
        if (done >= 0) rate = done / ((cur.t - prev.t) / 1000);
      }
      return { t: cur.t, rate, avg: cur.lastMinute / 60, failed: cur.failedLastMinute / 60 };
    });
  }

  function niceStep(max, ticks) {
    const raw = max / ticks;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const norm = raw / mag;
    const step = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
    return step * mag;
  }

  function drawChart() {
    const canvas = $("chart");
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const css = getComputedStyle(document.documentElement);
    const color = (name) => css.getPropertyValue(name).trim();

    const pts = series();
    const now = performance.now();
    const first = state.samples.length ? state.samples[0].t : now;
    const span = Math.min(CHART_WINDOW_S, Math.max(CHART_MIN_SPAN_S, (now - first) / 1000));
    const visible = pts.filter((p) => now - p.t <= span * 1000 + POLL_MS * 2);
    const peak = Math.max(1, ...visible.map((p) => Math.max(p.rate ?? 0, p.avg, p.failed)));
    const step = niceStep(peak * 1.08, 4);
    const top = step * Math.ceil((peak * 1.08) / step);

    const pad = { l: 40, r: 8, t: 8, b: 18 };
    const w = width - pad.l - pad.r;
    const hh = height - pad.t - pad.b;
    const x = (t) => pad.l + w * (1 - (now - t) / 1000 / span);
    const y = (v) => pad.t + hh * (1 - v / top);

    ctx.font = `11px ${getComputedStyle(document.body).fontFamily}`;
    ctx.lineWidth = 1;
    ctx.strokeStyle = color("--chart-grid");
    ctx.fillStyle = color("--chart-label");
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    const decimals = step < 1 ? (step < 0.1 ? 2 : 1) : 0;
    for (let v = 0; v <= top + step / 2; v += step) {
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(pad.l, yy);
      ctx.lineTo(pad.l + w, yy);
      ctx.stroke();
      ctx.fillText(v.toFixed(decimals), pad.l - 6, yy);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const every = span > 120 ? 60 : span > 50 ? 30 : 10;
    for (let ago = 0; ago <= span; ago += every) {
      const xx = pad.l + w * (1 - ago / span);
      const label = ago === 0 ? "now" : ago % 60 === 0 ? `−${ago / 60} min` : `−${ago} s`;
      ctx.fillText(label, Math.min(Math.max(xx, pad.l + 12), pad.l + w - 12), pad.t + hh + 4);
    }

    ctx.save();
    ctx.beginPath();
    ctx.rect(pad.l, pad.t - 2, w, hh + 4);
    ctx.clip();

    // completed / s between polls: filled area, broken where unknown
    const runs = [];
    let run = [];
    for (const p of visible) {
      if (p.rate === null) {
        if (run.length) runs.push(run);
        run = [];
      } else run.push(p);
    }
    if (run.length) runs.push(run);
    ctx.lineJoin = "round";
    for (const r of runs) {
      ctx.beginPath();
      ctx.moveTo(x(r[0].t), y(0));
      for (const p of r) ctx.lineTo(x(p.t), y(p.rate));
      ctx.lineTo(x(r[r.length - 1].t), y(0));
      ctx.closePath();
      ctx.fillStyle = color("--chart-rate-fill");
      ctx.fill();
      ctx.beginPath();
      r.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p.rate)) : ctx.moveTo(x(p.t), y(p.rate))));
      ctx.strokeStyle = color("--chart-rate");
      ctx.lineWidth = 2;
      ctx.stroke();
      if (r.length === 1) {
        ctx.fillStyle = color("--chart-rate");
        ctx.fillRect(x(r[0].t) - 1.5, y(r[0].rate) - 1.5, 3, 3);
      }
    }

    const line = (key, name, dash) => {
      if (!visible.length) return;
      ctx.beginPath();
      visible.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p[key])) : ctx.moveTo(x(p.t), y(p[key]))));
      ctx.setLineDash(dash);
      ctx.strokeStyle = color(name);
      ctx.lineWidth = 1.5;
      ctx.stroke();
      ctx.setLineDash([]);
    };
    line("avg", "--chart-avg", [5, 3]);
    if (visible.some((p) => p.failed > 0)) line("failed", "--chart-failed", [2, 2]);
    ctx.restore();

    const latest = pts[pts.length - 1];
    const rateNow = [...pts].reverse().find((p) => p.rate !== null);
    canvas.dataset.rate = rateNow ? String(rateNow.rate) : "";
    canvas.dataset.avg = latest ? String(latest.avg) : "";
    const summary = $("chart-summary");
    const minutes = Math.round(span / 60);
    if (latest) {
      const nowText = rateNow ? fmtRate(rateNow.rate) : "–";
      summary.replaceChildren(
        h("strong", { text: nowText }), " jobs/s now · ",
        h("strong", { text: fmtRate(latest.avg) }), "/s 1-min avg",
      );
      canvas.setAttribute(
        "aria-label",
        `Jobs completed per second over the last ${minutes} minute${minutes === 1 ? "" : "s"}: ` +
          `${nowText} per second now, ${fmtRate(latest.avg)} per second averaged over the last minute.`,
      );
    }
  }

  // -- the last hour, per minute (GET /stats/minutes) ----------------------------------------
  //
  // One bar per minute, completed below and failed on top; the minute under way is the last
  // bar. A minute not counted yet (the API counts a few per read) is left empty.

  const HOUR_W = 610;
  const HOUR_H = 44;

  async function refreshHour() {
    const body = await api("GET", "stats/minutes", { minutes: 60 });
    renderHour(body.minutes, body.since);
  }

  /** The bars, and a summary that says how many minutes its counts cover: on a new database
   * the hour mostly lies before `since`, when there was nothing to count. */
  function renderHour(rows, since) {
    const chart = $("hour-chart");
    const begins = since ? Date.parse(since) : -Infinity;
    const before = (r) => Date.parse(r.minute) + 60000 <= begins;
    const total = (r) => (r.completed ?? 0) + (r.failed ?? 0);
    const max = Math.max(1, ...rows.map(total));
    const step = HOUR_W / Math.max(rows.length, 1);
    const bars = rows.map((r, i) => {
      const x = i * step + 1;
      const width = Math.max(step - 2, 1);
      const hc = ((r.completed ?? 0) / max) * (HOUR_H - 2);
      const hf = ((r.failed ?? 0) / max) * (HOUR_H - 2);
      const g = svg("g", { class: "hour-bar", "data-minute": r.minute, "data-completed": r.completed ?? "", "data-failed": r.failed ?? "", "data-partial": r.partial ? "1" : "" });
      if (before(r)) g.dataset.before = "1";
      const title = svg("title");
      const when = `${fmtTime(r.minute).slice(11, 16)}${r.partial ? " (so far)" : ""}`;
      title.textContent = before(r)
        ? `${when}: before this database had jobs`
        : r.completed === null
          ? `${when}: not counted yet`
          : `${when}: ${fmtInt(r.completed)} completed, ${fmtInt(r.failed)} failed, ${fmtInt(r.cancelled)} cancelled`;
      g.append(title, svg("rect", { class: "hour-bg", x, y: 0, width, height: HOUR_H }));
      if (hc > 0) g.append(svg("rect", { class: "hour-completed", x, y: HOUR_H - hc, width, height: hc }));
      if (hf > 0) g.append(svg("rect", { class: "hour-failed", x, y: HOUR_H - hc - hf, width, height: hf }));
      return g;
    });
    chart.replaceChildren(...bars);
    const covered = rows.filter((r) => !before(r));
    const counted = covered.filter((r) => r.completed !== null);
    const sum = (k) => counted.reduce((a, r) => a + r[k], 0);
    const pending = covered.length - counted.length;
    const n = counted.length;
    const note = n < rows.length ? ` · ${fmtInt(n)} minute${n === 1 ? "" : "s"} of data${pending ? `, ${fmtInt(pending)} more being counted` : ""}` : "";
    const summary = $("hour-summary");
    summary.replaceChildren(
      h("strong", { text: fmtInt(sum("completed")) }), " completed · ",
      h("strong", { class: sum("failed") ? "bad-text" : "", text: fmtInt(sum("failed")) }), " failed",
      note ? h("span", { class: "muted", text: note }) : "",
    );
    summary.dataset.completed = String(sum("completed"));
    summary.dataset.failed = String(sum("failed"));
    summary.dataset.minutes = String(n);
  }

  // -- jobs list ---------------------------------------------------------------------------

  // List pages carry no job data unless asked; the rows show a payload preview, and the
  // detail pane reads the whole job (result, errors) from GET /jobs/{id}.
  function filterParams() {
    const f = state.filters;
    return { status: f.status, queue: f.queue, task: f.task, group_key: f.group, payload: f.payload, include: "payload" };
  }

  async function refreshJobs() {
    if (state.jobs.length > MAX_LIVE_ROWS) return; // beyond one page of 500: no live refresh
    const gen = state.listGen;
    const limit = Math.min(MAX_LIVE_ROWS, Math.max(PAGE_SIZE, Math.ceil(state.jobs.length / PAGE_SIZE) * PAGE_SIZE));
    let page;
    try {
      page = await api("GET", "jobs", { ...filterParams(), limit });
    } catch (err) {
      if (gen === state.listGen) listError(err);
      throw err;
    }
    if (gen !== state.listGen) return;
    state.jobs = page.jobs;
    state.nextCursor = page.next_cursor;
    state.listLoaded = true;
    renderJobs();
  }

  async function loadMore() {
    if (!state.nextCursor) return;
    const gen = state.listGen;
    const button = $("load-more");
    button.disabled = true;
    try {
      const page = await api("GET", "jobs", { ...filterParams(), limit: PAGE_SIZE, cursor: state.nextCursor });
      if (gen !== state.listGen) return;
      const seen = new Set(state.jobs.map((j) => j.job_id));
      state.jobs = state.jobs.concat(page.jobs.filter((j) => !seen.has(j.job_id)));
      state.nextCursor = page.next_cursor;
      renderJobs();
    } catch (err) {
      actionFailed(err, "Could not load more jobs");
    } finally {
      button.disabled = false;
    }
  }

  function listError(err) {
    if (err.status === 401 || err.status === 403 || err.status === 503 || err.status === 0) return;
    const message = $("jobs-message");
    message.textContent = `Could not list jobs: ${err.detail}`;
    message.hidden = false;
  }

  function makeJobRow(job) {
    const open = h("button", { type: "button", class: "linkish" });
    open.addEventListener("click", (event) => {
      event.stopPropagation();
      openJob(job.job_id);
    });
    const tr = h(
      "tr",
      { data: { jobId: job.job_id } },
      h("td", {}, open),
      h("td", { data: { col: "status" } }),
      h("td", { class: "cell-task", data: { col: "task" } }),
      h("td", { class: "cell-queue", data: { col: "queue" } }),
      h("td", { class: "cell-group", data: { col: "group" } }),
      h("td", { class: "num", data: { col: "attempts" } }),
      h("td", { data: { col: "created" } }),
      h("td", { class: "payload", data: { col: "payload" } }),
    );
    tr.addEventListener("click", () => openJob(job.job_id));
    return tr;
  }

  /** A group key as a tag; clicking it lists that group's jobs. */
  function groupTag(key) {
    const tag = h("button", {
      type: "button",
      class: "tag",
      text: key,
      title: `Group ${key}: list its jobs`,
      "aria-label": `Show the jobs of group ${key}`,
      data: { groupKey: key },
    });
    tag.addEventListener("click", (event) => {
      event.stopPropagation();
      if (state.wf) closeWorkflow();
      setFilters({ group: key });
    });
    return tag;
  }

  function statusCell(td, job) {
    const p = barProgress(job);
    td.replaceChildren(h("span", { class: "status-cell" }, badge(job.status), p ? progressBar(p, "bar-row") : null));
    td.dataset.value = job.status;
  }

  function updateJobRow(tr, job) {
    const label = shortId(job.job_id);
    const error = job.status === "failed" ? firstLine(job.error) : "";
    const key = json([label, job.status, job.attempt_count, job.max_attempts, job.task, job.queue, job.group_key, job.progress, error]);
    const cell = (col) => tr.querySelector(`[data-col="${col}"]`);
    if (tr.dataset.key !== key) {
      tr.dataset.key = key;
      const open = tr.querySelector("button");
      setText(open, label);
      open.setAttribute("aria-label", `Open job ${label} (${job.task}, ${job.status})`);
      open.title = job.job_id;
      statusCell(cell("status"), job);
      const group = cell("group");
      group.replaceChildren(job.group_key === null || job.group_key === undefined ? "" : groupTag(job.group_key));
      group.dataset.value = job.group_key ?? "";
      setText(cell("task"), job.task);
      cell("task").title = job.task;
      setText(cell("queue"), job.queue);
      cell("queue").title = job.queue;
      setText(cell("attempts"), `${job.attempt_count}/${job.max_attempts}`);
      // A failed job's error comes first: it is what the row is looked at for.
      const preview = JSON.stringify(job.payload);
      cell("payload").replaceChildren(
        error ? h("span", { class: "row-error", title: job.error, text: error }) : "",
        preview.length > 160 ? `${preview.slice(0, 160)}…` : preview,
      );
    }
    const created = cell("created");
    setText(created, fmtAgo(job.created_at));
    created.title = fmtTime(job.created_at);
    const selected = job.job_id === state.selectedId;
    tr.classList.toggle("selected", selected);
    const open = tr.querySelector("button");
    if (selected) open.setAttribute("aria-current", "true");
    else open.removeAttribute("aria-current");
  }

  function renderJobs() {
    const body = $("jobs-body");
    const existing = new Map([...body.rows].map((tr) => [tr.dataset.jobId, tr]));
    state.jobs.forEach((job, i) => {
      const tr = existing.get(job.job_id) || makeJobRow(job);
      existing.delete(job.job_id);
      updateJobRow(tr, job);
      if (body.rows[i] !== tr) body.insertBefore(tr, body.rows[i] || null);
    });
    for (const tr of existing.values()) tr.remove();
    const message = $("jobs-message");
    message.hidden = !state.listLoaded || state.jobs.length > 0;
    message.textContent = "No jobs match these filters.";
    const n = state.jobs.length;
    const more = state.nextCursor ? " (more below)" : "";
    setText($("jobs-count"), state.listLoaded ? `${fmtInt(n)} job${n === 1 ? "" : "s"} shown${more}` : "Loading…");
    $("jobs-count").dataset.value = String(n);
    $("load-more").hidden = !state.nextCursor;
    if (state.filters.payload && state.listLoaded) {
      // A payload search looks at a bounded number of jobs per page (see GET /jobs).
      setText($("jobs-count"), `${fmtInt(n)} job${n === 1 ? "" : "s"} found with that payload${state.nextCursor ? "; Load more searches further" : ""}`);
    }
    updateBulkButtons();
  }

  function setFilters(filters, { fromHash = false } = {}) {
    state.filters = { ...state.filters, ...filters };
    $("f-status").value = state.filters.status;
    $("f-queue").value = state.filters.queue;
    $("f-task").value = state.filters.task;
    $("f-group").value = state.filters.group;
    $("f-payload").value = state.filters.payload;
    showPayloadError(payloadProblem(state.filters.payload));
    if (!fromHash) writeHash(false);
    state.listGen += 1;
    state.jobs = [];
    state.nextCursor = null;
    state.listLoaded = false;
    $("jobs-scroll").scrollTop = 0;
    renderJobs();
    refreshJobs().catch((err) => trouble([err]));
  }

  function readFilters() {
    const payload = $("f-payload").value.trim();
    const problem = payloadProblem(payload);
    showPayloadError(problem);
    const next = {
      status: $("f-status").value,
      queue: $("f-queue").value.trim(),
      task: $("f-task").value.trim(),
      group: $("f-group").value,
      payload: problem ? state.filters.payload : payload, // a bad one is not sent
    };
    const f = state.filters;
    if (Object.keys(next).some((k) => next[k] !== f[k])) setFilters(next);
  }

  const MAX_PAYLOAD_FILTER = 2000; // as the API's bound

  /** What is wrong with a payload filter's text, or null (empty: no filter). */
  function payloadProblem(text) {
    if (!text) return null;
    if (text.length > MAX_PAYLOAD_FILTER) return `at most ${MAX_PAYLOAD_FILTER} characters`;
    let value;
    try {
      value = JSON.parse(text);
    } catch {
      return 'not JSON: write an object, such as {"account": 42}';
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) return 'a JSON object, such as {"account": 42}';
    return null;
  }

  function showPayloadError(problem) {
    const p = $("f-payload-error");
    p.hidden = !problem;
    p.textContent = problem ? `Payload filter: ${problem}.` : "";
    $("f-payload").setAttribute("aria-invalid", problem ? "true" : "false");
  }

  const UUID_RE = /^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$/i;

  /** The job id field: a whole id opens that job (its page is in the address, #job=...). */
  function openTypedJob() {
    const input = $("f-id");
    const id = input.value.trim();
    const error = $("f-id-error");
    if (!id) {
      error.hidden = true;
      return;
    }
    if (!UUID_RE.test(id)) {
      error.textContent = "Job id: a whole job id (a UUID), such as 0b0c6a9e-3c5e-4a53-9a3f-2a8f6f1d9c11.";
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      return;
    }
    error.hidden = true;
    input.setAttribute("aria-invalid", "false");
    input.value = "";
    openJob(id.toLowerCase());
  }

  /** The version, from the OpenAPI document (which the token does not guard). */
  async function readVersion() {
    try {
      const response = await fetch(new URL("openapi.json", API_BASE), { cache: "no-store", credentials: "omit" });
      if (!response.ok) return;
      const spec = await response.json();
      const version = spec && spec.info && spec.info.version;
      if (version) setText($("version"), `v${version}`);
    } catch {
      /* no OpenAPI document: no version shown */
    }
  }

  // -- bulk actions by filter (POST /jobs/bulk) --------------------------------------------
  //
  // A dry run counts the jobs the action applies to; the dialog shows that count and the
  // filters; once confirmed, the action goes in bounded steps (each looks at BULK_STEP jobs at
  // most) until the API says it is done.

  const BULK_STEP = 500;
  const BULK_MAX_STEPS = 2000; // a million candidates: past that, the user asks again
  const BULK_STATUSES = {
    retry: ["failed", "cancelled"],
    cancel: ["waiting", "queued", "processing"],
    delete: ["completed", "failed", "cancelled"],
  };
  const BULK_WORDS = { retry: "Retry", cancel: "Cancel", delete: "Delete" };

  function bulkBody(action) {
    const f = state.filters;
    const body = { action };
    if (f.status) body.status = f.status;
    if (f.queue) body.queue = f.queue;
    if (f.task) body.task = f.task;
    if (f.group) body.group_key = f.group;
    if (f.payload) body.payload = JSON.parse(f.payload); // checked by payloadProblem
    return body;
  }

  function describeFilters() {
    const f = state.filters;
    const parts = [
      f.status && `status ${f.status}`,
      f.queue && `queue ${f.queue}`,
      f.task && `task ${f.task}`,
      f.group && `group ${f.group}`,
      f.payload && `payload containing ${f.payload}`,
    ].filter(Boolean);
    return parts.length ? `Matching ${parts.join(", ")}.` : "Every job (no filter is set).";
  }

  function updateBulkButtons() {
    const status = state.filters.status;
    for (const [action, statuses] of Object.entries(BULK_STATUSES)) {
      const button = $(`bulk-${action}`);
      const fits = !status || statuses.includes(status);
      button.disabled = state.bulkBusy || !fits;
      button.title = fits
        ? `${BULK_WORDS[action]} every ${status || statuses.join(", ")} job matching the filters`
        : `${BULK_WORDS[action]} applies to ${statuses.join(", ")} jobs, not ${status}`;
    }
  }

  /** Asks with the page's own dialog; answers true for yes. */
  function confirmDialog(title, text, detail, yes) {
    const dialog = $("confirm");
    setText($("confirm-title"), title);
    setText($("confirm-text"), text);
    setText($("confirm-filter"), detail);
    setText($("confirm-yes"), yes);
    return new Promise((resolve) => {
      const done = (answer) => {
        $("confirm-yes").removeEventListener("click", onYes);
        $("confirm-no").removeEventListener("click", onNo);
        dialog.removeEventListener("cancel", onNo);
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      const onYes = () => done(true);
      const onNo = (event) => {
        if (event) event.preventDefault();
        done(false);
      };
      $("confirm-yes").addEventListener("click", onYes);
      $("confirm-no").addEventListener("click", onNo);
      dialog.addEventListener("cancel", onNo);
      dialog.showModal();
      $("confirm-no").focus();
    });
  }

  async function bulkAction(action) {
    if (state.bulkBusy) return;
    if (payloadProblem(state.filters.payload)) return;
    const word = BULK_WORDS[action];
    const progress = $("bulk-progress");
    state.bulkBusy = true;
    updateBulkButtons();
    try {
      setText(progress, "Counting…");
      const count = await api("POST", "jobs/bulk", undefined, { ...bulkBody(action), dry_run: true });
      setText(progress, "");
      const n = count.matched;
      if (n === 0) {
        toast(`No job to ${action}: none matches.`);
        return;
      }
      const what = `${count.exact ? "" : "at least "}${fmtInt(n)} job${n === 1 ? "" : "s"}`;
      const extra = action === "cancel" ? " Running ones are asked to stop; jobs waiting for them are cancelled too." : action === "delete" ? " This cannot be undone." : "";
      const ok = await confirmDialog(`${word} ${what}?`, `${word} ${what}.${extra}`, describeFilters(), `${word} ${what}`);
      if (!ok) return;
      let affected = 0;
      let stopping = 0;
      let after = null;
      for (let step = 0; step < BULK_MAX_STEPS; step += 1) {
        const answer = await api("POST", "jobs/bulk", undefined, { ...bulkBody(action), limit: BULK_STEP, after });
        affected += answer.affected || 0;
        stopping += answer.stopping || 0;
        after = answer.next_after || null;
        setText(progress, `${word}: ${fmtInt(affected)} so far…`);
        if (!after) break;
      }
      const past = { retry: "Requeued", cancel: "Cancelled", delete: "Deleted" }[action];
      const asked = stopping ? ` (${fmtInt(stopping)} running, asked to stop)` : "";
      toast(`${past} ${fmtInt(affected)} job${affected === 1 ? "" : "s"}${asked}.`);
      tick();
    } catch (err) {
      actionFailed(err, `Could not ${action} the matching jobs`);
    } finally {
      setText(progress, "");
      state.bulkBusy = false;
      updateBulkButtons();
    }
  }

  // -- workers page (GET /workers) ----------------------------------------------------------

  /** The pages besides the jobs list, each a card of its own: its id is the view's name. */
  const VIEWS = ["jobs", "workers", "scheduled", "cron"];

  function showView(view) {
    state.view = view;
    for (const other of VIEWS.slice(1)) $(other).hidden = other !== view;
    $("jobs-card").hidden = view !== "jobs" || Boolean(state.wf);
    document.body.dataset.view = view;
    for (const name of VIEWS) $(`nav-${name}`).setAttribute("aria-pressed", String(name === view));
    const refresh = { workers: refreshWorkers, scheduled: refreshScheduled, cron: refreshCron }[view];
    if (refresh) refresh().catch((err) => trouble([err]));
  }

  function goView(view) {
    if (view === state.view) return;
    if (state.wf && view !== "jobs") hideWorkflow();
    showView(view);
    writeHash(true);
  }

  async function refreshWorkers() {
    const rows = await api("GET", "workers");
    if (state.view !== "workers") return;
    state.workers = rows;
    renderWorkers();
  }

  function renderWorkers() {
    const rows = state.workers || [];
    const body = $("workers-body");
    body.replaceChildren(
      ...rows.map((w) => {
        const jobs = w.jobs.map((job) => {
          const open = h("button", { type: "button", class: "linkish", text: `${shortId(job.job_id)} ${job.task}`, title: `${job.job_id} on ${job.queue}, started ${fmtTime(job.started_at)}`, "aria-label": `Open job ${shortId(job.job_id)} (${job.task}), run by ${w.worker_id}` });
          open.addEventListener("click", () => openJob(job.job_id));
          return h("li", {}, open, h("span", { class: "muted small", text: ` ${fmtAgo(job.started_at)}` }));
        });
        const more = w.running - w.jobs.length;
        const queues = !w.listening ? h("span", { class: "muted", text: "not listening (busy)" }) : w.queues === null ? "every queue" : w.queues.join(", ");
        return h(
          "tr",
          { data: { workerId: w.worker_id, listening: w.listening ? "1" : "" } },
          h("th", { scope: "row", class: "mono", title: w.worker_id, text: w.worker_id }),
          h("td", { data: { col: "queues" } }, w.listening ? h("span", { class: "badge badge-active", text: "listening" }) : null, " ", queues),
          h("td", { class: "num", data: { col: "running" }, text: fmtInt(w.running) }),
          h("td", { data: { col: "jobs" } }, jobs.length ? h("ul", { class: "worker-jobs" }, jobs, more > 0 ? h("li", { class: "muted", text: `and ${fmtInt(more)} more` }) : null) : h("span", { class: "muted", text: "idle" })),
        );
      }),
    );
    $("workers-empty").hidden = rows.length > 0;
    const listening = rows.filter((w) => w.listening).length;
    const running = rows.reduce((a, w) => a + w.running, 0);
    setText($("workers-note"), `${fmtInt(rows.length)} worker${rows.length === 1 ? "" : "s"}, ${fmtInt(listening)} listening, ${fmtInt(running)} job${running === 1 ? "" : "s"} running`);
  }

  // -- scheduled page (GET /scheduled): jobs due later ---------------------------------------
  //
  // Like the jobs list: the first pages are read again on every poll (500 rows at most), and
  // "Load more" follows the keyset cursor. "in 3 min" is counted from the database's clock (the
  // page's `now`), so a browser whose clock is off still shows when a worker will take the job.

  const WAIT_WORDS = { first_run: "first run", retry: "retry", snoozed: "snoozed" };

  function schedParams() {
    const f = state.sched.filters;
    return { queue: f.queue, task: f.task };
  }

  function readSchedFilters() {
    setSchedFilters({ queue: $("s-queue").value.trim(), task: $("s-task").value.trim() });
    writeHash(false);
  }

  function setSchedFilters(filters) {
    const sched = state.sched;
    sched.filters = { queue: filters.queue || "", task: filters.task || "" };
    $("s-queue").value = sched.filters.queue;
    $("s-task").value = sched.filters.task;
    sched.gen += 1;
    sched.jobs = [];
    sched.nextCursor = null;
    sched.loaded = false;
    renderScheduled();
    if (state.view === "scheduled" && !state.authNeeded) refreshScheduled().catch((err) => trouble([err]));
  }

  function takeClock(page) {
    const server = Date.parse(page.now);
    if (Number.isFinite(server)) state.sched.skew = server - Date.now();
  }

  async function refreshScheduled() {
    const sched = state.sched;
    if (sched.jobs.length > MAX_LIVE_ROWS) return;
    const gen = sched.gen;
    const limit = Math.min(MAX_LIVE_ROWS, Math.max(PAGE_SIZE, Math.ceil(sched.jobs.length / PAGE_SIZE) * PAGE_SIZE));
    let page;
    try {
      page = await api("GET", "scheduled", { ...schedParams(), limit });
    } catch (err) {
      if (gen === sched.gen) schedError(err);
      throw err;
    }
    if (gen !== sched.gen || state.view !== "scheduled") return;
    takeClock(page);
    sched.jobs = page.jobs;
    sched.nextCursor = page.next_cursor;
    sched.loaded = true;
    renderScheduled();
  }

  async function loadMoreScheduled() {
    const sched = state.sched;
    if (!sched.nextCursor) return;
    const gen = sched.gen;
    const button = $("scheduled-more");
    button.disabled = true;
    try {
      const page = await api("GET", "scheduled", { ...schedParams(), limit: PAGE_SIZE, cursor: sched.nextCursor });
      if (gen !== sched.gen) return;
      takeClock(page);
      const seen = new Set(sched.jobs.map((j) => j.job_id));
      sched.jobs = sched.jobs.concat(page.jobs.filter((j) => !seen.has(j.job_id)));
      sched.nextCursor = page.next_cursor;
      renderScheduled();
    } catch (err) {
      actionFailed(err, "Could not load more scheduled jobs");
    } finally {
      button.disabled = false;
    }
  }

  function schedError(err) {
    if (err.status === 401 || err.status === 403 || err.status === 503 || err.status === 0) return;
    const message = $("scheduled-message");
    message.textContent = `Could not list scheduled jobs: ${err.detail}`;
    message.hidden = false;
  }

  /** "in 3 min 4 s" from the database's clock; "due now" once it passed. */
  function fmtDue(iso) {
    const s = (Date.parse(iso) - (Date.now() + state.sched.skew)) / 1000;
    if (!Number.isFinite(s)) return "";
    return s <= 0.5 ? "due now" : `in ${fmtDuration(s)}`;
  }

  function waitWhy(job) {
    if (job.reason === "retry") {
      const which = job.failed_attempt ? `after error ${job.failed_attempt}` : "after an error";
      return h("span", { class: "badge badge-failed", title: job.last_error || "", text: `retry ${which}` });
    }
    if (job.reason === "snoozed") return h("span", { class: "badge badge-paused", text: "snoozed" });
    return h("span", { class: "badge badge-queued", text: WAIT_WORDS.first_run });
  }

  function makeScheduledRow(job) {
    const id = job.job_id;
    const open = h("button", { type: "button", class: "linkish", text: shortId(id), title: id, "aria-label": `Open job ${shortId(id)}` });
    open.addEventListener("click", () => openJob(id));
    const run = h("button", { type: "button", class: "small", text: "Run now", "aria-label": `Run job ${shortId(id)} now` });
    run.addEventListener("click", () => scheduledAction(id, "run-now", run));
    const cancel = h("button", { type: "button", class: "small danger", text: "Cancel", "aria-label": `Cancel job ${shortId(id)}` });
    cancel.addEventListener("click", () => scheduledAction(id, "cancel", cancel));
    return h(
      "tr",
      { data: { jobId: id } },
      h("td", {}, open),
      h("td", { class: "cell-task", data: { col: "task" } }),
      h("td", { class: "cell-queue", data: { col: "queue" } }),
      h("td", { data: { col: "due" } }, h("span", { class: "due-in" }), h("span", { class: "muted small due-at" })),
      h("td", { class: "num", data: { col: "attempt" } }),
      h("td", { data: { col: "why" } }),
      h("td", { class: "actions", data: { col: "actions" } }, run, " ", cancel),
    );
  }

  function renderScheduled() {
    const sched = state.sched;
    const body = $("scheduled-body");
    const rows = new Map([...body.children].map((tr) => [tr.dataset.jobId, tr]));
    const wanted = sched.jobs.map((job) => {
      const tr = rows.get(job.job_id) || makeScheduledRow(job);
      const cell = (col) => tr.querySelector(`[data-col="${col}"]`);
      setText(cell("task"), job.task);
      setText(cell("queue"), job.queue);
      setText(tr.querySelector(".due-in"), fmtDue(job.run_at));
      setText(tr.querySelector(".due-at"), ` ${fmtTime(job.run_at)}`);
      tr.querySelector(".due-in").title = job.run_at;
      setText(cell("attempt"), `${job.attempt_count}/${job.max_attempts}`);
      const why = cell("why");
      const key = `${job.reason}:${job.failed_attempt}:${job.last_error}`;
      if (why.dataset.key !== key) {
        why.dataset.key = key;
        why.dataset.reason = job.reason;
        why.replaceChildren(waitWhy(job));
      }
      tr.classList.toggle("selected", job.job_id === state.selectedId);
      return tr;
    });
    // Keep rows in place that stay: a button under the pointer is not replaced mid-click.
    wanted.forEach((tr, index) => {
      if (body.children[index] !== tr) body.insertBefore(tr, body.children[index] || null);
    });
    while (body.children.length > wanted.length) body.lastElementChild.remove();
    const message = $("scheduled-message");
    if (sched.loaded && sched.jobs.length === 0) {
      const f = sched.filters;
      message.textContent = f.queue || f.task ? "No job of these filters is due later." : "No job is due later.";
      message.hidden = false;
    } else if (sched.loaded) message.hidden = true;
    const more = sched.nextCursor ? "+" : "";
    setText($("scheduled-count"), sched.loaded ? `${fmtInt(sched.jobs.length)}${more} shown` : "");
    $("scheduled-more").hidden = !sched.nextCursor;
  }

  async function scheduledAction(id, kind, button) {
    if (kind === "cancel") {
      const ok = await confirmDialog(`Cancel job ${shortId(id)}?`, "It will not run; Retry on its page queues it again.", id, "Cancel job");
      if (!ok) return;
    }
    button.disabled = true;
    try {
      const job = await api("POST", `jobs/${segment(id)}/${kind}`);
      toast(kind === "run-now" ? `Job ${shortId(id)} is due now.` : `Job ${shortId(id)} cancelled.`);
      if (state.selectedId === id && job && job.job_id) showJob(job);
      tick();
    } catch (err) {
      actionFailed(err, `Could not ${kind === "run-now" ? "run" : "cancel"} job ${shortId(id)}`);
      refreshScheduled().catch(() => {});
    } finally {
      button.disabled = false;
    }
  }

  // -- cron page (GET /periodic) -------------------------------------------------------------

  const CRON_STATES = { ok: "ticking", pending: "first tick to come", missed: "no live worker", invalid: "invalid" };

  async function refreshCron() {
    const page = await api("GET", "periodic");
    if (state.view !== "cron") return;
    takeClock(page);
    state.cron = page.tasks;
    renderCron();
  }

  function renderCron() {
    const rows = state.cron || [];
    $("cron-body").replaceChildren(
      ...rows.map((t) => {
        const last = t.last_tick;
        let lastCell;
        if (!last) lastCell = h("span", { class: "muted", text: "none yet" });
        else {
          const open = last.job_id ? h("button", { type: "button", class: "linkish", text: shortId(last.job_id), title: last.job_id, "aria-label": `Open job ${shortId(last.job_id)} of ${t.name}` }) : null;
          if (open) open.addEventListener("click", () => openJob(last.job_id));
          lastCell = [
            h("span", { title: last.at, text: fmtAgo(last.at) }),
            h("div", { class: "muted small", text: fmtTime(last.at) }),
            h("div", {}, open, " ", last.job_status ? badge(last.job_status) : h("span", { class: "muted small", text: "job deleted" })),
          ];
        }
        const kind = t.state === "ok" ? "active" : t.state === "pending" ? "queued" : "failed";
        return h(
          "tr",
          { data: { task: t.name, state: t.state } },
          h("th", { scope: "row", class: "mono", title: t.name, text: t.name }),
          h("td", { data: { col: "schedule" } }, h("code", { text: t.cron }), t.description ? h("div", { class: "muted small", text: t.description }) : null, h("div", { class: "muted small", text: `queue ${t.queue}` })),
          h("td", { data: { col: "last" } }, lastCell),
          h("td", { data: { col: "next" } }, t.next_tick ? [h("span", { title: t.next_tick, text: fmtDue(t.next_tick) }), h("div", { class: "muted small", text: fmtTime(t.next_tick) })] : "—"),
          h(
            "td",
            { data: { col: "state" } },
            h("span", { class: `badge badge-${kind}`, text: CRON_STATES[t.state] || t.state }),
            t.queue_paused ? [" ", h("span", { class: "badge badge-paused", text: "queue paused" })] : null,
            t.state === "missed" || t.state === "invalid" ? h("div", { class: "why", text: t.reason }) : null,
            h("div", { class: "muted small", title: t.registered_at, text: `registered ${fmtAgo(t.registered_at)}` }),
          ),
        );
      }),
    );
    $("cron-empty").hidden = rows.length > 0;
    const missed = rows.filter((t) => t.state === "missed").length;
    setText($("cron-note"), `${fmtInt(rows.length)} periodic task${rows.length === 1 ? "" : "s"}${missed ? `, ${fmtInt(missed)} without a live worker` : ""}`);
  }

  // -- where the page is: the URL's hash ---------------------------------------------------
  //
  // #job=<id> opens a job's detail, #workflow=<id> the workflow view, and both can be there
  // (#workflow=<id>&job=<id>). The list's filters are there too (#status=failed&queue=emails,
  // payload= a JSON object), view=workers|scheduled|cron for the other pages, and the Scheduled
  // page's own filters (squeue=, stask=), so reloading or sharing the
  // address shows the same view. Selecting a job or changing a filter replaces the history
  // entry; opening or leaving a workflow or a page adds one, so Back goes back to the list.

  const FILTER_KEYS = ["status", "queue", "task", "group", "payload"];

  function readHash() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const filters = {};
    for (const key of FILTER_KEYS) filters[key] = (params.get(key) || "").slice(0, key === "payload" ? MAX_PAYLOAD_FILTER : 200);
    if (!STATUSES.includes(filters.status)) filters.status = "";
    if (payloadProblem(filters.payload)) filters.payload = "";
    return {
      job: params.get("job") || null,
      workflow: params.get("workflow") || null,
      view: VIEWS.includes(params.get("view")) ? params.get("view") : "jobs",
      filters,
      sched: { queue: (params.get("squeue") || "").slice(0, 200), task: (params.get("stask") || "").slice(0, 200) },
    };
  }

  function writeHash(push) {
    const params = new URLSearchParams();
    if (state.view !== "jobs") params.set("view", state.view);
    for (const key of FILTER_KEYS) if (state.filters[key]) params.set(key, state.filters[key]);
    if (state.sched.filters.queue) params.set("squeue", state.sched.filters.queue);
    if (state.sched.filters.task) params.set("stask", state.sched.filters.task);
    if (state.wf) params.set("workflow", state.wf.id);
    if (state.selectedId) params.set("job", state.selectedId);
    const hash = params.toString();
    const url = hash ? `#${hash}` : location.pathname + location.search;
    try {
      if (push) history.pushState(null, "", url);
      else history.replaceState(null, "", url);
    } catch {
      /* file:// and the like */
    }
  }

  /** Shows what the hash names (on load, Back and Forward, or an edited address). */
  function applyHash() {
    const want = readHash();
    if (FILTER_KEYS.some((k) => want.filters[k] !== state.filters[k])) setFilters(want.filters, { fromHash: true });
    const sf = state.sched.filters;
    if (want.sched.queue !== sf.queue || want.sched.task !== sf.task) setSchedFilters(want.sched);
    if (want.view !== state.view) showView(want.view);
    if (want.workflow !== (state.wf ? state.wf.id : null)) {
      if (want.workflow) showWorkflow(want.workflow);
      else hideWorkflow();
    }
    if (want.job !== state.selectedId) {
      if (want.job) selectJob(want.job);
      else unselectJob();
    }
  }

  // -- job detail --------------------------------------------------------------------------

  function openJob(id) {
    selectJob(id);
    writeHash(false);
    // One column (a narrow screen): the job's page is below the lists; go there.
    if (window.matchMedia("(max-width: 1000px)").matches) $("detail").scrollIntoView({ block: "start" });
  }

  function closeJob() {
    unselectJob();
    writeHash(false);
  }

  function selectJob(id) {
    stopStream();
    state.selectedId = id;
    state.selectedMissing = false;
    state.selectedJob = null; // a listed job lacks its result and errors: "Loading…" until read
    state.detailJson = null;
    state.streamRetryAt = 0;
    renderDetail();
    renderJobs();
    markWorkflowSelection();
    refreshDetail().catch((err) => trouble([err]));
  }

  function unselectJob() {
    stopStream();
    state.selectedId = null;
    state.selectedJob = null;
    state.detailJson = null;
    renderDetail();
    renderJobs();
    markWorkflowSelection();
  }

  async function refreshDetail() {
    const id = state.selectedId;
    if (!id) return;
    let job;
    try {
      job = await api("GET", `jobs/${segment(id)}`);
    } catch (err) {
      if (state.selectedId !== id) return;
      if (err.status === 404 || err.status === 422) {
        state.selectedJob = null;
        state.selectedMissing = true;
        renderDetail();
        return;
      }
      throw err;
    }
    // A stream that went live meanwhile has told something at least as new.
    if (state.selectedId !== id || streaming()) return;
    if (job.job_id !== id) {
      // The address named it otherwise (upper case, no dashes): from now on, as the API does.
      state.selectedId = job.job_id;
      writeHash(false);
    }
    showJob(job);
  }

  /** Shows a fresh read of the selected job (polled or pushed) and follows it while it runs. */
  function showJob(job) {
    if (job.job_id !== state.selectedId) return;
    state.selectedJob = job;
    state.selectedMissing = false;
    renderDetail();
    updateWorkflowJob(job);
    followSelected();
  }

  function field(name, value) {
    return [h("dt", { text: name }), h("dd", {}, value)];
  }

  function timeField(name, iso) {
    return field(name, iso ? [h("time", { datetime: iso, text: fmtTime(iso) }), h("span", { class: "ago", data: { ago: iso }, text: fmtAgo(iso) })] : h("span", { class: "muted", text: "—" }));
  }

  const MAX_LISTED_PARENTS = 20;

  function parentsField(ids) {
    const shown = ids.slice(0, MAX_LISTED_PARENTS).map((id) => {
      const button = h("button", { type: "button", class: "linkish", text: shortId(id), title: id, "aria-label": `Open job ${shortId(id)}, a dependency` });
      button.addEventListener("click", () => openJob(id));
      return button;
    });
    const more = ids.length - shown.length;
    return field("Depends on", h("span", { class: "id-list" }, shown, more > 0 ? h("span", { class: "muted", text: `and ${fmtInt(more)} more` }) : null));
  }

  function workflowField(id) {
    const button = h("button", { type: "button", class: "linkish", text: `Show workflow ${shortId(id)}`, title: id, data: { workflowId: id } });
    button.addEventListener("click", () => openWorkflow(id));
    return field("Workflow", button);
  }

  function renderDetail() {
    const job = state.selectedJob;
    const open = state.selectedId !== null;
    $("detail-empty").hidden = open;
    $("detail-body").hidden = !open;
    $("btn-close").hidden = !open;
    $("btn-retry").hidden = !job || !(job.status === "failed" || job.status === "cancelled");
    $("btn-run-now").hidden = !job || job.status !== "queued" || !(Date.parse(job.run_at) > Date.now() + state.sched.skew);
    $("btn-cancel").hidden = !job || FINAL.has(job.status);
    $("btn-delete").hidden = !job || !FINAL.has(job.status);
    const status = $("detail-status");
    if (!open) {
      setText($("detail-title"), "Job detail");
      status.replaceChildren();
      state.detailJson = null;
      return;
    }
    if (!job) {
      setText($("detail-title"), "Job");
      status.replaceChildren();
      $("detail-body").replaceChildren(
        h("p", { class: "empty", text: state.selectedMissing ? `No job ${state.selectedId} (deleted, or never existed).` : "Loading…" }),
      );
      state.detailJson = null;
      return;
    }
    // Progress changes often: it is updated in place, the rest is rebuilt only when it changed
    // (so a selection in the payload survives a progress report).
    const snapshot = json({ ...job, progress: null });
    if (snapshot === state.detailJson) {
      for (const span of $("detail-body").querySelectorAll("[data-ago]")) setText(span, fmtAgo(span.dataset.ago));
      updateDetailProgress(job);
      return;
    }
    state.detailJson = snapshot;
    setText($("detail-title"), job.task);
    $("detail-title").title = job.task;
    status.replaceChildren(badge(job.status));
    status.dataset.value = job.status;
    $("detail-body").replaceChildren(...detailParts(job).flat().filter(Boolean));
    updateDetailProgress(job);
  }

  function detailParts(job) {
    const errors = Array.isArray(job.errors) ? job.errors : [];
    const errorList = errors.length
      ? h(
          "ol",
          { class: "errors" },
          errors.map((e) =>
            h(
              "li",
              {},
              h(
                "div",
                { class: "meta" },
                h("strong", { text: `Attempt ${e.attempt ?? "?"}` }),
                e.at ? ` · ${fmtTime(e.at)}` : "",
                e.worker ? ` · worker ${e.worker}` : "",
              ),
              h("pre", { class: "error", text: e.error ?? json(e) }),
            ),
          ),
        )
      : job.error
        ? h("pre", { class: "error", text: job.error })
        : h("p", { class: "muted", text: "No failed attempt." });

    const hasResult = job.result !== null && job.result !== undefined;
    const parents = Array.isArray(job.depends_on) ? job.depends_on : [];
    const hasGroup = job.group_key !== null && job.group_key !== undefined;
    return [
      h("div", { class: "job-id", text: job.job_id }),
      job.status === "failed" ? lastError(job, errors) : null,
      h(
        "dl",
        { class: "fields" },
        field("Queue", job.queue),
        hasGroup ? field("Group", groupTag(job.group_key)) : null,
        job.workflow_id ? workflowField(job.workflow_id) : null,
        parents.length ? parentsField(parents) : null,
        field("Priority", String(job.priority)),
        field("Attempts", `${job.attempt_count} of ${job.max_attempts}`),
        job.dedup_key !== null ? field("Dedup key", h("span", { class: "mono", text: job.dedup_key })) : null,
        field("Worker", job.worker_id ? h("span", { class: "mono", text: job.worker_id }) : h("span", { class: "muted", text: "—" })),
        timeField("Created", job.created_at),
        timeField("Run at", job.run_at),
        timeField("Started", job.started_at),
        timeField("Finished", job.finished_at),
        job.status === "processing" ? timeField("Lease expires", job.lease_expires_at) : null,
        job.cancel_requested_at ? timeField("Cancel asked", job.cancel_requested_at) : null,
      ),
      h("div", { class: "progress-box", data: { part: "progress" } }),
      h("h3", { text: "Timeline" }),
      timeline(job),
      h("h3", { text: "Payload" }),
      h("pre", { class: "json payload", text: json(job.payload) }),
      hasResult || job.status === "completed" ? [h("h3", { text: "Result" }), h("pre", { class: "json result", text: json(job.result) })] : null,
      h("h3", { text: `Errors (${errors.length})` }),
      h("div", { class: "errors-box" }, errorList),
    ];
  }

  /** A failed job's error, at the top of its page (every attempt's is under Errors). */
  function lastError(job, errors) {
    const last = errors.length ? errors[errors.length - 1] : null; // appended as they fail
    const text = job.error ?? (last ? last.error : null);
    if (!text) return null;
    return h(
      "div",
      { class: "top-error", data: { part: "error" } },
      h("div", { class: "meta" }, h("strong", { text: "Failed" }), ` · attempt ${job.attempt_count} of ${job.max_attempts}`, last && last.at ? ` · ${fmtTime(last.at)}` : ""),
      h("pre", { class: "error-text", text }),
    );
  }

  /** The job's life in time order: created, due, each failed attempt (from its errors
   * history), the last start, a cancel request, and its end. */
  function timeline(job) {
    const events = [];
    const add = (kind, at, text, error) => {
      if (at) events.push({ kind, at, text, error, t: Date.parse(at) });
    };
    add("created", job.created_at, "Created");
    if (job.run_at && job.run_at !== job.created_at) {
      const due = Date.parse(job.run_at) > Date.now() ? "Due (not yet)" : "Due";
      add("run_at", job.run_at, due);
    }
    const errors = Array.isArray(job.errors) ? job.errors : [];
    for (const e of errors) add("attempt_failed", e.at, `Attempt ${e.attempt ?? "?"} failed${e.worker ? ` on ${e.worker}` : ""}`, e.error);
    add("started", job.started_at, `Attempt ${job.attempt_count} started${job.worker_id ? ` on ${job.worker_id}` : ""}`);
    add("cancel_requested", job.cancel_requested_at, "Cancel requested");
    if (FINAL.has(job.status)) add("finished", job.finished_at, `Ended ${job.status}`);
    events.sort((a, b) => a.t - b.t);
    const first = events.length ? events[0].t : 0;
    return h(
      "ol",
      { class: "timeline" },
      events.map((e) =>
        h(
          "li",
          { data: { event: e.kind } },
          h("span", { class: `tl-dot tl-${e.kind}`, "aria-hidden": "true" }),
          h("span", { class: "tl-text", text: e.text }),
          h("time", { datetime: e.at, class: "muted small", text: `${fmtTime(e.at)}${e.t > first ? ` (+${fmtDuration((e.t - first) / 1000)})` : ""}` }),
          e.error ? h("span", { class: "tl-error", title: e.error, text: firstLine(e.error) }) : null,
        ),
      ),
    );
  }

  /** The detail's progress: a bar while the job runs, the last report's text once it ended. */
  function updateDetailProgress(job) {
    const box = $("detail-body").querySelector('[data-part="progress"]');
    if (!box) return;
    const p = job.progress;
    const known = p && (p.fraction !== null || p.message);
    box.hidden = !known;
    if (!known) {
      box.replaceChildren();
      return;
    }
    const running = barProgress(job);
    let bar = box.querySelector("progress");
    let text = box.querySelector(".progress-text");
    if (!text || Boolean(bar) !== Boolean(running)) {
      bar = running ? progressBar(p, "bar-detail") : null;
      text = h("div", { class: "progress-text" });
      box.replaceChildren(h("h3", { text: "Progress" }), bar, text);
    } else if (bar) updateBar(bar, p);
    setText(text, running ? fmtProgress(p) : `Last reported: ${fmtProgress(p)}`);
  }

  async function deleteJob() {
    const id = state.selectedId;
    if (!id) return;
    const ok = await confirmDialog(`Delete job ${shortId(id)}?`, "Its row, payload, result and errors are removed. This cannot be undone.", id, "Delete job");
    if (!ok || state.selectedId !== id) return;
    const button = $("btn-delete");
    button.disabled = true;
    try {
      await api("DELETE", `jobs/${segment(id)}`);
      toast(`Job ${shortId(id)} deleted.`);
      closeJob();
      tick();
    } catch (err) {
      actionFailed(err, `Could not delete job ${shortId(id)}`);
    } finally {
      button.disabled = false;
    }
  }

  async function jobAction(kind) {
    const id = state.selectedId;
    if (!id) return;
    const button = $(`btn-${kind}`);
    button.disabled = true;
    try {
      const job = await api("POST", `jobs/${segment(id)}/${kind}`);
      if (state.selectedId === id && job && job.job_id) showJob(job);
      const done = { retry: "requeued", "run-now": "is due now" }[kind];
      toast(done ? `Job ${shortId(id)} ${done}.` : `Job ${shortId(id)}: cancel ${job && job.status === "processing" ? "requested" : "done"}.`);
      kickWorkflow(); // its other jobs may follow (cancelled dependents, a rerun branch)
      tick();
    } catch (err) {
      actionFailed(err, `Could not ${kind} job ${shortId(id)}`);
      refreshDetail().catch(() => {});
    } finally {
      button.disabled = false;
    }
  }

  // -- the selected job's event stream -----------------------------------------------------
  //
  // GET /jobs/{id}/events pushes the job at once and on every change of status or progress,
  // and ends after a final status. EventSource cannot send the Authorization header that the
  // token needs, so the stream is read with fetch() and parsed here (event:/data: lines, an
  // event ending at a blank line). While it is live the detail is not polled; once it ended,
  // the poll takes over again. One that broke off (the network, the database, a 503 when the
  // API serves too many streams) is tried again after STREAM_RETRY_MS, the poll serving
  // meanwhile.

  function streaming() {
    return Boolean(state.stream && state.stream.live && state.stream.id === state.selectedId);
  }

  function stopStream() {
    if (!state.stream) return;
    state.stream.controller.abort();
    state.stream = null;
    $("detail").dataset.stream = "";
  }

  function followSelected() {
    const job = state.selectedJob;
    if (!job || job.job_id !== state.selectedId || FINAL.has(job.status) || state.authNeeded) return;
    if (state.stream && state.stream.id === job.job_id) return;
    if (Date.now() < state.streamRetryAt) return;
    stopStream();
    const stream = { id: job.job_id, controller: new AbortController(), live: false };
    state.stream = stream;
    runStream(stream);
  }

  async function runStream(stream) {
    let ended = false;
    try {
      const headers = { Accept: "text/event-stream" };
      const token = getToken();
      if (token) headers.Authorization = `Bearer ${token}`;
      const url = new URL(`jobs/${segment(stream.id)}/events`, API_BASE);
      const { signal } = stream.controller;
      const response = await fetch(url, { headers, cache: "no-store", credentials: "omit", signal });
      if (!response.ok || !response.body || state.stream !== stream) return;
      stream.live = true;
      $("detail").dataset.stream = "live";
      await readEvents(response.body, (event, data) => {
        if (state.stream !== stream || event !== "job") return; // "error": the stream ends
        const job = JSON.parse(data);
        if (FINAL.has(job.status)) ended = true;
        showJob(job);
      });
    } catch {
      /* aborted, or the connection broke: the poll serves */
    } finally {
      if (state.stream === stream) {
        state.stream = null;
        $("detail").dataset.stream = "";
        if (!ended) state.streamRetryAt = Date.now() + STREAM_RETRY_MS;
      }
    }
  }

  /** Reads server-sent events from a byte stream, calling onEvent(name, data) for each. */
  async function readEvents(body, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let carry = ""; // a chunk's last "\r" may be the first half of a "\r\n"
    let scanned = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      let text = carry + value;
      carry = text.endsWith("\r") ? "\r" : "";
      if (carry) text = text.slice(0, -1);
      buffer += text.replace(/\r\n?/g, "\n");
      if (buffer.length > STREAM_MAX_BUFFER) throw new Error("an event too large");
      let end;
      while ((end = buffer.indexOf("\n\n", scanned)) >= 0) {
        emitEvent(buffer.slice(0, end), onEvent);
        buffer = buffer.slice(end + 2);
        scanned = 0;
      }
      scanned = Math.max(0, buffer.length - 1);
    }
  }

  function emitEvent(block, onEvent) {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue; // a comment: the keep-alive
      const colon = line.indexOf(":");
      const key = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (key === "event") name = value;
      else if (key === "data") data.push(value);
    }
    if (data.length) onEvent(name, data.join("\n"));
  }

  // -- workflow view -----------------------------------------------------------------------
  //
  // GET /workflows/{id} is polled every second while any of its jobs has not ended (its overall
  // status may be failed or cancelled while another branch still runs), then no more until an
  // action here (retry, cancel) or the selected job's stream says one moved again. A stream per
  // job would not scale to a workflow's thousand jobs; one poll reads them all.
  //
  // Layout: a job's layer is its depth (the longest chain of dependencies above it); layers are
  // columns from left to right. Each column is ordered by where the jobs' parents (then
  // children) sit, a few sweeps each way, which keeps chains straight and crossings few; then a
  // job is placed level with the mean of its parents, or below the job above it.

  const NODE_W = 176;
  const NODE_H = 50;
  const GAP_X = 56;
  const GAP_Y = 12;
  const PAD = 16;
  const SWEEPS = 4;
  const ZOOMS = [1, 0.75, 0.5, 0.35, 0.2]; // a few hundred jobs fit in view at the small ones

  function openWorkflow(id) {
    showWorkflow(id);
    writeHash(true);
  }

  function closeWorkflow() {
    hideWorkflow();
    writeHash(true);
  }

  function showWorkflow(id) {
    if (state.wf && state.wf.id === id) return;
    if (state.wf) clearTimeout(state.wf.timer); // another workflow: replaced in place
    state.wf = { id, data: null, missing: false, error: null, timer: null, busy: false, again: false, done: false, layoutKey: null, nodes: new Map(), edges: [] };
    if (state.view !== "jobs") showView("jobs");
    $("jobs-card").hidden = true;
    $("workflow").hidden = false;
    renderWorkflow();
    kickWorkflow();
  }

  function hideWorkflow() {
    if (!state.wf) return;
    clearTimeout(state.wf.timer);
    state.wf = null;
    $("workflow").hidden = true;
    $("wf-canvas").replaceChildren();
    applyZoom(); // no workflow: an empty sizer
    $("jobs-card").hidden = state.view !== "jobs";
    if (!state.authNeeded) refreshJobs().catch((err) => trouble([err]));
  }

  /** Reads the workflow now (after an action, or to start). */
  function kickWorkflow() {
    const wf = state.wf;
    if (!wf) return;
    clearTimeout(wf.timer);
    wf.timer = null;
    wf.done = false;
    refreshWorkflow(wf);
  }

  /** From the page's poll: picks the workflow's poll up again after a token was entered. */
  function resumeWorkflow() {
    const wf = state.wf;
    if (wf && !wf.timer && !wf.busy && !wf.done) refreshWorkflow(wf);
  }

  async function refreshWorkflow(wf) {
    if (state.authNeeded || state.wf !== wf) return;
    if (wf.busy) {
      wf.again = true; // an answer on its way may predate what asked for this one
      return;
    }
    wf.busy = true;
    wf.again = false;
    let delay = document.hidden ? HIDDEN_POLL_MS : WORKFLOW_POLL_MS;
    try {
      const data = await api("GET", `workflows/${segment(wf.id)}`);
      if (state.wf !== wf) return;
      if (data.workflow_id !== wf.id) {
        wf.id = data.workflow_id; // as the API spells it (the address may not)
        writeHash(false);
      }
      wf.data = data;
      wf.missing = false;
      wf.error = null;
      wf.done = data.jobs.every((job) => FINAL.has(job.status));
    } catch (err) {
      if (state.wf !== wf) return;
      if (err.status === 404 || err.status === 422) {
        wf.data = null;
        wf.missing = true;
        wf.done = true;
      } else if (err.status === 401 || err.status === 403) {
        needToken(err);
      } else {
        wf.error = err.detail || err.message;
        if (err.status === 503 || err.status === 0) trouble([err]);
        delay = Math.max(delay, POLL_MS);
      }
    } finally {
      wf.busy = false;
    }
    if (state.wf !== wf || state.authNeeded) return;
    renderWorkflow();
    if (wf.again) refreshWorkflow(wf);
    else if (!wf.done) {
      wf.timer = setTimeout(() => {
        wf.timer = null;
        refreshWorkflow(wf);
      }, delay);
    }
  }

  /** A job read elsewhere (the detail's stream, an action) updates its node at once. */
  function updateWorkflowJob(job) {
    const wf = state.wf;
    if (!wf || !wf.data || job.workflow_id !== wf.id) return;
    const i = wf.data.jobs.findIndex((j) => j.job_id === job.job_id);
    if (i < 0) return;
    wf.data.jobs[i] = job;
    if (wf.done && !FINAL.has(job.status)) kickWorkflow(); // it runs again: so does the poll
    else renderWorkflow();
  }

  function renderWorkflow() {
    const wf = state.wf;
    if (!wf) return;
    const card = $("workflow");
    setText($("wf-title"), `Workflow ${shortId(wf.id)}`);
    setText($("wf-id"), wf.id);
    const message = $("wf-message");
    const status = $("wf-status");
    const data = wf.data;
    card.dataset.live = wf.done ? "" : "1";
    if (!data) {
      status.replaceChildren();
      status.dataset.value = "";
      setText($("wf-summary"), "");
      $("wf-canvas").replaceChildren();
      wf.nodes = new Map();
      wf.edges = [];
      wf.layoutKey = null;
      wf.size = null;
      applyZoom();
      message.hidden = false;
      message.textContent = wf.missing
        ? `No workflow ${wf.id} (its jobs were deleted, or it never existed).`
        : wf.error
          ? `Could not read workflow ${wf.id}: ${wf.error}`
          : "Loading…";
      return;
    }
    message.hidden = !wf.error;
    message.textContent = wf.error ? `Could not refresh: ${wf.error}. Showing the last answer.` : "";
    if (status.dataset.value !== data.status) {
      status.replaceChildren(badge(data.status));
      status.dataset.value = data.status;
    }
    setText($("wf-summary"), workflowSummary(data.jobs));
    const layoutKey = data.jobs.map((j) => `${j.job_id}<${j.depends_on.join(",")}`).join(";");
    if (layoutKey !== wf.layoutKey) {
      buildGraph(wf, data.jobs);
      wf.layoutKey = layoutKey;
    }
    const byId = new Map(data.jobs.map((job) => [job.job_id, job]));
    for (const job of data.jobs) updateNode(wf.nodes.get(job.job_id), job);
    for (const edge of wf.edges) {
      const parent = byId.get(edge.dataset.from);
      const edgeState = !parent ? "" : parent.status === "completed" ? "done" : parent.status === "failed" || parent.status === "cancelled" ? "broken" : "";
      if (edge.dataset.state !== edgeState) edge.dataset.state = edgeState;
    }
    markWorkflowSelection();
  }

  function workflowSummary(jobs) {
    const counts = new Map();
    for (const job of jobs) counts.set(job.status, (counts.get(job.status) || 0) + 1);
    const parts = [...counts.keys()]
      .sort((a, b) => STATUSES.indexOf(a) - STATUSES.indexOf(b))
      .map((s) => `${fmtInt(counts.get(s))} ${s}`);
    return `${fmtInt(jobs.length)} job${jobs.length === 1 ? "" : "s"}: ${parts.join(" · ")}`;
  }

  /** Layers (depth), order within each layer and positions of a workflow's jobs. */
  function layoutGraph(jobs) {
    const index = new Map(jobs.map((job, i) => [job.job_id, i]));
    const parents = jobs.map((job) => [...new Set(job.depends_on)].filter((id) => index.has(id)).map((id) => index.get(id)));
    const outside = jobs.map((job, i) => new Set(job.depends_on).size - parents[i].length);
    const children = jobs.map(() => []);
    parents.forEach((ps, i) => ps.forEach((p) => children[p].push(i)));

    // Depth in topological order (the API refuses cycles; a job in one would stay in layer 0).
    const layer = jobs.map(() => 0);
    const pending = parents.map((ps) => ps.length);
    const ready = [];
    pending.forEach((n, i) => n === 0 && ready.push(i));
    for (let k = 0; k < ready.length; k++) {
      for (const c of children[ready[k]]) {
        layer[c] = Math.max(layer[c], layer[ready[k]] + 1);
        if (--pending[c] === 0) ready.push(c);
      }
    }
    const depth = layer.reduce((a, l) => Math.max(a, l), 0);
    const columns = Array.from({ length: depth + 1 }, () => []);
    layer.forEach((l, i) => columns[l].push(i)); // first the API's order: oldest first

    const rank = jobs.map(() => 0);
    const setRanks = (column) => column.forEach((i, r) => (rank[i] = r));
    columns.forEach(setRanks);
    const mean = (ids, fallback) => (ids.length ? ids.reduce((a, i) => a + rank[i], 0) / ids.length : fallback);
    for (let sweep = 0; sweep < SWEEPS; sweep++) {
      const down = sweep % 2 === 0;
      const order = down ? columns.slice(1) : columns.slice(0, -1).reverse();
      for (const column of order) {
        const key = new Map(column.map((i) => [i, mean(down ? parents[i] : children[i], rank[i])]));
        column.sort((a, b) => key.get(a) - key.get(b) || rank[a] - rank[b]);
        setRanks(column);
      }
    }

    const step = NODE_H + GAP_Y;
    const y = jobs.map(() => 0);
    for (const column of columns) {
      let next = 0;
      for (const i of column) {
        const ps = parents[i];
        const level = ps.length ? ps.reduce((a, p) => a + y[p], 0) / ps.length : next;
        y[i] = Math.round(Math.max(next, level));
        next = y[i] + step;
      }
    }
    const x = layer.map((l) => PAD + l * (NODE_W + GAP_X));
    const top = y.map((v) => PAD + v);
    const width = PAD * 2 + (depth + 1) * NODE_W + depth * GAP_X;
    const height = PAD * 2 + y.reduce((a, v) => Math.max(a, v), 0) + NODE_H;
    return { layer, parents, outside, x, y: top, width, height };
  }

  function buildGraph(wf, jobs) {
    const g = layoutGraph(jobs);
    const canvas = $("wf-canvas");
    canvas.style.width = `${g.width}px`;
    canvas.style.height = `${g.height}px`;
    wf.size = { width: g.width, height: g.height };
    applyZoom();
    const edges = svg("svg", { class: "wf-edges", width: g.width, height: g.height, viewBox: `0 0 ${g.width} ${g.height}`, "aria-hidden": "true" });
    const marker = svg("marker", { id: "wf-arrow", viewBox: "0 0 8 8", refX: "8", refY: "4", markerWidth: "7", markerHeight: "7", orient: "auto" });
    marker.append(svg("path", { d: "M0,0 L8,4 L0,8 z", class: "wf-arrow" }));
    const defs = svg("defs");
    defs.append(marker);
    edges.append(defs);
    wf.edges = [];
    jobs.forEach((job, i) => {
      for (const p of g.parents[i]) {
        const x1 = g.x[p] + NODE_W;
        const y1 = g.y[p] + NODE_H / 2;
        const x2 = g.x[i] - 2;
        const y2 = g.y[i] + NODE_H / 2;
        const bend = Math.max(GAP_X / 2, (x2 - x1) / 2);
        const path = svg("path", {
          class: "wf-edge",
          d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
          "marker-end": "url(#wf-arrow)",
          "data-from": jobs[p].job_id,
          "data-to": job.job_id,
        });
        edges.append(path);
        wf.edges.push(path);
      }
    });
    wf.nodes = new Map();
    const nodes = jobs.map((job, i) => {
      const node = makeNode(job, g.layer[i], g.outside[i]);
      node.style.left = `${g.x[i]}px`;
      node.style.top = `${g.y[i]}px`;
      wf.nodes.set(job.job_id, node);
      return node;
    });
    canvas.replaceChildren(edges, ...nodes);
  }

  function makeNode(job, layer, outside) {
    const node = h(
      "button",
      { type: "button", class: "wf-node", data: { jobId: job.job_id, layer, outside } },
      h("span", { class: "wf-head" }, h("span", { class: "wf-ref" }), h("span", { class: "wf-task" })),
      h("span", { class: "wf-meta" }, h("span", { class: "wf-status" }), " · ", h("span", { class: "wf-id" })),
    );
    node.addEventListener("click", () => openJob(job.job_id));
    return node;
  }

  function updateNode(node, job) {
    if (!node) return;
    const id = shortId(job.job_id);
    const ref = job.ref ?? ""; // its name in POST /workflows
    const key = json([id, ref, job.status, job.task, job.progress, job.group_key]);
    if (node.dataset.key === key) return;
    node.dataset.key = key;
    node.dataset.status = job.status;
    setText(node.querySelector(".wf-ref"), ref);
    setText(node.querySelector(".wf-task"), job.task);
    setText(node.querySelector(".wf-status"), job.status);
    setText(node.querySelector(".wf-id"), id);
    const p = barProgress(job);
    const bar = node.querySelector("progress");
    if (p && bar) updateBar(bar, p);
    else if (p) node.append(progressBar(p, "bar-node"));
    else if (bar) bar.remove();
    const outside = Number(node.dataset.outside);
    const label = [
      `Job ${ref ? `${ref} (${job.task})` : job.task} ${id}`,
      job.status,
      p ? `progress ${fmtProgress(p)}` : null,
      job.group_key !== null && job.group_key !== undefined ? `group ${job.group_key}` : null,
      outside ? `also waits for ${outside} job${outside === 1 ? "" : "s"} outside this workflow` : null,
    ].filter(Boolean);
    node.setAttribute("aria-label", label.join(", "));
    node.title = `${ref ? `${ref}: ` : ""}${job.task}\n${job.job_id}\n${label.slice(1).join("\n")}`;
  }

  /** Scales the graph (a CSS transform; set through the CSSOM, which the CSP allows). */
  function applyZoom(change) {
    const at = ZOOMS.indexOf(state.zoom);
    if (change) state.zoom = ZOOMS[Math.min(ZOOMS.length - 1, Math.max(0, at - change))];
    const z = state.zoom;
    const size = state.wf && state.wf.size ? state.wf.size : { width: 0, height: 0 };
    $("wf-canvas").style.transform = z === 1 ? "" : `scale(${z})`;
    $("wf-sizer").style.width = `${Math.ceil(size.width * z)}px`;
    $("wf-sizer").style.height = `${Math.ceil(size.height * z)}px`;
    setText($("wf-zoom"), `${Math.round(z * 100)} %`, z);
    $("wf-zoom-in").disabled = z === ZOOMS[0];
    $("wf-zoom-out").disabled = z === ZOOMS[ZOOMS.length - 1];
  }

  function markWorkflowSelection() {
    if (!state.wf) return;
    for (const [id, node] of state.wf.nodes) {
      const selected = id === state.selectedId;
      if (node.classList.contains("selected") === selected) continue;
      node.classList.toggle("selected", selected);
      if (selected) node.setAttribute("aria-current", "true");
      else node.removeAttribute("aria-current");
    }
  }

  // -- messages ----------------------------------------------------------------------------

  function toast(text, kind) {
    const item = h("div", { class: kind || "", text });
    $("toast").append(item);
    setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
  }

  function actionFailed(err, what) {
    if (err.status === 401 || err.status === 403) return needToken(err);
    if (err.status === 503 || err.status === 0) trouble([err]);
    toast(`${what}: ${err.detail || err.message}`, "error");
  }

  // -- start -------------------------------------------------------------------------------

  function init() {
    $("forget-token").hidden = getToken() === null;
    $("auth-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token-input").value.trim();
      if (!token) return;
      setToken(token);
      state.authNeeded = false;
      state.ticks = 0;
      $("auth-message").textContent = "Checking…";
      tick();
    });
    $("forget-token").addEventListener("click", () => {
      stopStream();
      setToken(null);
      state.ticks = 0;
      tick();
    });
    $("filters").addEventListener("submit", (event) => {
      event.preventDefault();
      readFilters();
    });
    $("f-status").addEventListener("change", readFilters);
    for (const id of ["f-queue", "f-task", "f-group"]) {
      let timer = null;
      $(id).addEventListener("change", readFilters);
      $(id).addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(readFilters, 400);
      });
    }
    $("f-clear").addEventListener("click", () => {
      $("f-id").value = "";
      $("f-id-error").hidden = true;
      setFilters({ status: "", queue: "", task: "", group: "", payload: "" });
    });
    $("f-payload").addEventListener("change", readFilters);
    $("f-payload").addEventListener("keydown", (event) => {
      if (event.key === "Enter") {
        event.preventDefault();
        readFilters();
      }
    });
    $("f-id").addEventListener("keydown", (event) => {
      if (event.key === "Enter") {
        event.preventDefault();
        openTypedJob();
      }
    });
    $("f-id").addEventListener("change", openTypedJob);
    for (const action of Object.keys(BULK_STATUSES)) $(`bulk-${action}`).addEventListener("click", () => bulkAction(action));
    $("btn-delete").addEventListener("click", deleteJob);
    $("nav-jobs").addEventListener("click", () => goView("jobs"));
    $("nav-workers").addEventListener("click", () => goView("workers"));
    $("nav-scheduled").addEventListener("click", () => goView("scheduled"));
    $("nav-cron").addEventListener("click", () => goView("cron"));
    for (const id of ["s-queue", "s-task"]) {
      $(id).addEventListener("change", readSchedFilters);
      $(id).addEventListener("keydown", (event) => {
        if (event.key === "Enter") {
          event.preventDefault();
          readSchedFilters();
        }
      });
    }
    $("s-filters").addEventListener("submit", (event) => event.preventDefault());
    $("s-clear").addEventListener("click", () => {
      setSchedFilters({ queue: "", task: "" });
      writeHash(false);
    });
    $("scheduled-more").addEventListener("click", loadMoreScheduled);
    $("load-more").addEventListener("click", loadMore);
    $("btn-retry").addEventListener("click", () => jobAction("retry"));
    $("btn-run-now").addEventListener("click", () => jobAction("run-now"));
    $("btn-cancel").addEventListener("click", () => jobAction("cancel"));
    $("btn-close").addEventListener("click", closeJob);
    $("wf-back").addEventListener("click", closeWorkflow);
    $("wf-zoom-in").addEventListener("click", () => applyZoom(1));
    $("wf-zoom-out").addEventListener("click", () => applyZoom(-1));
    window.addEventListener("popstate", applyHash);
    window.addEventListener("hashchange", applyHash);
    document.addEventListener("keydown", (event) => {
      const typing = event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement;
      if (event.key === "Escape" && !typing && state.selectedId && !$("confirm").open) closeJob();
    });
    document.addEventListener("visibilitychange", () => {
      if (document.hidden || state.authNeeded) return;
      tick();
      if (state.wf && !state.wf.done) kickWorkflow(); // from the hidden pace to the live one
    });
    if (typeof ResizeObserver === "function") new ResizeObserver(() => drawChart()).observe($("chart"));

    applyHash();
    renderJobs();
    readVersion();
    tick();
  }

  init();
})();
