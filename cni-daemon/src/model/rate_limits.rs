//! `RATE_LIMITS`: each pod with an egress rate limit has a token bucket the pod program
//! spends its packets from (`cni-ebpf/src/features/rate.rs`), kept equal to the
//! records' limits. The bucket is a policer behind the pod's own `tbf`, which shapes
//! what the pod's stack sends: it gets [`RATE_SLACK_PERCENT`] more rate and twice the
//! burst (at least two GSO packets), so that shaped traffic never meets an empty bucket,
//! and what skips the qdisc (a raw socket with `PACKET_QDISC_BYPASS`) is held near the
//! limit.

use std::collections::BTreeMap;

use crate::model::record::EndpointRecord;
use aya::maps::{HashMap, MapData, MapError};
use cni_ebpf_common::RateBucket;

/// How much faster than the limit the bucket refills.
pub const RATE_SLACK_PERCENT: u64 = 5;
/// The smallest burst a bucket holds: two 64 KiB GSO packets.
const MIN_BURST_BYTES: u64 = 2 * 65_536;

pub struct RateLimits {
    map: HashMap<MapData, u32, RateBucket>,
}

impl RateLimits {
    pub fn open(map: HashMap<MapData, u32, RateBucket>) -> Self {
        Self { map }
    }

    /// Makes the map hold a bucket for each endpoint of `endpoints` with an egress
    /// limit, by its host veth's ifindex. A bucket whose rate and burst stay is left as
    /// it is (its tokens with it); a new or changed one starts full.
    pub fn sync<'a>(
        &mut self,
        endpoints: impl IntoIterator<Item = &'a EndpointRecord>,
    ) -> Result<(), MapError> {
        let desired: BTreeMap<u32, (u64, u64)> = endpoints
            .into_iter()
            .filter_map(|endpoint| Some((endpoint.host_ifindex, bucket_of(endpoint)?)))
            .collect();
        let present: Vec<(u32, RateBucket)> = self.map.iter().collect::<Result<_, _>>()?;
        for (ifindex, _) in &present {
            if !desired.contains_key(ifindex) {
                crate::maps::removed(self.map.remove(ifindex))?;
            }
        }
        let kept: BTreeMap<u32, (u64, u64)> = present
            .iter()
            .map(|(ifindex, bucket)| (*ifindex, (bucket.rate, bucket.burst)))
            .collect();
        for (ifindex, (rate, burst)) in desired {
            if kept.get(&ifindex) != Some(&(rate, burst)) {
                let bucket = RateBucket {
                    rate,
                    burst,
                    tokens: burst,
                    refilled_ns: 0,
                };
                self.map.insert(ifindex, bucket, 0)?;
            }
        }
        Ok(())
    }
}

/// The bucket of `endpoint`'s egress limit (bytes per second, burst bytes), if it has
/// one.
fn bucket_of(endpoint: &EndpointRecord) -> Option<(u64, u64)> {
    let bandwidth = endpoint.bandwidth.as_ref()?;
    let rate_bits = bandwidth.egress_rate?;
    let rate = (rate_bits / 8).saturating_mul(100 + RATE_SLACK_PERCENT) / 100;
    let burst = (bandwidth.egress_burst.unwrap_or(0) / 8)
        .saturating_mul(2)
        .max(MIN_BURST_BYTES);
    Some((rate, burst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::Limits;

    fn limited(rate: Option<u64>, burst: Option<u64>) -> EndpointRecord {
        EndpointRecord {
            bandwidth: Some(Limits {
                egress_rate: rate,
                egress_burst: burst,
                ..Limits::default()
            }),
            ..EndpointRecord::for_tests("c")
        }
    }

    #[test]
    fn the_bucket_has_room_over_the_pods_own_shaper() {
        // 8 Mbit/s, 2 Mbit of burst: 1 MB/s and 5% more, twice 250 kB.
        assert_eq!(
            bucket_of(&limited(Some(8_000_000), Some(2_000_000))),
            Some((1_050_000, 500_000))
        );
        // A small burst is raised to two GSO packets.
        assert_eq!(
            bucket_of(&limited(Some(8_000_000), Some(8_000))),
            Some((1_050_000, MIN_BURST_BYTES))
        );
        assert_eq!(bucket_of(&limited(None, Some(8_000))), None);
    }
}
