// relay.v1 from @grpc/grpc-js with its default channel options, as a person's own client would call
// it: the same modes and output as relay_client.py (see there).
//
// usage: node relay_client.mjs ADDRESS HANDLE receive COUNT SECONDS
//        node relay_client.mjs ADDRESS HANDLE send TO COUNT SECONDS
// The machine token comes from RELAY_TOKEN; the packages from RELAY_NODE_MODULES.
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(path.join(process.env.RELAY_NODE_MODULES, "index.js"));
const grpc = require("@grpc/grpc-js");
const loader = require("@grpc/proto-loader");

const here = path.dirname(fileURLToPath(import.meta.url));
const definition = loader.loadSync("relay/v1/relay.proto", {
  includeDirs: [path.join(here, "..", "..", "proto")],
  keepCase: true,
  defaults: true,
});
const relayV1 = grpc.loadPackageDefinition(definition).relay.v1;

const [address, handle, mode, ...rest] = process.argv.slice(2);
const relay = new relayV1.Relay(address, grpc.credentials.createInsecure());
const bearer = (token) => {
  const metadata = new grpc.Metadata();
  metadata.set("authorization", `Bearer ${token}`);
  return metadata;
};
const call = (method, request, metadata) =>
  new Promise((resolve, reject) =>
    relay[method](request, metadata, (error, reply) => (error ? reject(error) : resolve(reply))),
  );
const describe = (error) => `${grpc.status[error.code] ?? error.code}: ${error.details}`;

const hello = await call("Hello", { handle, harness: "other" }, bearer(process.env.RELAY_TOKEN));
const session = bearer(hello.session_token);

let received = 0;
let error = null;
let ended = false;
const expected = mode === "receive" ? Number(rest[0]) : Infinity;
let reachExpected;
const allReceived = new Promise((resolve) => (reachExpected = resolve));
const pushes = relay.Subscribe({}, session);
pushes.on("data", (push) => {
  if (push.event === "message" || push.message) {
    received += 1;
    if (received >= expected) reachExpected();
  }
});
pushes.on("error", (e) => {
  if (e.code !== grpc.status.CANCELLED && error === null) error = describe(e);
  ended = true;
  reachExpected();
});
pushes.on("end", () => {
  ended = true;
  reachExpected();
});
console.log("subscribed");

let sent = 0;
if (mode === "receive") {
  const seconds = Number(rest[1]);
  await Promise.race([allReceived, new Promise((resolve) => setTimeout(resolve, seconds * 1000))]);
} else {
  const [to, count, seconds] = [rest[0], Number(rest[1]), Number(rest[2])];
  const deadline = Date.now() + seconds * 1000;
  try {
    while (sent < count && Date.now() < deadline && error === null) {
      await call("Send", { to: [to], body: `serial ${sent}`, client_id: `${handle}-${sent}` }, session);
      sent += 1;
    }
  } catch (e) {
    error = describe(e);
  }
}
const streamOpen = mode === "receive" || !ended;
pushes.cancel();
console.log(JSON.stringify({ received, sent, error, stream_open: streamOpen }));
relay.close();
process.exit(0);
