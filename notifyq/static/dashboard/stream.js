// The selected job's event stream (GET /jobs/{id}/events), read with fetch(). Each job it
// reads is the bus's "job" event, which the detail shows.

import { API_BASE, getToken, segment } from "./api.js";
import { emit } from "./bus.js";
import { $ } from "./dom.js";
import { FINAL } from "./format.js";
import { state } from "./state.js";

const STREAM_RETRY_MS = 10000; // after a stream that broke off (not one that ended)
const STREAM_MAX_BUFFER = 16 * 1024 * 1024; // one event's text; a job's data is bounded

// GET /jobs/{id}/events pushes the job at once and on every change of status or progress,
// and ends after a final status. EventSource cannot send the Authorization header that the
// token needs, so the stream is read with fetch() and parsed here (event:/data: lines, an
// event ending at a blank line). While it is live the detail is not polled; once it ended,
// the poll takes over again. One that broke off (the network, the database, a 503 when the
// API serves too many streams) is tried again after STREAM_RETRY_MS, the poll serving
// meanwhile.

export function streaming() {
  return Boolean(state.stream && state.stream.live && state.stream.id === state.selectedId);
}

export function stopStream() {
  if (!state.stream) return;
  state.stream.controller.abort();
  state.stream = null;
  $("detail").dataset.stream = "";
}

export function followSelected() {
  const job = state.selectedJob;
  if (!job || job.job_id !== state.selectedId || FINAL.has(job.status) || state.authNeeded) return;
  if (state.stream && state.stream.id === job.job_id) return;
  if (Date.now() < state.streamRetryAt) return;
  stopStream();
  const stream = { id: job.job_id, controller: new AbortController(), live: false };
  state.stream = stream;
  runStream(stream);
}

async function runStream(stream) {
  let ended = false;
  try {
    const headers = { Accept: "text/event-stream" };
    const token = getToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    const url = new URL(`jobs/${segment(stream.id)}/events`, API_BASE);
    const { signal } = stream.controller;
    const response = await fetch(url, { headers, cache: "no-store", credentials: "omit", signal });
    if (!response.ok || !response.body || state.stream !== stream) return;
    stream.live = true;
    $("detail").dataset.stream = "live";
    await readEvents(response.body, (event, data) => {
      if (state.stream !== stream || event !== "job") return; // "error": the stream ends
      const job = JSON.parse(data);
      if (FINAL.has(job.status)) ended = true;
      emit("job", job);
    });
  } catch {
    /* aborted, or the connection broke: the poll serves */
  } finally {
    if (state.stream === stream) {
      state.stream = null;
      $("detail").dataset.stream = "";
      if (!ended) state.streamRetryAt = Date.now() + STREAM_RETRY_MS;
    }
  }
}

/** Reads server-sent events from a byte stream, calling onEvent(name, data) for each. */
async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let carry = ""; // a chunk's last "\r" may be the first half of a "\r\n"
  let scanned = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    let text = carry + value;
    carry = text.endsWith("\r") ? "\r" : "";
    if (carry) text = text.slice(0, -1);
    buffer += text.replace(/\r\n?/g, "\n");
    if (buffer.length > STREAM_MAX_BUFFER) throw new Error("an event too large");
    let end;
    while ((end = buffer.indexOf("\n\n", scanned)) >= 0) {
      emitEvent(buffer.slice(0, end), onEvent);
      buffer = buffer.slice(end + 2);
      scanned = 0;
    }
    scanned = Math.max(0, buffer.length - 1);
  }
}

function emitEvent(block, onEvent) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue; // a comment: the keep-alive
    const colon = line.indexOf(":");
    const key = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (key === "event") name = value;
    else if (key === "data") data.push(value);
  }
  if (data.length) onEvent(name, data.join("\n"));
}
