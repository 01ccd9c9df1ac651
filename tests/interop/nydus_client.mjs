// The real, unmodified nydus-client (npm `nydus-client` 5.3.1, over engine.io-client 6), a child
// process of tests/protocols/test_nydus_interop.py, against wireproto's nydus server.
//
//   node nydus_client.mjs URL [MODE [TOKEN]]   MODE "websocket": transports ['websocket'] only;
//                                      "polling": ['polling'] only; otherwise the defaults (HTTP
//                                      long-polling, then the upgrade to WebSocket). TOKEN goes in
//                                      an Authorization: Bearer header (engine.io's extraHeaders)
// Client routes: /news/:topic and /files/* print {"event":"publish",...} with params and splats.
// stdin, one command per line:  invoke ID PATH [JSON]  |  close  |  raw TEXT (sent as it is, as one
//   Engine.IO message, through the client's own connection: nydus-client's encodeURI would turn a
//   malformed escape such as %ZZ into %25ZZ)
// stdout, one JSON object per line: {"event":"connect","transport":..} | {"event":"upgrade",
//   "transport":..} | {"event":"result","id":..,"data":..} | {"event":"error","id":..,"status":..,
//   "message":..,"body":..} | {"event":"publish","route":..,"params":..,"splats":..,"data":..} |
//   {"event":"unhandled","path":..} | {"event":"disconnect","reason":..} | {"event":"unauthorized"}
import readline from "node:readline";
import nydusClient from "nydus-client";

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const [url, mode, token] = process.argv.slice(2);
const options = { reconnectionAttempts: 1 };
if (mode === "websocket" || mode === "polling") options.transports = [mode];
if (token) options.extraHeaders = { Authorization: `Bearer ${token}` };
const client = nydusClient(url, options);

client.on("connect", () => {
  const transport = client.conn.transport.name;
  out({ event: "connect", transport });
  client.conn.on("upgrade", (t) => out({ event: "upgrade", transport: t.name }));
});
client.on("disconnect", (reason) => out({ event: "disconnect", reason }));
client.on("unauthorized", () => out({ event: "unauthorized" }));
client.on("error", (err) => out({ event: "client-error", message: String(err && err.message) }));
client.on("unhandled", ({ path }) => out({ event: "unhandled", path }));
const publish = ({ route, params, splats }, data) =>
  out({ event: "publish", route, params, splats, data });
client.registerRoute("/news/:topic", publish);
client.registerRoute("/files/*", publish);
client.connect();

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const [command, id, path, ...rest] = line.split(" ");
  if (command === "close") {
    client.disconnect();
    return;
  }
  if (command === "raw") {
    client.conn.send(line.slice("raw ".length));
    return;
  }
  const data = rest.length ? JSON.parse(rest.join(" ")) : undefined;
  client.invoke(path, data).then(
    (result) => out({ event: "result", id, data: result }),
    (err) => out({ event: "error", id, status: err.status, message: err.message, body: err.body }),
  );
});
