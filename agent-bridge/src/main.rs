//! agent-bridge: the per-machine Relay bridge. The MCP server arrives with its own change.

fn main() -> std::process::ExitCode {
    eprintln!("agent-bridge: not available yet");
    std::process::ExitCode::FAILURE
}
