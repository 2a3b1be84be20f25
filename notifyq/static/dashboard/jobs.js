// The Jobs card: the list, its filters (kept in the address) and the job id field.

import { api } from "./api.js";
import { updateBulkButtons } from "./bulk.js";
import { emit } from "./bus.js";
import { trouble } from "./conn.js";
import { $, h, setText } from "./dom.js";
import { badge, barProgress, firstLine, fmtAgo, fmtInt, fmtTime, json, payloadProblem, progressBar, shortId, waitsFor } from "./format.js";
import { writeHash } from "./hash.js";
import { actionFailed } from "./messages.js";
import { MAX_LIVE_ROWS, PAGE_SIZE, state } from "./state.js";

// List pages carry no job data unless asked; the rows show a payload preview, and the
// detail pane reads the whole job (result, errors) from GET /jobs/{id}.
function filterParams() {
  const f = state.filters;
  return { status: f.status, queue: f.queue, task: f.task, group_key: f.group, payload: f.payload, include: "payload" };
}

export async function refreshJobs() {
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

export async function loadMore() {
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
    emit("open-job", job.job_id);
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
  tr.addEventListener("click", () => emit("open-job", job.job_id));
  return tr;
}

/** A group key as a tag; clicking it lists that group's jobs. */
export function groupTag(key) {
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
    if (state.wf) emit("close-workflow");
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
  const waits = job.status === "suspended" ? waitsFor(job) : "";
  const key = json([label, job.status, job.attempt_count, job.max_attempts, job.task, job.queue, job.group_key, job.progress, error, waits]);
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
      waits ? h("span", { class: "row-waits", text: `waits for ${waits}` }) : "",
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

export function renderJobs() {
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

export function setFilters(filters, { fromHash = false } = {}) {
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

export function readFilters() {
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

function showPayloadError(problem) {
  const p = $("f-payload-error");
  p.hidden = !problem;
  p.textContent = problem ? `Payload filter: ${problem}.` : "";
  $("f-payload").setAttribute("aria-invalid", problem ? "true" : "false");
}

const UUID_RE = /^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$/i;

/** The job id field: a whole id opens that job (its page is in the address, #job=...). */
export function openTypedJob() {
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
  emit("open-job", id.toLowerCase());
}
