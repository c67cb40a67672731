//! Child processes that cannot outlive the test process.
//!
//! Linux delivers a parent-death signal when the *thread* that forked a child exits, not the
//! process. Test harnesses run each test on its own short-lived thread, so a server shared by
//! the whole binary would be killed when the test that happened to start it finished. Every
//! spawn is therefore done by one thread that lives as long as the process.
//!
//! A server that the whole binary shares lives in a `static` and is never dropped, so the
//! directory it works in is removed at exit instead ([`remove_at_exit`]).

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Sender, channel};
use std::sync::{LazyLock, Mutex, Once};

type Job = (Command, Sender<io::Result<Child>>);

static SPAWNER: LazyLock<Mutex<Sender<Job>>> = LazyLock::new(|| {
    let (jobs, incoming) = channel::<Job>();
    std::thread::Builder::new()
        .name("testkit-spawner".into())
        .spawn(move || {
            for (mut command, reply) in incoming {
                let _ = reply.send(command.spawn());
            }
            // The sender lives in a static, so this loop only ends with the process.
        })
        .map(|_| ())
        .unwrap_or_else(|err| panic!("cannot start the spawner thread: {err}"));
    Mutex::new(jobs)
});

/// A command running `program`; when `under` names a program (and its flags), that program
/// with `program` appended to them instead: valgrind, for instance, which runs it in the same
/// process.
pub fn command_under(under: &[String], program: impl AsRef<std::ffi::OsStr>) -> Command {
    match under.split_first() {
        Some((wrapper, flags)) => {
            let mut command = Command::new(wrapper);
            command.args(flags).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Spawns `command` so that it is killed (SIGKILL) when this process exits, even by a signal.
pub fn spawn(mut command: Command) -> io::Result<Child> {
    // SAFETY: prctl is async-signal-safe and touches only the calling (child) process.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() == 1 {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (reply, answer) = channel();
    SPAWNER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// Sends `command`'s stdout and stderr to a new file at `log` (and its stdin to nothing), for a
/// server whose log the test reads or prints on failure.
pub fn log_to(command: &mut Command, log: &Path) {
    let stdout = std::fs::File::create(log)
        .unwrap_or_else(|err| panic!("create the log file {}: {err}", log.display()));
    let stderr = stdout.try_clone().expect("clone the log file handle");
    command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
}

/// Kills the child in `slot`, if any, and waits for it (SIGKILL, like a crash).
pub fn kill(slot: &mut Option<Child>) {
    if let Some(mut child) = slot.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Prints the log of the server `what` at `path` when the current thread is panicking: called
/// from a handle's drop, it puts the server's side of a failure next to the test's.
pub fn print_log_if_panicking(what: &str, path: &Path) {
    if std::thread::panicking() {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        eprintln!("---- {what} log ({}) ----\n{log}", path.display());
    }
}

/// Directories to remove when the process exits.
static AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes `dir` (recursively) when this process exits normally, as the test harness does after
/// the last test. For the working directories of servers that live in a `static`.
pub fn remove_at_exit(dir: PathBuf) {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a plain function with no captured state; it runs once, at exit.
        unsafe {
            libc::atexit(remove_registered);
        }
    });
    AT_EXIT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(dir);
}

extern "C" fn remove_registered() {
    // A test thread that panicked while holding the lock must not stop the clean-up.
    let dirs = AT_EXIT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for dir in dirs.iter() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The variable that tells a test binary's child which test it runs alone.
const ALONE: &str = "TOLLGATE_TEST_ALONE";

/// For a test that reads what the whole process counts (a process-wide metric): other tests of
/// its binary, running beside it, would add to the counts. Called first thing with the test's
/// full name (`module::case::target`), it answers `true` in a child process that runs this one
/// test alone, where the test goes on; in the test binary itself it runs that child, fails the
/// test with the child's output if the child failed, and answers `false`: the test returns.
pub fn alone(test: &str) -> bool {
    if std::env::var_os(ALONE).is_some_and(|name| name == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let output = Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, test)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {test} in a process of its own: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test}, alone in a process of its own, failed ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    false
}
