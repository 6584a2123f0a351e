//! `relay-wake-bench`: the benchmark is in `bench.rs`. It drives Claude Code in a terminal multiplexer and its tests' harness, so it runs on Linux.

#[cfg(target_os = "linux")]
#[path = "bench.rs"]
mod bench;

#[cfg(target_os = "linux")]
fn main() {
    bench::main();
}

#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("relay-wake-bench runs on Linux only");
    std::process::ExitCode::FAILURE
}
