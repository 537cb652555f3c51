//! NetworkPolicy in the datapath: which identity an address has, which ways through
//! each isolated pod has, and the verdicts already given to flows.
//!
//! A new flow at an isolated pod costs three longest-prefix lookups, whatever the number
//! of policies and peers: the peer's address to its identity (`POLICY_IDS`), then the
//! pod's ways for that identity and for any identity (`POLICY_RULES`); every later
//! packet of the flow one hash lookup (`POLICY_FLOWS`). Keys are family-neutral: an
//! address is 16 bytes after its family.
//!
//! A check stands at one pod, the *endpoint* (by its host-side ifindex), as the sender
//! (its egress) or the receiver (its ingress) of a packet. A flow's verdicts are kept
//! oriented as its first packet went, from the *opener* to the *responder*: at the
//! opener the question is whether its egress lets the flow out, at the responder
//! whether its ingress lets it in, whichever way the packet goes; so the replies of an
//! allowed flow pass, and a policy change (a new [`PolicyConfig::generation`]) asks
//! each question again of the flow's next packet.

/// `AddrKey::family` of an IPv4 address (its 4 bytes first, the rest zero).
pub const FAMILY_IPV4: u8 = 4;
/// `AddrKey::family` of an IPv6 address.
pub const FAMILY_IPV6: u8 = 6;

/// Data of a `POLICY_IDS` key: an address prefix of one family. The LPM key's prefix
/// length counts [`ADDR_KEY_FIXED_BITS`] (family and padding) plus the address bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddrKey {
    pub family: u8,
    /// Always zero.
    pub pad: [u8; 3],
    /// The address in network order; an IPv4 address in the first 4 bytes.
    pub addr: [u8; 16],
}

/// Bits of an [`AddrKey`] before the address.
pub const ADDR_KEY_FIXED_BITS: u32 = 32;

impl AddrKey {
    pub const fn ipv4(addr: [u8; 4]) -> Self {
        let mut bytes = [0; 16];
        bytes[0] = addr[0];
        bytes[1] = addr[1];
        bytes[2] = addr[2];
        bytes[3] = addr[3];
        Self {
            family: FAMILY_IPV4,
            pad: [0; 3],
            addr: bytes,
        }
    }

    /// The LPM prefix length of this key's first `bits` address bits.
    pub const fn prefix_len(bits: u32) -> u32 {
        ADDR_KEY_FIXED_BITS + bits
    }
}

/// In a rule: any identity.
pub const ANY_IDENTITY: u32 = 0;
/// An address no peer matches (under no prefix of `POLICY_IDS`).
pub const WORLD_IDENTITY: u32 = 1;

/// `RuleKey::direction`.
pub mod direction {
    pub const INGRESS: u8 = 0;
    pub const EGRESS: u8 = 1;
}

/// Data of a `POLICY_RULES` key: one way through at an endpoint, in one direction, for
/// the peers of one identity, a protocol and a block of ports. Fields in the order the
/// prefix covers them; multi-byte fields in network order so that prefixes cut them
/// where they should.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RuleKey {
    /// The endpoint's host-side ifindex.
    pub endpoint: [u8; 4],
    /// [`direction`].
    pub direction: u8,
    /// Always zero.
    pub pad: [u8; 3],
    /// The peer's identity ([`ANY_IDENTITY`]: any).
    pub identity: [u8; 4],
    /// IP protocol number (ignored under [`RULE_ANY_PROTOCOL_BITS`]).
    pub protocol: u8,
    /// Always zero.
    pub pad2: u8,
    /// The port on the responder's side (ignored beyond the prefix).
    pub port: [u8; 2],
}

/// Prefix length of a rule for every protocol and port.
pub const RULE_ANY_PROTOCOL_BITS: u32 = 96;
/// Prefix length of a rule for every port of its protocol; a port block of `b` bits
/// adds `b`.
pub const RULE_PROTOCOL_BITS: u32 = 112;

impl RuleKey {
    pub const fn new(endpoint: u32, direction: u8, identity: u32, protocol: u8, port: u16) -> Self {
        Self {
            endpoint: endpoint.to_be_bytes(),
            direction,
            pad: [0; 3],
            identity: identity.to_be_bytes(),
            protocol,
            pad2: 0,
            port: port.to_be_bytes(),
        }
    }
}

/// Value of `POLICY_RULES`: the policy the way belongs to (its counters' slot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleValue {
    pub policy: u32,
}

/// Value of `POLICY_ENDPOINTS` (keyed by the pod's host-side ifindex, `u32`): the
/// directions it is isolated in. A pod missing there is isolated in neither.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyEndpoint {
    /// [`isolated`] bits.
    pub isolated: u32,
    /// The counters' slot of a policy isolating it for ingress, and for egress: where
    /// a packet no way lets through is counted.
    pub ingress_policy: u32,
    pub egress_policy: u32,
}

/// Bits of [`PolicyEndpoint::isolated`].
pub mod isolated {
    pub const INGRESS: u32 = 1 << 0;
    pub const EGRESS: u32 = 1 << 1;
}

/// `POLICY_CONFIG[0]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Raised by the daemon after each change of the rules: verdicts given under
    /// another are asked again.
    pub generation: u32,
    /// [`mode`].
    pub mode: u32,
}

/// `PolicyConfig::mode`.
pub mod mode {
    /// What no way lets through is dropped.
    pub const ENFORCE: u32 = 0;
    /// It is counted as a drop would be, and let through.
    pub const AUDIT: u32 = 1;
}

/// Key of `POLICY_FLOWS`: a flow as its first packet went, opener first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub family: u8,
    pub protocol: u8,
    /// Always zero.
    pub pad: [u8; 2],
    /// Ports in host order (an ICMP echo's identifier on the requester's side, 0 on
    /// the other; 0 for protocols without ports).
    pub opener_port: u16,
    pub responder_port: u16,
    pub opener: [u8; 16],
    pub responder: [u8; 16],
}

/// Value of `POLICY_FLOWS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowVerdict {
    /// The [`PolicyConfig::generation`] the verdicts were given under.
    pub generation: u32,
    /// [`allowed`] bits.
    pub allowed: u32,
}

/// Bits of [`FlowVerdict::allowed`].
pub mod allowed {
    /// The opener's egress lets the flow out.
    pub const OPENER_EGRESS: u32 = 1 << 0;
    /// The responder's ingress lets it in.
    pub const RESPONDER_INGRESS: u32 = 1 << 1;
}

/// Value of `POLICY_STATS` (per CPU, keyed by a policy's slot, `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyCounters {
    /// Flows a way of this policy let through.
    pub allowed: u64,
    /// Packets dropped at a pod this policy isolates.
    pub denied: u64,
    /// Packets that would have been dropped, let through in audit mode.
    pub audited: u64,
}

/// Prefixes `POLICY_IDS` holds: every pod of the largest cluster the tables are sized
/// for (100,000) and their ipBlocks.
pub const MAX_POLICY_ADDRS: u32 = 262_144;
/// Ways `POLICY_RULES` holds for all of a node's pods.
pub const MAX_POLICY_RULES: u32 = 1_048_576;
/// Flows whose verdicts are kept; the least recently seen go first when it is full.
pub const MAX_POLICY_FLOWS: u32 = 262_144;
/// Policies counted at once (slots of `POLICY_STATS`).
pub const MAX_POLICY_SLOTS: u32 = 65_536;

const _: () = assert!(core::mem::size_of::<AddrKey>() == 20);
const _: () = assert!(core::mem::size_of::<RuleKey>() == 16);
const _: () = assert!(core::mem::size_of::<RuleValue>() == 4);
const _: () = assert!(core::mem::size_of::<PolicyEndpoint>() == 12);
const _: () = assert!(core::mem::size_of::<PolicyConfig>() == 8);
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);
const _: () = assert!(core::mem::size_of::<FlowVerdict>() == 8);
const _: () = assert!(core::mem::size_of::<PolicyCounters>() == 24);

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY (all): #[repr(C)], fixed-width fields, explicit padding, sizes asserted.
    unsafe impl aya::Pod for super::AddrKey {}
    unsafe impl aya::Pod for super::RuleKey {}
    unsafe impl aya::Pod for super::RuleValue {}
    unsafe impl aya::Pod for super::PolicyEndpoint {}
    unsafe impl aya::Pod for super::PolicyConfig {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowVerdict {}
    unsafe impl aya::Pod for super::PolicyCounters {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_prefix_stops_before_the_fields_it_leaves_open() {
        let key = RuleKey::new(7, direction::EGRESS, 0x0102_0304, 6, 0x1f90);
        // SAFETY: RuleKey is #[repr(C)], 16 bytes of integers with no padding.
        let bytes: [u8; 16] = unsafe { core::mem::transmute(key) };
        // Endpoint, direction and identity end at byte 12 (bit 96).
        assert_eq!(&bytes[..12], &[0, 0, 0, 7, 1, 0, 0, 0, 1, 2, 3, 4]);
        assert_eq!(RULE_ANY_PROTOCOL_BITS, 12 * 8);
        // The protocol and its padding end at byte 14 (bit 112), the port follows.
        assert_eq!(&bytes[12..], &[6, 0, 0x1f, 0x90]);
        assert_eq!(RULE_PROTOCOL_BITS, 14 * 8);
    }
}
