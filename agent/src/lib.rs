//! What an agent does with Relay, written once for every way an agent reaches it: the relay tools
//! (names, schemas, descriptions, annotations, who they are listed to, how their results are
//! shaped and how other agents' text is framed) and the client session that makes their calls.
//! `agent-bridge` serves them over stdio on the agent's machine; `relay-server` over HTTP to agents
//! that cannot run a bridge, calling its own gRPC service in-process, so both take one code path.

pub mod frame;
pub mod relay;
pub mod repo;
pub mod tools;
pub mod version;

pub use version::Version;
