// The Publish and Call forms. The Call form's name field offers what the broker answers
// (/api/routes): the UBRE request names or the nydus paths, for the protocol chosen.

import { api } from "./api.js";
import { element } from "./format.js";

// /api/routes is asked again at most this often (handlers come and go with their clients).
const ROUTES_MAX_AGE_MS = 10_000;

const $ = (selector) => document.querySelector(selector);

let routes = null;
let asked = 0;

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
  $("#call").protocol.addEventListener("change", offerRoutes);
  $("#call").name.addEventListener("focus", askRoutes);
}
