//! `relay-bench`: the benchmark is in `bench.rs`. It reads the CPU time of the server and of Postgres from /proc, so it runs on Linux.

#[cfg(target_os = "linux")]
#[path = "bench.rs"]
mod bench;

#[cfg(target_os = "linux")]
fn main() {
    bench::main();
}

#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("relay-bench runs on Linux only");
    std::process::ExitCode::FAILURE
}
