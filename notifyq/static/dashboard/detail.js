// The job detail: selecting a job, its page, and the actions on it.

import { api, segment } from "./api.js";
import { emit } from "./bus.js";
import { trouble } from "./conn.js";
import { $, h, setText } from "./dom.js";
import { badge, barProgress, FINAL, firstLine, fmtAgo, fmtDuration, fmtInt, fmtProgress, fmtTime, json, progressBar, shortId, updateBar, waitsFor } from "./format.js";
import { writeHash } from "./hash.js";
import { groupTag, renderJobs } from "./jobs.js";
import { actionFailed, confirmDialog, toast } from "./messages.js";
import { state } from "./state.js";
import { followSelected, stopStream, streaming } from "./stream.js";
import { kickWorkflow, markWorkflowSelection, openWorkflow, updateWorkflowJob } from "./workflow.js";

export function openJob(id) {
  selectJob(id);
  writeHash(false);
  // One column (a narrow screen): the job's page is below the lists; go there.
  if (window.matchMedia("(max-width: 1000px)").matches) $("detail").scrollIntoView({ block: "start" });
}

export function closeJob() {
  unselectJob();
  writeHash(false);
}

export function selectJob(id) {
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

export function unselectJob() {
  stopStream();
  state.selectedId = null;
  state.selectedJob = null;
  state.detailJson = null;
  renderDetail();
  renderJobs();
  markWorkflowSelection();
}

export async function refreshDetail() {
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
export function showJob(job) {
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

export function renderDetail() {
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
      job.status === "suspended" ? field("Waits for", waitsFor(job)) : null,
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
  // A durable job's recorded steps (ctx.step), each when it finished, in their order.
  for (const step of Array.isArray(job.steps) ? job.steps : []) add("step", step.finished_at, `Step ${step.name} done`);
  if (job.status === "suspended") add("suspended", job.suspended_until ?? new Date().toISOString(), job.suspended_until ? "Runs again (suspended until)" : `Suspended: waits for signal ${job.waiting_for_signal}`);
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

export async function deleteJob() {
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
    emit("refresh");
  } catch (err) {
    actionFailed(err, `Could not delete job ${shortId(id)}`);
  } finally {
    button.disabled = false;
  }
}

export async function jobAction(kind) {
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
    emit("refresh");
  } catch (err) {
    actionFailed(err, `Could not ${kind} job ${shortId(id)}`);
    refreshDetail().catch(() => {});
  } finally {
    button.disabled = false;
  }
}
