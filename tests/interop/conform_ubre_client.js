// The UBRE client kit's driver contract (docs/conformance.md, "UBRE clients: the driver and
// results") written with the real, unmodified ubre.js (npm `ubre` 0.0.23) and its own WebSocket
// wrapper, `Ubre.ws(socket)`, on the `ws` package at 7 (`ws7`): that wrapper reads a text
// message as a string, which ws 8 no longer gives.
//
//   wireproto conform client --protocol ubre --listen ws://127.0.0.1:8780/ubre \
//       --run "node tests/interop/conform_ubre_client.js {url}"
//
// ubre.js leaves connections to the application and has no reconnection of its own, so this
// driver exits when its connection closes, and --run starts it again for the next case.
"use strict";
const Ubre = require("ubre");
const WebSocket = require("ws7");

const url = process.argv[2] || process.env.WIREPROTO_CONFORM_URL;
const socket = new WebSocket(url, { perMessageDeflate: false });
const ubre = Ubre.ws(socket);

ubre.handle("echo", (body) => body);
ubre.handle("fail", (body) => Promise.reject(body));

const echo = (body) => ubre.publish("conformance/out", body);
let input = ubre.subscribe("conformance/in", echo);
ubre.subscribe("conformance/ask", (body) =>
  ubre.request("echo", body).then(
    (answer) => ubre.publish("conformance/answer", answer),
    (failure) => ubre.publish("conformance/failed", failure)
  )
);
// Leave conformance/in, or join it again.
ubre.subscribe("conformance/leave", () => {
  if (input) {
    input.unsubscribe();
    input = null;
  } else {
    input = ubre.subscribe("conformance/in", echo);
  }
});

socket.addEventListener("close", () => process.exit(0));
socket.addEventListener("error", () => {}); // a close follows
