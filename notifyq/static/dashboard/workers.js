// The Workers page (GET /workers).

import { api } from "./api.js";
import { emit } from "./bus.js";
import { $, h, setText } from "./dom.js";
import { fmtAgo, fmtInt, fmtTime, shortId } from "./format.js";
import { state } from "./state.js";

export async function refreshWorkers() {
  const rows = await api("GET", "workers");
  if (state.view !== "workers") return;
  state.workers = rows;
  renderWorkers();
}

function renderWorkers() {
  const rows = state.workers || [];
  const body = $("workers-body");
  body.replaceChildren(
    ...rows.map((w) => {
      const jobs = w.jobs.map((job) => {
        const open = h("button", { type: "button", class: "linkish", text: `${shortId(job.job_id)} ${job.task}`, title: `${job.job_id} on ${job.queue}, started ${fmtTime(job.started_at)}`, "aria-label": `Open job ${shortId(job.job_id)} (${job.task}), run by ${w.worker_id}` });
        open.addEventListener("click", () => emit("open-job", job.job_id));
        return h("li", {}, open, h("span", { class: "muted small", text: ` ${fmtAgo(job.started_at)}` }));
      });
      const more = w.running - w.jobs.length;
      const queues = !w.listening ? h("span", { class: "muted", text: "not listening (busy)" }) : w.queues === null ? "every queue" : w.queues.join(", ");
      return h(
        "tr",
        { data: { workerId: w.worker_id, listening: w.listening ? "1" : "" } },
        h("th", { scope: "row", class: "mono", title: w.worker_id, text: w.worker_id }),
        h("td", { data: { col: "queues" } }, w.listening ? h("span", { class: "badge badge-active", text: "listening" }) : null, " ", queues),
        h("td", { class: "num", data: { col: "running" }, text: fmtInt(w.running) }),
        h("td", { data: { col: "jobs" } }, jobs.length ? h("ul", { class: "worker-jobs" }, jobs, more > 0 ? h("li", { class: "muted", text: `and ${fmtInt(more)} more` }) : null) : h("span", { class: "muted", text: "idle" })),
      );
    }),
  );
  $("workers-empty").hidden = rows.length > 0;
  const listening = rows.filter((w) => w.listening).length;
  const running = rows.reduce((a, w) => a + w.running, 0);
  setText($("workers-note"), `${fmtInt(rows.length)} worker${rows.length === 1 ? "" : "s"}, ${fmtInt(listening)} listening, ${fmtInt(running)} job${running === 1 ? "" : "s"} running`);
}
