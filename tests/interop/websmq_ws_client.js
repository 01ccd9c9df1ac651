// A WEBSMQ client on Node's `ws`, written from shared/specs/websmq.md alone: an independent
// WebSocket stack and codec for the broker's interop tests.
//
//   node websmq_ws_client.js ws://127.0.0.1:PORT/websmq
//
// stdin, one command per line:  sub TOPIC | unsub TOPIC | pub TOPIC TEXT | will TOPIC TEXT |
//                               raw HEX (send these bytes as one binary frame) | text STRING
// stdout, one JSON object per line: {"event":"open"}, {"event":"frame","type":..,"topic":..,
// "payload":..}, {"event":"close","code":..,"reason":..}
"use strict";
const WebSocket = require("ws");
const readline = require("readline");

const TYPES = ["publish", "subscribe", "unsubscribe", "lastwill"];
const CODES = { pub: 0, sub: 1, unsub: 2, will: 3 };

function frame(type, topic, payload) {
  const t = Buffer.from(topic, "ascii");
  const header = Buffer.alloc(2);
  header.writeUInt16BE((type << 14) | t.length);
  return Buffer.concat([header, t, Buffer.from(payload || "", "utf8")]);
}

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const socket = new WebSocket(process.argv[2], { perMessageDeflate: false });
socket.on("open", () => out({ event: "open" }));
socket.on("message", (data, isBinary) => {
  const header = data.readUInt16BE(0);
  const length = header & 0x3fff;
  out({
    event: "frame",
    binary: isBinary,
    type: TYPES[header >> 14],
    topic: data.subarray(2, 2 + length).toString("ascii"),
    payload: data.subarray(2 + length).toString("utf8"),
  });
});
socket.on("close", (code, reason) => {
  out({ event: "close", code, reason: reason.toString() });
  process.exit(0);
});
socket.on("error", (err) => out({ event: "error", message: err.message }));

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const [command, topic, ...rest] = line.split(" ");
  if (command === "raw") socket.send(Buffer.from(topic, "hex"), { binary: true });
  else if (command === "text") socket.send([topic, ...rest].join(" "), { binary: false });
  else socket.send(frame(CODES[command], topic, rest.join(" ")), { binary: true });
});
