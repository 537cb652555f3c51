//! Running the IPAM plugin as a bounded child process: its stdin written on a thread of
//! its own (a plugin may print before it has read everything), its stdout read up to
//! [`MAX_OUTPUT`], and the whole run a timeout ([`DEFAULT_TIMEOUT`] unless the network
//! config's `ipamTimeout` says otherwise). A plugin that hangs or prints
//! without end is killed; the plugin is another program and its output crosses a trust
//! boundary.

use std::{
    io::{self, Read, Write},
    os::unix::process::CommandExt,
    process::{Child, ExitStatus},
    sync::mpsc,
    thread,
    time::Duration,
};

use nix::{sys::signal, unistd::Pid};

/// How long one run of the IPAM plugin may take. Plugins that keep their state locally
/// (host-local) answer in milliseconds; those that ask a datastore (whereabouts, Calico's
/// IPAM) in seconds. A minute leaves them room and ends well before kubelet gives up on
/// the runtime request (four minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The most the IPAM plugin may print on stdout: a result or an error is a few KiB.
pub const MAX_OUTPUT: usize = 1 << 20;

/// Why a run was cut short.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("did not finish within {} s and was killed", .0.as_secs())]
    TimedOut(Duration),
    #[error("printed more than {MAX_OUTPUT} bytes and was killed")]
    TooMuchOutput,
    #[error("could not be read from or waited for: {0}")]
    Io(#[from] io::Error),
}

/// Feeds `stdin` to `child` (spawned with piped stdin and stdout), reads its stdout and
/// waits for it, within the bounds above.
pub fn run(
    mut child: Child,
    stdin: Vec<u8>,
    timeout: Duration,
) -> Result<(ExitStatus, Vec<u8>), RunError> {
    if let Some(mut pipe) = child.stdin.take() {
        // A plugin that exits without reading stdin closes the pipe; its exit status
        // tells what happened, so a write error is not the story.
        thread::spawn(move || drop(pipe.write_all(&stdin)));
    }
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| RunError::Io(io::Error::other("the plugin's stdout is not a pipe")))?;
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    thread::spawn(move || {
        let mut output = Vec::new();
        let read = (&mut stdout)
            .take(MAX_OUTPUT as u64 + 1)
            .read_to_end(&mut output);
        let outcome = match read {
            Ok(_) if output.len() > MAX_OUTPUT => {
                kill(pid);
                let _ = child.wait();
                Err(RunError::TooMuchOutput)
            }
            Ok(_) => child
                .wait()
                .map(|status| (status, output))
                .map_err(RunError::Io),
            Err(error) => {
                kill(pid);
                let _ = child.wait();
                Err(RunError::Io(error))
            }
        };
        let _ = done.send(outcome);
    });
    finished.recv_timeout(timeout).unwrap_or_else(|_| {
        // The reader may stay blocked if the plugin left a child holding its stdout; the
        // plugin process ends soon after this error anyway.
        kill(pid);
        Err(RunError::TimedOut(timeout))
    })
}

/// Kills the plugin's whole process group (it leads one, see [`command`]): a shell
/// script's children hold its pipes too.
fn kill(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = signal::killpg(Pid::from_raw(pid), signal::Signal::SIGKILL);
    }
}

/// A command for the plugin at `path`, in a process group of its own so that [`run`]
/// can kill everything it started; stdin and stdout piped, stderr ours.
pub fn command(path: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(path);
    command
        .process_group(0)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    command
}
