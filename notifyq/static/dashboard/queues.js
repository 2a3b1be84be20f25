// The Queues card: one row per queue, the totals' tiles, pause and resume.

import { api, segment } from "./api.js";
import { addSample, drawChart } from "./charts.js";
import { $, h, setText } from "./dom.js";
import { fmtDuration, fmtInt } from "./format.js";
import { setFilters } from "./jobs.js";
import { actionFailed, toast } from "./messages.js";
import { state } from "./state.js";

/** Queue states in which due jobs do not move at all until someone acts. */
const STUCK_STATES = new Set(["paused", "unregistered", "breaker_open", "no_workers"]);
const QUEUE_COLS = ["waiting", "queued", "due", "processing", "completed", "failed", "cancelled", "completed_last_minute", "oldest_due_seconds"];
/** Queues the page asks for: GET /queues answers pages (500 by default); the first one is shown. */
const QUEUE_PAGE = 500;

export async function refreshQueues() {
  const sent = performance.now();
  const page = { limit: QUEUE_PAGE };
  const [rows, states] = await Promise.all([api("GET", "queues", page), api("GET", "queues/states", page).catch(() => null)]);
  const t = (sent + performance.now()) / 2; // about when the server counted
  state.queues = rows;
  if (Array.isArray(states)) state.queueStates = new Map(states.map((q) => [q.queue, q]));
  addSample(rows, t);
  renderQueues(rows);
  drawChart();
  fillDatalist($("queue-names"), rows.map((q) => q.queue));
}

export async function refreshTasks() {
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
  const notes = [];
  if (rows.length >= QUEUE_PAGE) notes.push(`the first ${fmtInt(QUEUE_PAGE)} queues by name; the tiles count these only`);
  if (estimated) notes.push("~ completed counts are estimated on this large table");
  setText($("queues-note"), notes.join("; "));
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
