// notifyq dashboard: plain JavaScript modules, no dependencies, no build step. This one starts
// the page: it wires the controls to the other modules, shows what the address names and
// starts the poll.
//
// The page short-polls the HTTP API (GET /queues, GET /queues/states, GET /stats/fair-keys,
// GET /jobs, GET /jobs/{id}, GET /workflows/{id}, GET /workers, GET /scheduled, GET /periodic)
// and draws what it gets; the job in the detail pane is followed through its event stream
// (GET /jobs/{id}/events) while it runs. Every value from the API reaches the page through text
// nodes or attribute values, never as HTML (dom.js), so payloads, errors and names are shown
// verbatim and cannot inject markup.
//
// The imports go one way, from here down to the helpers (dom, format, api, state, bus,
// messages), with the views in between: a module never imports one that imports it back.
// When a view needs what a module above it does (the poll's refresh, the detail opening a
// job), it emits an event on the bus (bus.js), and wire() below says who answers each, before
// anything runs. Every module only declares at its top level; this one calls init().

import { API_BASE, getToken, setToken } from "./api.js";
import { BULK_STATUSES, bulkAction } from "./bulk.js";
import { on } from "./bus.js";
import { drawChart } from "./charts.js";
import { closeJob, deleteJob, jobAction, openJob, showJob } from "./detail.js";
import { $, setText } from "./dom.js";
import { writeHash } from "./hash.js";
import { loadMore, openTypedJob, readFilters, renderJobs, setFilters } from "./jobs.js";
import { tick } from "./poll.js";
import { applyHash, goView, showView } from "./router.js";
import { loadMoreScheduled, readSchedFilters, setSchedFilters } from "./scheduled.js";
import { state } from "./state.js";
import { stopStream } from "./stream.js";
import { applyZoom, closeWorkflow, kickWorkflow } from "./workflow.js";

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

/** Who answers each of the bus's events (the modules below emit them). */
function wire() {
  on("refresh", tick); // read everything now (after an action changed jobs)
  on("open-job", openJob); // a job's link was followed
  on("job", showJob); // a fresh read of a job (its stream, an action's answer)
  on("show-view", showView);
  on("close-workflow", closeWorkflow);
}

function init() {
  wire();
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
