// The real, unmodified engine.io-client (npm `engine.io-client` 6, installed with nydus-client),
// a child process for wireproto's Engine.IO server tests.
//
//   node engineio_client.js http://127.0.0.1:PORT [polling,websocket]
//
// The second argument is engine.io-client's `transports` option (default: its own default,
// polling first, then the upgrade).
// stdin, one command per line:  send TEXT | sendbin HEX | close
// stdout, one JSON object per line: {"event":"open","transport":..}, {"event":"upgrade",
// "transport":..}, {"event":"message","text":..} or {"event":"message","hex":..},
// {"event":"poll"} (a long-poll request sent, while polling), {"event":"poll sent","port":..}
// (that request handed to the operating system, from that local port), {"event":"close",
// "reason":..}, {"event":"error","message":..}
"use strict";
const diagnostics = require("diagnostics_channel");
const { Socket } = require("engine.io-client");
const readline = require("readline");

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
// Each long-poll GET once written out, with the port it leaves from: a test can then watch the
// server's end of that connection until the server has read it.
diagnostics.subscribe("http.client.request.start", ({ request }) => {
  if (request.method === "GET" && request.path.includes("transport=polling")) {
    request.on("finish", () => out({ event: "poll sent", port: request.socket.localPort }));
  }
});
const options = process.argv[3] ? { transports: process.argv[3].split(",") } : {};
const socket = new Socket(process.argv[2], options);
socket.on("open", () => {
  out({ event: "open", transport: socket.transport.name });
  // Each long-poll GET as it is sent, so a test can wait for one to be outstanding.
  socket.transport.on("poll", () => out({ event: "poll" }));
});
socket.on("upgrade", (transport) => out({ event: "upgrade", transport: transport.name }));
socket.on("message", (data) => {
  if (typeof data === "string") out({ event: "message", text: data });
  else out({ event: "message", hex: Buffer.from(data).toString("hex") });
});
socket.on("error", (error) => out({ event: "error", message: String(error && error.message) }));
socket.on("close", (reason) => {
  out({ event: "close", reason });
  // A moment for the close packet's POST to go out, when polling.
  setTimeout(() => process.exit(0), 200);
});
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const space = line.indexOf(" ");
  const command = space < 0 ? line : line.slice(0, space);
  const argument = space < 0 ? "" : line.slice(space + 1);
  if (command === "send") socket.send(argument);
  else if (command === "sendbin") socket.send(Buffer.from(argument, "hex"));
  else if (command === "close") socket.close();
});
