//! The programs of the object, one file per attach point, each holding its own
//! dispatch: [`pod`] (the pods' veths), [`uplink`] (source NAT on the uplinks),
//! [`overlay`] (the tunnel device between nodes), [`guard`] (the node's other
//! devices, where the pods' gateways are hidden),
//! [`sock`] (the node's sockets, for hostPorts) and [`count_by_source`] (a counter on
//! the uplink); [`nat_sweep`] is run by the daemon, never attached. Each entry is
//! thin: it calls a `try_*` function or a feature and returns the verdict computed
//! there (the socket hooks have none to compute: they never refuse a call).

pub mod count_by_source;
pub mod guard;
pub mod nat_sweep;
pub mod overlay;
pub mod pod;
pub mod sock;
pub mod uplink;
