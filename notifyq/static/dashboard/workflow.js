// The workflow view: a workflow's jobs as a graph, polled while any of them runs.

import { api, segment } from "./api.js";
import { emit } from "./bus.js";
import { needToken, trouble } from "./conn.js";
import { $, h, setText, svg } from "./dom.js";
import { badge, barProgress, FINAL, fmtInt, fmtProgress, json, progressBar, shortId, STATUSES, updateBar } from "./format.js";
import { writeHash } from "./hash.js";
import { refreshJobs } from "./jobs.js";
import { HIDDEN_POLL_MS, POLL_MS, state } from "./state.js";

const WORKFLOW_POLL_MS = 1000;

// GET /workflows/{id} is polled every second while any of its jobs has not ended (its overall
// status may be failed or cancelled while another branch still runs), then no more until an
// action here (retry, cancel) or the selected job's stream says one moved again. A stream per
// job would not scale to a workflow's thousand jobs; one poll reads them all.
//
// Layout: a job's layer is its depth (the longest chain of dependencies above it); layers are
// columns from left to right. Each column is ordered by where the jobs' parents (then
// children) sit, a few sweeps each way, which keeps chains straight and crossings few; then a
// job is placed level with the mean of its parents, or below the job above it.

const NODE_W = 176;
const NODE_H = 50;
const GAP_X = 56;
const GAP_Y = 12;
const PAD = 16;
const SWEEPS = 4;
const ZOOMS = [1, 0.75, 0.5, 0.35, 0.2]; // a few hundred jobs fit in view at the small ones

export function openWorkflow(id) {
  showWorkflow(id);
  writeHash(true);
}

export function closeWorkflow() {
  hideWorkflow();
  writeHash(true);
}

export function showWorkflow(id) {
  if (state.wf && state.wf.id === id) return;
  if (state.wf) clearTimeout(state.wf.timer); // another workflow: replaced in place
  state.wf = { id, data: null, missing: false, error: null, timer: null, busy: false, again: false, done: false, layoutKey: null, nodes: new Map(), edges: [] };
  if (state.view !== "jobs") emit("show-view", "jobs");
  $("jobs-card").hidden = true;
  $("workflow").hidden = false;
  renderWorkflow();
  kickWorkflow();
}

export function hideWorkflow() {
  if (!state.wf) return;
  clearTimeout(state.wf.timer);
  state.wf = null;
  $("workflow").hidden = true;
  $("wf-canvas").replaceChildren();
  applyZoom(); // no workflow: an empty sizer
  $("jobs-card").hidden = state.view !== "jobs";
  if (!state.authNeeded) refreshJobs().catch((err) => trouble([err]));
}

/** Reads the workflow now (after an action, or to start). */
export function kickWorkflow() {
  const wf = state.wf;
  if (!wf) return;
  clearTimeout(wf.timer);
  wf.timer = null;
  wf.done = false;
  refreshWorkflow(wf);
}

/** From the page's poll: picks the workflow's poll up again after a token was entered. */
export function resumeWorkflow() {
  const wf = state.wf;
  if (wf && !wf.timer && !wf.busy && !wf.done) refreshWorkflow(wf);
}

async function refreshWorkflow(wf) {
  if (state.authNeeded || state.wf !== wf) return;
  if (wf.busy) {
    wf.again = true; // an answer on its way may predate what asked for this one
    return;
  }
  wf.busy = true;
  wf.again = false;
  let delay = document.hidden ? HIDDEN_POLL_MS : WORKFLOW_POLL_MS;
  try {
    const data = await api("GET", `workflows/${segment(wf.id)}`);
    if (state.wf !== wf) return;
    if (data.workflow_id !== wf.id) {
      wf.id = data.workflow_id; // as the API spells it (the address may not)
      writeHash(false);
    }
    wf.data = data;
    wf.missing = false;
    wf.error = null;
    wf.done = data.jobs.every((job) => FINAL.has(job.status));
  } catch (err) {
    if (state.wf !== wf) return;
    if (err.status === 404 || err.status === 422) {
      wf.data = null;
      wf.missing = true;
      wf.done = true;
    } else if (err.status === 401 || err.status === 403) {
      needToken(err);
    } else {
      wf.error = err.detail || err.message;
      if (err.status === 503 || err.status === 0) trouble([err]);
      delay = Math.max(delay, POLL_MS);
    }
  } finally {
    wf.busy = false;
  }
  if (state.wf !== wf || state.authNeeded) return;
  renderWorkflow();
  if (wf.again) refreshWorkflow(wf);
  else if (!wf.done) {
    wf.timer = setTimeout(() => {
      wf.timer = null;
      refreshWorkflow(wf);
    }, delay);
  }
}

/** A job read elsewhere (the detail's stream, an action) updates its node at once. */
export function updateWorkflowJob(job) {
  const wf = state.wf;
  if (!wf || !wf.data || job.workflow_id !== wf.id) return;
  const i = wf.data.jobs.findIndex((j) => j.job_id === job.job_id);
  if (i < 0) return;
  wf.data.jobs[i] = job;
  if (wf.done && !FINAL.has(job.status)) kickWorkflow(); // it runs again: so does the poll
  else renderWorkflow();
}

function renderWorkflow() {
  const wf = state.wf;
  if (!wf) return;
  const card = $("workflow");
  setText($("wf-title"), `Workflow ${shortId(wf.id)}`);
  setText($("wf-id"), wf.id);
  const message = $("wf-message");
  const status = $("wf-status");
  const data = wf.data;
  card.dataset.live = wf.done ? "" : "1";
  if (!data) {
    status.replaceChildren();
    status.dataset.value = "";
    setText($("wf-summary"), "");
    $("wf-canvas").replaceChildren();
    wf.nodes = new Map();
    wf.edges = [];
    wf.layoutKey = null;
    wf.size = null;
    applyZoom();
    message.hidden = false;
    message.textContent = wf.missing
      ? `No workflow ${wf.id} (its jobs were deleted, or it never existed).`
      : wf.error
        ? `Could not read workflow ${wf.id}: ${wf.error}`
        : "Loading…";
    return;
  }
  message.hidden = !wf.error;
  message.textContent = wf.error ? `Could not refresh: ${wf.error}. Showing the last answer.` : "";
  if (status.dataset.value !== data.status) {
    status.replaceChildren(badge(data.status));
    status.dataset.value = data.status;
  }
  setText($("wf-summary"), workflowSummary(data.jobs));
  const layoutKey = data.jobs.map((j) => `${j.job_id}<${j.depends_on.join(",")}`).join(";");
  if (layoutKey !== wf.layoutKey) {
    buildGraph(wf, data.jobs);
    wf.layoutKey = layoutKey;
  }
  const byId = new Map(data.jobs.map((job) => [job.job_id, job]));
  for (const job of data.jobs) updateNode(wf.nodes.get(job.job_id), job);
  for (const edge of wf.edges) {
    const parent = byId.get(edge.dataset.from);
    const edgeState = !parent ? "" : parent.status === "completed" ? "done" : parent.status === "failed" || parent.status === "cancelled" ? "broken" : "";
    if (edge.dataset.state !== edgeState) edge.dataset.state = edgeState;
  }
  markWorkflowSelection();
}

function workflowSummary(jobs) {
  const counts = new Map();
  for (const job of jobs) counts.set(job.status, (counts.get(job.status) || 0) + 1);
  const parts = [...counts.keys()]
    .sort((a, b) => STATUSES.indexOf(a) - STATUSES.indexOf(b))
    .map((s) => `${fmtInt(counts.get(s))} ${s}`);
  return `${fmtInt(jobs.length)} job${jobs.length === 1 ? "" : "s"}: ${parts.join(" · ")}`;
}

/** Layers (depth), order within each layer and positions of a workflow's jobs. */
function layoutGraph(jobs) {
  const index = new Map(jobs.map((job, i) => [job.job_id, i]));
  const parents = jobs.map((job) => [...new Set(job.depends_on)].filter((id) => index.has(id)).map((id) => index.get(id)));
  const outside = jobs.map((job, i) => new Set(job.depends_on).size - parents[i].length);
  const children = jobs.map(() => []);
  parents.forEach((ps, i) => ps.forEach((p) => children[p].push(i)));

  // Depth in topological order (the API refuses cycles; a job in one would stay in layer 0).
  const layer = jobs.map(() => 0);
  const pending = parents.map((ps) => ps.length);
  const ready = [];
  pending.forEach((n, i) => n === 0 && ready.push(i));
  for (let k = 0; k < ready.length; k++) {
    for (const c of children[ready[k]]) {
      layer[c] = Math.max(layer[c], layer[ready[k]] + 1);
      if (--pending[c] === 0) ready.push(c);
    }
  }
  const depth = layer.reduce((a, l) => Math.max(a, l), 0);
  const columns = Array.from({ length: depth + 1 }, () => []);
  layer.forEach((l, i) => columns[l].push(i)); // first the API's order: oldest first

  const rank = jobs.map(() => 0);
  const setRanks = (column) => column.forEach((i, r) => (rank[i] = r));
  columns.forEach(setRanks);
  const mean = (ids, fallback) => (ids.length ? ids.reduce((a, i) => a + rank[i], 0) / ids.length : fallback);
  for (let sweep = 0; sweep < SWEEPS; sweep++) {
    const down = sweep % 2 === 0;
    const order = down ? columns.slice(1) : columns.slice(0, -1).reverse();
    for (const column of order) {
      const key = new Map(column.map((i) => [i, mean(down ? parents[i] : children[i], rank[i])]));
      column.sort((a, b) => key.get(a) - key.get(b) || rank[a] - rank[b]);
      setRanks(column);
    }
  }

  const step = NODE_H + GAP_Y;
  const y = jobs.map(() => 0);
  for (const column of columns) {
    let next = 0;
    for (const i of column) {
      const ps = parents[i];
      const level = ps.length ? ps.reduce((a, p) => a + y[p], 0) / ps.length : next;
      y[i] = Math.round(Math.max(next, level));
      next = y[i] + step;
    }
  }
  const x = layer.map((l) => PAD + l * (NODE_W + GAP_X));
  const top = y.map((v) => PAD + v);
  const width = PAD * 2 + (depth + 1) * NODE_W + depth * GAP_X;
  const height = PAD * 2 + y.reduce((a, v) => Math.max(a, v), 0) + NODE_H;
  return { layer, parents, outside, x, y: top, width, height };
}

function buildGraph(wf, jobs) {
  const g = layoutGraph(jobs);
  const canvas = $("wf-canvas");
  canvas.style.width = `${g.width}px`;
  canvas.style.height = `${g.height}px`;
  wf.size = { width: g.width, height: g.height };
  applyZoom();
  const edges = svg("svg", { class: "wf-edges", width: g.width, height: g.height, viewBox: `0 0 ${g.width} ${g.height}`, "aria-hidden": "true" });
  const marker = svg("marker", { id: "wf-arrow", viewBox: "0 0 8 8", refX: "8", refY: "4", markerWidth: "7", markerHeight: "7", orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L8,4 L0,8 z", class: "wf-arrow" }));
  const defs = svg("defs");
  defs.append(marker);
  edges.append(defs);
  wf.edges = [];
  jobs.forEach((job, i) => {
    for (const p of g.parents[i]) {
      const x1 = g.x[p] + NODE_W;
      const y1 = g.y[p] + NODE_H / 2;
      const x2 = g.x[i] - 2;
      const y2 = g.y[i] + NODE_H / 2;
      const bend = Math.max(GAP_X / 2, (x2 - x1) / 2);
      const path = svg("path", {
        class: "wf-edge",
        d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
        "marker-end": "url(#wf-arrow)",
        "data-from": jobs[p].job_id,
        "data-to": job.job_id,
      });
      edges.append(path);
      wf.edges.push(path);
    }
  });
  wf.nodes = new Map();
  const nodes = jobs.map((job, i) => {
    const node = makeNode(job, g.layer[i], g.outside[i]);
    node.style.left = `${g.x[i]}px`;
    node.style.top = `${g.y[i]}px`;
    wf.nodes.set(job.job_id, node);
    return node;
  });
  canvas.replaceChildren(edges, ...nodes);
}

function makeNode(job, layer, outside) {
  const node = h(
    "button",
    { type: "button", class: "wf-node", data: { jobId: job.job_id, layer, outside } },
    h("span", { class: "wf-head" }, h("span", { class: "wf-ref" }), h("span", { class: "wf-task" })),
    h("span", { class: "wf-meta" }, h("span", { class: "wf-status" }), " · ", h("span", { class: "wf-id" })),
  );
  node.addEventListener("click", () => emit("open-job", job.job_id));
  return node;
}

function updateNode(node, job) {
  if (!node) return;
  const id = shortId(job.job_id);
  const ref = job.ref ?? ""; // its name in POST /workflows
  const key = json([id, ref, job.status, job.task, job.progress, job.group_key]);
  if (node.dataset.key === key) return;
  node.dataset.key = key;
  node.dataset.status = job.status;
  setText(node.querySelector(".wf-ref"), ref);
  setText(node.querySelector(".wf-task"), job.task);
  setText(node.querySelector(".wf-status"), job.status);
  setText(node.querySelector(".wf-id"), id);
  const p = barProgress(job);
  const bar = node.querySelector("progress");
  if (p && bar) updateBar(bar, p);
  else if (p) node.append(progressBar(p, "bar-node"));
  else if (bar) bar.remove();
  const outside = Number(node.dataset.outside);
  const label = [
    `Job ${ref ? `${ref} (${job.task})` : job.task} ${id}`,
    job.status,
    p ? `progress ${fmtProgress(p)}` : null,
    job.group_key !== null && job.group_key !== undefined ? `group ${job.group_key}` : null,
    outside ? `also waits for ${outside} job${outside === 1 ? "" : "s"} outside this workflow` : null,
  ].filter(Boolean);
  node.setAttribute("aria-label", label.join(", "));
  node.title = `${ref ? `${ref}: ` : ""}${job.task}\n${job.job_id}\n${label.slice(1).join("\n")}`;
}

/** Scales the graph (a CSS transform; set through the CSSOM, which the CSP allows). */
export function applyZoom(change) {
  const at = ZOOMS.indexOf(state.zoom);
  if (change) state.zoom = ZOOMS[Math.min(ZOOMS.length - 1, Math.max(0, at - change))];
  const z = state.zoom;
  const size = state.wf && state.wf.size ? state.wf.size : { width: 0, height: 0 };
  $("wf-canvas").style.transform = z === 1 ? "" : `scale(${z})`;
  $("wf-sizer").style.width = `${Math.ceil(size.width * z)}px`;
  $("wf-sizer").style.height = `${Math.ceil(size.height * z)}px`;
  setText($("wf-zoom"), `${Math.round(z * 100)} %`, z);
  $("wf-zoom-in").disabled = z === ZOOMS[0];
  $("wf-zoom-out").disabled = z === ZOOMS[ZOOMS.length - 1];
}

export function markWorkflowSelection() {
  if (!state.wf) return;
  for (const [id, node] of state.wf.nodes) {
    const selected = id === state.selectedId;
    if (node.classList.contains("selected") === selected) continue;
    node.classList.toggle("selected", selected);
    if (selected) node.setAttribute("aria-current", "true");
    else node.removeAttribute("aria-current");
  }
}
