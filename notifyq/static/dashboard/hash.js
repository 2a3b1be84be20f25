// The URL's hash: the page's state written into it (router.js reads it back).
//
// #job=<id> opens a job's detail, #workflow=<id> the workflow view, and both can be there
// (#workflow=<id>&job=<id>). The list's filters are there too (#status=failed&queue=emails,
// payload= a JSON object), view=workers|scheduled|cron for the other pages, and the Scheduled
// page's own filters (squeue=, stask=), so reloading or sharing the
// address shows the same view. Selecting a job or changing a filter replaces the history
// entry; opening or leaving a workflow or a page adds one, so Back goes back to the list.

import { state } from "./state.js";

export const FILTER_KEYS = ["status", "queue", "task", "group", "payload"];

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
