// The tap: the messages on the topics a pattern matches, as they pass through the hub, each with
// its time, topic, protocol and payload as sent (text, else hex). The page keeps the last 500
// lines; paused, it goes on reading and keeps what comes (up to 500) for when it resumes. What
// does not fit (more in one frame than it keeps, or while paused) is counted and said.

import { headers } from "./api.js";
import { clipped, clock, element, integer, payloadText } from "./format.js";

export const TAP_LINES = 500;

const $ = (selector) => document.querySelector(selector);

let tapping = null; // the open tap's AbortController
let waiting = []; // lines read and not yet shown, oldest first
let dropped = 0; // lines that did not fit in `waiting`, never shown
let droppedPaused = false; // some of them while paused
let paused = false;
let drawing = 0; // the animation frame that will show `waiting`

function lineItem(line) {
  const item = element("li");
  if (line.dropped !== undefined) {
    item.append(element("em", line.paused
      ? `${integer(line.dropped)} messages dropped while paused (the page keeps ${TAP_LINES})`
      : `${integer(line.dropped)} messages not shown: more came at once than the page keeps ` +
        `(${TAP_LINES})`));
    return item;
  }
  if (line.skipped !== undefined) {
    item.append(element("em", `${integer(line.skipped)} messages skipped: the page could not ` +
      "keep up"));
    return item;
  }
  const seconds = Number.isFinite(line.time) ? line.time : line.received;
  const topic = clipped(line.topic);
  const name = element("span", topic.text, "topic");
  if (topic.title) name.title = topic.title;
  item.append(element("time", clock(seconds)), name);
  const [kind, value] = payloadText(line);
  const about = [line.protocol ?? "", line.will ? "will" : "", kind,
    Number.isFinite(line.size) ? `${integer(line.size)} B` : ""].filter(Boolean).join(", ");
  item.append(element("span", about, "kind"), element("code", value));
  return item;
}

function showWaiting() {
  drawing = 0;
  const list = $("#tapped");
  if (!paused && waiting.length) {
    if (dropped && waiting.length >= TAP_LINES) {
      // The note of what was dropped takes the oldest line's place, so that it is seen.
      const over = waiting.length - (TAP_LINES - 1);
      waiting.splice(0, over);
      dropped += over;
    }
    const items = [];
    if (dropped) items.push(lineItem({ dropped, paused: droppedPaused }));
    for (const line of waiting) items.push(lineItem(line));
    // Newest first, so a reader's place does not move while lines come in below the top.
    list.prepend(...items.reverse().slice(0, TAP_LINES));
    while (list.children.length > TAP_LINES) list.lastElementChild.remove();
    waiting = [];
    dropped = 0;
    droppedPaused = false;
  }
  $("#tap-waiting").textContent = !paused ? ""
    : `${integer(waiting.length)} waiting${dropped ? `, ${integer(dropped)} dropped` : ""}`;
}

function received(line) {
  if (line.tap !== undefined) {
    $("#tap-state").textContent = `tapping ${line.tap}`;
    return;
  }
  line.received = Date.now() / 1000;
  waiting.push(line);
  if (waiting.length > TAP_LINES) {
    // More than the page keeps came since the last frame (or while paused): the oldest go,
    // counted, and the note of them is shown with the rest.
    const over = waiting.length - TAP_LINES;
    waiting.splice(0, over);
    dropped += over;
    if (paused) droppedPaused = true;
  }
  // Shown once a frame, however many lines come in between.
  if (!drawing) drawing = requestAnimationFrame(showWaiting);
}

export function stopTap() {
  if (tapping) tapping.abort();
  tapping = null;
  $("#untap").disabled = true;
  // Paused, what was kept can still be shown.
  $("#tap-pause").disabled = !paused;
}

function setPaused(pause) {
  paused = pause;
  const button = $("#tap-pause");
  button.textContent = pause ? "resume" : "pause";
  button.setAttribute("aria-pressed", String(pause));
  showWaiting();
}

async function startTap(pattern) {
  stopTap();
  const controller = new AbortController();
  tapping = controller;
  $("#untap").disabled = false;
  $("#tap-pause").disabled = false;
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
      for (const line of lines) if (line) received(JSON.parse(line));
    }
    $("#tap-state").textContent = "the tap ended";
  } catch (error) {
    $("#tap-state").textContent = error.name === "AbortError" ? "stopped" : `tap: ${error.message}`;
  } finally {
    if (tapping === controller) stopTap();
  }
}

export function setUpTap() {
  $("#tap").addEventListener("submit", (event) => {
    event.preventDefault();
    startTap(event.target.pattern.value);
  });
  $("#untap").addEventListener("click", stopTap);
  $("#tap-pause").addEventListener("click", () => setPaused(!paused));
}
