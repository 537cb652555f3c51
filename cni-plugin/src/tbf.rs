//! The token bucket filter (`tbf`) qdisc that enforces a pod's rate limits: its wire
//! form (netlink-packet-route names no `tbf` options, so they are written and read here
//! as the kernel's `struct tc_tbf_qopt` and its attributes, `linux/pkt_sched.h`) and the
//! numbers the bandwidth plugin derives from a rate and a burst.
//!
//! The qdisc sits at the root of the pod's interface (what the pod sends) and of its
//! host veth (what the pod receives): on every kernel, `fq` and earliest-departure-time
//! pacing only shape at the device that holds `fq`, which misses pod-to-pod and
//! node-to-pod traffic (see docs/decisions.md).

use rtnetlink::packet_core::{DefaultNla, Nla, NlasIterator};
use rtnetlink::packet_route::tc::{TcAttribute, TcMessage, TcOption};

use crate::spec::Limit;

/// The queueing delay the qdisc's backlog may add at the limit's rate before it drops,
/// as the bandwidth plugin sets it (`latencyInMillis`).
pub const LATENCY_MS: u64 = 25;

pub const KIND: &str = "tbf";

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
/// `TC_LINKLAYER_ETHERNET`: the kernel then needs no rate table.
const LINKLAYER_ETHERNET: u8 = 1;
/// `sizeof(struct tc_tbf_qopt)`: two 12-byte `tc_ratespec`, then limit, buffer, mtu.
const QOPT_LEN: usize = 36;

/// One qdisc's settings, in bytes as the kernel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Bytes per second.
    pub rate: u64,
    /// The bucket's size in bytes: how much may leave at once after an idle time.
    pub burst: u32,
    /// The backlog in bytes beyond which packets are dropped.
    pub limit: u32,
}

impl From<Limit> for Tbf {
    /// The bandwidth plugin's arithmetic: bits to bytes, and a backlog of the burst plus
    /// [`LATENCY_MS`] at the rate.
    fn from(limit: Limit) -> Self {
        let rate = limit.rate / 8;
        // `Limit` holds bursts of at most u32::MAX bytes (checked with the config).
        let burst = u32::try_from(limit.burst / 8).unwrap_or(u32::MAX);
        let queued = u32::try_from(rate.saturating_mul(LATENCY_MS) / 1000).unwrap_or(u32::MAX);
        Self {
            rate,
            burst,
            limit: burst.saturating_add(queued),
        }
    }
}

impl Tbf {
    /// The `TCA_OPTIONS` of a new qdisc: the parameters, the 64-bit rate when the 32-bit
    /// field cannot hold it, and the burst in bytes (the kernel derives the bucket's
    /// time from it).
    pub fn options(&self) -> Vec<TcOption> {
        let mut qopt = [0u8; QOPT_LEN];
        qopt[1] = LINKLAYER_ETHERNET;
        qopt[8..12].copy_from_slice(&rate32(self.rate).to_ne_bytes());
        qopt[24..28].copy_from_slice(&self.limit.to_ne_bytes());
        let mut options = vec![TcOption::Other(DefaultNla::new(
            TCA_TBF_PARMS,
            qopt.to_vec(),
        ))];
        if self.rate > u64::from(u32::MAX) {
            options.push(TcOption::Other(DefaultNla::new(
                TCA_TBF_RATE64,
                self.rate.to_ne_bytes().to_vec(),
            )));
        }
        options.push(TcOption::Other(DefaultNla::new(
            TCA_TBF_BURST,
            self.burst.to_ne_bytes().to_vec(),
        )));
        options
    }
}

/// The rate and the limit of a `tbf` qdisc as the kernel dumps it (it dumps the bucket
/// as a time, not the burst, so the burst is checked through the limit, which holds it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dumped {
    pub rate: u64,
    pub limit: u32,
}

impl Dumped {
    /// Whether this qdisc enforces `tbf`.
    pub fn matches(&self, tbf: &Tbf) -> bool {
        self.rate == tbf.rate && self.limit == tbf.limit
    }
}

/// What a dumped qdisc message holds, when it is a `tbf`.
pub fn dumped(message: &TcMessage) -> Option<Dumped> {
    let is_tbf = message
        .attributes
        .iter()
        .any(|attribute| matches!(attribute, TcAttribute::Kind(kind) if kind == KIND));
    if !is_tbf {
        return None;
    }
    // An unknown kind's TCA_OPTIONS come as one raw attribute holding the nested ones.
    let nested = message
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            TcAttribute::Options(options) => options.iter().find_map(|option| match option {
                TcOption::Other(nla) => Some(nla),
                _ => None,
            }),
            _ => None,
        })?;
    let mut value = vec![0u8; nested.value_len()];
    nested.emit_value(&mut value);
    let mut qopt = None;
    let mut rate64 = None;
    for nla in NlasIterator::new(value.as_slice()).flatten() {
        match nla.kind() {
            TCA_TBF_PARMS if nla.value().len() >= QOPT_LEN => qopt = Some(nla.value().to_vec()),
            TCA_TBF_RATE64 => rate64 = nla.value().try_into().ok().map(u64::from_ne_bytes),
            _ => {}
        }
    }
    let qopt = qopt?;
    let field =
        |at: usize| u32::from_ne_bytes([qopt[at], qopt[at + 1], qopt[at + 2], qopt[at + 3]]);
    Some(Dumped {
        rate: rate64.unwrap_or_else(|| u64::from(field(8))),
        limit: field(24),
    })
}

/// The 32-bit rate field: the rate, or all ones when `TCA_TBF_RATE64` carries it.
fn rate32(rate: u64) -> u32 {
    u32::try_from(rate).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use rtnetlink::packet_core::Emitable;

    use super::*;

    #[test]
    fn bits_become_bytes_and_the_limit_holds_the_burst_and_25_ms() {
        let tbf = Tbf::from(Limit {
            rate: 50_000_000,
            burst: 5_000_000,
        });
        assert_eq!(tbf.rate, 6_250_000);
        assert_eq!(tbf.burst, 625_000);
        assert_eq!(tbf.limit, 625_000 + 156_250);
    }

    #[test]
    fn kubernetes_burst_saturates_the_limit_instead_of_wrapping() {
        // containerd sends u32::MAX bits as the burst with every annotation's rate.
        let tbf = Tbf::from(Limit {
            rate: 800_000_000_000,
            burst: 8 * u64::from(u32::MAX),
        });
        assert_eq!(tbf.burst, u32::MAX);
        assert_eq!(tbf.limit, u32::MAX);
    }

    #[test]
    fn what_is_written_reads_back_through_the_dump_parser() {
        for rate in [6_250_000, 8_000_000_000] {
            let tbf = Tbf {
                rate,
                burst: 100_000,
                limit: 300_000,
            };
            let mut message = TcMessage::default();
            message.attributes.push(TcAttribute::Kind(KIND.to_owned()));
            // The kernel's dump nests the options the way they were sent.
            let mut nested = Vec::new();
            for option in tbf.options() {
                let TcOption::Other(nla) = option else {
                    unreachable!()
                };
                let mut buffer = vec![0u8; nla.buffer_len()];
                nla.emit(&mut buffer);
                nested.extend(buffer);
            }
            message
                .attributes
                .push(TcAttribute::Options(vec![TcOption::Other(
                    DefaultNla::new(2, nested),
                )]));
            let dumped = dumped(&message).expect("a tbf");
            assert!(dumped.matches(&tbf), "{dumped:?} {tbf:?}");
            assert_eq!(rate32(rate) == u32::MAX, rate > u64::from(u32::MAX));
        }
    }
}
