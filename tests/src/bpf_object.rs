//! The eBPF object built by CI, loaded straight into the kernel for BPF_PROG_TEST_RUN:
//! its maps are pinned in a bpffs folder of its own (so tests share no state with each
//! other or with a daemon), seeded and read through typed accessors. The folder is
//! removed on drop, also when a test panics.

use std::{
    io,
    path::{Path, PathBuf},
    sync::Mutex,
};

use aya::{
    Ebpf, EbpfLoader, Pod,
    maps::{Array, HashMap, LpmTrie, Map, MapError, PerCpuArray, PerCpuHashMap, lpm_trie::Key},
    programs::{ProgramError, SchedClassifier, TestRun, TestRunOptions},
};
use cni_ebpf_common::{
    DropReason, EndpointCounters, EndpointInfo, EndpointKey, FlowCounts, FragmentKey,
    FragmentTarget, NatConfig, NatCounter, NatEntry, NatKey, NatReverseKey, PortKey, PortTarget,
    RefusedFlows, TARGET_COUNT, Uplinks, map_names,
};
use nix::{
    mount::{MsFlags, mount},
    sys::statfs::statfs,
};

use crate::unique_name;

const BPFFS: &str = "/sys/fs/bpf";

/// The object CI built: `EBPF_CNI_OBJECT`, else where `cargo xtask build` leaves it.
pub fn object_path() -> PathBuf {
    std::env::var_os("EBPF_CNI_OBJECT").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/ebpf/bpfel-unknown-none/release/cni-ebpf"
            ))
        },
        PathBuf::from,
    )
}

/// `/sys/fs/bpf/ecni-<pid>-<n>-<tag>`, removed with everything pinned in it on drop.
pub struct BpfFolder {
    path: PathBuf,
}

impl BpfFolder {
    pub fn new(tag: &str) -> Self {
        ensure_bpffs();
        let path = Path::new(BPFFS).join(unique_name(tag));
        std::fs::create_dir(&path)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", path.display()));
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BpfFolder {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            // No panic while a failing test may already be unwinding.
            Err(error) => eprintln!("cannot remove {}: {error}", self.path.display()),
        }
    }
}

/// Mounts bpffs on /sys/fs/bpf when the machine has not (as the daemon does); once per
/// process, so parallel tests cannot stack two mounts.
fn ensure_bpffs() {
    static MOUNTING: Mutex<()> = Mutex::new(());
    let _serial = MOUNTING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let stat = statfs(BPFFS).unwrap_or_else(|error| panic!("cannot statfs {BPFFS}: {error}"));
    // The magic's type differs between libc targets; compare as u64.
    if stat.filesystem_type().0 as u64 != libc::BPF_FS_MAGIC as u64 {
        mount(
            Some("bpf"),
            BPFFS,
            Some("bpf"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap_or_else(|error| panic!("cannot mount bpffs on {BPFFS}: {error}"));
    }
}

/// What one BPF_PROG_TEST_RUN returned.
pub struct Run {
    pub verdict: u32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
}

/// The loaded object. Fields drop in order: the maps' descriptors close before their
/// folder is removed.
pub struct BpfObject {
    ebpf: Ebpf,
    folder: BpfFolder,
}

impl BpfObject {
    /// Loads the object with fresh maps and loads the classifiers named in `programs`.
    pub fn load(tag: &str, programs: &[&str]) -> Self {
        Self::load_sized(tag, programs, None)
    }

    /// Like [`Self::load`], with flow tables (and `DEST_PORTS`) of `max_flows` entries
    /// each when given, as the daemon's `--nat-max-flows` sizes them.
    pub fn load_sized(tag: &str, programs: &[&str], max_flows: Option<u32>) -> Self {
        let folder = BpfFolder::new(tag);
        let path = object_path();
        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(folder.path());
        if let Some(max_flows) = max_flows {
            for name in [
                map_names::NAT_OUT,
                map_names::NAT_IN,
                map_names::NAT_INBOUND,
                map_names::HOSTPORT_FLOWS,
                map_names::DEST_PORTS,
            ] {
                loader.map_max_entries(name, max_flows);
            }
        }
        let mut ebpf = loader.load_file(&path).unwrap_or_else(|error| {
            panic!(
                "cannot load {} (build it with `cargo xtask build`): {error}",
                path.display()
            )
        });
        for &name in programs {
            classifier_mut(&mut ebpf, name)
                .load()
                .unwrap_or_else(|error| panic!("the verifier rejects {name}: {error:?}"));
        }
        Self { ebpf, folder }
    }

    /// Runs classifier `name` once on `frame` (the skb's device is the caller's loopback),
    /// as at that device's TC ingress.
    pub fn run(&self, name: &str, frame: &[u8]) -> Run {
        self.run_at(name, frame, Hook::TcIngress)
    }

    /// Like [`Self::run`], on `hook`.
    pub fn run_at(&self, name: &str, frame: &[u8], hook: Hook) -> Run {
        self.try_run_at(name, frame, hook).unwrap_or_else(|error| {
            panic!("BPF_PROG_TEST_RUN of {name} on {frame:02x?} failed: {error:?}")
        })
    }

    /// Like [`Self::run`], but returns the kernel's refusal (it checks some frames before
    /// the program sees them) instead of panicking.
    pub fn try_run(&self, name: &str, frame: &[u8]) -> Result<Run, ProgramError> {
        self.try_run_at(name, frame, Hook::TcIngress)
    }

    fn try_run_at(&self, name: &str, frame: &[u8], hook: Hook) -> Result<Run, ProgramError> {
        let program: &SchedClassifier = self
            .ebpf
            .program(name)
            .unwrap_or_else(|| panic!("the object has no program {name}"))
            .try_into()
            .unwrap_or_else(|error| panic!("{name} is not a classifier: {error}"));
        // Room to spare, so a program that grew the frame would show instead of ENOSPC.
        let mut out = vec![0; frame.len() + 256];
        let context = hook.context();
        let result = program.test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&context),
            ..TestRunOptions::new()
        })?;
        out.truncate(result.data_size_out as usize);
        Ok(Run {
            verdict: result.return_value,
            frame: out,
        })
    }

    /// Pins classifier `name` in this object's folder (for `tc ... object-pinned`), so it
    /// can be attached to a real device; returns the pin's path.
    pub fn pin_program(&mut self, name: &str) -> PathBuf {
        let path = self.folder.path().join(format!("prog_{name}"));
        classifier_mut(&mut self.ebpf, name)
            .pin(&path)
            .unwrap_or_else(|error| panic!("cannot pin {name} at {}: {error}", path.display()));
        path
    }

    /// Writes one entry of the endpoints map, as the daemon does for a pod.
    pub fn insert_endpoint(&mut self, addr: [u8; 4], info: EndpointInfo) {
        self.hash_insert(map_names::ENDPOINTS, EndpointKey { addr }, info);
    }

    /// New flows of the pod at `pod_addr` refused (`NAT_REFUSED`), by reason, summed
    /// over CPUs.
    pub fn nat_refused(&self, pod_addr: [u8; 4]) -> RefusedFlows {
        let refused: PerCpuHashMap<_, [u8; 4], RefusedFlows> =
            PerCpuHashMap::try_from(self.map(map_names::NAT_REFUSED))
                .expect("NAT_REFUSED is a per-CPU LRU hash map");
        match refused.get(&pod_addr, 0) {
            Ok(per_cpu) => per_cpu
                .iter()
                .fold(RefusedFlows::default(), |sum, cpu| sum.add(cpu)),
            Err(MapError::KeyNotFound) => RefusedFlows::default(),
            Err(error) => panic!("cannot read the refusals of {pod_addr:?}: {error}"),
        }
    }

    /// The pod at `pod_addr`'s entries in the flow tables as its budget counts them
    /// (`FLOW_COUNTS`; zero when absent).
    pub fn flow_counts(&self, pod_addr: [u8; 4]) -> FlowCounts {
        let counts: HashMap<_, [u8; 4], FlowCounts> =
            HashMap::try_from(self.map(map_names::FLOW_COUNTS)).expect("FLOW_COUNTS is a hash map");
        match counts.get(&pod_addr, 0) {
            Ok(counts) => counts,
            Err(MapError::KeyNotFound) => FlowCounts::default(),
            Err(error) => panic!("cannot read the flow counts of {pod_addr:?}: {error}"),
        }
    }

    /// The node ports the pod of `flow` holds toward its destination (`DEST_PORTS`; 0
    /// when absent).
    pub fn dest_ports(&self, flow: &NatKey) -> u32 {
        let held: HashMap<_, NatKey, u32> =
            HashMap::try_from(self.map(map_names::DEST_PORTS)).expect("DEST_PORTS is a hash map");
        match held.get(&flow.destination(), 0) {
            Ok(count) => count,
            Err(MapError::KeyNotFound) => 0,
            Err(error) => panic!("cannot read the ports of {flow:?}: {error}"),
        }
    }

    /// The counters of the endpoint behind `ifindex`, summed over CPUs (zero when absent).
    pub fn endpoint_counters(&self, ifindex: u32) -> EndpointCounters {
        let map = self
            .ebpf
            .map(map_names::ENDPOINT_COUNTERS)
            .expect("the object has the endpoint counters map");
        let counters: PerCpuHashMap<_, u32, EndpointCounters> =
            PerCpuHashMap::try_from(map).expect("ENDPOINT_COUNTERS is a per-CPU hash map");
        match counters.get(&ifindex, 0) {
            Ok(per_cpu) => per_cpu
                .iter()
                .fold(EndpointCounters::default(), |sum, cpu| sum.plus(*cpu)),
            Err(MapError::KeyNotFound) => EndpointCounters::default(),
            Err(error) => panic!("cannot read the counters of ifindex {ifindex}: {error}"),
        }
    }

    /// Drops counted for `reason`, summed over CPUs.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.per_cpu_sum(map_names::DROPS, reason as u32)
    }

    // --- hostPort maps ---------------------------------------------------------------------

    /// Maps (`proto`, `host_addr`, `host_port`) to `pod_addr`:`pod_port`, as the daemon
    /// does: the mapping, the node address it lives on, and the target port's bit.
    pub fn insert_host_port(
        &mut self,
        proto: u8,
        host_addr: [u8; 4],
        host_port: u16,
        pod_addr: [u8; 4],
        pod_port: u16,
    ) {
        let key = PortKey {
            host_addr,
            host_port,
            proto,
            pad: 0,
        };
        let target = PortTarget {
            pod_addr,
            pod_port,
            pad: [0; 2],
        };
        self.hash_insert(map_names::HOSTPORTS, key, target);
        self.hash_insert(map_names::NODE_ADDRS, host_addr, 1u8);
        let mut targets: Array<_, u32> = Array::try_from(self.map_mut(map_names::HOSTPORT_TARGETS))
            .expect("HOSTPORT_TARGETS is an array");
        let word = u32::from(pod_port) / 32;
        let old = targets.get(&word, 0).unwrap_or(0);
        let bits = old | 1 << (pod_port % 32);
        targets
            .set(word, bits, 0)
            .unwrap_or_else(|error| panic!("cannot mark port {pod_port}: {error}"));
        if bits != old {
            let ports = targets.get(&TARGET_COUNT, 0).unwrap_or(0) + 1;
            targets
                .set(TARGET_COUNT, ports, 0)
                .unwrap_or_else(|error| panic!("cannot count port {pod_port}: {error}"));
        }
    }

    // --- Source NAT maps ------------------------------------------------------------------

    /// Writes the NAT configuration as the daemon does with one uplink: `config`, and
    /// its uplink (`uplink_ifindex`, with `node_addr`) as the only one.
    pub fn set_nat_config(&mut self, config: NatConfig) {
        let mut array: Array<_, NatConfig> =
            Array::try_from(self.map_mut(map_names::NAT_CONFIG)).expect("NAT_CONFIG is an array");
        array
            .set(0, config, 0)
            .unwrap_or_else(|error| panic!("cannot write the NAT configuration: {error}"));
        let mut uplinks = Uplinks::default();
        assert!(uplinks.push(config.uplink_ifindex, config.node_addr));
        self.set_uplinks(uplinks);
    }

    /// Writes the uplinks NAT translates on.
    pub fn set_uplinks(&mut self, uplinks: Uplinks) {
        let mut array: Array<_, Uplinks> =
            Array::try_from(self.map_mut(map_names::UPLINKS)).expect("UPLINKS is an array");
        array
            .set(0, uplinks, 0)
            .unwrap_or_else(|error| panic!("cannot write the uplinks: {error}"));
    }

    /// Adds `addr/prefix_len` to the destinations that keep the pod's address.
    pub fn insert_cluster_cidr(&mut self, addr: [u8; 4], prefix_len: u32) {
        let mut trie: LpmTrie<_, [u8; 4], u8> =
            LpmTrie::try_from(self.map_mut(map_names::CLUSTER_CIDRS))
                .expect("CLUSTER_CIDRS is an LPM trie");
        trie.insert(&Key::new(prefix_len, addr), 1, 0)
            .unwrap_or_else(|error| panic!("cannot insert {addr:?}/{prefix_len}: {error}"));
    }

    /// The pod side of a translated flow, if `NAT_OUT` has it.
    pub fn nat_out(&self, key: &NatKey) -> Option<NatEntry> {
        self.hash_get(map_names::NAT_OUT, key)
    }

    /// The node side of a translated flow, if `NAT_IN` has it.
    pub fn nat_in(&self, key: &NatReverseKey) -> Option<NatEntry> {
        self.hash_get(map_names::NAT_IN, key)
    }

    pub fn insert_nat_out(&mut self, key: NatKey, entry: NatEntry) {
        self.hash_insert(map_names::NAT_OUT, key, entry);
    }

    pub fn insert_nat_in(&mut self, key: NatReverseKey, entry: NatEntry) {
        self.hash_insert(map_names::NAT_IN, key, entry);
    }

    /// Every entry of `NAT_OUT`, in the map's order.
    pub fn nat_out_entries(&self) -> Vec<(NatKey, NatEntry)> {
        self.hash_entries(map_names::NAT_OUT)
    }

    /// Every record of `NAT_FRAGMENTS` (fragmented datagrams whose first fragment was
    /// translated), in the map's order.
    pub fn nat_fragments(&self) -> Vec<(FragmentKey, FragmentTarget)> {
        self.hash_entries(map_names::NAT_FRAGMENTS)
    }

    /// Every note of `NAT_INBOUND` (flows opened from outside to a pod's own address),
    /// with its state and when it was last seen.
    pub fn nat_inbound(&self) -> Vec<(NatKey, NatEntry)> {
        self.hash_entries(map_names::NAT_INBOUND)
    }

    pub fn insert_nat_inbound(&mut self, key: NatKey, note: NatEntry) {
        self.hash_insert(map_names::NAT_INBOUND, key, note);
    }

    /// Every connection of `HOSTPORT_FLOWS` (through a hostPort mapping, keyed from the
    /// pod's side), with its state and when it was last seen.
    pub fn hostport_flows(&self) -> Vec<(NatKey, NatEntry)> {
        self.hash_entries(map_names::HOSTPORT_FLOWS)
    }

    pub fn insert_hostport_flow(&mut self, key: NatKey, entry: NatEntry) {
        self.hash_insert(map_names::HOSTPORT_FLOWS, key, entry);
    }

    pub fn insert_nat_fragment(&mut self, key: FragmentKey, target: FragmentTarget) {
        self.hash_insert(map_names::NAT_FRAGMENTS, key, target);
    }

    /// Every entry of `NAT_IN`, in the map's order.
    pub fn nat_in_entries(&self) -> Vec<(NatReverseKey, NatEntry)> {
        self.hash_entries(map_names::NAT_IN)
    }

    /// Points every per-destination port cursor at `offset` in the port
    /// range: the next new flow to any destination tries that port first.
    pub fn set_nat_cursors(&mut self, offset: u32) {
        let mut array: Array<_, u32> =
            Array::try_from(self.map_mut(map_names::NAT_CURSORS)).expect("NAT_CURSORS is an array");
        for slot in 0..array.len() {
            // Stored as the offset plus one (0: not used yet).
            array
                .set(slot, offset + 1, 0)
                .unwrap_or_else(|error| panic!("cannot write cursor {slot}: {error}"));
        }
    }

    /// A NAT counter, summed over CPUs.
    pub fn nat_counter(&self, counter: NatCounter) -> u64 {
        self.per_cpu_sum(map_names::NAT_STATS, counter as u32)
    }

    // --- Typed access shared by the accessors above ---------------------------------------

    fn map(&self, name: &str) -> &Map {
        self.ebpf
            .map(name)
            .unwrap_or_else(|| panic!("the object has no map {name}"))
    }

    fn map_mut(&mut self, name: &str) -> &mut Map {
        self.ebpf
            .map_mut(name)
            .unwrap_or_else(|| panic!("the object has no map {name}"))
    }

    /// Slot `index` of the per-CPU array `name`, summed over CPUs.
    fn per_cpu_sum(&self, name: &str, index: u32) -> u64 {
        let array: PerCpuArray<_, u64> = PerCpuArray::try_from(self.map(name))
            .unwrap_or_else(|error| panic!("{name} is not a per-CPU array: {error}"));
        array
            .get(&index, 0)
            .unwrap_or_else(|error| panic!("cannot read slot {index} of {name}: {error}"))
            .iter()
            .sum()
    }

    /// `name` is a hash or LRU hash map of `K` -> `V`.
    fn hash_get<K: Pod + std::fmt::Debug, V: Pod>(&self, name: &str, key: &K) -> Option<V> {
        let map: HashMap<_, K, V> = HashMap::try_from(self.map(name))
            .unwrap_or_else(|error| panic!("{name} is not a hash map: {error}"));
        match map.get(key, 0) {
            Ok(value) => Some(value),
            Err(MapError::KeyNotFound) => None,
            Err(error) => panic!("cannot read {key:?} in {name}: {error}"),
        }
    }

    fn hash_insert<K: Pod + std::fmt::Debug, V: Pod>(&mut self, name: &str, key: K, value: V) {
        let mut map: HashMap<_, K, V> = HashMap::try_from(self.map_mut(name))
            .unwrap_or_else(|error| panic!("{name} is not a hash map: {error}"));
        map.insert(key, value, 0)
            .unwrap_or_else(|error| panic!("cannot insert {key:?} in {name}: {error}"));
    }

    fn hash_entries<K: Pod, V: Pod>(&self, name: &str) -> Vec<(K, V)> {
        let map: HashMap<_, K, V> = HashMap::try_from(self.map(name))
            .unwrap_or_else(|error| panic!("{name} is not a hash map: {error}"));
        map.iter()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|error| panic!("cannot iterate {name}: {error}"))
    }
}

fn classifier_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> &'a mut SchedClassifier {
    ebpf.program_mut(name)
        .unwrap_or_else(|| panic!("the object has no program {name}"))
        .try_into()
        .unwrap_or_else(|error| panic!("{name} is not a classifier: {error}"))
}

/// Where a test run's program runs, as the program can tell: by the frame's input
/// device (`skb->skb_iif`, `ingress_ifindex` in `__sk_buff`), which TC ingress sets to
/// the device itself and a netkit pair clears (`cni-ebpf`'s `packet::at_tc_ingress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    TcIngress,
    NetkitPeer,
}

impl Hook {
    /// The start of a `struct __sk_buff` (UAPI `linux/bpf.h`: eleven `__u32`, `len` to
    /// `ifindex`) for `BPF_PROG_TEST_RUN`'s context: zero but for `ingress_ifindex` and
    /// `ifindex`, both the loopback's (1) at TC ingress; the kernel refuses the other
    /// fields here.
    fn context(self) -> Vec<u8> {
        const INGRESS_IFINDEX: usize = 9 * 4;
        const IFINDEX: usize = 10 * 4;
        const LOOPBACK: u32 = 1;
        let mut context = vec![0u8; 11 * 4];
        let input = match self {
            Self::TcIngress => LOOPBACK,
            Self::NetkitPeer => 0,
        };
        context[INGRESS_IFINDEX..INGRESS_IFINDEX + 4].copy_from_slice(&input.to_ne_bytes());
        context[IFINDEX..IFINDEX + 4].copy_from_slice(&LOOPBACK.to_ne_bytes());
        context
    }
}
