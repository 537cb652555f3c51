//! Values the messages carry as strings on the wire and typed everywhere else: a MAC
//! address (`aa:bb:cc:dd:ee:ff`) and a port mapping's protocol (`tcp`, `udp`, `sctp`).

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An Ethernet address; written `aa:bb:cc:dd:ee:ff` (lowercase), read in either case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// The group bit: an address no frame may come from.
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 1 == 1
    }

    pub fn is_zero(self) -> bool {
        self.0 == [0; 6]
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        Self(octets)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        // Through `pad`, so that widths in tables apply.
        f.pad(&format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}"))
    }
}

/// Why a text is no MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("expected six ':'-separated octets")]
    Octets,
    #[error("each octet must be two hex digits")]
    Digits,
}

impl FromStr for MacAddr {
    type Err = MacError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut mac = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut mac {
            let part = parts.next().ok_or(MacError::Octets)?;
            // Checked by hand: from_str_radix would also accept a sign, as in "+f".
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(MacError::Digits);
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| MacError::Digits)?;
        }
        if parts.next().is_some() {
            return Err(MacError::Octets);
        }
        Ok(Self(mac))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse()
            .map_err(|error| serde::de::Error::custom(format!("MAC address {text:?}: {error}")))
    }
}

/// A port mapping's protocol, written in lowercase. Ordered as its names are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Sctp,
    Tcp,
    Udp,
}

impl Protocol {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sctp => "sctp",
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }

    /// The protocol as a Kubernetes object names it (`TCP`, `UDP`, `SCTP`; absent is
    /// TCP, as the API server defaults it); another name is none.
    pub fn from_kubernetes(name: Option<&str>) -> Option<Self> {
        match name {
            None | Some("TCP") => Some(Self::Tcp),
            Some("UDP") => Some(Self::Udp),
            Some("SCTP") => Some(Self::Sctp),
            Some(_) => None,
        }
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [Self::Sctp, Self::Tcp, Self::Udp]
            .into_iter()
            .find(|protocol| protocol.as_str() == text)
            .ok_or_else(|| format!("{text:?} is not tcp, udp or sctp"))
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_protocol_names_are_uppercase_and_default_to_tcp() {
        assert_eq!(Protocol::from_kubernetes(None), Some(Protocol::Tcp));
        assert_eq!(
            Protocol::from_kubernetes(Some("SCTP")),
            Some(Protocol::Sctp)
        );
        assert_eq!(Protocol::from_kubernetes(Some("UDP")), Some(Protocol::Udp));
        assert_eq!(Protocol::from_kubernetes(Some("udp")), None);
        assert_eq!(Protocol::from_kubernetes(Some("ICMP")), None);
    }

    #[test]
    fn a_mac_reads_in_either_case_and_writes_lowercase_as_a_json_string() {
        let mac: MacAddr = "0A:1b:2C:3d:4E:5f".parse().expect("a MAC");
        assert_eq!(mac.octets(), [0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f]);
        assert_eq!(mac.to_string(), "0a:1b:2c:3d:4e:5f");
        assert_eq!(format!("{mac:<18}|"), "0a:1b:2c:3d:4e:5f |");
        let json = serde_json::to_string(&mac).expect("JSON");
        assert_eq!(json, "\"0a:1b:2c:3d:4e:5f\"");
        assert_eq!(serde_json::from_str::<MacAddr>(&json).expect("back"), mac);
        for bad in [
            "",
            "0a:1b:2c:3d:4e",
            "0a:1b:2c:3d:4e:5f:60",
            "+a:1b:2c:3d:4e:5f",
            "0a:1b:2c:3d:4e:5g",
            "a:1b:2c:3d:4e:5f",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
            assert!(
                serde_json::from_str::<MacAddr>(&format!("{bad:?}")).is_err(),
                "{bad}"
            );
        }
        assert!(MacAddr([1, 0, 0, 0, 0, 0]).is_multicast());
        assert!(MacAddr::default().is_zero());
    }

    #[test]
    fn protocols_are_lowercase_names_ordered_as_names() {
        assert_eq!(
            serde_json::to_string(&Protocol::Tcp).expect("JSON"),
            "\"tcp\""
        );
        assert_eq!(
            serde_json::from_str::<Protocol>("\"sctp\"").expect("read"),
            Protocol::Sctp
        );
        assert!(serde_json::from_str::<Protocol>("\"TCP\"").is_err());
        let mut names = [Protocol::Udp, Protocol::Tcp, Protocol::Sctp];
        names.sort();
        assert_eq!(names.map(Protocol::as_str), ["sctp", "tcp", "udp"]);
        assert_eq!(format!("{:<5}|", Protocol::Udp), "udp  |");
    }
}
