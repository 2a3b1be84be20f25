// The Throughput card: completed/s between polls on a canvas, and the last hour per minute.

import { api } from "./api.js";
import { $, h, svg } from "./dom.js";
import { fmtInt, fmtRate, fmtTime } from "./format.js";
import { POLL_MS, state } from "./state.js";

const CHART_WINDOW_S = 180;
const CHART_MIN_SPAN_S = 30;

// "completed / s" is the difference of the summed exact completed counts between two polls,
// divided by the time between them: the rate of that interval. A negative difference
// (retention or DELETE removed completed jobs) or an estimated count (large table) leaves a
// gap instead of a wrong value. "last-minute average" is completed_last_minute / 60, exact
// whatever the table's size, but smoothed over a minute.

export function addSample(rows, t) {
  const sum = (k) => rows.reduce((a, q) => a + q[k], 0);
  const estimated = rows.some((q) => q.completed_estimated);
  state.samples.push({
    t,
    completed: estimated ? null : sum("completed"),
    lastMinute: sum("completed_last_minute"),
    failedLastMinute: sum("failed_last_minute"),
  });
  const cutoff = t - (CHART_WINDOW_S + 10) * 1000;
  while (state.samples.length > 2 && state.samples[1].t < cutoff) state.samples.shift();
}

function series() {
  const s = state.samples;
  return s.map((cur, i) => {
    const prev = s[i - 1];
    let rate = null;
    if (prev && cur.completed !== null && prev.completed !== null && cur.t - prev.t > 200) {
      const done = cur.completed - prev.completed;
      if (done >= 0) rate = done / ((cur.t - prev.t) / 1000);
    }
    return { t: cur.t, rate, avg: cur.lastMinute / 60, failed: cur.failedLastMinute / 60 };
  });
}

function niceStep(max, ticks) {
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
  return step * mag;
}

export function drawChart() {
  const canvas = $("chart");
  const ctx = fitCanvas(canvas);
  if (!ctx) return;
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue(name).trim();

  const pts = series();
  const frame = chartFrame(canvas, pts);
  drawGrid(ctx, frame, color);

  ctx.save();
  ctx.beginPath();
  ctx.rect(frame.pad.l, frame.pad.t - 2, frame.w, frame.hh + 4);
  ctx.clip();
  drawRate(ctx, frame, color);
  const line = (key, name, dash) => {
    const { visible, x, y } = frame;
    if (!visible.length) return;
    ctx.beginPath();
    visible.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p[key])) : ctx.moveTo(x(p.t), y(p[key]))));
    ctx.setLineDash(dash);
    ctx.strokeStyle = color(name);
    ctx.lineWidth = 1.5;
    ctx.stroke();
    ctx.setLineDash([]);
  };
  line("avg", "--chart-avg", [5, 3]);
  if (frame.visible.some((p) => p.failed > 0)) line("failed", "--chart-failed", [2, 2]);
  ctx.restore();

  describeChart(canvas, pts, frame.span);
}

// The canvas sized to its box at the screen's pixel ratio, cleared; null while it has no size.
function fitCanvas(canvas) {
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (!width || !height) return null;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  return ctx;
}

// What the chart shows (its time span, the points in it, the scale) and where (x and y).
function chartFrame(canvas, pts) {
  const now = performance.now();
  const first = state.samples.length ? state.samples[0].t : now;
  const span = Math.min(CHART_WINDOW_S, Math.max(CHART_MIN_SPAN_S, (now - first) / 1000));
  const visible = pts.filter((p) => now - p.t <= span * 1000 + POLL_MS * 2);
  const peak = Math.max(1, ...visible.map((p) => Math.max(p.rate ?? 0, p.avg, p.failed)));
  const step = niceStep(peak * 1.08, 4);
  const top = step * Math.ceil((peak * 1.08) / step);
  const pad = { l: 40, r: 8, t: 8, b: 18 };
  const w = canvas.clientWidth - pad.l - pad.r;
  const hh = canvas.clientHeight - pad.t - pad.b;
  const x = (t) => pad.l + w * (1 - (now - t) / 1000 / span);
  const y = (v) => pad.t + hh * (1 - v / top);
  return { span, visible, step, top, pad, w, hh, x, y };
}

// The horizontal grid lines with their values, and the time labels under the chart.
function drawGrid(ctx, { span, step, top, pad, w, hh, y }, color) {
  ctx.font = `11px ${getComputedStyle(document.body).fontFamily}`;
  ctx.lineWidth = 1;
  ctx.strokeStyle = color("--chart-grid");
  ctx.fillStyle = color("--chart-label");
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const decimals = step < 1 ? (step < 0.1 ? 2 : 1) : 0;
  for (let v = 0; v <= top + step / 2; v += step) {
    const yy = Math.round(y(v)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(pad.l, yy);
    ctx.lineTo(pad.l + w, yy);
    ctx.stroke();
    ctx.fillText(v.toFixed(decimals), pad.l - 6, yy);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const every = span > 120 ? 60 : span > 50 ? 30 : 10;
  for (let ago = 0; ago <= span; ago += every) {
    const xx = pad.l + w * (1 - ago / span);
    const label = ago === 0 ? "now" : ago % 60 === 0 ? `−${ago / 60} min` : `−${ago} s`;
    ctx.fillText(label, Math.min(Math.max(xx, pad.l + 12), pad.l + w - 12), pad.t + hh + 4);
  }
}

// Completed jobs a second between polls: a filled area, broken where unknown.
function drawRate(ctx, { visible, x, y }, color) {
  const runs = [];
  let run = [];
  for (const p of visible) {
    if (p.rate === null) {
      if (run.length) runs.push(run);
      run = [];
    } else run.push(p);
  }
  if (run.length) runs.push(run);
  ctx.lineJoin = "round";
  for (const r of runs) {
    ctx.beginPath();
    ctx.moveTo(x(r[0].t), y(0));
    for (const p of r) ctx.lineTo(x(p.t), y(p.rate));
    ctx.lineTo(x(r[r.length - 1].t), y(0));
    ctx.closePath();
    ctx.fillStyle = color("--chart-rate-fill");
    ctx.fill();
    ctx.beginPath();
    r.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p.rate)) : ctx.moveTo(x(p.t), y(p.rate))));
    ctx.strokeStyle = color("--chart-rate");
    ctx.lineWidth = 2;
    ctx.stroke();
    if (r.length === 1) {
      ctx.fillStyle = color("--chart-rate");
      ctx.fillRect(x(r[0].t) - 1.5, y(r[0].rate) - 1.5, 3, 3);
    }
  }
}

// The figures beside the chart, and the same in words for a screen reader (and the tests).
function describeChart(canvas, pts, span) {
  const latest = pts[pts.length - 1];
  const rateNow = [...pts].reverse().find((p) => p.rate !== null);
  canvas.dataset.rate = rateNow ? String(rateNow.rate) : "";
  canvas.dataset.avg = latest ? String(latest.avg) : "";
  const summary = $("chart-summary");
  const minutes = Math.round(span / 60);
  if (latest) {
    const nowText = rateNow ? fmtRate(rateNow.rate) : "–";
    summary.replaceChildren(
      h("strong", { text: nowText }), " jobs/s now · ",
      h("strong", { text: fmtRate(latest.avg) }), "/s 1-min avg",
    );
    canvas.setAttribute(
      "aria-label",
      `Jobs completed per second over the last ${minutes} minute${minutes === 1 ? "" : "s"}: ` +
        `${nowText} per second now, ${fmtRate(latest.avg)} per second averaged over the last minute.`,
    );
  }
}

// -- the last hour, per minute (GET /stats/minutes) ----------------------------------------
//
// One bar per minute, completed below and failed on top; the minute under way is the last
// bar. A minute not counted yet (the API counts a few per read) is left empty.

const HOUR_W = 610;
const HOUR_H = 44;

export async function refreshHour() {
  const body = await api("GET", "stats/minutes", { minutes: 60 });
  renderHour(body.minutes, body.since);
}

/** The bars, and a summary that says how many minutes its counts cover: on a new database
 * the hour mostly lies before `since`, when there was nothing to count. */
function renderHour(rows, since) {
  const chart = $("hour-chart");
  const begins = since ? Date.parse(since) : -Infinity;
  const before = (r) => Date.parse(r.minute) + 60000 <= begins;
  const total = (r) => (r.completed ?? 0) + (r.failed ?? 0);
  const max = Math.max(1, ...rows.map(total));
  const step = HOUR_W / Math.max(rows.length, 1);
  const bars = rows.map((r, i) => {
    const x = i * step + 1;
    const width = Math.max(step - 2, 1);
    const hc = ((r.completed ?? 0) / max) * (HOUR_H - 2);
    const hf = ((r.failed ?? 0) / max) * (HOUR_H - 2);
    const g = svg("g", { class: "hour-bar", "data-minute": r.minute, "data-completed": r.completed ?? "", "data-failed": r.failed ?? "", "data-partial": r.partial ? "1" : "" });
    if (before(r)) g.dataset.before = "1";
    const title = svg("title");
    const when = `${fmtTime(r.minute).slice(11, 16)}${r.partial ? " (so far)" : ""}`;
    title.textContent = before(r)
      ? `${when}: before this database had jobs`
      : r.completed === null
        ? `${when}: not counted yet`
        : `${when}: ${fmtInt(r.completed)} completed, ${fmtInt(r.failed)} failed, ${fmtInt(r.cancelled)} cancelled`;
    g.append(title, svg("rect", { class: "hour-bg", x, y: 0, width, height: HOUR_H }));
    if (hc > 0) g.append(svg("rect", { class: "hour-completed", x, y: HOUR_H - hc, width, height: hc }));
    if (hf > 0) g.append(svg("rect", { class: "hour-failed", x, y: HOUR_H - hc - hf, width, height: hf }));
    return g;
  });
  chart.replaceChildren(...bars);
  const covered = rows.filter((r) => !before(r));
  const counted = covered.filter((r) => r.completed !== null);
  const sum = (k) => counted.reduce((a, r) => a + r[k], 0);
  const pending = covered.length - counted.length;
  const n = counted.length;
  const note = n < rows.length ? ` · ${fmtInt(n)} minute${n === 1 ? "" : "s"} of data${pending ? `, ${fmtInt(pending)} more being counted` : ""}` : "";
  const summary = $("hour-summary");
  summary.replaceChildren(
    h("strong", { text: fmtInt(sum("completed")) }), " completed · ",
    h("strong", { class: sum("failed") ? "bad-text" : "", text: fmtInt(sum("failed")) }), " failed",
    note ? h("span", { class: "muted", text: note }) : "",
  );
  summary.dataset.completed = String(sum("completed"));
  summary.dataset.failed = String(sum("failed"));
  summary.dataset.minutes = String(n);
}
