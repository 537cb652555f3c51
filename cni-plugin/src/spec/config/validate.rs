//! Whether a parsed configuration is usable for a given command. Everything is checked
//! here, before anything is applied.

use std::net::IpAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;

use super::{ConfigError, NetConf, parse_unicast_mac};
use crate::spec::env::{Command, is_spec_identifier};
use crate::spec::error::CniError;
use crate::spec::version::{CniVersion, parse_version};

/// 68 is the IPv4 minimum (RFC 791); 65535 the largest a 16-bit length field carries.
const MTU_RANGE: RangeInclusive<u32> = 68..=65535;
/// Seconds an IPAM run may be given: at least one, at most ten minutes.
pub const IPAM_TIMEOUT_RANGE: RangeInclusive<u64> = 1..=600;

impl NetConf {
    /// Checks the configuration for `command`:
    /// - `cniVersion` is one this plugin speaks, and the command exists in it: CHECK from
    ///   0.4.0, GC and STATUS from 1.1.0 (code 1);
    /// - `name` follows the spec's network-name rule (code 7);
    /// - `ipam.type` is present and is a bare file name, for every command but VERSION:
    ///   ADD/CHECK/DEL/GC delegate to IPAM, and so does STATUS, since the spec has a
    ///   plugin relay STATUS to the delegates it needs for ADD (code 7);
    /// - for ADD, the only verb that acts on them: `mtu` is in 68..=65535, `ipamTimeout`
    ///   in 1..=600;
    ///   `runtimeConfig.mac` is a unicast MAC; port mappings have non-zero ports;
    ///   bandwidth limits are whole (see [`NetConf::shaping`]);
    ///   `runtimeConfig.ips` are addresses or CIDRs (code 7). DEL, CHECK and GC do not
    ///   refuse what they do not use (see [`NetConf::parse_for`]);
    /// - CHECK has a `prevResult` and GC a valid-attachments list (code 7). A GC without
    ///   the list is refused, not read as "nothing is valid", which would free everything.
    ///
    /// VERSION does not use the configuration and always passes.
    pub fn validate_for(&self, command: Command) -> Result<(), CniError> {
        Ok(self.check_for(command)?)
    }

    fn check_for(&self, command: Command) -> Result<(), ConfigError> {
        if command == Command::Version {
            return Ok(());
        }
        let version = parse_version(&self.cni_version)?;
        let needs = match command {
            Command::Check if !version.has_check() => Some(CniVersion::V0_4_0),
            Command::Gc | Command::Status if !version.has_gc_and_status() => {
                Some(CniVersion::V1_1_0)
            }
            _ => None,
        };
        if let Some(needs) = needs {
            return Err(ConfigError::CommandTooNew {
                command,
                needs,
                has: version,
            });
        }
        check_network_name(&self.name)?;
        self.checked_ipam_type()?;
        if command == Command::Add {
            self.check_pod_settings()?;
        }
        match command {
            Command::Check if self.prev_result.is_none() => Err(ConfigError::CommandNeeds {
                command,
                field: "prevResult",
            }),
            Command::Gc if self.valid_attachments.is_none() => Err(ConfigError::CommandNeeds {
                command,
                field: super::VALID_ATTACHMENTS_KEY,
            }),
            _ => Ok(()),
        }
    }

    pub(super) fn checked_ipam_type(&self) -> Result<&str, ConfigError> {
        let ipam_type = self
            .ipam
            .as_ref()
            .map(|ipam| ipam.plugin_type.as_str())
            .unwrap_or_default();
        if ipam_type.is_empty() {
            return Err(ConfigError::MissingField("ipam.type"));
        }
        // The type is looked up as a file in CNI_PATH: a separator would escape it.
        if ipam_type.contains(['/', '\\']) || ipam_type == "." || ipam_type == ".." {
            return Err(ConfigError::invalid(
                "ipam.type",
                format!("{ipam_type:?} is not a plain file name"),
            ));
        }
        Ok(ipam_type)
    }

    pub(super) fn checked_runtime_mac(&self) -> Result<Option<[u8; 6]>, ConfigError> {
        let Some(mac) = &self.runtime_config.mac else {
            return Ok(None);
        };
        parse_unicast_mac(mac)
            .map(Some)
            .map_err(|why| ConfigError::invalid("runtimeConfig.mac", format!("{mac:?} {why}")))
    }

    /// What only ADD acts on: the MTU and `runtimeConfig`.
    fn check_pod_settings(&self) -> Result<(), ConfigError> {
        if let Some(mtu) = self.mtu.filter(|mtu| !MTU_RANGE.contains(mtu)) {
            return Err(ConfigError::invalid(
                "mtu",
                format!("{mtu} is outside 68..=65535"),
            ));
        }
        if let Some(secs) = self
            .ipam_timeout
            .filter(|secs| !IPAM_TIMEOUT_RANGE.contains(secs))
        {
            return Err(ConfigError::invalid(
                "ipamTimeout",
                format!("{secs} is outside 1..=600 seconds"),
            ));
        }
        let rc = &self.runtime_config;
        self.checked_runtime_mac()?;
        self.checked_own_shaping()?;
        for (i, mapping) in rc.port_mappings.iter().enumerate() {
            if mapping.host_port == 0 || mapping.container_port == 0 {
                return Err(ConfigError::invalid(
                    format!("runtimeConfig.portMappings[{i}]"),
                    "hostPort and containerPort must be 1..=65535",
                ));
            }
        }
        for ip in &rc.ips {
            if ip.parse::<IpAddr>().is_err() && ip.parse::<IpNet>().is_err() {
                return Err(ConfigError::invalid(
                    "runtimeConfig.ips",
                    format!("{ip:?} is neither an IP address nor a CIDR"),
                ));
            }
        }
        Ok(())
    }
}

/// The spec's rule for network names, the same shape as a container id.
fn check_network_name(name: &str) -> Result<(), ConfigError> {
    if is_spec_identifier(name) {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            "name",
            format!(
                "{name:?} must start with a letter or digit, followed by letters, digits, '_', '.' or '-'"
            ),
        ))
    }
}
