// Where the page is: the view shown, and what the URL's hash names (hash.js writes it).

import { trouble } from "./conn.js";
import { refreshCron } from "./cron.js";
import { selectJob, unselectJob } from "./detail.js";
import { $ } from "./dom.js";
import { MAX_PAYLOAD_FILTER, payloadProblem, STATUSES } from "./format.js";
import { FILTER_KEYS, writeHash } from "./hash.js";
import { setFilters } from "./jobs.js";
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
