// The Scheduled page (GET /scheduled): jobs due later.

import { api, segment } from "./api.js";
import { emit } from "./bus.js";
import { trouble } from "./conn.js";
import { $, h, setText } from "./dom.js";
import { fmtDuration, fmtInt, fmtTime, shortId } from "./format.js";
import { actionFailed, confirmDialog, toast } from "./messages.js";
import { writeHash } from "./hash.js";
import { MAX_LIVE_ROWS, PAGE_SIZE, state } from "./state.js";

// Like the jobs list: the first pages are read again on every poll (500 rows at most), and
// "Load more" follows the keyset cursor. "in 3 min" is counted from the database's clock (the
// page's `now`), so a browser whose clock is off still shows when a worker will take the job.

const WAIT_WORDS = { first_run: "first run", retry: "retry", snoozed: "snoozed" };

function schedParams() {
  const f = state.sched.filters;
  return { queue: f.queue, task: f.task };
}

export function readSchedFilters() {
  setSchedFilters({ queue: $("s-queue").value.trim(), task: $("s-task").value.trim() });
  writeHash(false);
}

export function setSchedFilters(filters) {
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

export function takeClock(page) {
  const server = Date.parse(page.now);
  if (Number.isFinite(server)) state.sched.skew = server - Date.now();
}

export async function refreshScheduled() {
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

export async function loadMoreScheduled() {
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
export function fmtDue(iso) {
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
  open.addEventListener("click", () => emit("open-job", id));
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
    if (state.selectedId === id && job && job.job_id) emit("job", job);
    emit("refresh");
  } catch (err) {
    actionFailed(err, `Could not ${kind === "run-now" ? "run" : "cancel"} job ${shortId(id)}`);
    refreshScheduled().catch(() => {});
  } finally {
    button.disabled = false;
  }
}
