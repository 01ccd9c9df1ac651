// The status page (docs/browser.md): everything it shows comes from the admin API at /api/,
// polled every second, and the tap's stream. Text from the broker goes into the page as text,
// never as markup.

const REFRESH_SECONDS = 1;
const TAPPED_ROWS = 200;
const CREDENTIALS = "wireproto-authorization";

const $ = (selector) => document.querySelector(selector);

function element(tag, text, className) {
  const made = document.createElement(tag);
  if (text !== undefined && text !== null) made.textContent = String(text);
  if (className) made.className = className;
  return made;
}

function headers(extra = {}) {
  const found = { "x-wireproto-page": "1", ...extra };
  const authorization = sessionStorage.getItem(CREDENTIALS);
  if (authorization) found.authorization = authorization;
  return found;
}

class Refused extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, body) {
  const options = body === undefined
    ? { headers: headers() }
    : { method: "POST", headers: headers({ "content-type": "application/json" }),
        body: JSON.stringify(body) };
  const response = await fetch(`/api/${path}`, options);
  const answer = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Refused(response.status, answer.error || response.statusText);
  return answer;
}

function shownPayload(described) {
  for (const kind of ["json", "msgpack", "text", "hex"]) {
    if (kind in described) {
      const value = kind === "json" || kind === "msgpack"
        ? JSON.stringify(described[kind]) : described[kind];
      return [kind, value + (described.truncated ? " …" : "")];
    }
  }
  return ["", ""];
}

function fill(table, rows) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows.map((cells) => {
    const row = element("tr");
    for (const cell of cells) {
      if (cell instanceof Node) {
        const holder = element("td");
        holder.append(cell);
        row.append(holder);
      } else {
        row.append(element("td", cell));
      }
    }
    return row;
  }));
}

function showFigures(broker, sessions) {
  const figures = [
    ["connections", sessions.length],
    ["published", broker.published],
    ["delivered", broker.delivered],
    ["dropped", broker.dropped],
    ["last values", broker.retained],
    ["up", `${Math.round(broker.uptime)} s`],
  ];
  $("#figures").replaceChildren(...figures.map(([name, value]) => {
    const box = element("div", name);
    box.prepend(element("b", value));
    return box;
  }));
}

function closeButton(session) {
  const button = element("button", "close");
  button.type = "button";
  button.dataset.session = session.id;
  button.dataset.node = session.node;
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await api(`sessions/${session.id}/close?node=${encodeURIComponent(session.node)}`, {});
    } catch (error) {
      problem(error.message);
    }
    refresh();
  });
  return button;
}

function show(status) {
  $("#node").textContent = status.nodes.length > 1
    ? `${status.nodes.length} processes: ${status.nodes.join(", ")}` : status.broker.node;
  $("#sessions").classList.toggle("one-process", status.nodes.length === 1);
  showFigures(status.broker, status.sessions);
  fill($("#listeners"), status.listeners.map((l) => [l.protocol, l.transport, l.address]));
  fill($("#links"), status.links.map((l) => [
    `${l.kind} ${l.name}`, l.endpoint, l.kind === "phyllo" ? (l.connected ? "open" : "down") : "",
    l.to_hub ?? "", l.to_device ?? ""]));
  $("#links").hidden = status.links.length === 0;
  $("#session-count").textContent = `(${status.sessions.length})`;
  fill($("#sessions"), status.sessions.map((s) => [
    s.id, s.node, s.protocol, s.transport, s.peer, s.principal ?? "anonymous",
    s.subscriptions.join(" "), s.received, s.sent, s.queued_bytes, closeButton(s)]));
  fill($("#topics"), status.topics.map((t) => {
    const value = element("span", t.last_value ? shownPayload(t.last_value)[1] : "");
    value.className = "value";
    return [t.topic + (t.pattern ? " (pattern)" : ""), t.subscribers, t.rate, value];
  }));
}

function problem(text) {
  $("#problem").textContent = text || "";
  $("#problem").hidden = !text;
}

function askToLogIn(why) {
  $("#broker").hidden = true;
  $("#login").hidden = false;
  $("#login-why").textContent = why;
  $("#logout").hidden = !sessionStorage.getItem(CREDENTIALS);
}

let refreshing = false;

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    show(await api("status"));
    $("#broker").hidden = false;
    $("#login").hidden = true;
    problem("");
  } catch (error) {
    if (error.status === 401) askToLogIn("This broker wants an admin's credentials.");
    else if (error.status === 403) askToLogIn(`Refused: ${error.message}`);
    else problem(`The broker does not answer: ${error.message}`);
  } finally {
    refreshing = false;
  }
}

async function whoami() {
  try {
    const me = await api("whoami");
    $("#who").textContent = `as ${me.name ?? "anonymous"}`;
    $("#logout").hidden = !sessionStorage.getItem(CREDENTIALS);
  } catch {
    $("#who").textContent = "";
  }
}

$("#login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  const token = form.token.value.trim();
  const authorization = token ? `Bearer ${token}`
    : `Basic ${btoa(unescape(encodeURIComponent(`${form.user.value}:${form.password.value}`)))}`;
  sessionStorage.setItem(CREDENTIALS, authorization);
  form.password.value = "";
  form.token.value = "";
  await refresh();
  await whoami();
});

$("#logout").addEventListener("click", () => {
  sessionStorage.removeItem(CREDENTIALS);
  stopTap();
  $("#who").textContent = "";
  askToLogIn("Logged out.");
});

// -- the tap -------------------------------------------------------------------------------------

let tapping = null;

function stopTap() {
  if (tapping) tapping.abort();
  tapping = null;
  $("#untap").disabled = true;
}

function tapped(line) {
  const item = element("li");
  if (line.tap !== undefined) {
    $("#tap-state").textContent = `tapping ${line.tap}`;
    return;
  }
  if (line.skipped !== undefined) {
    item.append(element("em", `${line.skipped} messages skipped: the page could not keep up`));
  } else {
    const [kind, value] = shownPayload(line);
    item.append(element("span", line.topic, "topic"), element("span", kind, "kind"),
      element("code", value));
    if (line.protocol) item.append(element("span", ` (${line.protocol}${line.will ? ", will" : ""})`, "kind"));
  }
  const list = $("#tapped");
  list.prepend(item);
  while (list.children.length > TAPPED_ROWS) list.lastElementChild.remove();
}

async function startTap(pattern) {
  stopTap();
  const controller = new AbortController();
  tapping = controller;
  $("#untap").disabled = false;
  $("#tap-state").textContent = "opening…";
  try {
    const response = await fetch(`/api/tap?pattern=${encodeURIComponent(pattern)}`,
      { headers: headers(), signal: controller.signal });
    if (!response.ok) {
      const answer = await response.json().catch(() => ({}));
      throw new Error(answer.error || response.statusText);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += value;
      const lines = pending.split("\n");
      pending = lines.pop();
      for (const line of lines) if (line) tapped(JSON.parse(line));
    }
    $("#tap-state").textContent = "the tap ended";
  } catch (error) {
    if (error.name !== "AbortError") $("#tap-state").textContent = `tap: ${error.message}`;
    else $("#tap-state").textContent = "stopped";
  } finally {
    if (tapping === controller) stopTap();
  }
}

$("#tap").addEventListener("submit", (event) => {
  event.preventDefault();
  startTap(event.target.pattern.value);
});
$("#untap").addEventListener("click", stopTap);

// -- publish and call ----------------------------------------------------------------------------

$("#publish").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  const encoding = form.encoding.value;
  let payload = form.payload.value;
  try {
    if (encoding === "json") payload = JSON.parse(payload);
    const answer = await api("publish", { topic: form.topic.value, payload, encoding });
    form.result.value = `delivered to ${answer.delivered}`;
  } catch (error) {
    form.result.value = `refused: ${error.message}`;
  }
});

$("#call").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  try {
    const text = form.body.value.trim();
    const request = { protocol: form.protocol.value, name: form.name.value };
    if (text) request.body = JSON.parse(text);
    const answer = await api("call", request);
    form.result.value = `${answer.ok ? "ok" : "failed"}: ${JSON.stringify(answer.body)}`;
  } catch (error) {
    form.result.value = `refused: ${error.message}`;
  }
});

refresh().then(whoami);
setInterval(refresh, REFRESH_SECONDS * 1000);
