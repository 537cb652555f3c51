//! A network namespace that exists as long as its guard, or one a container runtime made
//! (`Netns::existing`), which the runtime removes.

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use aya::programs::{SchedClassifier, TcAttachType};

use crate::unique_name;

pub struct Netns {
    name: String,
    /// The namespace's file: `/run/netns/<name>` for one made here.
    path: PathBuf,
    /// Whether the guard made the namespace, and so deletes it on drop.
    owned: bool,
}

impl Netns {
    /// Creates `ecni-<pid>-<n>-<tag>` with its loopback up.
    pub fn new(tag: &str) -> Self {
        let name = unique_name(tag);
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let netns = Self {
            path: PathBuf::from("/run/netns").join(&name),
            name,
            owned: true,
        };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    /// The namespace a container runtime mounted at `path`, for the helpers here;
    /// left in place on drop (the runtime removes it).
    pub fn existing(path: &std::path::Path) -> Self {
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| panic!("{} names no namespace", path.display()));
        Self {
            name,
            path: path.to_owned(),
            owned: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The MAC of `ifname` in this namespace.
    pub fn mac(&self, ifname: &str) -> [u8; 6] {
        let out = self.ip(&["-j", "link", "show", "dev", ifname]);
        let links: serde_json::Value = serde_json::from_str(&out).expect("ip -j prints JSON");
        parse_mac(links[0]["address"].as_str().expect("a MAC"))
    }

    /// Runs `work` on a new thread inside this namespace (the caller's threads never
    /// change namespace).
    pub fn spawn<T, F>(&self, work: F) -> std::thread::JoinHandle<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        use std::os::fd::AsFd;
        let file = std::fs::File::open(self.path()).expect("cannot open the netns file");
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("setns failed");
            work()
        })
    }

    /// Runs `work` inside this namespace and waits for it.
    pub fn run_inside<T, F>(&self, work: F) -> T
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.spawn(work).join().expect("the netns thread panicked")
    }

    /// Names of the TCX programs on `device` in this namespace, ingress then egress, asked
    /// from the kernel (Debian's bpftool predates TCX and cannot list them).
    pub fn tcx_programs(&self, device: &str) -> Vec<String> {
        // A kernel without TCX (before 6.6) refuses the query: it has no such program.
        if !crate::kernel::has_tcx() {
            return Vec::new();
        }
        let device = device.to_owned();
        self.run_inside(move || {
            let mut names = Vec::new();
            for direction in [TcAttachType::Ingress, TcAttachType::Egress] {
                let (_, programs) = SchedClassifier::query_tcx(&device, direction)
                    .unwrap_or_else(|error| panic!("query {device}: {error}"));
                names.extend(
                    programs
                        .iter()
                        .filter_map(|program| program.name_as_str().map(str::to_owned)),
                );
            }
            names
        })
    }

    /// The BPF filters `tc -j filter show <what>` lists in this namespace (`what`: `dev
    /// <device> ingress`, `block <index>`...), as (program name, preference).
    pub fn bpf_filters(&self, what: &[&str]) -> Vec<(String, u64)> {
        let args: Vec<&str> = ["-j", "filter", "show"]
            .iter()
            .chain(what)
            .copied()
            .collect();
        let out = self.run("tc", &args);
        assert!(
            out.status.success(),
            "tc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let filters: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        filters
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|filter| {
                let name = filter["options"]["bpf_name"].as_str()?;
                Some((name.to_owned(), filter["pref"].as_u64().unwrap_or(0)))
            })
            .collect()
    }

    /// Every program on `device` in this namespace, TCX links and then clsact BPF
    /// filters, each ingress then egress: the same names whichever way the daemon
    /// attached (`--enable-tcx`).
    pub fn tc_programs(&self, device: &str) -> Vec<String> {
        let mut names = self.tcx_programs(device);
        for direction in ["ingress", "egress"] {
            names.extend(
                self.bpf_filters(&["dev", device, direction])
                    .into_iter()
                    .map(|(name, _)| name),
            );
        }
        names
    }

    /// The namespace's file, for `nsenter --net=` and setns.
    pub fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// `ip -n <ns> <args>` (through nsenter for a runtime's namespace, which `ip -n`
    /// cannot name); panics with ip's message when it fails.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut command = if self.owned {
            let mut command = Command::new("ip");
            command.args(["-n", &self.name]);
            command
        } else {
            self.command("ip")
        };
        let out = run_ok(command.args(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `program` to run inside the namespace. Uses nsenter, which (unlike
    /// `ip netns exec`) keeps the caller's mounts, so bpffs stays visible.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        command
    }

    /// The namespace's iptables rules (`iptables-save` without its comment lines, which
    /// carry timestamps): to show that nothing was written.
    pub fn iptables_rules(&self) -> String {
        let out = self.run("iptables-save", &[]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| !line.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Runs `program args` inside the namespace and returns its output, whatever its exit.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("cannot run {program} in {}: {error}", self.name))
    }

    /// Joins this namespace to `other` with a veth pair: `here` in this one, `there` in
    /// the other, both up, with the given addresses (CIDR notation).
    pub fn link_veth(
        &self,
        here: &str,
        here_addr: &str,
        other: &Netns,
        there: &str,
        there_addr: &str,
    ) {
        self.ip(&[
            "link",
            "add",
            here,
            "type",
            "veth",
            "peer",
            "name",
            there,
            "netns",
            other.name(),
        ]);
        self.ip(&["addr", "add", here_addr, "dev", here]);
        self.ip(&["link", "set", here, "up"]);
        other.ip(&["addr", "add", there_addr, "dev", there]);
        other.ip(&["link", "set", there, "up"]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // Deleting the namespace also removes every link inside it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// `aa:bb:cc:dd:ee:ff` as bytes.
pub fn parse_mac(text: &str) -> [u8; 6] {
    text.parse::<cni_api::MacAddr>()
        .unwrap_or_else(|error| panic!("{text:?} is no MAC: {error}"))
        .octets()
}

/// Runs `command`, panicking with its stderr when it fails.
pub fn run_ok(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|error| panic!("cannot start {command:?}: {error}"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
