//! Real runtimes and the DaemonSet: containerd through the CRI, podman, the manifests in
//! `deploy/`, the image run as the DaemonSet.
//!
//! One binary of many modules, so that one build serves them all: run one with
//! `cargo test -p ebpf-cni-tests --test runtimes <module>::`.

mod deploy_capabilities;
mod deploy_end_to_end;
mod deploy_manifests;
mod runtime_containerd;
mod runtime_podman;
