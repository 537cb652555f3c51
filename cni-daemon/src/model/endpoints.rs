//! Endpoint records ([`EndpointRecord`], the daemon's own type, versioned): one JSON
//! file per pod interface in the state folder, mirrored into the pinned BPF endpoints
//! map (pod IPv4 -> host veth, pod MAC).
//!
//! The files are the source of truth: a restarted daemon reads them, drops those whose
//! host veth is gone (a DEL that ran while the daemon was down), and rewrites the map.
//! A record is written whole or not at all (a temporary file, fsync, rename, fsync of
//! the folder), readable by root only. A record that cannot be read at start (cut short
//! by a crash of the machine, emptied, edited) is renamed `<name>.bad` with a warning and
//! rebuilt from what the node still has ([`Endpoints::rebuild`]); it never stops the
//! daemon.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
};

use aya::maps::{HashMap, MapData};
use cni_ebpf_common::{EndpointInfo, EndpointKey, endpoint_flags};

use cni_api::{EndpointId, naming};

use crate::model::record::{EndpointRecord, RECORD_VERSION};

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("state file {path}: {source}")]
    State { path: String, source: io::Error },
    #[error("state file {path} is not a valid record: {source}")]
    Corrupt {
        path: String,
        source: serde_json::Error,
    },
    #[error("{addr} already belongs to {owner_container}/{owner_ifname}")]
    AddressTaken {
        addr: IpAddr,
        owner_container: String,
        owner_ifname: String,
    },
    #[error("cannot rebuild unreadable records: {0}")]
    Rebuild(String),
    #[error("endpoints map: {0}")]
    Map(#[from] aya::maps::MapError),
}

pub struct Endpoints {
    dir: PathBuf,
    records: BTreeMap<EndpointId, EndpointRecord>,
    map: HashMap<MapData, EndpointKey, EndpointInfo>,
    /// Host veths (by index) with a root qdisc: their pods' frames go through it
    /// (`endpoint_flags::SHAPED`).
    queued: BTreeSet<u32>,
}

impl Endpoints {
    /// Reads the records in `dir`, forgets those whose host veth no longer exists, and
    /// makes `map` hold exactly the remaining endpoints.
    /// Returns the records and the endpoints dropped because their veth is gone.
    pub fn open(
        dir: &Path,
        map: HashMap<MapData, EndpointKey, EndpointInfo>,
    ) -> Result<(Self, Vec<EndpointRecord>), EndpointError> {
        fs::create_dir_all(dir).map_err(|source| state_error(dir, source))?;
        let mut endpoints = Self {
            dir: dir.to_owned(),
            records: BTreeMap::new(),
            map,
            queued: BTreeSet::new(),
        };
        let mut gone = Vec::new();
        let mut bad = Vec::new();
        for entry in fs::read_dir(dir).map_err(|source| state_error(dir, source))? {
            let path = entry.map_err(|source| state_error(dir, source))?.path();
            let name = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.ends_with(TMP_SUFFIX) {
                tracing::info!(path = %path.display(), "removing a half-written record");
                remove_file(&path)?;
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let record = match read_record(&path) {
                Ok(record) => record,
                Err(error) => {
                    let aside = path.with_file_name(format!("{name}{BAD_SUFFIX}"));
                    fs::rename(&path, &aside).map_err(|source| state_error(&path, source))?;
                    tracing::warn!(
                        %error,
                        moved_to = %aside.display(),
                        "an unreadable endpoint record is set aside; rebuilding it from the node"
                    );
                    bad.extend(id_of_record(stem));
                    continue;
                }
            };
            if host_veth_alive(&record) {
                endpoints.records.insert(record.id.clone(), record);
            } else {
                tracing::info!(
                    container = %record.id.container_id,
                    ifname = %record.id.ifname,
                    veth = %record.host_veth,
                    "forgetting an endpoint whose veth is gone"
                );
                remove_file(&path)?;
                gone.push(record);
            }
        }
        if !bad.is_empty() {
            endpoints.rebuild(bad)?;
        }
        endpoints.queued = match crate::datapath::tc_block::queued_links(None) {
            Ok(queued) => queued,
            Err(error) => {
                // Through the host veth is right for every pod, only slower.
                tracing::warn!(%error, "cannot list the qdiscs: every pod's frames go through its host veth");
                endpoints.records.values().map(|e| e.host_ifindex).collect()
            }
        };
        endpoints.rewrite_map()?;
        Ok((endpoints, gone))
    }

    /// Rebuilds the records of `ids`, set aside unreadable, from what the node still
    /// has: the host veth that carries the id in its alias (`ebpf-cni/<network>/<container
    /// id>/<ifname>`) or the plugin's name for it ([`naming::host_veth`]; the network is
    /// then the other records' one) and the endpoints map's entries for that veth (addresses, MACs,
    /// masquerading). What only the record held is lost: the netns path, the port
    /// mappings (the pod's hostPorts come back with its next ADD) and the bandwidth
    /// limits' values (the qdiscs that enforce them stay, and are still honoured);
    /// the cluster ranges are taken from another endpoint of the same network. An id
    /// with no such veth, or no entry in the map, is dropped.
    fn rebuild(&mut self, ids: Vec<EndpointId>) -> Result<(), EndpointError> {
        let links = crate::datapath::tc_block::aliased_links(naming::ALIAS_PREFIX)
            .map_err(|error| EndpointError::Rebuild(error.to_string()))?;
        let entries: Vec<(EndpointKey, EndpointInfo)> =
            self.map.iter().collect::<Result<_, _>>()?;
        for id in ids {
            let by_alias = links.iter().find_map(|(name, index, alias)| {
                let (network, container_id, ifname) = naming::parse_alias(alias)?;
                (container_id == id.container_id && ifname == id.ifname)
                    .then(|| (Some(network.to_owned()), name.clone(), *index))
            });
            let found = by_alias.or_else(|| {
                let name = naming::host_veth(&id.container_id, &id.ifname);
                let index = nix::net::if_::if_nametoindex(name.as_str()).ok()?;
                Some((None, name, index))
            });
            let Some((network, host_veth, host_ifindex)) = found else {
                tracing::warn!(container = %id.container_id, ifname = %id.ifname,
                    "no veth of this endpoint is left: dropped");
                continue;
            };
            // Without an alias, the network is the one every other record names, if any.
            let network = network.or_else(|| {
                let mut networks = self.records.values().map(|other| &other.network);
                let first = networks.next()?;
                networks.all(|other| other == first).then(|| first.clone())
            });
            let Some(network) = network else {
                tracing::warn!(container = %id.container_id, ifname = %id.ifname,
                    veth = %host_veth, "the network of this endpoint is unknown: dropped");
                continue;
            };
            let mine: Vec<&(EndpointKey, EndpointInfo)> = entries
                .iter()
                .filter(|(_, info)| info.host_ifindex == host_ifindex)
                .collect();
            let Some((_, info)) = mine.first() else {
                tracing::warn!(container = %id.container_id, ifname = %id.ifname,
                    veth = %host_veth, "the endpoints map has nothing of this endpoint: dropped");
                continue;
            };
            let cluster_cidrs = self
                .records
                .values()
                .find(|other| other.network == network)
                .map(|other| other.cluster_cidrs.clone())
                .unwrap_or_default();
            // The gateway of the range the address is in, as a record of the same
            // network has it (IPAM gives a range one gateway).
            let gateway = self.records.values().find_map(|other| {
                let gateway = other.gateway?;
                (other.network == network
                    && other.ips.iter().any(|net| {
                        net.contains(&gateway)
                            && mine
                                .iter()
                                .any(|(key, _)| net.contains(&IpAddr::V4(key.addr.into())))
                    }))
                .then_some(gateway)
            });
            let endpoint = EndpointRecord {
                version: RECORD_VERSION,
                id: id.clone(),
                network,
                netns: PathBuf::new(),
                host_veth,
                host_ifindex,
                host_mac: info.host_mac.into(),
                mac: info.pod_mac.into(),
                ips: mine
                    .iter()
                    .map(|(key, _)| {
                        ipnet::IpNet::V4(ipnet::Ipv4Net::from(Ipv4Addr::from(key.addr)))
                    })
                    .collect(),
                masquerade: info.flags & endpoint_flags::MASQUERADE != 0,
                cluster_cidrs,
                port_mappings: Vec::new(),
                bandwidth: None,
                gateway,
                pod: None,
            };
            write_record(&self.record_path(&id), &endpoint)?;
            tracing::warn!(
                container = %id.container_id,
                ifname = %id.ifname,
                veth = %endpoint.host_veth,
                ips = ?endpoint.ips,
                "endpoint rebuilt from the node (its hostPorts return with its next ADD)"
            );
            self.records.insert(id, endpoint);
        }
        Ok(())
    }

    /// Refuses `endpoint` when one of its addresses belongs to another endpoint;
    /// changes nothing.
    pub fn check(&self, endpoint: &EndpointRecord) -> Result<(), EndpointError> {
        for addr in endpoint.ips.iter().map(ipnet::IpNet::addr) {
            if let Some(owner) = self.owner_of(addr).filter(|owner| owner.id != endpoint.id) {
                return Err(EndpointError::AddressTaken {
                    addr,
                    owner_container: owner.id.container_id.clone(),
                    owner_ifname: owner.id.ifname.clone(),
                });
            }
        }
        Ok(())
    }

    /// Records `endpoint` (replacing a record with the same id) and writes its addresses
    /// into the map. Refuses an address owned by another endpoint. All or nothing: on a
    /// failure (a full map, a failed write) the map and the records are as they were.
    pub fn attach(&mut self, endpoint: EndpointRecord) -> Result<(), EndpointError> {
        self.check(&endpoint)?;
        let queued = match crate::datapath::tc_block::queued_links(Some(endpoint.host_ifindex)) {
            Ok(queued) => !queued.is_empty(),
            Err(error) => {
                tracing::warn!(%error, veth = %endpoint.host_veth, "cannot list the veth's qdiscs: its frames go through it");
                true
            }
        };
        let info = endpoint_info(&endpoint, queued);
        let previous = self.records.get(&endpoint.id).cloned();
        let new_keys: Vec<EndpointKey> = ipv4_keys(&endpoint).collect();
        let old_keys: Vec<EndpointKey> = previous.iter().flat_map(ipv4_keys).collect();
        for (done, key) in new_keys.iter().enumerate() {
            if let Err(error) = self.map.insert(key, info, 0) {
                self.restore(&new_keys[..done], previous.as_ref());
                return Err(error.into());
            }
        }
        if let Err(error) = write_record(&self.record_path(&endpoint.id), &endpoint) {
            self.restore(&new_keys, previous.as_ref());
            // The write may have failed after its rename (the folder's fsync).
            if let Some(previous) = &previous {
                let _ = write_record(&self.record_path(&previous.id), previous);
            }
            return Err(error);
        }
        for key in old_keys.iter().filter(|key| !new_keys.contains(key)) {
            crate::maps::removed(self.map.remove(key))?;
        }
        tracing::info!(
            container = %endpoint.id.container_id,
            ifname = %endpoint.id.ifname,
            veth = %endpoint.host_veth,
            ips = ?endpoint.ips,
            "endpoint attached"
        );
        if queued {
            self.queued.insert(endpoint.host_ifindex);
        } else {
            self.queued.remove(&endpoint.host_ifindex);
        }
        self.records.insert(endpoint.id.clone(), endpoint);
        Ok(())
    }

    /// Follows a change of link `ifindex`'s root qdisc (`queued`: a qdisc other than
    /// the veth's default `noqueue`): the map entries of the endpoint on that host veth
    /// get the flag or lose it. Returns whether anything changed; a link that is no
    /// endpoint's changes nothing.
    pub fn set_queued(&mut self, ifindex: u32, queued: bool) -> Result<bool, EndpointError> {
        let owners: Vec<EndpointRecord> = self
            .records
            .values()
            .filter(|endpoint| endpoint.host_ifindex == ifindex)
            .cloned()
            .collect();
        if owners.is_empty() || self.queued.contains(&ifindex) == queued {
            return Ok(false);
        }
        for endpoint in &owners {
            let info = endpoint_info(endpoint, queued);
            for key in ipv4_keys(endpoint) {
                self.map.insert(key, info, 0)?;
            }
        }
        if queued {
            self.queued.insert(ifindex);
        } else {
            self.queued.remove(&ifindex);
        }
        Ok(true)
    }

    /// Undoes a part-done [`Self::attach`]: the keys `inserted` go, and `previous`'s
    /// entries are written back as they were. Best effort: it runs on a failure path.
    fn restore(&mut self, inserted: &[EndpointKey], previous: Option<&EndpointRecord>) {
        for key in inserted {
            let _ = crate::maps::removed(self.map.remove(key));
        }
        if let Some(previous) = previous {
            let info = endpoint_info(previous, self.queued.contains(&previous.host_ifindex));
            for key in ipv4_keys(previous) {
                let _ = self.map.insert(key, info, 0);
            }
        }
    }

    /// Forgets `id`; returns its record when it was known.
    pub fn detach(&mut self, id: &EndpointId) -> Result<Option<EndpointRecord>, EndpointError> {
        let Some(endpoint) = self.records.get(id).cloned() else {
            return Ok(None);
        };
        self.unmap(&endpoint)?;
        remove_file(&self.record_path(id))?;
        self.records.remove(id);
        tracing::info!(container = %id.container_id, ifname = %id.ifname, "endpoint detached");
        Ok(Some(endpoint))
    }

    /// The ids of `network`'s endpoints that are not in `keep`.
    pub fn stale(&self, network: &str, keep: &[EndpointId]) -> Vec<EndpointId> {
        self.records
            .values()
            .filter(|endpoint| endpoint.network == network && !keep.contains(&endpoint.id))
            .map(|endpoint| endpoint.id.clone())
            .collect()
    }

    /// The host veths whose pods get their frames through a root qdisc.
    pub fn queued(&self) -> Vec<u32> {
        self.queued.iter().copied().collect()
    }

    pub fn get(&self, id: &EndpointId) -> Option<&EndpointRecord> {
        self.records.get(id)
    }

    pub fn list(&self) -> impl Iterator<Item = &EndpointRecord> {
        self.records.values()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn owner_of(&self, addr: IpAddr) -> Option<&EndpointRecord> {
        self.records
            .values()
            .find(|endpoint| endpoint.ips.iter().any(|ip| ip.addr() == addr))
    }

    fn unmap(&mut self, endpoint: &EndpointRecord) -> Result<(), EndpointError> {
        for key in ipv4_keys(endpoint) {
            crate::maps::removed(self.map.remove(&key))?;
        }
        Ok(())
    }

    /// Makes the map hold exactly the records' addresses: the records' entries go in
    /// (over equal ones) before stale ones go. A restart never leaves a moment without a
    /// live pod's entry, in which the running programs would hand its traffic to the
    /// node's stack (a hostPort connection from outside was answered with a reset; the
    /// moment was long enough to hit in a software-emulated guest).
    fn rewrite_map(&mut self) -> Result<(), EndpointError> {
        let before: Vec<EndpointKey> = self.map.keys().collect::<Result<_, _>>()?;
        let records: Vec<EndpointRecord> = self.records.values().cloned().collect();
        let mut wanted = Vec::new();
        for endpoint in &records {
            let info = endpoint_info(endpoint, self.queued.contains(&endpoint.host_ifindex));
            for key in ipv4_keys(endpoint) {
                self.map.insert(key, info, 0)?;
                wanted.push(key.addr);
            }
        }
        for key in before.iter().filter(|key| !wanted.contains(&key.addr)) {
            crate::maps::removed(self.map.remove(key))?;
        }
        Ok(())
    }

    fn record_path(&self, id: &EndpointId) -> PathBuf {
        // Container ids never contain '@' (CNI spec charset), so the name is unambiguous.
        self.dir
            .join(format!("{}@{}.json", id.container_id, id.ifname))
    }
}

/// Suffix of a record being written; one left at start is a write cut short.
const TMP_SUFFIX: &str = ".json.tmp";
/// Suffix given to an unreadable record set aside at start.
const BAD_SUFFIX: &str = ".bad";
/// The id in a record's file name (`<container id>@<ifname>`, see `record_path`).
fn id_of_record(stem: &str) -> Option<EndpointId> {
    let (container_id, ifname) = stem.split_once('@')?;
    Some(EndpointId {
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
    })
}

/// The map value of `endpoint`; `queued`: its host veth has a root qdisc.
fn endpoint_info(endpoint: &EndpointRecord, queued: bool) -> EndpointInfo {
    let mut flags = 0;
    if endpoint.masquerade {
        flags |= endpoint_flags::MASQUERADE;
    }
    if queued {
        flags |= endpoint_flags::SHAPED;
    }
    if endpoint
        .bandwidth
        .as_ref()
        .is_some_and(|limits| limits.egress_rate.is_some())
    {
        flags |= endpoint_flags::LIMITED;
    }
    EndpointInfo {
        host_ifindex: endpoint.host_ifindex,
        pod_mac: endpoint.mac.octets(),
        host_mac: endpoint.host_mac.octets(),
        flags,
        pad: [0; 2],
    }
}

fn ipv4_keys(endpoint: &EndpointRecord) -> impl Iterator<Item = EndpointKey> + '_ {
    endpoint.ipv4_addrs().map(|addr| EndpointKey {
        addr: addr.octets(),
    })
}

fn host_veth_alive(endpoint: &EndpointRecord) -> bool {
    nix::net::if_::if_nametoindex(endpoint.host_veth.as_str())
        .is_ok_and(|index| index == endpoint.host_ifindex)
}

fn read_record(path: &Path) -> Result<EndpointRecord, EndpointError> {
    let bytes = fs::read(path).map_err(|source| state_error(path, source))?;
    serde_json::from_slice(&bytes).map_err(|source| EndpointError::Corrupt {
        path: path.display().to_string(),
        source,
    })
}

/// Writes the record whole or not at all (mode 0600, see `cni_api::files`): a crash,
/// even of the machine, leaves the old record or the new one, never half of one.
fn write_record(path: &Path, endpoint: &EndpointRecord) -> Result<(), EndpointError> {
    let bytes = serde_json::to_vec_pretty(endpoint).map_err(|source| EndpointError::Corrupt {
        path: path.display().to_string(),
        source,
    })?;
    cni_api::files::write_atomic(path, &bytes, 0o600).map_err(|source| state_error(path, source))
}

fn remove_file(path: &Path) -> Result<(), EndpointError> {
    crate::files::remove_file(path)
        .map(drop)
        .map_err(|source| state_error(path, source))
}

fn state_error(path: &Path, source: io::Error) -> EndpointError {
    EndpointError::State {
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_names_give_their_id() {
        let id = id_of_record("c0ffee@eth0").expect("an id");
        assert_eq!(
            (id.container_id.as_str(), id.ifname.as_str()),
            ("c0ffee", "eth0")
        );
        assert!(id_of_record("no-separator").is_none());
    }
}
