// WEBSMQ for the browser: an ES module served by wireproto at /js/websmq.js (docs/browser.md).
//
//   import { connect } from "/js/websmq.js";
//   const client = connect("ws://127.0.0.1:8765/websmq");
//   client.subscribe("sensors/temp", (message) => console.log(message.topic, message.text()));
//   client.publish("sensors/temp", "21.5");
//   client.setWill("clients/me", "offline");
//
// Every frame is binary: a big-endian u16 header (type in the top 2 bits, topic length in the
// low 14), the topic (ASCII, URL-encoded), then the payload. The client reconnects with a
// growing delay (./socket.js), and sends its subscriptions and its will again on every new
// connection.

import { ReconnectingClient } from "./socket.js";

const PUBLISH = 0, SUBSCRIBE = 1, UNSUBSCRIBE = 2, LAST_WILL = 3;
const MAX_TOPIC_LENGTH = 0x3fff;
const TOPIC = /^(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})+$/;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A topic from any text: each level percent-encoded, the `/` between levels kept. */
export function topicFromText(text) {
  return text.split("/").map(encodeURIComponent).join("/");
}

/** Throws a TypeError for what is not a WEBSMQ topic. */
export function checkTopic(topic) {
  if (typeof topic !== "string" || !TOPIC.test(topic) || topic.length > MAX_TOPIC_LENGTH) {
    throw new TypeError(`not a WEBSMQ topic: ${JSON.stringify(topic)} (use topicFromText)`);
  }
}

function bytesOf(payload) {
  if (payload === undefined || payload === null) return new Uint8Array(0);
  if (payload instanceof Uint8Array) return payload;
  if (payload instanceof ArrayBuffer) return new Uint8Array(payload);
  if (typeof payload === "string") return encoder.encode(payload);
  return encoder.encode(JSON.stringify(payload));
}

export function encodeFrame(type, topic, payload) {
  const name = encoder.encode(topic);
  const body = bytesOf(payload);
  const frame = new Uint8Array(2 + name.length + body.length);
  const header = (type << 14) | name.length;
  frame[0] = header >> 8;
  frame[1] = header & 0xff;
  frame.set(name, 2);
  frame.set(body, 2 + name.length);
  return frame;
}

export function decodeFrame(data) {
  const bytes = new Uint8Array(data);
  if (bytes.length < 2) throw new Error(`WEBSMQ frame of ${bytes.length} byte(s)`);
  const header = (bytes[0] << 8) | bytes[1];
  const length = header & MAX_TOPIC_LENGTH;
  if (bytes.length < 2 + length) throw new Error("WEBSMQ frame shorter than its topic");
  const payload = bytes.subarray(2 + length);
  return {
    type: header >> 14,
    topic: decoder.decode(bytes.subarray(2, 2 + length)),
    payload,
    will: header >> 14 === LAST_WILL,
    text: () => decoder.decode(payload),
    json: () => JSON.parse(decoder.decode(payload)),
  };
}

/** Whether an MQTT-style pattern (`+` one level, a last `#` the rest) matches `topic`. */
export function patternMatches(pattern, topic) {
  const want = pattern.split("/");
  const have = topic.split("/");
  if (topic.startsWith("$") && (want[0] === "#" || want[0] === "+")) return false;
  for (let i = 0; i < want.length; i++) {
    if (want[i] === "#") return true;
    if (i >= have.length || (want[i] !== "+" && want[i] !== have[i])) return false;
  }
  return want.length === have.length;
}

export class WebsmqClient extends ReconnectingClient {
  /**
   * @param {string} url ws:// or wss:// address of a WEBSMQ listener
   * @param {object} [options] reconnect (true), minDelay (0.5 s), maxDelay (30 s),
   *   maxQueue (1000 frames kept while disconnected), protocols (WebSocket subprotocols)
   */
  constructor(url, options = {}) {
    super(url, options);
    this.will = null;
  }

  /** Call `callback(message)` for each publish on `topic` (a pattern, when the broker allows). */
  subscribe(topic, callback) {
    checkTopic(topic);
    if (this._track(topic, callback)) this._sendNow(encodeFrame(SUBSCRIBE, topic));
    return () => this.unsubscribe(topic, callback);
  }

  unsubscribe(topic, callback) {
    if (this._untrack(topic, callback)) this._sendNow(encodeFrame(UNSUBSCRIBE, topic));
  }

  /** Publish `payload` (bytes, text, or a value sent as JSON) on `topic`. */
  publish(topic, payload) {
    checkTopic(topic);
    this._send(encodeFrame(PUBLISH, topic, payload));
  }

  /** What the broker publishes for this client when it disconnects; sent again on reconnect. */
  setWill(topic, payload) {
    checkTopic(topic);
    this.will = encodeFrame(LAST_WILL, topic, payload);
    this._sendNow(this.will);
  }

  _opened(socket) {
    for (const topic of this.subscriptions.keys()) socket.send(encodeFrame(SUBSCRIBE, topic));
    if (this.will) socket.send(this.will);
  }

  _received(data) {
    if (typeof data === "string") return; // WEBSMQ frames are binary
    let message;
    try {
      message = decodeFrame(data);
    } catch (error) {
      this._failed(error);
      return;
    }
    for (const [topic, callbacks] of this.subscriptions) {
      if (topic === message.topic || patternMatches(topic, message.topic)) {
        for (const callback of callbacks) callback(message);
      }
    }
    this.dispatchEvent(new MessageEvent("message", { data: message }));
  }
}

export function connect(url, options) {
  return new WebsmqClient(url, options);
}
