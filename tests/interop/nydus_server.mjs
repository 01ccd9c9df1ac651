// The real, unmodified nydus server (npm `nydus` 5.3.2, over engine.io 6) on an HTTP server on
// 127.0.0.1, a child process of tests/protocols/test_nydus_interop.py, for wireproto's nydus client.
//
//   node nydus_server.mjs          listens on a port the system picks
//
// Routes: /echo/:what answers {"what":..,"body":..}; /calm throws InvokeError(420, "Enhance your
// calm", {"retry": true}); /crash throws a plain Error; /subscribe/:topic subscribes the caller to
// /news/:topic with initial data {"initial": topic} and answers "subscribed".
// stdin, one command per line:  pub PATH JSON  (server.publish) | close (close every client)
// stdout, one JSON object per line: {"event":"listening","port":N} | {"event":"connection","id":..}
//   | {"event":"disconnect","id":..} | {"event":"parserError","message":..}
import http from "node:http";
import readline from "node:readline";
import nydus, { InvokeError } from "nydus";

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const httpServer = http.createServer();
const server = nydus(httpServer, { pingInterval: 1000, pingTimeout: 1000 });

server.on("connection", (client) => {
  out({ event: "connection", id: client.id });
  client.on("close", () => out({ event: "disconnect", id: client.id }));
});
server.on("parserError", (client, message) => out({ event: "parserError", message }));
server.on("error", (err) => out({ event: "error", message: String(err) }));

server.registerRoute("/echo/:what", async (data) => ({
  what: data.get("params").get("what"),
  body: data.get("body"),
}));
server.registerRoute("/calm", async () => {
  throw new InvokeError("Enhance your calm", 420, { retry: true });
});
server.registerRoute("/crash", async () => {
  throw new Error("boom");
});
server.registerRoute("/subscribe/:topic", async (data) => {
  const topic = data.get("params").get("topic");
  server.subscribeClient(data.get("client"), `/news/${topic}`, { initial: topic });
  return "subscribed";
});

httpServer.listen(0, "127.0.0.1", () => out({ event: "listening", port: httpServer.address().port }));

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const [command, path, ...rest] = line.split(" ");
  if (command === "pub") server.publish(path, JSON.parse(rest.join(" ")));
  else if (command === "close") for (const client of server.clients.values()) client.close();
});
