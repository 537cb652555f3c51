//! Endpoint records: one JSON file per pod interface in the state folder, mirrored into
//! the pinned BPF endpoints map (pod IPv4 -> host veth, pod MAC).
//!
//! The files are the source of truth: a restarted daemon reads them, drops those whose
//! host veth is gone (a DEL that ran while the daemon was down), and rewrites the map.

use std::{
    collections::BTreeMap,
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
};

use aya::maps::{HashMap, MapData};
use cni_ebpf_common::{EndpointInfo, EndpointKey, endpoint_flags};

use cni_api::{Endpoint, EndpointId};

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("state file {path}: {source}")]
    State { path: String, source: io::Error },
    #[error("state file {path} is not a valid record: {source}")]
    Corrupt {
        path: String,
        source: serde_json::Error,
    },
    #[error("invalid MAC address {0:?}")]
    Mac(String),
    #[error("{addr} already belongs to {owner_container}/{owner_ifname}")]
    AddressTaken {
        addr: IpAddr,
        owner_container: String,
        owner_ifname: String,
    },
    #[error("endpoints map: {0}")]
    Map(#[from] aya::maps::MapError),
}

pub struct Endpoints {
    dir: PathBuf,
    records: BTreeMap<EndpointId, Endpoint>,
    map: HashMap<MapData, EndpointKey, EndpointInfo>,
}

impl Endpoints {
    /// Reads the records in `dir`, forgets those whose host veth no longer exists, and
    /// makes `map` hold exactly the remaining endpoints.
    /// Returns the records and the endpoints dropped because their veth is gone.
    pub fn open(
        dir: &Path,
        map: HashMap<MapData, EndpointKey, EndpointInfo>,
    ) -> Result<(Self, Vec<Endpoint>), EndpointError> {
        fs::create_dir_all(dir).map_err(|source| state_error(dir, source))?;
        let mut endpoints = Self {
            dir: dir.to_owned(),
            records: BTreeMap::new(),
            map,
        };
        let mut gone = Vec::new();
        for entry in fs::read_dir(dir).map_err(|source| state_error(dir, source))? {
            let path = entry.map_err(|source| state_error(dir, source))?.path();
            if path.extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            let record = read_record(&path)?;
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
        endpoints.rewrite_map()?;
        Ok((endpoints, gone))
    }

    /// Records `endpoint` (replacing a record with the same id) and writes its addresses
    /// into the map. Refuses an address owned by another endpoint.
    pub fn attach(&mut self, endpoint: Endpoint) -> Result<(), EndpointError> {
        let info = endpoint_info(&endpoint)?;
        for addr in endpoint.ips.iter().map(ipnet::IpNet::addr) {
            if let Some(owner) = self.owner_of(addr).filter(|owner| owner.id != endpoint.id) {
                return Err(EndpointError::AddressTaken {
                    addr,
                    owner_container: owner.id.container_id.clone(),
                    owner_ifname: owner.id.ifname.clone(),
                });
            }
        }
        if let Some(previous) = self.records.get(&endpoint.id).cloned() {
            self.unmap(&previous)?;
        }
        write_record(&self.record_path(&endpoint.id), &endpoint)?;
        for key in ipv4_keys(&endpoint) {
            self.map.insert(key, info, 0)?;
        }
        tracing::info!(
            container = %endpoint.id.container_id,
            ifname = %endpoint.id.ifname,
            veth = %endpoint.host_veth,
            ips = ?endpoint.ips,
            "endpoint attached"
        );
        self.records.insert(endpoint.id.clone(), endpoint);
        Ok(())
    }

    /// Forgets `id`; returns its record when it was known.
    pub fn detach(&mut self, id: &EndpointId) -> Result<Option<Endpoint>, EndpointError> {
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

    pub fn get(&self, id: &EndpointId) -> Option<&Endpoint> {
        self.records.get(id)
    }

    pub fn list(&self) -> impl Iterator<Item = &Endpoint> {
        self.records.values()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn owner_of(&self, addr: IpAddr) -> Option<&Endpoint> {
        self.records
            .values()
            .find(|endpoint| endpoint.ips.iter().any(|ip| ip.addr() == addr))
    }

    fn unmap(&mut self, endpoint: &Endpoint) -> Result<(), EndpointError> {
        for key in ipv4_keys(endpoint) {
            crate::maps::removed(self.map.remove(&key))?;
        }
        Ok(())
    }

    /// Makes the map hold exactly the records' addresses.
    fn rewrite_map(&mut self) -> Result<(), EndpointError> {
        let stale: Vec<EndpointKey> = self.map.keys().collect::<Result<_, _>>()?;
        for key in stale {
            self.map.remove(&key)?;
        }
        let records: Vec<Endpoint> = self.records.values().cloned().collect();
        for endpoint in &records {
            let info = endpoint_info(endpoint)?;
            for key in ipv4_keys(endpoint) {
                self.map.insert(key, info, 0)?;
            }
        }
        Ok(())
    }

    fn record_path(&self, id: &EndpointId) -> PathBuf {
        // Container ids never contain '@' (CNI spec charset), so the name is unambiguous.
        self.dir
            .join(format!("{}@{}.json", id.container_id, id.ifname))
    }
}

/// The map value of `endpoint`.
fn endpoint_info(endpoint: &Endpoint) -> Result<EndpointInfo, EndpointError> {
    let mut flags = 0;
    if endpoint.masquerade {
        flags |= endpoint_flags::MASQUERADE;
    }
    Ok(EndpointInfo {
        host_ifindex: endpoint.host_ifindex,
        pod_mac: parse_mac(&endpoint.mac)?,
        host_mac: parse_mac(&endpoint.host_mac)?,
        flags,
        pad: [0; 2],
    })
}

fn ipv4_keys(endpoint: &Endpoint) -> impl Iterator<Item = EndpointKey> + '_ {
    endpoint.ips.iter().filter_map(|net| match net.addr() {
        IpAddr::V4(addr) => Some(EndpointKey {
            addr: addr.octets(),
        }),
        IpAddr::V6(_) => None,
    })
}

/// `aa:bb:cc:dd:ee:ff` -> bytes.
pub fn parse_mac(text: &str) -> Result<[u8; 6], EndpointError> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts
            .next()
            .ok_or_else(|| EndpointError::Mac(text.to_owned()))?;
        if part.len() != 2 {
            return Err(EndpointError::Mac(text.to_owned()));
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| EndpointError::Mac(text.to_owned()))?;
    }
    if parts.next().is_some() {
        return Err(EndpointError::Mac(text.to_owned()));
    }
    Ok(mac)
}

fn host_veth_alive(endpoint: &Endpoint) -> bool {
    nix::net::if_::if_nametoindex(endpoint.host_veth.as_str())
        .is_ok_and(|index| index == endpoint.host_ifindex)
}

fn read_record(path: &Path) -> Result<Endpoint, EndpointError> {
    let bytes = fs::read(path).map_err(|source| state_error(path, source))?;
    serde_json::from_slice(&bytes).map_err(|source| EndpointError::Corrupt {
        path: path.display().to_string(),
        source,
    })
}

/// Writes through a temporary file and a rename, so a crash never leaves half a record.
fn write_record(path: &Path, endpoint: &Endpoint) -> Result<(), EndpointError> {
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(endpoint).map_err(|source| EndpointError::Corrupt {
        path: path.display().to_string(),
        source,
    })?;
    fs::write(&tmp, bytes).map_err(|source| state_error(&tmp, source))?;
    fs::rename(&tmp, path).map_err(|source| state_error(path, source))
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
    fn mac_text_parses_to_bytes() {
        assert_eq!(
            parse_mac("0a:58:0A:f4:00:1b").expect("valid"),
            [0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x1b]
        );
    }

    #[test]
    fn malformed_macs_are_refused() {
        for bad in [
            "",
            "0a:58:0a:f4:00",
            "0a:58:0a:f4:00:1b:00",
            "0a:58:0a:f4:00:zz",
            "a:58:0a:f4:00:1b0",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
