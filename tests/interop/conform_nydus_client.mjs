// The real, unmodified nydus-client (npm `nydus-client` 5.3.1, over engine.io-client 6) as the
// client under test of `wireproto conform client --protocol nydus`, doing what the driver
// contract asks (docs/conformance.md, "nydus clients: the driver and results").
//
//   node conform_nydus_client.mjs URL [MODE]   MODE "polling": transports ['polling'] only (no
//                                              upgrade); otherwise the defaults (long-polling,
//                                              then the upgrade to WebSocket)
import nydusClient from "nydus-client";

const [url, mode] = process.argv.slice(2);
const options = {};
if (mode === "polling") options.transports = ["polling"];
const client = nydusClient(url || process.env.WIREPROTO_CONFORM_URL, options);
const report = (path, data) => client.invoke(path, data).catch(() => {});

client.on("connect", () => {
  client.invoke("/conformance/hello there", { hello: "conformance" }).then(
    (result) => report("/conformance/answered", { result: result === undefined ? null : result }),
    (err) => report("/conformance/answered", {
      // An ERROR whose data is no {status, message} rejects with that data as it is.
      error: err instanceof Error ? { status: err.status, message: err.message, body: err.body } : err,
    }),
  );
});
client.registerRoute("/conformance/*", ({ splats }, data) =>
  report("/conformance/published", { path: "/conformance/" + splats[0], data: data === undefined ? null : data }));
// Errors the library reports (an unknown invoke id, say) are said, never fatal.
client.on("error", (err) => console.log("error:", String(err && err.message)));
client.on("unhandled", ({ path }) => console.log("unhandled publish:", path));
client.connect();
