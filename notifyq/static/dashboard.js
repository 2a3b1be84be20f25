// notifyq dashboard: plain JavaScript, no dependencies, no build step.
//
// It short-polls the HTTP API (GET /queues, GET /jobs, GET /jobs/{id}) and draws what it gets.
// Every value from the API reaches the page through text nodes or attribute values, never as
// HTML, so payloads, errors and names are shown verbatim and cannot inject markup.
"use strict";

(() => {
  const POLL_MS = 1500;
  const HIDDEN_POLL_MS = 5000;
  const CHART_WINDOW_S = 180;
  const CHART_MIN_SPAN_S = 30;
  const PAGE_SIZE = 50;
  const MAX_LIVE_ROWS = 500; // GET /jobs answers at most 500 a page
  const TASKS_EVERY = 20; // polls between refreshes of the task names
  const TOKEN_KEY = "notifyq.apiToken";
  const STATUSES = ["queued", "processing", "completed", "failed", "cancelled"];
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

  const shortId = (id) => String(id).slice(0, 8);

  function badge(status) {
    const known = STATUSES.includes(status) || status === "paused" || status === "active";
    return h("span", { class: `badge badge-${known ? status : "other"}`, text: status });
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

  async function api(method, path, params) {
    const url = new URL(path, API_BASE);
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
    }
    const headers = { Accept: "application/json" };
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    let response;
    try {
      response = await fetch(url, { method, headers, cache: "no-store", credentials: "omit" });
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
    filters: { status: "", queue: "", task: "" },
    jobs: [],
    nextCursor: null,
    listGen: 0, // bumps on every filter change; stale answers are dropped
    listLoaded: false,
    selectedId: null,
    selectedJob: null,
    selectedMissing: false,
    detailJson: null,
    bulkRetry: false,
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
    const work = [refreshQueues(), refreshJobs(), refreshDetail()];
    if (state.ticks % TASKS_EVERY === 1) work.push(refreshTasks());
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

  const QUEUE_COLS = ["queued", "due", "processing", "completed", "failed", "cancelled", "completed_last_minute", "oldest_due_seconds"];

  async function refreshQueues() {
    const sent = performance.now();
    const rows = await api("GET", "queues");
    const t = (sent + performance.now()) / 2; // about when the server counted
    state.queues = rows;
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
    const stateCell = h("td", { data: { col: "state" } }, h("div", { class: "state-cell" }, h("span", { class: "badge" }), pause));
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
    const stateCell = cell("state");
    stateCell.dataset.value = q.paused ? "paused" : "active";
    const label = stateCell.querySelector(".badge");
    setText(label, q.paused ? "paused" : "active");
    label.className = `badge badge-${q.paused ? "paused" : "active"}`;
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
    const sum = (k) => rows.reduce((a, q) => a + q[k], 0);
    const waits = rows.map((q) => q.oldest_due_seconds).filter((s) => s !== null);
    const oldest = waits.length ? Math.max(...waits) : null;
    const tile = (name) => document.querySelector(`#tiles [data-tile="${name}"]`);
    for (const name of ["due", "processing", "completed_last_minute", "failed"]) {
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

  // -- jobs list ---------------------------------------------------------------------------

  // List pages carry no job data unless asked; the rows show a payload preview, and the
  // detail pane reads the whole job (result, errors) from GET /jobs/{id}.
  function filterParams() {
    const f = state.filters;
    return { status: f.status, queue: f.queue, task: f.task, include: "payload" };
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
      h("td", { class: "num", data: { col: "attempts" } }),
      h("td", { data: { col: "created" } }),
      h("td", { class: "payload", data: { col: "payload" } }),
    );
    tr.addEventListener("click", () => openJob(job.job_id));
    return tr;
  }

  function updateJobRow(tr, job) {
    const key = json([job.status, job.attempt_count, job.max_attempts, job.task, job.queue]);
    const cell = (col) => tr.querySelector(`[data-col="${col}"]`);
    if (tr.dataset.key !== key) {
      tr.dataset.key = key;
      const open = tr.querySelector("button");
      setText(open, shortId(job.job_id));
      open.setAttribute("aria-label", `Open job ${shortId(job.job_id)} (${job.task}, ${job.status})`);
      open.title = job.job_id;
      cell("status").replaceChildren(badge(job.status));
      cell("status").dataset.value = job.status;
      setText(cell("task"), job.task);
      cell("task").title = job.task;
      setText(cell("queue"), job.queue);
      cell("queue").title = job.queue;
      setText(cell("attempts"), `${job.attempt_count}/${job.max_attempts}`);
      const preview = JSON.stringify(job.payload);
      setText(cell("payload"), preview.length > 160 ? `${preview.slice(0, 160)}…` : preview);
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
    updateRequeueButton();
  }

  function setFilters(filters) {
    state.filters = { ...state.filters, ...filters };
    $("f-status").value = state.filters.status;
    $("f-queue").value = state.filters.queue;
    $("f-task").value = state.filters.task;
    state.listGen += 1;
    state.jobs = [];
    state.nextCursor = null;
    state.listLoaded = false;
    $("jobs-scroll").scrollTop = 0;
    renderJobs();
    refreshJobs().catch((err) => trouble([err]));
  }

  function readFilters() {
    const next = {
      status: $("f-status").value,
      queue: $("f-queue").value.trim(),
      task: $("f-task").value.trim(),
    };
    const f = state.filters;
    if (next.status !== f.status || next.queue !== f.queue || next.task !== f.task) setFilters(next);
  }

  // -- requeue all failed (when the API has POST /jobs/retry) ------------------------------

  function updateRequeueButton() {
    const button = $("requeue-all");
    const status = state.filters.status;
    const fits = state.bulkRetry && (status === "failed" || status === "cancelled");
    button.hidden = !fits;
    if (!fits) return;
    const scope = [state.filters.queue && `queue ${state.filters.queue}`, state.filters.task && `task ${state.filters.task}`].filter(Boolean);
    setText(button, `Requeue all ${status}`);
    button.title = `Requeue every ${status} job${scope.length ? ` of ${scope.join(" and ")}` : ""}`;
  }

  async function requeueAll() {
    const { status, queue, task } = state.filters;
    if (status !== "failed" && status !== "cancelled") return;
    const button = $("requeue-all");
    if (!window.confirm(`${button.title}?`)) return;
    button.disabled = true;
    try {
      const answer = await api("POST", "jobs/retry", { status, queue, task });
      const n = answer && typeof answer.requeued === "number" ? answer.requeued : null;
      toast(n === null ? `Requeued the ${status} jobs.` : `Requeued ${fmtInt(n)} ${status} job${n === 1 ? "" : "s"}.`);
      tick();
    } catch (err) {
      actionFailed(err, `Could not requeue the ${status} jobs`);
    } finally {
      button.disabled = false;
    }
  }

  async function detectBulkRetry() {
    try {
      const response = await fetch(new URL("openapi.json", API_BASE), { cache: "no-store", credentials: "omit" });
      if (!response.ok) return;
      const spec = await response.json();
      state.bulkRetry = Boolean(spec && spec.paths && spec.paths["/jobs/retry"] && spec.paths["/jobs/retry"].post);
      const version = spec && spec.info && spec.info.version;
      if (version) setText($("version"), `v${version}`);
      updateRequeueButton();
    } catch {
      /* no OpenAPI document: no bulk button */
    }
  }

  // -- job detail --------------------------------------------------------------------------

  function openJob(id) {
    state.selectedId = id;
    state.selectedMissing = false;
    state.selectedJob = null; // a listed job lacks its result and errors: "Loading…" until read
    state.detailJson = null;
    try {
      history.replaceState(null, "", `#job=${segment(id)}`);
    } catch {
      /* file:// and the like */
    }
    renderDetail();
    renderJobs();
    refreshDetail().catch((err) => trouble([err]));
  }

  function closeJob() {
    state.selectedId = null;
    state.selectedJob = null;
    state.detailJson = null;
    try {
      history.replaceState(null, "", location.pathname + location.search);
    } catch {
      /* ignore */
    }
    renderDetail();
    renderJobs();
  }

  async function refreshDetail() {
    const id = state.selectedId;
    if (!id) return;
    try {
      const job = await api("GET", `jobs/${segment(id)}`);
      if (state.selectedId !== id) return;
      state.selectedJob = job;
      state.selectedMissing = false;
    } catch (err) {
      if (state.selectedId !== id) return;
      if (err.status === 404 || err.status === 422) {
        state.selectedJob = null;
        state.selectedMissing = true;
      } else throw err;
    }
    renderDetail();
  }

  function field(name, value) {
    return [h("dt", { text: name }), h("dd", {}, value)];
  }

  function timeField(name, iso) {
    return field(name, iso ? [h("time", { datetime: iso, text: fmtTime(iso) }), h("span", { class: "ago", data: { ago: iso }, text: fmtAgo(iso) })] : h("span", { class: "muted", text: "—" }));
  }

  function renderDetail() {
    const job = state.selectedJob;
    const open = state.selectedId !== null;
    $("detail-empty").hidden = open;
    $("detail-body").hidden = !open;
    $("btn-close").hidden = !open;
    $("btn-retry").hidden = !job || !(job.status === "failed" || job.status === "cancelled");
    $("btn-cancel").hidden = !job || !(job.status === "queued" || job.status === "processing");
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
    const snapshot = json(job);
    if (snapshot === state.detailJson) {
      for (const span of $("detail-body").querySelectorAll("[data-ago]")) setText(span, fmtAgo(span.dataset.ago));
      return;
    }
    state.detailJson = snapshot;
    setText($("detail-title"), job.task);
    $("detail-title").title = job.task;
    status.replaceChildren(badge(job.status));
    status.dataset.value = job.status;

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
    const parts = [
      h("div", { class: "job-id", text: job.job_id }),
      h(
        "dl",
        { class: "fields" },
        field("Queue", job.queue),
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
      h("h3", { text: "Payload" }),
      h("pre", { class: "json payload", text: json(job.payload) }),
      hasResult || job.status === "completed" ? [h("h3", { text: "Result" }), h("pre", { class: "json result", text: json(job.result) })] : null,
      h("h3", { text: `Errors (${errors.length})` }),
      h("div", { class: "errors-box" }, errorList),
    ];
    $("detail-body").replaceChildren(...parts.flat().filter(Boolean));
  }

  async function jobAction(kind) {
    const id = state.selectedId;
    if (!id) return;
    const button = kind === "retry" ? $("btn-retry") : $("btn-cancel");
    button.disabled = true;
    try {
      const job = await api("POST", `jobs/${segment(id)}/${kind}`);
      if (state.selectedId === id && job && job.job_id) {
        state.selectedJob = job;
        renderDetail();
      }
      toast(kind === "retry" ? `Job ${shortId(id)} requeued.` : `Job ${shortId(id)}: cancel ${job && job.status === "processing" ? "requested" : "done"}.`);
      tick();
    } catch (err) {
      actionFailed(err, `Could not ${kind} job ${shortId(id)}`);
      refreshDetail().catch(() => {});
    } finally {
      button.disabled = false;
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
      setToken(null);
      state.ticks = 0;
      tick();
    });
    $("filters").addEventListener("submit", (event) => {
      event.preventDefault();
      readFilters();
    });
    $("f-status").addEventListener("change", readFilters);
    for (const id of ["f-queue", "f-task"]) {
      let timer = null;
      $(id).addEventListener("change", readFilters);
      $(id).addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(readFilters, 400);
      });
    }
    $("f-clear").addEventListener("click", () => setFilters({ status: "", queue: "", task: "" }));
    $("load-more").addEventListener("click", loadMore);
    $("requeue-all").addEventListener("click", requeueAll);
    $("btn-retry").addEventListener("click", () => jobAction("retry"));
    $("btn-cancel").addEventListener("click", () => jobAction("cancel"));
    $("btn-close").addEventListener("click", closeJob);
    document.addEventListener("keydown", (event) => {
      const typing = event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement;
      if (event.key === "Escape" && !typing && state.selectedId) closeJob();
    });
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && !state.authNeeded) tick();
    });
    if (typeof ResizeObserver === "function") new ResizeObserver(() => drawChart()).observe($("chart"));

    const match = /^#job=([^&]+)$/.exec(location.hash);
    if (match) {
      try {
        openJob(decodeURIComponent(match[1]));
      } catch {
        /* a malformed hash */
      }
    }
    renderJobs();
    detectBulkRetry();
    tick();
  }

  init();
})();
