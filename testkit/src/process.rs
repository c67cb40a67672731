//! Child processes that cannot outlive the test process.
//!
//! Linux delivers a parent-death signal when the *thread* that forked a child exits, not the
//! process. Test harnesses run each test on its own short-lived thread, so a server shared by
//! the whole binary would be killed when the test that happened to start it finished. Every
//! spawn is therefore done by one thread that lives as long as the process.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::LazyLock;
use std::sync::Mutex;
use std::sync::mpsc::{Sender, channel};

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
