// The real, unmodified ubre.js client (npm `ubre` 0.0.23) through its own WebSocket wrapper,
// `Ubre.ws(socket)`, on `ws` 7: that wrapper reads a text message as a string, which ws 8 no
// longer gives. It is a child process of tests/protocols/test_ubre_interop.py.
//
//   node ubre_ws_client.js ws://127.0.0.1:PORT/ubre [COMMAND...]
//
// stdin, one command per line (JSON is the rest of the line, and may be left out):
//   sub TOPIC [JSON]         subscribe, with JSON as the subscribe's body if given
//   unsub TOPIC              unsubscribe
//   pub TOPIC [JSON]         publish (ubre.js sends it only if its peer subscribed to TOPIC)
//   req NAME [JSON]          request; the reply is printed as a success or fail event
//   handle NAME              answer NAME with {"handled": body}
//   handle-async NAME        answer NAME with {"handled": body} from a promise, a little later
//   handle-throw NAME        answer NAME by throwing a TypeError
//   close                    close the WebSocket
// stdout, one JSON object per line:
//   {"event":"open"} | {"event":"close","code":..}
//   {"event":"publish","topic":..,"body":..}
//   {"event":"success"|"fail","request":NAME,"body":..}
//   {"event":"handling","request":NAME,"body":..}
//   {"event":"peer-subscribe"|"peer-unsubscribe","topic":..}  the server wants a topic (or not)
"use strict";
const Ubre = require("ubre");
const WebSocket = require("ws7");
const readline = require("readline");

// An event without "body" had none (JSON.stringify leaves out undefined).
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const parse = (text) => (text === "" ? undefined : JSON.parse(text));

const socket = new WebSocket(process.argv[2], { perMessageDeflate: false });
const ubre = Ubre.ws(socket);
ubre.onSubscribe = (topic) => out({ event: "peer-subscribe", topic });
ubre.onUnsubscribe = (topic) => out({ event: "peer-unsubscribe", topic });
socket.addEventListener("open", () => out({ event: "open" }));
socket.addEventListener("close", (e) => {
  out({ event: "close", code: e.code, reason: e.reason });
  process.exit(0);
});
socket.addEventListener("error", (e) => out({ event: "error", message: String(e.message) }));

const subscriptions = new Map();

const commands = {
  sub(topic, json) {
    const fn = (body) => out({ event: "publish", topic, body });
    subscriptions.set(
      topic,
      json === "" ? ubre.subscribe(topic, fn) : ubre.subscribe(topic, parse(json), fn)
    );
  },
  unsub(topic) {
    subscriptions.get(topic).unsubscribe();
    subscriptions.delete(topic);
  },
  pub(topic, json) {
    ubre.publish(topic, parse(json));
  },
  req(name, json) {
    ubre.request(name, parse(json)).then(
      (body) => out({ event: "success", request: name, body }),
      (body) => out({ event: "fail", request: name, body })
    );
  },
  handle(name) {
    ubre.handle(name, (body) => {
      out({ event: "handling", request: name, body });
      return { handled: body };
    });
  },
  "handle-async"(name) {
    ubre.handle(name, (body) => {
      out({ event: "handling", request: name, body });
      return new Promise((resolve) => setTimeout(() => resolve({ handled: body }), 20));
    });
  },
  "handle-throw"(name) {
    ubre.handle(name, (body) => {
      out({ event: "handling", request: name, body });
      throw new TypeError("cannot handle " + JSON.stringify(body));
    });
  },
  close() {
    socket.close();
  },
};

function run(line) {
  const [command, name, ...rest] = line.split(" ");
  try {
    commands[command](name, rest.join(" "));
  } catch (err) {
    out({ event: "error", message: `${line}: ${err.message}` });
  }
}

// Commands given as arguments run before the socket opens: handlers ready for the first request.
process.argv.slice(3).forEach(run);
readline.createInterface({ input: process.stdin }).on("line", run);
// The test closes stdin (or dies): go with it, so no peer outlives its test.
process.stdin.on("end", () => process.exit(0));
