// The Publish and Call forms. The Call form's name field offers what the broker answers
// (/api/routes): the UBRE request names or the nydus routes, for the protocol chosen. A nydus
// route is a pattern, not a path (docs/nydus.md): the form offers it labelled as such and does
// not call a parameter's own name (`:room`) or a splat (`*`) as if it were a value. In a
// cluster, a publish reaches every process, but the count of deliveries the answer gives is the
// answering process's: the result says so.

import { api } from "./api.js";
import { element, integer } from "./format.js";

// /api/routes is asked again at most this often (handlers come and go with their clients).
const ROUTES_MAX_AGE_MS = 10_000;

const $ = (selector) => document.querySelector(selector);

let routes = null;
let asked = 0;
let processes = 1; // the broker's processes, as its last status said

// The broker's processes, from each status.
export function brokerProcesses(count) {
  processes = count;
}

// " on this process" where a count of deliveries is only the answering process's: the answer's
// `processes` (a count or a list) when it has one, else the last status's.
function onThisProcess(answer) {
  const told = answer?.processes;
  const count = Array.isArray(told) ? told.length : Number.isFinite(told) ? told : processes;
  return count > 1 ? " on this process" : "";
}

// ruta3's tokens in a nydus route: a `:name` parameter (maybe `(regex)` and `?` after it) or a
// `*` splat.
const TOKENS = /(\/)?(\.)?:(\w+)(?:(\(.*?\)))?(\?)?|\*/g;
// What, outside its tokens, makes a route a regular expression rather than a path.
const REGEX = /[+?$^[\]{}()|\\]/;

function offered() {
  const protocol = $("#call").protocol.value;
  return Array.isArray(routes?.[protocol]) ? routes[protocol].map(String) : [];
}

// The placeholders of a nydus route, as a reader fills them in: ":room", "*".
function placeholders(route) {
  return [...route.matchAll(TOKENS)].map((token) => (token[0] === "*" ? "*" : `:${token[3]}`));
}

function isRegex(route) {
  return REGEX.test(route.replace(TOKENS, ""));
}

function describe(route) {
  const holes = [...new Set(placeholders(route))];
  if (holes.length) return `template: replace ${holes.join(" and ")}`;
  return isRegex(route) ? "pattern: write a path it matches" : "";
}

// Why a nydus name is not to be sent as it is, or "": it still holds a placeholder of an offered
// route, or it is an offered route written as a regular expression (sent when submitted again).
let held = null;
function unready(name) {
  const routes = offered();
  for (const hole of new Set(routes.flatMap(placeholders))) {
    const holds = hole === "*" ? name.includes("*")
      : new RegExp(`${hole}(?!\\w)`).test(name);
    if (holds) return `replace ${hole} in ${name}: it is the route's template, not a value`;
  }
  if (routes.includes(name) && isRegex(name) && held !== name) {
    held = name;
    return `${name} is a route written as a regular expression: write a path it matches ` +
      "(or call again to send it as it is)";
  }
  return "";
}

function offerRoutes() {
  const nydus = $("#call").protocol.value === "nydus";
  $("#call-names").replaceChildren(...offered().map((name) => {
    const option = element("option");
    option.value = name;
    const label = nydus ? describe(name) : "";
    if (label) option.label = label;
    return option;
  }));
}

export async function askRoutes() {
  if (Date.now() - asked < ROUTES_MAX_AGE_MS) return;
  asked = Date.now();
  try {
    routes = await api("routes");
  } catch {
    routes = null; // a broker without /api/routes: the field takes any name
  }
  offerRoutes();
}

export function setUpForms() {
  $("#publish").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const encoding = form.encoding.value;
    let payload = form.payload.value;
    try {
      if (encoding === "json") payload = JSON.parse(payload);
      const answer = await api("publish", { topic: form.topic.value, payload, encoding });
      form.result.value = `delivered to ${integer(answer.delivered)}${onThisProcess(answer)}`;
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
      const why = request.protocol === "nydus" ? unready(request.name) : "";
      if (why) {
        form.result.value = `not sent: ${why}`;
        return;
      }
      held = null;
      if (text) request.body = JSON.parse(text);
      const answer = await api("call", request);
      // The hub's own /_hub/publish counts its deliveries as /api/publish does.
      const counted = request.protocol === "nydus" && request.name === "/_hub/publish" &&
        answer.ok && Number.isFinite(answer.body?.delivered);
      const where = counted ? onThisProcess(answer) : "";
      form.result.value = `${answer.ok ? "ok" : "failed"}: ${JSON.stringify(answer.body)}` +
        (where ? ` (delivered${where})` : "");
    } catch (error) {
      form.result.value = `refused: ${error.message}`;
    }
  });
  $("#call").protocol.addEventListener("change", offerRoutes);
  $("#call").name.addEventListener("focus", askRoutes);
}
