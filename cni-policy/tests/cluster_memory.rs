//! What the cluster source holds for 10,000 pods and 1,000 policies, counted by a global
//! allocator that tracks the bytes live in this test binary: served by the fake API
//! server, listed, translated and published, then counted once the lists' buffers are
//! gone. The figure is in `cni_policy::cluster`'s documentation; this test prints it
//! (`--nocapture`) and fails when it grows past a bound.
//!
//! One test in this binary, so that nothing else allocates meanwhile.

#[path = "../../tests/src/fake_api/mod.rs"]
mod fake_api;
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use cni_nodes::{ClusterAccess, connect};
use cni_policy::watch_cluster;
use fake_api::{FakeApi, NAMESPACES, NETWORK_POLICIES, PODS};
use serde_json::{Value, json};
use support::{namespace, pod, policy};

/// Bytes requested from the allocator and not freed yet, and how many allocations hold
/// them.
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_BLOCKS: AtomicIsize = AtomicIsize::new(0);

struct Counting;

fn grow(bytes: usize, blocks: isize) {
    LIVE_BYTES.fetch_add(bytes as isize, Ordering::Relaxed);
    LIVE_BLOCKS.fetch_add(blocks, Ordering::Relaxed);
}

fn shrink(bytes: usize, blocks: isize) {
    LIVE_BYTES.fetch_sub(bytes as isize, Ordering::Relaxed);
    LIVE_BLOCKS.fetch_sub(blocks, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; the counters only
// watch.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            grow(layout.size(), 1);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            grow(layout.size(), 1);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(block, layout) };
        shrink(layout.size(), 1);
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            shrink(layout.size(), 0);
            grow(new_size, 0);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> (isize, isize) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_BLOCKS.load(Ordering::Relaxed),
    )
}

const NAMESPACE_COUNT: usize = 100;
const PODS_PER_NAMESPACE: usize = 100;
const POLICIES_PER_NAMESPACE: usize = 10;

/// The most the source may hold for them: about twice the 21.6 MiB `cni_policy::cluster`
/// documents.
const BOUND: isize = 44 << 20;

fn team(n: usize) -> String {
    format!("team-{n:03}")
}

/// A Deployment's pod: four labels, one address, one named port.
fn deployment_pod(ns: usize, n: usize) -> Value {
    let app = format!("app-{}", n % 10);
    pod(
        &team(ns),
        &format!("{app}-7d4b9c8f6-{n:05}"),
        "100",
        &format!("10.{}.{}.{}", 100 + ns / 100, ns % 100, n + 1),
        &[
            &format!("app={app}"),
            "pod-template-hash=7d4b9c8f6",
            &format!("app.kubernetes.io/name={app}"),
            &format!("app.kubernetes.io/part-of={}", team(ns)),
        ],
    )
}

/// A policy letting one app of another team into one app here, on a port by number and
/// one by name.
fn team_policy(ns: usize, n: usize) -> Value {
    let spec = json!({
        "podSelector": {"matchLabels": {"app": format!("app-{n}")}},
        "policyTypes": ["Ingress"],
        "ingress": [{
            "from": [{
                "namespaceSelector": {"matchLabels": {"team": team((ns + 1) % NAMESPACE_COUNT)}},
                "podSelector": {"matchLabels": {"app": format!("app-{}", (n + 1) % 10)}},
            }],
            "ports": [{"protocol": "TCP", "port": 8080}, {"port": "http"}],
        }],
    });
    policy(&team(ns), &format!("allow-app-{n}"), "200", spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pods_and_a_thousand_policies_fit_the_bound() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut api = FakeApi::start().await;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    let client = connect(&ClusterAccess::Kubeconfig(kubeconfig))
        .await
        .expect("a client");
    let (before, blocks_before) = live();
    let mut rx = watch_cluster(client);

    let namespaces: Vec<Value> = (0..NAMESPACE_COUNT)
        .map(|ns| namespace(&team(ns), "1", &[&format!("team={}", team(ns))]))
        .collect();
    api.expect_list_of(NAMESPACES)
        .await
        .reply_list("300", &namespaces);
    drop(namespaces);
    let pods: Vec<Value> = (0..NAMESPACE_COUNT)
        .flat_map(|ns| (0..PODS_PER_NAMESPACE).map(move |n| deployment_pod(ns, n)))
        .collect();
    api.expect_list_of(PODS).await.reply_list("300", &pods);
    drop(pods);
    let policies: Vec<Value> = (0..NAMESPACE_COUNT)
        .flat_map(|ns| (0..POLICIES_PER_NAMESPACE).map(move |n| team_policy(ns, n)))
        .collect();
    api.expect_list_of(NETWORK_POLICIES)
        .await
        .reply_list("300", &policies);
    drop(policies);
    let _watches = [
        api.expect_watch_of(NAMESPACES, "300").await,
        api.expect_watch_of(PODS, "300").await,
        api.expect_watch_of(NETWORK_POLICIES, "300").await,
    ];
    tokio::time::timeout(Duration::from_secs(120), rx.changed())
        .await
        .expect("published")
        .expect("the source runs");
    {
        let objects = rx.borrow_and_update();
        assert_eq!(objects.namespaces.len(), NAMESPACE_COUNT);
        assert_eq!(objects.pods.len(), NAMESPACE_COUNT * PODS_PER_NAMESPACE);
        assert_eq!(
            objects.policies.len(),
            NAMESPACE_COUNT * POLICIES_PER_NAMESPACE,
            "{:?}",
            objects.refused.first()
        );
    }
    // What the lists left behind (the connections' buffers) settles.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (after, blocks_after) = live();
    let held = after - before;

    // One published copy, counted alone: a clone of it.
    let published = rx.borrow().clone();
    let (start, start_blocks) = live();
    let timer = Instant::now();
    let copy = (*published).clone();
    let cloned_in = timer.elapsed();
    let (end, end_blocks) = live();
    drop(copy);

    let mib = |bytes: isize| bytes as f64 / f64::from(1 << 20);
    println!(
        "held: {:.1} MiB in {} allocations; one published Objects: {:.1} MiB in {} allocations, cloned in {cloned_in:?} (this build)",
        mib(held),
        blocks_after - blocks_before,
        mib(end - start),
        end_blocks - start_blocks,
    );
    assert!(held < BOUND, "{:.1} MiB held", mib(held));
}
