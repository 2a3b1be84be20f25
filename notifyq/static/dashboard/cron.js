// The Cron page (GET /periodic).

import { api } from "./api.js";
import { emit } from "./bus.js";
import { $, h, setText } from "./dom.js";
import { badge, fmtAgo, fmtInt, fmtTime, shortId } from "./format.js";
import { fmtDue, takeClock } from "./scheduled.js";
import { state } from "./state.js";

const CRON_STATES = { ok: "ticking", pending: "first tick to come", missed: "no live worker", invalid: "invalid" };

export async function refreshCron() {
  const page = await api("GET", "periodic");
  if (state.view !== "cron") return;
  takeClock(page);
  state.cron = page.tasks;
  renderCron();
}

function renderCron() {
  const rows = state.cron || [];
  $("cron-body").replaceChildren(
    ...rows.map((t) => {
      const last = t.last_tick;
      let lastCell;
      if (!last) lastCell = h("span", { class: "muted", text: "none yet" });
      else {
        const open = last.job_id ? h("button", { type: "button", class: "linkish", text: shortId(last.job_id), title: last.job_id, "aria-label": `Open job ${shortId(last.job_id)} of ${t.name}` }) : null;
        if (open) open.addEventListener("click", () => emit("open-job", last.job_id));
        lastCell = [
          h("span", { title: last.at, text: fmtAgo(last.at) }),
          h("div", { class: "muted small", text: fmtTime(last.at) }),
          h("div", {}, open, " ", last.job_status ? badge(last.job_status) : h("span", { class: "muted small", text: "job deleted" })),
        ];
      }
      const kind = t.state === "ok" ? "active" : t.state === "pending" ? "queued" : "failed";
      return h(
        "tr",
        { data: { task: t.name, state: t.state } },
        h("th", { scope: "row", class: "mono", title: t.name, text: t.name }),
        h("td", { data: { col: "schedule" } }, h("code", { text: t.cron }), t.description ? h("div", { class: "muted small", text: t.description }) : null, h("div", { class: "muted small", text: `queue ${t.queue}` })),
        h("td", { data: { col: "last" } }, lastCell),
        h("td", { data: { col: "next" } }, t.next_tick ? [h("span", { title: t.next_tick, text: fmtDue(t.next_tick) }), h("div", { class: "muted small", text: fmtTime(t.next_tick) })] : "—"),
        h(
          "td",
          { data: { col: "state" } },
          h("span", { class: `badge badge-${kind}`, text: CRON_STATES[t.state] || t.state }),
          t.queue_paused ? [" ", h("span", { class: "badge badge-paused", text: "queue paused" })] : null,
          t.state === "missed" || t.state === "invalid" ? h("div", { class: "why", text: t.reason }) : null,
          h("div", { class: "muted small", title: t.registered_at, text: `registered ${fmtAgo(t.registered_at)}` }),
        ),
      );
    }),
  );
  $("cron-empty").hidden = rows.length > 0;
  const missed = rows.filter((t) => t.state === "missed").length;
  setText($("cron-note"), `${fmtInt(rows.length)} periodic task${rows.length === 1 ? "" : "s"}${missed ? `, ${fmtInt(missed)} without a live worker` : ""}`);
}
