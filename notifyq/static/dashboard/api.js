// The API client and the token it sends (kept in this tab's session storage).

import { $ } from "./dom.js";
import { json } from "./format.js";

const TOKEN_KEY = "notifyq.apiToken";

let memoryToken = null; // when sessionStorage is unavailable
export function getToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return memoryToken;
  }
}
export function setToken(token) {
  memoryToken = token;
  try {
    if (token === null) sessionStorage.removeItem(TOKEN_KEY);
    else sessionStorage.setItem(TOKEN_KEY, token);
  } catch {
    /* memoryToken serves */
  }
  $("forget-token").hidden = token === null;
}


/** The app's root: /dashboard is served next to /queues and /jobs (also behind a prefix). */
export const API_BASE = new URL(location.pathname.replace(/\/dashboard\/?$/, "/"), location.origin);

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status; // 0: no answer at all
    this.detail = detail;
  }
}

function detailOf(body) {
  if (!body || body.detail === undefined) return null;
  const d = body.detail;
  if (typeof d === "string") return d;
  if (Array.isArray(d)) {
    return d.map((e) => (e && e.msg ? `${(e.loc || []).join(".")}: ${e.msg}` : json(e))).join("; ");
  }
  return json(d);
}

export async function api(method, path, params, json) {
  const url = new URL(path, API_BASE);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch {
    throw new ApiError(0, "the notifyq API does not answer");
  }
  let body = null;
  try {
    const text = await response.text();
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, detailOf(body) || `HTTP ${response.status}`);
  }
  return body;
}

export const segment = (s) => encodeURIComponent(String(s));
