//! The node-local client: `ecni-probe` run as a child process inside a cgroup and a
//! network namespace. The daemon's socket programs select by cgroup, and cgroup
//! membership belongs to a process, so the threads of `spawn_in` cannot stand in.

use std::{
    io::Read,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{cgroup::Cgroup, netns::Netns};

/// The probe bounds each of its own waits (5 s); this bounds the whole run.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs `probe_bin args` in `cgroup` and `netns` and returns the JSON line it printed;
/// `Err` carries its exit status and stderr (e.g. "connect: Connection refused"), or
/// says it was killed after [`PROBE_TIMEOUT`].
pub fn probe(
    netns: &Netns,
    cgroup: &Cgroup,
    probe_bin: &Path,
    args: &[&str],
) -> Result<serde_json::Value, String> {
    let what = format!("ecni-probe {} in {}", args.join(" "), netns.name());
    // The shell joins the cgroup, then becomes nsenter, which becomes the probe: the
    // probe runs in the cgroup from its first instruction.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"procs=$1 net=$2; shift 2; echo $$ > "$procs" && exec nsenter --net="$net" -- "$@""#)
        .arg("sh")
        .arg(cgroup.path().join("cgroup.procs"))
        .arg(netns.path())
        .arg(probe_bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("{what}: cannot start: {error}"))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|error| format!("{what}: {error}"))?
        {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: killed after {PROBE_TIMEOUT:?}"));
        }
        thread::sleep(Duration::from_millis(20));
    };
    // The probe prints one line at most: it fits in the pipes without a reader.
    let (stdout, stderr) = output(&mut child);
    if !status.success() {
        return Err(format!("{what}: {status}: {}", stderr.trim()));
    }
    serde_json::from_str(stdout.trim())
        .map_err(|error| format!("{what}: printed no JSON ({error}): {stdout}"))
}

fn output(child: &mut Child) -> (String, String) {
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stdout.take() {
        let _ = pipe.read_to_string(&mut stdout);
    }
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (stdout, stderr)
}
