// The page's state, one object that every view reads and writes, and the poll's pace.

export const POLL_MS = 1500;
export const HIDDEN_POLL_MS = 5000;
export const PAGE_SIZE = 50;
export const MAX_LIVE_ROWS = 500; // GET /jobs answers at most 500 a page

export const state = {
  authNeeded: false,
  timer: null,
  ticks: 0,
  lastOk: null, // Date.now() of the last complete poll
  queues: [],
  samples: [], // {t, completed|null, lastMinute, failedLastMinute}
  filters: { status: "", queue: "", task: "", group: "", payload: "" },
  view: "jobs", // or one of VIEWS (router.js)
  sched: { filters: { queue: "", task: "" }, jobs: [], nextCursor: null, gen: 0, loaded: false, skew: 0 },
  cron: null, // GET /periodic, while the cron page is shown
  queueStates: new Map(), // queue -> GET /queues/states row
  workers: null, // GET /workers, while the workers page is shown
  bulkBusy: false,
  jobs: [],
  nextCursor: null,
  listGen: 0, // bumps on every filter change; stale answers are dropped
  listLoaded: false,
  selectedId: null,
  selectedJob: null,
  selectedMissing: false,
  detailJson: null,
  stream: null, // {id, controller, live}: the selected job's event stream, while it runs
  streamRetryAt: 0,
  wf: null, // the open workflow view: {id, data, missing, timer, busy, done, layoutKey, nodes}
  zoom: 1,
};
