// The page's events: how a module asks for what a module above it does (a refresh, to open a
// job) without importing it, so that the imports go one way only, down to the helpers. Only
// main.js, on top, says who answers each event, before anything runs.

const handlers = new Map();

/** Makes fn the answer to the event name (one answer each: main.js wires them once). */
export function on(name, fn) {
  if (handlers.has(name)) throw new Error(`the event ${name} is answered twice`);
  handlers.set(name, fn);
}

/** Calls the answer to the event name now, with args; an event nobody answers is a bug. */
export function emit(name, ...args) {
  const fn = handlers.get(name);
  if (!fn) throw new Error(`nobody answers the event ${name}`);
  fn(...args);
}
