// Bulk actions by filter (POST /jobs/bulk).

import { api } from "./api.js";
import { emit } from "./bus.js";
import { $, setText } from "./dom.js";
import { fmtInt, payloadProblem } from "./format.js";
import { actionFailed, confirmDialog, toast } from "./messages.js";
import { state } from "./state.js";

// A dry run counts the jobs the action applies to; the dialog shows that count and the
// filters; once confirmed, the action goes in bounded steps (each looks at BULK_STEP jobs at
// most) until the API says it is done.

const BULK_STEP = 500;
const BULK_MAX_STEPS = 2000; // a million candidates: past that, the user asks again
export const BULK_STATUSES = {
  retry: ["failed", "cancelled"],
  cancel: ["waiting", "queued", "processing", "suspended"],
  delete: ["completed", "failed", "cancelled"],
};
const BULK_WORDS = { retry: "Retry", cancel: "Cancel", delete: "Delete" };

function bulkBody(action) {
  const f = state.filters;
  const body = { action };
  if (f.status) body.status = f.status;
  if (f.queue) body.queue = f.queue;
  if (f.task) body.task = f.task;
  if (f.group) body.group_key = f.group;
  if (f.payload) body.payload = JSON.parse(f.payload); // checked by payloadProblem
  return body;
}

function describeFilters() {
  const f = state.filters;
  const parts = [
    f.status && `status ${f.status}`,
    f.queue && `queue ${f.queue}`,
    f.task && `task ${f.task}`,
    f.group && `group ${f.group}`,
    f.payload && `payload containing ${f.payload}`,
  ].filter(Boolean);
  return parts.length ? `Matching ${parts.join(", ")}.` : "Every job (no filter is set).";
}

export function updateBulkButtons() {
  const status = state.filters.status;
  for (const [action, statuses] of Object.entries(BULK_STATUSES)) {
    const button = $(`bulk-${action}`);
    const fits = !status || statuses.includes(status);
    button.disabled = state.bulkBusy || !fits;
    button.title = fits
      ? `${BULK_WORDS[action]} every ${status || statuses.join(", ")} job matching the filters`
      : `${BULK_WORDS[action]} applies to ${statuses.join(", ")} jobs, not ${status}`;
  }
}


export async function bulkAction(action) {
  if (state.bulkBusy) return;
  if (payloadProblem(state.filters.payload)) return;
  const word = BULK_WORDS[action];
  const progress = $("bulk-progress");
  state.bulkBusy = true;
  updateBulkButtons();
  try {
    setText(progress, "Counting…");
    const count = await api("POST", "jobs/bulk", undefined, { ...bulkBody(action), dry_run: true });
    setText(progress, "");
    const n = count.matched;
    if (n === 0) {
      toast(`No job to ${action}: none matches.`);
      return;
    }
    const what = `${count.exact ? "" : "at least "}${fmtInt(n)} job${n === 1 ? "" : "s"}`;
    const extra = action === "cancel" ? " Running ones are asked to stop; jobs waiting for them are cancelled too." : action === "delete" ? " This cannot be undone." : "";
    const ok = await confirmDialog(`${word} ${what}?`, `${word} ${what}.${extra}`, describeFilters(), `${word} ${what}`);
    if (!ok) return;
    let affected = 0;
    let stopping = 0;
    let after = null;
    for (let step = 0; step < BULK_MAX_STEPS; step += 1) {
      const answer = await api("POST", "jobs/bulk", undefined, { ...bulkBody(action), limit: BULK_STEP, after });
      affected += answer.affected || 0;
      stopping += answer.stopping || 0;
      after = answer.next_after || null;
      setText(progress, `${word}: ${fmtInt(affected)} so far…`);
      if (!after) break;
    }
    const past = { retry: "Requeued", cancel: "Cancelled", delete: "Deleted" }[action];
    const asked = stopping ? ` (${fmtInt(stopping)} running, asked to stop)` : "";
    toast(`${past} ${fmtInt(affected)} job${affected === 1 ? "" : "s"}${asked}.`);
    emit("refresh");
  } catch (err) {
    actionFailed(err, `Could not ${action} the matching jobs`);
  } finally {
    setText(progress, "");
    state.bulkBusy = false;
    updateBulkButtons();
  }
}
