//! `ebpf-cnid` as a real process inside a node namespace, with its own bpffs folder,
//! socket and cgroup, stopped and uninstalled on drop.

use std::{
    ffi::OsString,
    fs,
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use crate::{bins, cgroup::Cgroup, netns::Netns, scaled, unique_name};

/// How long a starting daemon may take to answer `status`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The paths of one daemon instance; they outlive a restart of the process.
pub struct Instance {
    pub bpf_dir: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    /// Where the daemon attaches its node-local hostPort programs: only processes in
    /// it (the tests' node-local clients) are translated, never the machine's.
    pub cgroup: Cgroup,
    /// The network namespace the daemon runs in, once started: the CLI runs there too
    /// (uninstall must, to remove the pods' TC block).
    netns: Mutex<Option<PathBuf>>,
}

impl Instance {
    pub fn new() -> Self {
        let name = unique_name("d");
        let run_dir = PathBuf::from("/run").join(&name);
        Self {
            bpf_dir: PathBuf::from("/sys/fs/bpf").join(&name),
            socket: run_dir.join("ebpf-cnid.sock"),
            state_dir: run_dir.join("state"),
            log: std::env::temp_dir().join(format!("{name}.log")),
            cgroup: Cgroup::new(),
            netns: Mutex::new(None),
        }
    }

    /// The flags that select this instance: bpffs folder, socket, state folder, cgroup.
    pub fn flags(&self) -> Vec<OsString> {
        vec![
            "--bpf-dir".into(),
            self.bpf_dir.clone().into(),
            "--socket".into(),
            self.socket.clone().into(),
            "--state-dir".into(),
            self.state_dir.clone().into(),
            "--cgroup".into(),
            self.cgroup.path().into(),
        ]
    }

    /// `ebpf-cnid <instance flags> <args>`, in the daemon's namespace once a daemon
    /// was started (else in the caller's).
    pub fn cli(&self, args: &[&str]) -> Output {
        let netns = self.netns.lock().map_or(None, |netns| netns.clone());
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net={}", netns.display()))
                    .arg("--")
                    .arg(bins::path("ebpf-cnid"));
                command
            }
            None => Command::new(bins::path("ebpf-cnid")),
        };
        command
            .args(self.flags())
            .args(args)
            .output()
            .expect("cannot run ebpf-cnid")
    }

    /// Like [`Self::cli`] with `--output json`, parsed; panics when the command fails.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let out = self.cli(&all);
        assert!(
            out.status.success(),
            "ebpf-cnid {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|error| {
            panic!(
                "ebpf-cnid {args:?} printed no JSON ({error}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Sends `request` to the daemon's socket as any client could, and returns its answer.
    pub fn request(&self, request: &cni_api::Request) -> cni_api::Response {
        cni_api::call(&self.socket, request, Duration::from_secs(10))
            .unwrap_or_else(|error| panic!("{request:?}: {error}"))
    }

    /// Everything the daemon logged so far (all of its runs).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Default for Instance {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let uninstall = self.cli(&["uninstall"]);
        let left = self.bpf_dir.exists();
        let _ = fs::remove_file(&self.log);
        // The run folder also holds what the test put there (host-local's data).
        if let Some(run_dir) = self.socket.parent() {
            let _ = fs::remove_dir_all(run_dir);
        }
        // `cgroup` is removed when the field drops, after `uninstall` above used it.
        // A failed uninstall, or one that left the pins, is the product's leak: the test
        // fails with it (unless it is failing already).
        if !std::thread::panicking() {
            assert!(
                uninstall.status.success() && !left,
                "`ebpf-cnid uninstall` left {} behind ({}): {}",
                self.bpf_dir.display(),
                uninstall.status,
                String::from_utf8_lossy(&uninstall.stderr)
            );
        }
    }
}

/// How long a daemon may take to exit after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// A running daemon process; killed on drop if still running.
pub struct Daemon {
    child: Option<Child>,
}

impl Daemon {
    /// Starts `ebpf-cnid run --attach <attach>` inside `node` and waits until it answers.
    pub fn start(node: &Netns, instance: &Instance, attach: &[&str]) -> Self {
        Self::start_with(node, instance, attach, &[])
    }

    /// Like [`Self::start`], with extra `run` flags (NAT timeouts, port range...).
    pub fn start_with(node: &Netns, instance: &Instance, attach: &[&str], flags: &[&str]) -> Self {
        Self::start_under(node, instance, &[], attach, flags)
    }

    /// Like [`Self::start_with`], run through `wrapper` (a command and its arguments
    /// that ends by running the daemon, for example `prlimit --nofile=64 --`).
    pub fn start_under(
        node: &Netns,
        instance: &Instance,
        wrapper: &[&str],
        attach: &[&str],
        flags: &[&str],
    ) -> Self {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&instance.log)
            .expect("cannot open the daemon log");
        if let Ok(mut netns) = instance.netns.lock() {
            *netns = Some(node.path());
        }
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = node.command(program);
                command.args(args).arg(bins::path("ebpf-cnid"));
                command
            }
            None => node.command(bins::path("ebpf-cnid")),
        };
        command
            .args(instance.flags())
            .arg("run")
            .env("EBPF_CNID_LOG", "info")
            // A runner in a pod has it; the daemon would then take the in-cluster
            // configuration for a node source. Only a wrapper sets it (`service_account`).
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        if !attach.is_empty() {
            command.arg("--attach").arg(attach.join(","));
        }
        command.args(flags);
        let child = command.spawn().expect("cannot start ebpf-cnid");
        let mut daemon = Self { child: Some(child) };
        daemon.wait_ready(instance);
        daemon
    }

    fn wait_ready(&mut self, instance: &Instance) {
        let deadline = Instant::now() + scaled(READY_TIMEOUT);
        loop {
            if instance.cli(&["status"]).status.success() {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "ebpf-cnid exited ({status}) before it was ready:\n{}",
                    instance.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "ebpf-cnid did not answer within {:?}:\n{}",
                scaled(READY_TIMEOUT),
                instance.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits for the exit; returns whether it exited cleanly. A daemon
    /// still running after [`STOP_LIMIT`] (stretched in a slow guest) is killed and
    /// counts as not stopping: a hang fails its test instead of holding the whole
    /// binary until its time runs out.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let pid = i32::try_from(child.id()).expect("pid fits i32");
        // SAFETY: kill has no memory-safety preconditions; pid is our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + scaled(STOP_LIMIT);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => {
                    eprintln!(
                        "daemon {pid} still running {:?} after SIGTERM: killed",
                        scaled(STOP_LIMIT)
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
            }
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits up to `timeout` (stretched in a slow guest: [`scaled`]) for `check` to hold,
/// polling.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + scaled(timeout);
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}
