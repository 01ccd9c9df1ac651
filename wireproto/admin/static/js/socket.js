// What wireproto's browser clients share (served at /js/socket.js): a WebSocket that reconnects
// with a growing delay (minDelay doubling up to maxDelay seconds, with jitter), and a bounded
// queue for what is sent while it is away, and the callbacks of each subscribed topic. A
// client subclasses it: `_opened(socket)` sends what
// every new connection needs again (subscriptions, a will), `_received(data)` takes each
// message.

export class ReconnectingClient extends EventTarget {
  constructor(url, options, defaults = {}) {
    super();
    this.url = url;
    this.options = { reconnect: true, minDelay: 0.5, maxDelay: 30, maxQueue: 1000, ...defaults,
      ...options };
    this.queue = [];
    this.subscriptions = new Map(); // topic -> Set of callbacks
    this.socket = null;
    this.closed = false;
    this.attempts = 0;
    // After the subclass's constructor has set its own fields.
    queueMicrotask(() => this._open());
  }

  get connected() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  /** Resolves once connected (at once if it is). */
  ready() {
    if (this.connected) return Promise.resolve(this);
    return new Promise((resolve) =>
      this.addEventListener("open", () => resolve(this), { once: true }));
  }

  /** Close for good: no reconnection. */
  close() {
    this.closed = true;
    clearTimeout(this._timer);
    if (this.socket) this.socket.close(1000);
  }

  _open() {
    if (this.closed) return;
    const socket = new WebSocket(this.url, this.options.protocols);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    socket.onopen = () => {
      this.attempts = 0;
      this._opened(socket);
      const queued = this.queue;
      this.queue = [];
      for (const data of queued) socket.send(data);
      this.dispatchEvent(new Event("open"));
    };
    socket.onmessage = (event) => this._received(event.data);
    socket.onclose = (event) => {
      this.socket = null;
      this.dispatchEvent(new CloseEvent("close", { code: event.code, reason: event.reason }));
      if (!this.closed && this.options.reconnect) this._retry();
    };
  }

  _retry() {
    const { minDelay, maxDelay } = this.options;
    const delay = Math.min(maxDelay, minDelay * 2 ** this.attempts++) * (0.5 + Math.random() / 2);
    this._timer = setTimeout(() => this._open(), delay * 1000);
  }

  /** Add `callback` to `topic`'s; true if the topic is new (its subscribe is to be sent). */
  _track(topic, callback) {
    let callbacks = this.subscriptions.get(topic);
    const added = !callbacks;
    if (added) {
      callbacks = new Set();
      this.subscriptions.set(topic, callbacks);
    }
    if (callback) callbacks.add(callback);
    return added;
  }

  /** Take `callback` (all, without one) from `topic`'s; true if none is left (unsubscribe). */
  _untrack(topic, callback) {
    const callbacks = this.subscriptions.get(topic);
    if (!callbacks) return false;
    if (callback) callbacks.delete(callback);
    if (callback && callbacks.size) return false;
    this.subscriptions.delete(topic);
    return true;
  }

  _opened(socket) {}

  _received(data) {}

  _failed(error) {
    this.dispatchEvent(new ErrorEvent("error", { error, message: error.message }));
  }

  /** Send now if connected; otherwise nothing (what `_opened` sends again). */
  _sendNow(data) {
    if (this.connected) this.socket.send(data);
  }

  /** Send now if connected, else queue it for the next connection (a bounded queue). */
  _send(data) {
    if (this.connected) {
      this.socket.send(data);
    } else if (this.queue.length < this.options.maxQueue) {
      this.queue.push(data);
    } else {
      throw new Error(`not connected, and ${this.options.maxQueue} messages wait already`);
    }
  }
}
