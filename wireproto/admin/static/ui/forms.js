// The Publish and Call forms. The Call form's name field offers what the broker answers
// (/api/routes): the UBRE request names or the nydus paths, for the protocol chosen. In a
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

function offerRoutes() {
  const protocol = $("#call").protocol.value;
  const names = Array.isArray(routes?.[protocol]) ? routes[protocol] : [];
  $("#call-names").replaceChildren(...names.map((name) => {
    const option = element("option");
    option.value = String(name);
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
