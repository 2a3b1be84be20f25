// The poll: every POLL_MS it reads what the page shows; the connection's state, the banner
// while the API or the database is away, and the token prompt.

import { ApiError, getToken } from "./api.js";
import { refreshHour } from "./charts.js";
import { refreshCron } from "./cron.js";
import { refreshDetail, renderDetail } from "./detail.js";
import { $, setText } from "./dom.js";
import { fmtDuration } from "./format.js";
import { refreshJobs } from "./jobs.js";
import { refreshQueues, refreshTasks } from "./queues.js";
import { refreshScheduled } from "./scheduled.js";
import { HIDDEN_POLL_MS, POLL_MS, state } from "./state.js";
import { stopStream, streaming } from "./stream.js";
import { refreshWorkers } from "./workers.js";
import { resumeWorkflow } from "./workflow.js";

const TASKS_EVERY = 20; // polls between refreshes of the task names
const HOUR_EVERY = 7; // polls between reads of the last hour's minutes (about 10 s)

function schedule() {
  clearTimeout(state.timer);
  state.timer = setTimeout(tick, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
}

export async function tick() {
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
export function trouble(errors) {
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

export function needToken(err) {
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
