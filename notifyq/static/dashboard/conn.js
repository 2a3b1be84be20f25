// The connection's state: live, the banner while the API or the database is away, and the
// token prompt. The poll reports here, and so does any view whose request failed.

import { ApiError, getToken } from "./api.js";
import { $, setText } from "./dom.js";
import { fmtDuration } from "./format.js";
import { state } from "./state.js";
import { stopStream } from "./stream.js";

export function connected() {
  state.lastOk = Date.now();
  $("banner").hidden = true;
  document.body.classList.remove("stale");
  $("app").hidden = false;
  $("auth").hidden = true;
  setConn("live", "live");
}

/** Routes poll failures: 401/403 ask for a token, 503 and no answer show a banner. */
export function trouble(errors) {
  const auth = errors.find((e) => e.status === 401 || e.status === 403);
  if (auth) return needToken(auth);
  const db = errors.find((e) => e.status === 503);
  const net = errors.find((e) => e.status === 0);
  const since = state.lastOk ? ` Showing data from ${fmtDuration((Date.now() - state.lastOk) / 1000)} ago.` : "";
  const banner = $("banner");
  if (db || net) {
    banner.dataset.kind = db ? "database" : "network";
    banner.textContent = db
      ? `Database unavailable: ${db.detail}.${since} Retrying every few seconds…`
      : `Cannot reach the notifyq API.${since} Retrying every few seconds…`;
    banner.hidden = false;
    document.body.classList.add("stale");
    setConn("down", db ? "database unavailable" : "offline");
    return;
  }
  // Anything else (a 422 of a filter, a 500) is shown where it happened; polling goes on.
  connected();
  for (const e of errors) if (!(e instanceof ApiError)) console.error(e);
}

function setConn(kind, text) {
  $("conn").dataset.state = kind;
  setText($("conn-text"), text);
}

export function needToken(err) {
  state.authNeeded = true;
  clearTimeout(state.timer);
  stopStream();
  if (state.wf) {
    clearTimeout(state.wf.timer);
    state.wf.timer = null;
  }
  const had = getToken();
  $("app").hidden = true;
  $("banner").hidden = true;
  $("auth").hidden = false;
  const message = $("auth-message");
  if (err.status === 403 && had) {
    message.className = "auth-error";
    message.textContent = `The API refused this token (${err.detail}). Enter the right one.`;
  } else {
    message.className = "";
    message.textContent = "This notifyq API requires a token (its NOTIFYQ_API_TOKEN).";
  }
  setConn("down", "token needed");
  const input = $("token-input");
  input.value = "";
  input.focus();
}
