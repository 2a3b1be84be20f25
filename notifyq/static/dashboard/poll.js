// The poll: every POLL_MS it reads what the page shows, and tells conn.js how that went.

import { refreshHour } from "./charts.js";
import { connected, trouble } from "./conn.js";
import { refreshCron } from "./cron.js";
import { refreshDetail, renderDetail } from "./detail.js";
import { refreshFair } from "./fair.js";
import { refreshJobs } from "./jobs.js";
import { refreshQueues, refreshTasks } from "./queues.js";
import { refreshScheduled } from "./scheduled.js";
import { HIDDEN_POLL_MS, POLL_MS, state } from "./state.js";
import { streaming } from "./stream.js";
import { refreshWorkers } from "./workers.js";
import { resumeWorkflow } from "./workflow.js";

const TASKS_EVERY = 20; // polls between refreshes of the task names
const HOUR_EVERY = 7; // polls between reads of the last hour's minutes (about 10 s)
// Polls between reads of the fair keys (about 6 s): each read counts every queued and running
// job that has a fair_key.
const FAIR_EVERY = 4;

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
  if (state.ticks % FAIR_EVERY === 1) work.push(refreshFair());
  const results = await Promise.allSettled(work);
  const errors = results.filter((r) => r.status === "rejected").map((r) => r.reason);
  if (errors.length === 0) connected();
  else trouble(errors);
  if (!state.authNeeded) schedule();
}
