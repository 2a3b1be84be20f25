// Messages to the user: toasts, failed actions and the confirm dialog.

import { $, h, setText } from "./dom.js";
import { needToken, trouble } from "./conn.js";

export function toast(text, kind) {
  const item = h("div", { class: kind || "", text });
  $("toast").append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

export function actionFailed(err, what) {
  if (err.status === 401 || err.status === 403) return needToken(err);
  if (err.status === 503 || err.status === 0) trouble([err]);
  toast(`${what}: ${err.detail || err.message}`, "error");
}

/** Asks with the page's own dialog; answers true for yes. */
export function confirmDialog(title, text, detail, yes) {
  const dialog = $("confirm");
  setText($("confirm-title"), title);
  setText($("confirm-text"), text);
  setText($("confirm-filter"), detail);
  setText($("confirm-yes"), yes);
  return new Promise((resolve) => {
    const done = (answer) => {
      $("confirm-yes").removeEventListener("click", onYes);
      $("confirm-no").removeEventListener("click", onNo);
      dialog.removeEventListener("cancel", onNo);
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    const onYes = () => done(true);
    const onNo = (event) => {
      if (event) event.preventDefault();
      done(false);
    };
    $("confirm-yes").addEventListener("click", onYes);
    $("confirm-no").addEventListener("click", onNo);
    dialog.addEventListener("cancel", onNo);
    dialog.showModal();
    $("confirm-no").focus();
  });
}
