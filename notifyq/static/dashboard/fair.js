// The Fair keys panel of the Queues card (GET /stats/fair-keys): the keys with the most jobs
// queued or running, by queue, with their weight. It stays hidden until the page has seen a
// job with a fair_key, then says so when none is left. Keys are names clients chose: each
// reaches the page as a text node or an attribute value (dom.js), never as HTML.

import { api } from "./api.js";
import { $, h, setText } from "./dom.js";
import { fmtInt } from "./format.js";

/** Keys the panel asks for, the busiest first (the API answers 100 at most). */
const FAIR_LIMIT = 20;

const fair = { seen: false, missing: false, key: null };

export async function refreshFair() {
  if (fair.missing) return;
  let answer;
  try {
    answer = await api("GET", "stats/fair-keys", { limit: FAIR_LIMIT });
  } catch (err) {
    // An API from before fair keys has no such route: the panel stays hidden, unasked.
    if (err.status !== 404) throw err;
    fair.missing = true;
    $("fair").hidden = true;
    return;
  }
  renderFair(Array.isArray(answer && answer.keys) ? answer.keys : []);
}

function count(col, n) {
  return h("td", { class: n === 0 ? "num zero" : "num", data: { col, value: n }, text: fmtInt(n) });
}

function makeRow(row) {
  return h(
    "tr",
    { data: { queue: row.queue, fairKey: row.fair_key } },
    h("th", { scope: "row", data: { col: "queue" }, title: row.queue }, h("span", { class: "qname", text: row.queue })),
    h("td", { class: "fair-key", data: { col: "fair_key" }, title: row.fair_key, text: row.fair_key }),
    count("queued", row.queued),
    count("running", row.running),
    h("td", { class: "num", data: { col: "weight", value: row.weight }, text: fmtInt(row.weight) }),
  );
}

function renderFair(rows) {
  if (rows.length > 0) fair.seen = true;
  $("fair").hidden = !fair.seen;
  if (!fair.seen) return;
  const key = JSON.stringify(rows);
  if (key === fair.key) return; // nothing changed: the rows (and a hovered one) stay
  fair.key = key;
  $("fair-body").replaceChildren(...rows.map(makeRow));
  $("fair-empty").hidden = rows.length > 0;
  const queued = rows.reduce((a, r) => a + r.queued, 0);
  const running = rows.reduce((a, r) => a + r.running, 0);
  const which = rows.length >= FAIR_LIMIT ? `the ${fmtInt(FAIR_LIMIT)} busiest keys` : `${fmtInt(rows.length)} key${rows.length === 1 ? "" : "s"}`;
  setText($("fair-note"), rows.length ? `${which}: ${fmtInt(queued)} queued, ${fmtInt(running)} running` : "");
}
