// The status page (docs/browser.md): everything it shows comes from the admin API at /api/,
// polled every second a page of each list at a time, and the tap's stream. Text from the broker
// goes into the page as text, never as markup.
//
// The modules: api.js (requests and credentials), format.js (numbers, times, payloads),
// table.js (tables updated in place, with filter, sort and pages), charts.js, tap.js, forms.js.

import { Refused, api, credentials, setCredentials } from "./api.js";
import { Charts } from "./charts.js";
import { duration, element, integer, payloadText, rate } from "./format.js";
import { askRoutes, brokerProcesses, setUpForms } from "./forms.js";
import { LiveTable, RowsInPlace } from "./table.js";
import { setUpTap, stopTap } from "./tap.js";

const REFRESH_MS = 1000;
const PAGE_ROWS = 50;
// performance.measure() entries of this name time each update, from the start of a poll to the
// end of drawing it; the page keeps at most UPDATES_KEPT of them.
const UPDATE = "wireproto-update";
const POLL_STARTED = "wireproto-poll";
const UPDATES_KEPT = 1000;

const $ = (selector) => document.querySelector(selector);

let loggedOut = false; // the login form shows: no polling until it is submitted
let showSys = false; // whether topics whose first level starts with $ are listed
let polling = false;
let again = false; // what to ask for changed during a poll: ask again when it ends
let timer = 0;
let historyAsked = false;
// The last history asked for named fewer processes than the status: ask again.
let historyShort = false;
// How many processes each status named over the last minute: a status that names fewer than the
// most answered without some (each is asked for a second at most), so its figures are partial.
const PROCESSES_REMEMBERED_MS = 60_000;
let processCounts = []; // [Date.now(), count], oldest first
let wholeNodes = null; // the processes of the last status that named them all
let wasPartial = false;

const poll = () => {
  again = true;
  if (!polling) refresh();
};

const sessions = new LiveTable("sessions", {
  limit: PAGE_ROWS, sort: "id", empty: "no connections", changed: poll,
  key: (s) => `${s.node} ${s.id}`,
  cells: (s) => [s.id, s.node, s.protocol, s.transport, s.peer, s.principal ?? "anonymous",
    duration(s.age), (s.subscriptions ?? []).join(" "), integer(s.received), integer(s.sent),
    integer(s.queued_bytes), integer(s.dropped)],
  extra: (s, row) => {
    const cell = element("td", null, "action");
    cell.append(closeButton(s));
    row.append(cell);
  },
});

const topics = new LiveTable("topics", {
  limit: PAGE_ROWS, sort: "topic", empty: "no topics", changed: poll,
  key: (t) => t.topic,
  cells: (t) => [t.topic + (t.pattern ? " (pattern)" : ""), integer(t.subscribers), rate(t.rate),
    t.last_value ? lastValue(t.last_value) : ""],
});

const listeners = new RowsInPlace($("#listeners"), {
  key: (l) => `${l.protocol} ${l.transport} ${l.address}`,
  cells: (l) => [l.protocol, l.transport, l.address],
});

const links = new RowsInPlace($("#links"), {
  key: (l) => `${l.node} ${l.kind} ${l.name}`,
  cells: (l) => [`${l.kind} ${l.name}`, l.endpoint,
    l.kind === "phyllo" ? (l.connected ? "open" : "down") : "", integer(l.to_hub),
    integer(l.to_device)],
});

// Each Phyllo link's device: its health, over every time it was opened.
const devices = new RowsInPlace($("#devices"), {
  key: (l) => `${l.node} ${l.name}`,
  cells: (l) => [l.name, l.port ?? "", l.connected ? "yes" : "no", integer(l.frames),
    integer(l.bytes_received), integer(l.bytes_sent), integer(l.crc_errors), integer(l.resyncs),
    integer(l.reopens), lastFrame(l.last_frame_age)],
});

const charts = new Charts();

// How long ago a device's last frame came, as the broker counted it: "3 s ago", or "never".
function lastFrame(age) {
  return typeof age === "number" ? `${duration(age)} ago` : "never";
}

// A last value as it was sent when it is text (as the tap shows it); bytes that are msgpack
// decoded, since their hex says little; other bytes as hex.
function lastValue(described) {
  if ("msgpack" in described && !("text" in described)) {
    return JSON.stringify(described.msgpack) + (described.truncated ? " …" : "");
  }
  return payloadText(described)[1];
}

function closeButton(session) {
  const button = element("button", "close");
  button.type = "button";
  button.dataset.session = session.id;
  button.dataset.node = session.node;
  button.addEventListener("click", async () => {
    const who = [session.protocol, session.peer, session.principal].filter(Boolean).join(", ");
    if (!window.confirm(`Close connection ${session.id} (${who})? Its will is published.`)) return;
    button.disabled = true;
    try {
      await api(`sessions/${session.id}/close?node=${encodeURIComponent(session.node)}`, {});
    } catch (error) {
      problem(error.message);
      button.disabled = false;
    }
    poll();
  });
  return button;
}

// -- what a poll shows ---------------------------------------------------------------------------

const figures = new Map();

function showFigures(values) {
  for (const [name, value] of values) {
    let box = figures.get(name);
    if (box === undefined) {
      box = element("div", name);
      box.prepend(element("b"));
      $("#figures").append(box);
      figures.set(name, box);
    }
    if (box.firstChild.textContent !== value) box.firstChild.textContent = value;
  }
}

function setText(selector, text) {
  const found = $(selector);
  if (found.textContent !== text) found.textContent = text;
}

function statusQuery() {
  const query = new URLSearchParams({ limit: String(PAGE_ROWS) });
  for (const [name, table] of [["sessions", sessions], ["topics", topics]]) {
    for (const [key, value] of Object.entries(table.parameters())) {
      if (key !== "limit") query.set(`${name}.${key}`, String(value));
    }
  }
  query.set("topics.sys", showSys ? "1" : "0");
  return query.toString();
}

// Shows a status; false when a list's offset had to move (its rows are gone): ask again.
function show(status) {
  const pages = status.pages ?? {};
  const broker = status.broker;
  setText("#version", broker.version ?? "");
  setText("#node", status.nodes.length > 1
    ? `${status.nodes.length} processes: ${status.nodes.join(", ")}` : broker.node);
  $("#sessions").classList.toggle("one-process", status.nodes.length === 1);
  brokerProcesses(status.nodes.length);
  const moved = sessions.showPage(status.sessions, pages.sessions);
  const movedTopics = topics.showPage(status.topics, pages.topics);
  const connections = pages.sessions?.total ?? status.sessions.length;
  showFigures([
    ["connections", integer(connections)],
    ["published", integer(broker.published)],
    ["delivered", integer(broker.delivered)],
    ["dropped", integer(broker.dropped)],
    ["last values", integer(broker.retained)],
    ["up", duration(broker.uptime)],
  ]);
  listeners.show(status.listeners);
  links.show(status.links);
  $("#links").hidden = status.links.length === 0;
  const phyllo = status.links.filter((l) => l.kind === "phyllo");
  devices.show(phyllo);
  $("#devices-section").hidden = phyllo.length === 0;
  showSysToggle(pages.topics?.sys);
  if (!partialFigures(status.nodes)) charts.poll(status, connections);
  charts.draw();
  return !(moved || movedTopics);
}

// Says when the status left a process out, and keeps its figures off the charts: they would
// show a dip that /api/history, which sums every process's own seconds, does not have. When the
// processes are whole again (or others), the charts are drawn again from /api/history.
function partialFigures(nodes) {
  const now = Date.now();
  processCounts = processCounts.filter(([at]) => now - at < PROCESSES_REMEMBERED_MS);
  processCounts.push([now, nodes.length]);
  const expected = Math.max(...processCounts.map(([, count]) => count));
  const partial = nodes.length < expected;
  setText("#partial", partial
    ? `${nodes.length} of ${expected} processes answered: the figures are partial` : "");
  $("#partial").hidden = !partial;
  if (!partial) {
    const names = nodes.join(" ");
    if (wasPartial || historyShort || (wholeNodes !== null && names !== wholeNodes)) {
      askHistory(nodes.length);
    }
    wholeNodes = names;
  }
  wasPartial = partial;
  return partial;
}

function showSysToggle(folded) {
  const button = $("#show-sys");
  button.hidden = !showSys && !(folded > 0);
  setText("#show-sys", showSys ? "hide $ topics" : `show ${integer(folded)} $ topics`);
  button.setAttribute("aria-pressed", String(showSys));
}

function problem(text) {
  $("#problem").textContent = text || "";
  $("#problem").hidden = !text;
}

function askToLogIn(why) {
  loggedOut = true;
  clearTimeout(timer);
  stopTap();
  $("#broker").hidden = true;
  $("#login").hidden = false;
  $("#login-why").textContent = why;
  $("#logout").hidden = !credentials();
}

function loggedIn() {
  const first = !$("#login").hidden || $("#broker").hidden;
  $("#broker").hidden = false;
  $("#login").hidden = true;
  if (first) {
    whoami();
    askRoutes();
  }
  if (!historyAsked) {
    historyAsked = true;
    askHistory();
  }
}

// The charts drawn again from /api/history, once it sums `expected` processes: a history that
// left one out (it did not answer in time) would draw the very dip the page keeps off them, so
// it is asked again at the next poll.
function askHistory(expected = 1) {
  historyShort = false;
  api("history").then((answer) => {
    if ((answer.nodes?.length ?? expected) < expected) {
      historyShort = true;
      return;
    }
    charts.history(answer);
    charts.draw();
  }, () => {}); // a broker without /api/history: the charts start now
}

function measured() {
  performance.measure(UPDATE, POLL_STARTED);
  if (performance.getEntriesByName(UPDATE).length > UPDATES_KEPT) {
    performance.clearMeasures(UPDATE);
  }
}

async function refresh() {
  if (loggedOut || polling) return;
  clearTimeout(timer);
  polling = true;
  again = false;
  const started = performance.now();
  performance.clearMarks(POLL_STARTED);
  performance.mark(POLL_STARTED);
  try {
    const status = await api(`status?${statusQuery()}`);
    if (!again && !loggedOut) {
      loggedIn();
      problem("");
      if (show(status)) measured();
      else again = true;
    }
  } catch (error) {
    if (error instanceof Refused && (error.status === 401 || error.status === 403)) {
      askToLogIn(credentials() ? `refused: ${error.message}`
        : "This broker wants an admin's credentials.");
    } else if (error instanceof Refused) {
      problem(`The broker refused: ${error.message}`);
    } else {
      problem(`The broker does not answer: ${error.message}`);
    }
  } finally {
    polling = false;
  }
  if (loggedOut) return;
  // A page nobody looks at asks nothing; it asks again when it is looked at.
  if (document.hidden) return;
  timer = setTimeout(refresh, again ? 0 : Math.max(0, REFRESH_MS - (performance.now() - started)));
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && !loggedOut) {
    historyAsked = false; // the charts missed what happened meanwhile
    refresh();
  }
});

async function whoami() {
  try {
    const me = await api("whoami");
    $("#who").textContent = `as ${me.name ?? "anonymous"}`;
    $("#logout").hidden = !credentials();
  } catch {
    $("#who").textContent = "";
  }
}

$("#login").addEventListener("submit", (event) => {
  event.preventDefault();
  const form = event.target;
  const token = form.token.value.trim();
  const authorization = token ? `Bearer ${token}`
    : `Basic ${btoa(unescape(encodeURIComponent(`${form.user.value}:${form.password.value}`)))}`;
  setCredentials(authorization);
  form.password.value = "";
  form.token.value = "";
  $("#login-why").textContent = "logging in…";
  loggedOut = false;
  refresh();
});

$("#logout").addEventListener("click", () => {
  setCredentials(null);
  $("#who").textContent = "";
  askToLogIn("Logged out.");
});

$("#show-sys").addEventListener("click", () => {
  showSys = !showSys;
  topics.offset = 0;
  poll();
});

setUpTap();
setUpForms();
refresh();
