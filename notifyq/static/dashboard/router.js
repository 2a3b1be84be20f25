// Where the page is: the view shown, and the URL's hash that names it.

import { trouble } from "./conn.js";
import { refreshCron } from "./cron.js";
import { selectJob, unselectJob } from "./detail.js";
import { $ } from "./dom.js";
import { STATUSES } from "./format.js";
import { MAX_PAYLOAD_FILTER, payloadProblem, setFilters } from "./jobs.js";
import { refreshScheduled, setSchedFilters } from "./scheduled.js";
import { state } from "./state.js";
import { refreshWorkers } from "./workers.js";
import { hideWorkflow, showWorkflow } from "./workflow.js";

/** The pages besides the jobs list, each a card of its own: its id is the view's name. */
const VIEWS = ["jobs", "workers", "scheduled", "cron"];

export function showView(view) {
  state.view = view;
  for (const other of VIEWS.slice(1)) $(other).hidden = other !== view;
  $("jobs-card").hidden = view !== "jobs" || Boolean(state.wf);
  document.body.dataset.view = view;
  for (const name of VIEWS) $(`nav-${name}`).setAttribute("aria-pressed", String(name === view));
  const refresh = { workers: refreshWorkers, scheduled: refreshScheduled, cron: refreshCron }[view];
  if (refresh) refresh().catch((err) => trouble([err]));
}

export function goView(view) {
  if (view === state.view) return;
  if (state.wf && view !== "jobs") hideWorkflow();
  showView(view);
  writeHash(true);
}

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

export function writeHash(push) {
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
export function applyHash() {
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
