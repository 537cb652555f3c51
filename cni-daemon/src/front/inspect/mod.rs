//! What the inspection commands (`ebpf-cnid status|endpoints|ports|counters|nat|nodes|
//! policy`) show, in three steps: [`read`] the pinned maps (no running daemon needed),
//! [`join`] them with what the daemon answers ([`nat`] for source NAT's flows), and
//! [`render`] the views as tables; `--output json` prints the same views serialized.

pub mod join;
pub mod nat;
pub mod read;
pub mod render;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("cannot open the pinned map {path} (is the daemon installed there?): {source}")]
    Open {
        path: String,
        source: aya::maps::MapError,
    },
    #[error("cannot read the map: {0}")]
    Read(#[from] aya::maps::MapError),
}
