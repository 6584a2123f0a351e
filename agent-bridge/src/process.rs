//! What the bridge asks of other processes, answered the same way on Linux, macOS and Windows:
//! whether one still runs, its parent, its executable, and when it ends; and how it starts one
//! apart from itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sysinfo::{Pid, ProcessRefreshKind, ProcessStatus, ProcessesToUpdate, System, UpdateKind};

/// How often [`ended`] looks where the platform cannot tell it.
const POLL: Duration = Duration::from_secs(2);

/// Looks process `pid` up afresh (its parent, status and start time come with every look; `kind`
/// adds more) and applies `read` to it; `None` when it no longer runs.
fn look<T>(pid: u32, kind: ProcessRefreshKind, read: impl FnOnce(&sysinfo::Process) -> T) -> Option<T> {
    let pid = Pid::from_u32(pid);
    let mut system = System::new();
    system.refresh_processes_specifics(ProcessesToUpdate::Some(&[pid]), true, kind);
    // A process that ended but was not yet reaped by its parent runs no more.
    system.process(pid).filter(|p| !matches!(p.status(), ProcessStatus::Zombie | ProcessStatus::Dead)).map(read)
}

/// Whether process `pid` still runs.
pub fn alive(pid: u32) -> bool {
    look(pid, ProcessRefreshKind::nothing(), |_| ()).is_some()
}

/// The parent of process `pid`, while both run.
pub fn parent(pid: u32) -> Option<u32> {
    look(pid, ProcessRefreshKind::nothing(), |p| p.parent().map(Pid::as_u32)).flatten()
}

/// The program process `pid` runs.
pub fn executable(pid: u32) -> Option<PathBuf> {
    look(pid, ProcessRefreshKind::nothing().with_exe(UpdateKind::Always), |p| p.exe().map(Path::to_path_buf)).flatten()
}

/// Resolves when process `pid` ends. The platform tells at once where it can (a pidfd on Linux,
/// kqueue on macOS, a process handle on Windows), on a thread of its own that waits for nothing
/// else; elsewhere, or when it refuses, the process is looked at every [`POLL`].
pub async fn ended(pid: u32) {
    let Ok(pid_i32) = i32::try_from(pid) else { return };
    let (done, told) = tokio::sync::oneshot::channel::<bool>();
    std::thread::spawn(move || {
        let waited = waitpid_any::WaitHandle::open(pid_i32).and_then(|mut handle| handle.wait());
        // A process gone before it could be opened has ended too; any other failure is polled.
        let ended = match waited {
            Ok(()) => true,
            Err(e) => e.raw_os_error() == Some(NO_SUCH_PROCESS),
        };
        let _ = done.send(ended);
    });
    if told.await == Ok(true) {
        return;
    }
    while alive(pid) {
        tokio::time::sleep(POLL).await;
    }
}

/// Starts `command` apart from the caller: in a session of its own on Unix (no terminal's hangup or
/// process group's signals reach it), a new process group without a console on Windows.
pub fn detach(command: &mut std::process::Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe and touches nothing of the parent's.
        unsafe {
            command.pre_exec(|| {
                let _ = rustix::process::setsid();
                Ok(())
            });
        }
    }
    #[cfg(windows)]
    {
        use std::os::windows::process::CommandExt;
        const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
        const DETACHED_PROCESS: u32 = 0x0000_0008;
        command.creation_flags(CREATE_NEW_PROCESS_GROUP | DETACHED_PROCESS);
    }
}

/// The error `open` gives for a process that is not there (`ESRCH`; Windows answers
/// `ERROR_INVALID_PARAMETER`, which is the same news).
#[cfg(unix)]
const NO_SUCH_PROCESS: i32 = rustix::io::Errno::SRCH.raw_os_error();
#[cfg(windows)]
const NO_SUCH_PROCESS: i32 = 87;
#[cfg(not(any(unix, windows)))]
const NO_SUCH_PROCESS: i32 = i32::MIN;

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> std::process::Child {
        let mut command = if cfg!(windows) {
            let mut c = std::process::Command::new("powershell");
            c.args(["-NoProfile", "-Command", "Start-Sleep 30"]);
            c
        } else {
            let mut c = std::process::Command::new("sleep");
            c.arg("30");
            c
        };
        command.stdin(std::process::Stdio::null()).spawn().expect("start a process to watch")
    }

    #[test]
    fn this_process_is_alive_with_its_parent_and_executable() {
        let me = std::process::id();
        assert!(alive(me));
        let exe = executable(me).expect("this test's executable");
        assert_eq!(exe.canonicalize().unwrap(), std::env::current_exe().unwrap().canonicalize().unwrap());
        let child = sleeper();
        assert_eq!(parent(child.id()), Some(me), "a child names this process as its parent");
        drop(child);
    }

    #[tokio::test]
    async fn an_ended_process_is_seen_to_end_and_to_be_gone() {
        let mut child = sleeper();
        let pid = child.id();
        let watch = tokio::spawn(ended(pid));
        assert!(alive(pid));
        child.kill().unwrap();
        // Reaped here, as an agent's client reaps its own children.
        child.wait().unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch).await.expect("the end is told").unwrap();
        assert!(!alive(pid), "a process that ended does not run");
        assert_eq!(parent(pid), None);
        // A process already gone ends at once.
        tokio::time::timeout(Duration::from_secs(1), ended(pid)).await.expect("already ended");
    }

    #[test]
    fn an_unreaped_child_is_not_alive() {
        let mut child = sleeper();
        child.kill().unwrap();
        // Not reaped yet: a zombie on Unix until wait() below.
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !alive(child.id())
        });
        assert!(gone, "a killed child is not counted as running");
        child.wait().unwrap();
    }
}
