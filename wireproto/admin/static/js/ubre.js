// UBRE for the browser: an ES module served by wireproto at /js/ubre.js (docs/browser.md).
//
//   import { connect } from "/js/ubre.js";
//   const client = connect("ws://127.0.0.1:8765/ubre");
//   client.subscribe("news", (body, topic) => console.log(topic, body));
//   client.publish("news", { title: "hello" });
//   const sum = await client.request("add", [1, 2], { timeout: 5 });
//
// It speaks UBRE's JSON format in text frames, as ubre.js does: {"subscribe": topic},
// {"publish": topic, "body": ...}, {"request": name, "id": n, "body": ...}, answered by
// {"success": n, "body": ...} or {"fail": n, "body": ...}. A publish whose payload is not UTF-8
// comes in UBRE's binary format instead, and its body is a Uint8Array. The client reconnects
// with a growing delay (./socket.js) and subscribes again; publishes and requests made while it is away wait
// in a bounded queue, and every request fails after its timeout either way.

import { ReconnectingClient } from "./socket.js";

const TYPES = { 0x53: "subscribe", 0x50: "publish", 0x55: "unsubscribe", 0x52: "request",
  0x73: "success", 0x66: "fail", 0x63: "fail" };
const decoder = new TextDecoder();

/** A request that failed: `body` is the fail body ("NotFound", "Timeout", a handler's value). */
export class RequestFailed extends Error {
  constructor(name, body) {
    super(`UBRE request ${JSON.stringify(name)} failed: ${JSON.stringify(body)}`);
    this.name = "RequestFailed";
    this.body = body;
  }
}

/** A binary-format message: type u8, name length u16, body length u32 (big-endian), name, body. */
export function decodeBinary(data) {
  const bytes = new Uint8Array(data);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 7) throw new Error(`UBRE binary message of ${bytes.length} bytes`);
  const type = TYPES[bytes[0]];
  if (!type) throw new Error(`UBRE binary message of unknown type 0x${bytes[0].toString(16)}`);
  const nameLength = view.getUint16(1);
  const bodyLength = view.getUint32(3);
  const name = decoder.decode(bytes.subarray(7, 7 + nameLength));
  const end = bodyLength === 0xffffffff ? bytes.length : 7 + nameLength + bodyLength;
  const message = { [type]: name };
  if (bodyLength) message.body = bytes.slice(7 + nameLength, end);
  return message;
}

export class UbreClient extends ReconnectingClient {
  /**
   * @param {string} url ws:// or wss:// address of a UBRE listener
   * @param {object} [options] reconnect (true), minDelay (0.5 s), maxDelay (30 s),
   *   timeout (a request's default, 30 s), maxQueue (1000 messages kept while disconnected)
   */
  constructor(url, options = {}) {
    super(url, options, { timeout: 30 });
    this.handlers = new Map(); // requests from the broker, by name
    this.pending = new Map(); // id -> {name, resolve, reject, timer}
    this.nextId = 1;
  }

  /** Call `callback(body, topic)` for each publish on `topic`; returns what cancels it. */
  subscribe(topic, callback) {
    if (this._track(topic, callback)) this._sendNow(JSON.stringify({ subscribe: topic }));
    return () => this.unsubscribe(topic, callback);
  }

  unsubscribe(topic, callback) {
    if (this._untrack(topic, callback)) this._sendNow(JSON.stringify({ unsubscribe: topic }));
  }

  /** Publish `body` (any JSON value; none when undefined) on `topic`. */
  publish(topic, body) {
    this._send(JSON.stringify(body === undefined ? { publish: topic } : { publish: topic, body }));
  }

  /** Resolves with the success body, or rejects with RequestFailed (its fail body, or
   * "Timeout" after `timeout` seconds, or "Closed" when the client is closed). */
  request(name, body, { timeout = this.options.timeout } = {}) {
    const id = this.nextId++;
    const text = JSON.stringify(
      body === undefined ? { request: name, id } : { request: name, id, body });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        this.queue = this.queue.filter((queued) => queued !== text);
        reject(new RequestFailed(name, "Timeout"));
      }, timeout * 1000);
      this.pending.set(id, { name, resolve, reject, timer });
      try {
        this._send(text);
      } catch (error) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject(error);
      }
    });
  }

  /** Answer the broker's requests for `name` with `handler(body)` (a value or a promise). */
  handle(name, handler) {
    this.handlers.set(name, handler);
  }

  close() {
    for (const [id, { name, reject, timer }] of this.pending) {
      clearTimeout(timer);
      reject(new RequestFailed(name, "Closed"));
      this.pending.delete(id);
    }
    super.close();
  }

  _opened(socket) {
    for (const topic of this.subscriptions.keys()) socket.send(JSON.stringify({ subscribe: topic }));
  }

  _received(data) {
    let message;
    try {
      message = typeof data === "string" ? JSON.parse(data) : decodeBinary(data);
    } catch (error) {
      this._failed(error);
      return;
    }
    if ("publish" in message) {
      const callbacks = this.subscriptions.get(message.publish);
      if (callbacks) for (const callback of callbacks) callback(message.body, message.publish);
    } else if ("success" in message || "fail" in message) {
      const id = "success" in message ? message.success : message.fail;
      const waiting = this.pending.get(id) ?? this.pending.get(Number(id));
      if (!waiting) return;
      this.pending.delete(id);
      this.pending.delete(Number(id));
      clearTimeout(waiting.timer);
      if ("success" in message) waiting.resolve(message.body);
      else waiting.reject(new RequestFailed(waiting.name, message.body));
    } else if ("request" in message) {
      this._answer(message);
    }
    this.dispatchEvent(new MessageEvent("message", { data: message }));
  }

  async _answer({ request, id, body }) {
    const handler = this.handlers.get(request);
    const key = id === undefined ? request : id;
    if (!handler) {
      this._sendNow(JSON.stringify({ fail: key, body: "NotFound" }));
      return;
    }
    try {
      this._sendNow(JSON.stringify({ success: key, body: await handler(body) }));
    } catch (error) {
      this._sendNow(JSON.stringify(
        { fail: key, body: error instanceof Error ? error.message : error }));
    }
  }
}

export function connect(url, options) {
  return new UbreClient(url, options);
}
