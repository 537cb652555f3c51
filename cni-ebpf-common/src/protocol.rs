//! Numbers of the wire that the datapath and the daemon both read: IP protocol numbers
//! (a packet's, and a flow key's `proto`) and the TCP flag bits its state follows.

/// IP protocol numbers (IANA), as in the IPv4 header.
pub mod ip_proto {
    pub const ICMP: u8 = 1;
    /// IP in IP.
    pub const IPIP: u8 = 4;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    /// Its ports, and a checksum over a pseudo header with the addresses (always set,
    /// unlike UDP's), sit where UDP has them.
    pub const DCCP: u8 = 33;
    pub const GRE: u8 = 47;
    pub const ESP: u8 = 50;
    /// Its CRC32c covers its ports and chunks, not the IP addresses (no pseudo header).
    pub const SCTP: u8 = 132;
    /// Laid out as DCCP is, for what NAT rewrites.
    pub const UDPLITE: u8 = 136;
}

/// Bits of the TCP header's flags byte (13 bytes in).
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;

    /// Whether a segment with `flags` opens a connection: a SYN without ACK.
    #[inline(always)]
    #[must_use]
    pub const fn opens(flags: u8) -> bool {
        flags & SYN != 0 && flags & ACK == 0
    }
}

#[cfg(test)]
mod tests {
    use super::tcp_flags::{ACK, FIN, RST, SYN, opens};

    #[test]
    fn only_a_syn_without_ack_opens_a_connection() {
        assert!(opens(SYN));
        assert!(!opens(SYN | ACK), "the answer to a SYN");
        assert!(!opens(ACK));
        assert!(!opens(FIN | ACK));
        assert!(!opens(RST));
    }
}
