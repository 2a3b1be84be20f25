// Building DOM safely: every value reaches the page as a text node or an attribute value,
// never as HTML.

const REFUSED_PROPS = /^(on|style$|innerhtml$|outerhtml$|srcdoc$|href$|src$|action$|formaction$)/i;

export const $ = (id) => document.getElementById(id);

/** An element; props are attributes (values only), "class", "text" or "data". */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (REFUSED_PROPS.test(key)) throw new Error(`h(): refusing to set ${key}`);
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = String(value);
    else if (key === "data") {
      for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v);
    } else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An SVG element; attrs are attribute values only (names are the dashboard's own). */
export function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (REFUSED_PROPS.test(key)) throw new Error(`svg(): refusing to set ${key}`);
    el.setAttribute(key, String(value));
  }
  return el;
}

/** Sets an element's text (and data-value) only when it changed. */
export function setText(el, text, value) {
  const s = String(text);
  if (el.textContent !== s) el.textContent = s;
  if (value !== undefined && el.dataset.value !== String(value)) el.dataset.value = String(value);
}
