//! Booting a guest with qemu and reading its console: the `vm-test:` lines guest.sh
//! prints, libtest's result lines, and the kernel's own messages, all streamed through.

use std::{
    collections::VecDeque,
    fs::OpenOptions,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;

use super::{emulator::Emulator, kernel::Kernel};
use crate::cmd::{self, TestTotals};

/// How the guest's CPUs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// KVM when `/dev/kvm` opens and a guest boots with it, else TCG.
    Auto,
    Kvm,
    /// qemu's software emulation: ten to twenty times slower than the host.
    Tcg,
}

impl Accel {
    fn args(self) -> &'static [&'static str] {
        match self {
            Self::Kvm => &["-accel", "kvm", "-cpu", "host"],
            _ => &["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Kvm => "KVM",
            _ => "TCG (software emulation)",
        }
    }

    /// How much slower than the host a guest runs, for the tests' waits: measured on
    /// this machine's kind, TCG took 8 to 20 times the host's time per test binary.
    pub fn time_scale(self) -> u32 {
        match self {
            Self::Kvm => 2,
            _ => 10,
        }
    }

    /// How long the guest may print nothing before it is taken for hung (a test that
    /// waits on its own for long, or the slowest binary's build-up, stays well under).
    pub fn quiet_limit(self) -> Duration {
        match self {
            Self::Kvm => Duration::from_secs(600),
            _ => Duration::from_secs(900),
        }
    }

    /// How long a test binary of `tests` tests may take in the guest before `timeout`
    /// stops it: per test, well over the mean here (under TCG a daemon's start alone
    /// takes about 20 s on 6.1, and CI's guest ran 127 tests of `datapath` in 55 minutes
    /// on two threads, 26 s each; this project's own machines are slower), and never
    /// less than [`Self::quiet_limit`].
    pub fn binary_timeout(self, tests: usize) -> Duration {
        let per_test = match self {
            Self::Kvm => Duration::from_secs(5),
            _ => Duration::from_secs(40),
        };
        (per_test * u32::try_from(tests).unwrap_or(u32::MAX)).max(self.quiet_limit())
    }

    fn boot_timeout(self) -> Duration {
        match self {
            Self::Kvm => Duration::from_secs(60),
            _ => Duration::from_secs(240),
        }
    }
}

/// `auto` resolved: KVM if the CPU announces virtualisation (`vmx` or `svm`), `/dev/kvm`
/// opens, and `kernel` boots with `probe` (an initramfs whose stage one answers
/// `vmprobe` at once) within 30 s. Some machines have a `/dev/kvm` that opens but runs
/// no guest (nested virtualisation without VMX: the boot stalls in real mode), so only
/// a boot tells; a CPU without the flags is TCG without the 30 s spent finding out.
pub fn resolve(emulator: &Emulator, requested: Accel, kernel: &Kernel, probe: &Path) -> Accel {
    if requested != Accel::Auto {
        return requested;
    }
    if let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo")
        && !announces_virtualisation(&cpuinfo)
    {
        eprintln!("vm-test: the CPU has no vmx or svm flag: TCG");
        return Accel::Tcg;
    }
    if let Err(error) = OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        eprintln!("vm-test: /dev/kvm does not open ({error}): TCG");
        return Accel::Tcg;
    }
    let mut command = qemu(emulator, Accel::Kvm, kernel, probe, "vmprobe=1");
    let found = Console::start(&mut command).map(|mut console| {
        let deadline = Instant::now() + Duration::from_secs(30);
        let found = console.wait_for("vm-test: probe ok", deadline, false);
        console.stop();
        matches!(found, Line::Text(_))
    });
    match found {
        Ok(true) => Accel::Kvm,
        _ => {
            eprintln!("vm-test: /dev/kvm opens but a guest does not boot with it within 30 s: TCG");
            Accel::Tcg
        }
    }
}

/// Whether a `/proc/cpuinfo` text lists `vmx` (Intel) or `svm` (AMD) among a CPU's flags.
fn announces_virtualisation(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter_map(|line| line.strip_prefix("flags")?.trim_start().strip_prefix(':'))
        .any(|flags| {
            flags
                .split_whitespace()
                .any(|flag| flag == "vmx" || flag == "svm")
        })
}

/// What one guest run gave.
#[derive(Default)]
pub struct Outcome {
    /// The tests counted up to the end, or up to what ended the guest early.
    pub totals: TestTotals,
    /// Binaries that exited non-zero, with their exit status (124: `timeout` stopped it).
    pub failed_binaries: Vec<(String, i32)>,
    /// What ended the guest before `vm-test: done`, if anything did: it did not boot,
    /// hung, or stopped (a kernel panic). The console's tail is printed with it.
    pub ended_early: Option<String>,
}

impl Outcome {
    /// Ends the run early for `reason`, and prints the console's tail.
    fn ended_early(mut self, reason: String, console: &Console) -> Self {
        eprintln!("vm-test: {reason}; the console's tail:\n{}", console.tail());
        self.ended_early = Some(reason);
        self
    }
}

/// Boots `kernel` with `initramfs` (its plan inside) and reads the console to the end or
/// to what ends the guest early (see [`Outcome::ended_early`]: a kernel panic ends qemu,
/// with `panic=-1` and `-no-reboot`). An error only when qemu does not start.
pub fn run(
    emulator: &Emulator,
    accel: Accel,
    kernel: &Kernel,
    initramfs: &Path,
    total: Duration,
) -> anyhow::Result<Outcome> {
    let mut command = qemu(emulator, accel, kernel, initramfs, "");
    eprintln!("+ {}", cmd::describe(&command));
    let mut console = Console::start(&mut command)?;
    let start = Instant::now();
    let mut outcome = Outcome::default();
    match console.wait_for("vm-test: guest up", start + accel.boot_timeout(), true) {
        Line::Text(_) => {}
        Line::Timeout => {
            console.stop();
            let reason = format!(
                "the guest did not boot within {} s",
                accel.boot_timeout().as_secs()
            );
            return Ok(outcome.ended_early(reason, &console));
        }
        Line::End => {
            let reason = format!("the guest stopped before it was up ({})", console.ended());
            return Ok(outcome.ended_early(reason, &console));
        }
    }
    let silence = accel.quiet_limit() + Duration::from_secs(60);
    loop {
        let deadline = (Instant::now() + silence).min(start + total);
        match console.next_line(deadline) {
            Line::Text(line) => {
                print_line(&line);
                cmd::add_result_line(&mut outcome.totals, &line);
                if let Some(rest) = line.strip_prefix("vm-test: exit ") {
                    let mut words = rest.split_whitespace();
                    if let (Some(name), Some(Ok(status))) =
                        (words.next(), words.next().map(str::parse::<i32>))
                        && status != 0
                    {
                        outcome.failed_binaries.push((name.to_owned(), status));
                    }
                }
                if line == "vm-test: done" {
                    console.stop();
                    return Ok(outcome);
                }
            }
            Line::Timeout => {
                console.stop();
                let reason = format!(
                    "the guest printed nothing for {} s or ran past {} min",
                    silence.as_secs(),
                    total.as_secs() / 60
                );
                return Ok(outcome.ended_early(reason, &console));
            }
            Line::End => {
                let reason = format!(
                    "the guest stopped before the end of its tests ({})",
                    console.ended()
                );
                return Ok(outcome.ended_early(reason, &console));
            }
        }
    }
}

fn qemu(
    emulator: &Emulator,
    accel: Accel,
    kernel: &Kernel,
    initramfs: &Path,
    extra_cmdline: &str,
) -> Command {
    let cpus = thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let mut command = Command::new(&emulator.binary);
    for folder in &emulator.firmware {
        command.arg("-L").arg(folder);
    }
    command
        .args(accel.args())
        .args(["-smp", &cpus.to_string(), "-m", "8G"])
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        // panic=-1 with -no-reboot: a panic ends qemu. oops=panic: an oops in a test
        // fails the run instead of leaving a stuck task. loglevel=4: errors and worse
        // among the tests' output. mitigations=off: page-table isolation alone costs
        // TCG a large share of its time; nothing tested depends on it.
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 oops=panic loglevel=4 mitigations=off {extra_cmdline}"
        ))
        // The host's root, read-only: the test binaries, the tools they run, the
        // unpacked kernel's modules. multidevs=remap: it spans several filesystems.
        .args([
            "-fsdev",
            "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
            "-device",
            "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        ])
        .stdin(Stdio::null());
    command
}

enum Line {
    Text(String),
    Timeout,
    End,
}

/// qemu's serial console (its stdout and stderr), line by line, echoed as it comes,
/// with the last lines kept for an error.
struct Console {
    child: Child,
    lines: mpsc::Receiver<String>,
    tail: VecDeque<String>,
}

const TAIL_LINES: usize = 60;

impl Console {
    fn start(command: &mut Command) -> anyhow::Result<Self> {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", command.get_program().to_string_lossy()))?;
        let (sender, lines) = mpsc::channel();
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let stderr = child.stderr.take().context("no stderr pipe")?;
        for stream in [
            Box::new(stdout) as Box<dyn std::io::Read + Send>,
            Box::new(stderr),
        ] {
            let sender = sender.clone();
            thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut buffer = Vec::new();
                // Bytes, not `lines()`: a console may carry invalid UTF-8.
                while reader.read_until(b'\n', &mut buffer).is_ok_and(|n| n > 0) {
                    let text = String::from_utf8_lossy(&buffer);
                    let text = text.trim_end_matches(['\n', '\r']).to_owned();
                    buffer.clear();
                    if sender.send(text).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Self {
            child,
            lines,
            tail: VecDeque::new(),
        })
    }

    fn next_line(&mut self, deadline: Instant) -> Line {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(text) => {
                if self.tail.len() == TAIL_LINES {
                    self.tail.pop_front();
                }
                self.tail.push_back(text.clone());
                Line::Text(text)
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Line::Timeout,
            Err(mpsc::RecvTimeoutError::Disconnected) => Line::End,
        }
    }

    /// Reads until a line equal to or starting with `marker` (returned as
    /// [`Line::Text`]), the deadline ([`Line::Timeout`]) or the end. `echo`: pass the
    /// lines through.
    fn wait_for(&mut self, marker: &str, deadline: Instant, echo: bool) -> Line {
        loop {
            match self.next_line(deadline) {
                Line::Text(text) => {
                    if echo {
                        print_line(&text);
                    }
                    if text.starts_with(marker) {
                        return Line::Text(text);
                    }
                }
                other => return other,
            }
        }
    }

    /// What ended the console early, for an error: qemu's exit status, and whether the
    /// tail shows a kernel panic.
    fn ended(&mut self) -> String {
        let status = self.stop();
        let panic = if self.tail().contains("Kernel panic") {
            ", a kernel panic"
        } else {
            ""
        };
        format!("qemu: {status}{panic}")
    }

    fn tail(&self) -> String {
        self.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Ends qemu (a no-op once it has exited) and returns how it exited.
    fn stop(&mut self) -> String {
        let _ = self.child.kill();
        self.child
            .wait()
            .map_or_else(|error| error.to_string(), |status| status.to_string())
    }
}

fn print_line(text: &str) {
    #[expect(clippy::print_stdout, reason = "the guest's console, passed through")]
    {
        println!("{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::announces_virtualisation;

    #[test]
    fn the_cpu_flags_tell_whether_kvm_can_run() {
        let intel = "processor\t: 0\nflags\t\t: fpu vme sse2 vmx ept\nbugs\t\t: spectre_v1\n";
        let amd = "flags\t\t: fpu svm npt\n";
        let nested_without = "flags\t\t: fpu hypervisor sse2 vmxnet\nvmx flags\t: ept\n";
        assert!(announces_virtualisation(intel));
        assert!(announces_virtualisation(amd));
        assert!(!announces_virtualisation(nested_without));
        assert!(!announces_virtualisation(""));
    }
}
