// Formatting: numbers, durations, times, short job ids, status badges and progress bars; and
// the check of a payload filter's text.

import { h } from "./dom.js";

export const STATUSES = ["waiting", "queued", "processing", "suspended", "completed", "failed", "cancelled"];
export const FINAL = new Set(["completed", "failed", "cancelled"]);


const numbers = new Intl.NumberFormat();
export const fmtInt = (n) => numbers.format(n);

export function fmtRate(r) {
  if (r === null || r === undefined || !Number.isFinite(r)) return "–";
  if (r >= 100) return fmtInt(Math.round(r));
  if (r >= 10) return r.toFixed(1);
  return r.toFixed(2);
}

export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  s = Math.max(0, s);
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function fmtAgo(iso) {
  if (!iso) return "";
  const s = (Date.now() - Date.parse(iso)) / 1000;
  if (!Number.isFinite(s)) return "";
  if (Math.abs(s) < 1) return "just now";
  return s > 0 ? `${fmtDuration(s)} ago` : `in ${fmtDuration(-s)}`;
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return (
    `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
    `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`
  );
}

// Job ids are time-ordered (UUID version 7): they begin with the clock, the same for every
// job of the same minute, and a workflow's ids differ only in their last digits. So an id is
// shown by its end, as many digits as tell it from every other id this page has shown (git's
// rule for short hashes, read from the other end), at least ID_DIGITS. The count only grows,
// so a text shown once never comes to stand for another job.
const ID_DIGITS = 8;
const MAX_IDS_KEPT = 100000; // a page open for days forgets the oldest (the count stays)
const ids = { digits: ID_DIGITS, byEnd: new Map() }; // the end of each id shown -> the id

export function shortId(id) {
  const full = String(id).toLowerCase();
  const end = (x) => x.slice(-ids.digits);
  const other = ids.byEnd.get(end(full));
  if (other !== undefined && other !== full) {
    while (end(other) === end(full)) ids.digits += 1;
    ids.byEnd = new Map([...ids.byEnd.values()].map((x) => [end(x), x]));
  }
  if (ids.byEnd.size >= MAX_IDS_KEPT) ids.byEnd.clear();
  ids.byEnd.set(end(full), full);
  return `…${end(full)}`;
}

export function badge(status) {
  const known = STATUSES.includes(status) || ["paused", "active", "running"].includes(status);
  return h("span", { class: `badge badge-${known ? status : "other"}`, text: status });
}

/** The progress worth a bar: a running job's report with a fraction or at least a message. */
export function barProgress(job) {
  const p = job && job.status === "processing" ? job.progress : null;
  if (!p || (p.fraction === null && !p.message)) return null;
  return p;
}

export function fmtProgress(p) {
  const parts = [];
  if (p.fraction !== null && p.fraction !== undefined) parts.push(`${Math.round(p.fraction * 100)} %`);
  if (p.message) parts.push(p.message);
  return parts.join(" · ");
}

/** A <progress>: determinate with a fraction, indeterminate (no value) with only a message. */
export function progressBar(p, cls) {
  const bar = h("progress", { class: `bar ${cls || ""}`.trim(), max: "1" });
  updateBar(bar, p);
  return bar;
}

export function updateBar(bar, p) {
  const fraction = p.fraction === null || p.fraction === undefined ? "" : String(p.fraction);
  if (bar.dataset.fraction !== fraction) {
    if (fraction === "") bar.removeAttribute("value");
    else bar.setAttribute("value", fraction);
    bar.dataset.fraction = fraction;
  }
  const text = fmtProgress(p);
  if (bar.title !== text) {
    bar.title = text;
    bar.setAttribute("aria-label", `Progress: ${text}`);
  }
}

/** An error's first line, cut at 200 characters: a list row or a timeline's line of it. */
export function firstLine(text) {
  const line = String(text ?? "").trim().split("\n", 1)[0];
  return line.length > 200 ? `${line.slice(0, 200)}…` : line;
}

export function json(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export const MAX_PAYLOAD_FILTER = 2000; // as the API's bound

/** What is wrong with a payload filter's text, or null (empty: no filter). */
export function payloadProblem(text) {
  if (!text) return null;
  if (text.length > MAX_PAYLOAD_FILTER) return `at most ${MAX_PAYLOAD_FILTER} characters`;
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    return 'not JSON: write an object, such as {"account": 42}';
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) return 'a JSON object, such as {"account": 42}';
  return null;
}

/** What a suspended job waits for: its signal (and until when), or the end of its sleep. */
export function waitsFor(job) {
  const until = job.suspended_until ? `until ${fmtTime(job.suspended_until)}` : "";
  if (job.waiting_for_signal) return `signal ${job.waiting_for_signal}${until ? `, ${until}` : ""}`;
  return until ? `sleeping ${until}` : "—";
}
