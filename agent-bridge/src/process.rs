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
    let (parent, started) = look(pid, ProcessRefreshKind::nothing(), |p| (p.parent(), p.start_time()))?;
    let parent = parent?.as_u32();
    // A child keeps its parent's number after the parent ended (on Windows, where numbers come back
    // soon): a process that started after the child is another one that took the number.
    let parent_started = look(parent, ProcessRefreshKind::nothing(), |p| p.start_time())?;
    (parent_started <= started).then_some(parent)
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
        let waited = waitpid_any::WaitHandle::open(pid_i32).and_then(|mut handle| {
            loop {
                // A signal to this process interrupts the wait, which is then taken up again.
                match handle.wait() {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    waited => break waited,
                }
            }
        });
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
        // A console that shows no window, which the console programs it starts share (a process
        // with no console at all would give each of them a window of its own).
        const CREATE_NO_WINDOW: u32 = 0x0800_0000;
        command.creation_flags(CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW);
    }
}

/// Where program `name` is: a path as given, a bare name looked for on `PATH` (on Windows with each
/// ending `PATHEXT` lists, so an npm shim `codex.cmd` is found as `codex`).
pub fn find_program(name: &str) -> Option<PathBuf> {
    find_program_in(name, &std::env::var_os("PATH")?)
}

/// [`find_program`] with `search` for `PATH`.
fn find_program_in(name: &str, search: &std::ffi::OsStr) -> Option<PathBuf> {
    let path = Path::new(name);
    if path.components().count() > 1 {
        return path.is_file().then(|| path.to_path_buf());
    }
    let endings: Vec<String> = if cfg!(windows) && path.extension().is_none() {
        let listed = std::env::var("PATHEXT").unwrap_or_else(|_| ".COM;.EXE;.BAT;.CMD".into());
        listed.split(';').filter(|e| !e.is_empty()).map(str::to_ascii_lowercase).collect()
    } else {
        vec![String::new()]
    };
    std::env::split_paths(search)
        .flat_map(|dir| endings.iter().map(move |ending| dir.join(format!("{name}{ending}"))))
        .find(|candidate| candidate.is_file())
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
        let mut child = sleeper();
        assert_eq!(parent(child.id()), Some(me), "a child names this process as its parent");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn programs_are_found_on_path_by_name_or_taken_as_given() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(find_program(me.to_str().unwrap()), Some(me.clone()));
        assert_eq!(find_program("/nonexistent/agent-bridge"), None);
        let dir = me.parent().unwrap();
        let name = me.file_stem().unwrap().to_str().unwrap();
        let path = std::env::join_paths([Path::new("/nonexistent"), dir]).unwrap();
        assert_eq!(find_program_in(name, &path), Some(me));
        assert_eq!(find_program_in("agent-bridge-nowhere", &path), None);
    }

    #[tokio::test]
    async fn a_waiter_waits_while_its_process_runs_and_is_told_when_it_ends() {
        let mut child = sleeper();
        let pid = child.id();
        let mut waiting = Box::pin(ended(pid));
        // Polled, the waiter opens the process and waits on it: still running, nothing is told.
        let early = tokio::time::timeout(Duration::from_millis(500), &mut waiting).await;
        assert!(early.is_err(), "a process that runs has not ended");
        assert!(alive(pid));
        child.kill().unwrap();
        // Told of the end itself, before anyone reaps the process (as an agent's client may not).
        tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the end is told");
        child.wait().unwrap();
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
