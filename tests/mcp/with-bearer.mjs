// Preloaded into the MCP conformance suite (`node --import`): every HTTP request it makes carries
// the machine token of RELAY_TOKEN as its bearer, as a remote agent's client sends it. The suite
// itself has no option for a header; its requests (the SDK's fetch and undici's own) all go through
// undici's global dispatcher, which this wraps.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.RELAY_NODE_MODULES, "index.js"));
const { Agent, setGlobalDispatcher } = require("undici");
const authorization = `Bearer ${process.env.RELAY_TOKEN}`;

const withBearer = (dispatch) => (options, handler) => {
  const headers = options.headers;
  if (Array.isArray(headers)) {
    options.headers = [...headers, "authorization", authorization];
  } else {
    options.headers = { ...(headers ?? {}), authorization };
  }
  return dispatch(options, handler);
};

setGlobalDispatcher(new Agent().compose(withBearer));
