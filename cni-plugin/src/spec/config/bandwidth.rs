//! Bandwidth limits: the bandwidth plugin's four keys (`ingressRate`, `ingressBurst`,
//! `egressRate`, `egressBurst`; rates in bits per second, bursts in bits), from the
//! plugin's own configuration or from `runtimeConfig.bandwidth`, checked into a
//! [`Shaping`].
//!
//! Which one counts is the bandwidth plugin's rule: the configuration's keys when it has
//! any (an operator's fixed limit for the network), else the runtime's (Kubernetes'
//! `kubernetes.io/ingress-bandwidth` and `egress-bandwidth` annotations).

use super::{Bandwidth, ConfigError, NetConf};

/// The MTU a veth gets when nothing names one.
pub const DEFAULT_MTU: u32 = 1500;

/// One direction's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Bits per second, at least 8.
    pub rate: u64,
    /// Bits, at least one packet of the MTU and at most `u32::MAX` bytes.
    pub burst: u64,
}

/// The limits of one pod: `ingress` is what it receives, `egress` what it sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shaping {
    pub ingress: Option<Limit>,
    pub egress: Option<Limit>,
}

impl Shaping {
    pub fn is_none(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }
}

impl NetConf {
    /// The pod's limits, checked (code 7): each direction has a rate and a burst or
    /// neither (0 is neither, as the bandwidth plugin reads it), the rate is at least
    /// 8 bits per second, the burst holds one packet of `mtu` bytes (the pod's veths')
    /// and at most 4 GiB (the qdisc's 32-bit byte count).
    pub fn shaping(&self, mtu: u32) -> Result<Shaping, super::CniError> {
        Ok(self.checked_shaping(mtu)?)
    }

    /// [`NetConf::shaping`] with the configuration's MTU, or the kernel's default.
    pub(super) fn checked_own_shaping(&self) -> Result<Shaping, ConfigError> {
        self.checked_shaping(self.mtu.unwrap_or(DEFAULT_MTU))
    }

    fn checked_shaping(&self, mtu: u32) -> Result<Shaping, ConfigError> {
        let (bandwidth, prefix) = match (&self.bandwidth, &self.runtime_config.bandwidth) {
            (Some(own), _) => (own, ""),
            (None, Some(runtime)) => (runtime, "runtimeConfig.bandwidth."),
            (None, None) => return Ok(Shaping::default()),
        };
        let Bandwidth {
            ingress_rate,
            ingress_burst,
            egress_rate,
            egress_burst,
        } = *bandwidth;
        Ok(Shaping {
            ingress: limit(prefix, "ingress", ingress_rate, ingress_burst, mtu)?,
            egress: limit(prefix, "egress", egress_rate, egress_burst, mtu)?,
        })
    }
}

fn limit(
    prefix: &str,
    direction: &str,
    rate: Option<u64>,
    burst: Option<u64>,
    mtu: u32,
) -> Result<Option<Limit>, ConfigError> {
    let rate_key = format!("{prefix}{direction}Rate");
    let burst_key = format!("{prefix}{direction}Burst");
    match (rate.unwrap_or(0), burst.unwrap_or(0)) {
        (0, 0) => Ok(None),
        (_, 0) => Err(ConfigError::invalid(
            burst_key,
            format!("is needed with {rate_key}"),
        )),
        (0, _) => Err(ConfigError::invalid(
            rate_key,
            format!("is needed with {burst_key}"),
        )),
        (rate, _) if rate < 8 => Err(ConfigError::invalid(
            rate_key,
            format!("{rate} is below 8 bits (one byte) per second"),
        )),
        (_, burst) if burst / 8 > u64::from(u32::MAX) => Err(ConfigError::invalid(
            burst_key,
            format!("{burst} bits is above 4 GiB, the most a qdisc's bucket holds"),
        )),
        (_, burst) if burst / 8 < u64::from(mtu) => Err(ConfigError::invalid(
            burst_key,
            format!(
                "{burst} bits is less than one packet of the MTU ({mtu} bytes, {} bits): \
                 no full-size packet could pass",
                u64::from(mtu) * 8
            ),
        )),
        (rate, burst) => Ok(Some(Limit { rate, burst })),
    }
}
