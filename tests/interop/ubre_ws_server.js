// The real, unmodified ubre.js (npm `ubre` 0.0.23) as a peer server: `Ubre.wss(server)` on a
// `ws` 7 server (ubre.js checks `data[0] === '{'`, true only of the strings ws 7 gives). It is a
// child process of tests/protocols/test_ubre_interop.py, for wireproto's UbreClient to talk to.
//
//   node ubre_ws_server.js        listens on 127.0.0.1, a port the system picks
//
// Handlers: echo (answers {"echo": body}), later (the same, from a promise), throws (throws a
// RangeError), never (a promise that never settles).
// stdin, one command per line (JSON is the rest of the line, and may be left out):
//   pub TOPIC [JSON]     ubre.publish: to every connection that subscribed to TOPIC
//   req NAME [JSON]      ubre(ws).request to every connection; replies print as events
//   sub TOPIC            ubre(ws).subscribe on every connection; publishes print as events
// stdout, one JSON object per line:
//   {"event":"listening","port":N} | {"event":"connection"} | {"event":"disconnection"}
//   {"event":"subscribe"|"unsubscribe","topic":..}       a client subscribed (or not)
//   {"event":"publish","topic":..,"body":..}             a client published on a `sub` topic
//   {"event":"handling","request":NAME,"body":..}        a handler was called
//   {"event":"success"|"fail","request":NAME,"body":..}  a client answered a `req`
"use strict";
const Ubre = require("ubre");
const WebSocket = require("ws7");
const readline = require("readline");

// An event without "body" had none (JSON.stringify leaves out undefined).
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const parse = (text) => (text === "" ? undefined : JSON.parse(text));

const wss = new WebSocket.Server({ port: 0, host: "127.0.0.1", perMessageDeflate: false });
const ubre = Ubre.wss(wss);
const connections = new Set();

wss.on("listening", () => out({ event: "listening", port: wss.address().port }));
wss.on("connection", (ws) => {
  connections.add(ws);
  out({ event: "connection" });
  ws.on("close", () => {
    connections.delete(ws);
    out({ event: "disconnection" });
  });
});
ubre.onSubscribe = (topic) => out({ event: "subscribe", topic });
ubre.onUnsubscribe = (topic) => out({ event: "unsubscribe", topic });

const handling = (name, answer) => (body) => {
  out({ event: "handling", request: name, body });
  return answer(body);
};
ubre.handle({
  echo: handling("echo", (body) => ({ echo: body })),
  later: handling("later", (body) => new Promise((ok) => setTimeout(() => ok({ echo: body }), 20))),
  throws: handling("throws", (body) => {
    throw new RangeError("out of range: " + JSON.stringify(body));
  }),
  never: handling("never", () => new Promise(() => {})),
});

const commands = {
  pub(topic, json) {
    ubre.publish(topic, parse(json));
  },
  req(name, json) {
    for (const ws of connections)
      ubre(ws).request(name, parse(json)).then(
        (body) => out({ event: "success", request: name, body }),
        (body) => out({ event: "fail", request: name, body })
      );
  },
  sub(topic) {
    for (const ws of connections)
      ubre(ws).subscribe(topic, (body) => out({ event: "publish", topic, body }));
  },
};

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const [command, name, ...rest] = line.split(" ");
  try {
    commands[command](name, rest.join(" "));
  } catch (err) {
    out({ event: "error", message: `${line}: ${err.message}` });
  }
});
// The test closes stdin (or dies): go with it, so no server outlives its test.
process.stdin.on("end", () => process.exit(0));
