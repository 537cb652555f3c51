//! Writing the model in the shape of one spec version.

use serde_json::{Map, Value, json};

use super::{CniResult, Dns, Interface, IpConfig, Route};
use crate::spec::version::CniVersion;

pub(super) fn to_json(result: &CniResult, version: CniVersion) -> Value {
    let mut out = Map::new();
    out.insert("cniVersion".into(), version.as_str().into());
    let interfaces: Vec<Value> = result
        .interfaces
        .iter()
        .map(|i| interface(i, version))
        .collect();
    let ips: Vec<Value> = result.ips.iter().map(|ip| ip_config(ip, version)).collect();
    let routes: Vec<Value> = result.routes.iter().map(|r| route(r, version)).collect();
    insert_list(&mut out, "interfaces", interfaces);
    insert_list(&mut out, "ips", ips);
    insert_list(&mut out, "routes", routes);
    if !result.dns.is_empty() {
        out.insert("dns".into(), dns(&result.dns));
    }
    Value::Object(out)
}

fn interface(interface: &Interface, version: CniVersion) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), interface.name.as_str().into());
    let mac = Some(interface.mac.as_str()).filter(|mac| !mac.is_empty());
    insert_opt(&mut out, "mac", mac);
    if version.has_gc_and_status() {
        insert_opt(&mut out, "mtu", interface.mtu);
    }
    insert_opt(&mut out, "sandbox", interface.sandbox.as_deref());
    if version.has_gc_and_status() {
        insert_opt(&mut out, "socketPath", interface.socket_path.as_deref());
        insert_opt(&mut out, "pciID", interface.pci_id.as_deref());
    }
    Value::Object(out)
}

fn ip_config(ip: &IpConfig, version: CniVersion) -> Value {
    let mut out = Map::new();
    if version.ips_have_version_field() {
        let family = if ip.address.addr().is_ipv4() {
            "4"
        } else {
            "6"
        };
        out.insert("version".into(), family.into());
    }
    out.insert("address".into(), ip.address.to_string().into());
    insert_opt(&mut out, "gateway", ip.gateway.map(|gw| gw.to_string()));
    insert_opt(&mut out, "interface", ip.interface);
    Value::Object(out)
}

fn route(route: &Route, version: CniVersion) -> Value {
    let mut out = Map::new();
    out.insert("dst".into(), route.dst.to_string().into());
    insert_opt(&mut out, "gw", route.gw.map(|gw| gw.to_string()));
    if version.has_gc_and_status() {
        insert_opt(&mut out, "mtu", route.mtu);
        insert_opt(&mut out, "advmss", route.advmss);
        insert_opt(&mut out, "priority", route.priority);
        insert_opt(&mut out, "table", route.table);
        insert_opt(&mut out, "scope", route.scope);
    }
    Value::Object(out)
}

fn dns(dns: &Dns) -> Value {
    let mut out = Map::new();
    insert_list(
        &mut out,
        "nameservers",
        dns.nameservers.iter().map(|s| json!(s)).collect(),
    );
    insert_opt(&mut out, "domain", dns.domain.as_deref());
    insert_list(
        &mut out,
        "search",
        dns.search.iter().map(|s| json!(s)).collect(),
    );
    insert_list(
        &mut out,
        "options",
        dns.options.iter().map(|s| json!(s)).collect(),
    );
    Value::Object(out)
}

fn insert_opt(out: &mut Map<String, Value>, key: &str, value: Option<impl Into<Value>>) {
    if let Some(value) = value {
        out.insert(key.into(), value.into());
    }
}

fn insert_list(out: &mut Map<String, Value>, key: &str, list: Vec<Value>) {
    if !list.is_empty() {
        out.insert(key.into(), Value::Array(list));
    }
}
