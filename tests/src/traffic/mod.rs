//! Real TCP and UDP traffic inside namespaces: echo servers, round trips, a long-lived
//! stream, many connections at once. Threads enter a namespace with setns and end with
//! their work, so the test's own threads never change namespace. Every loop is bounded
//! in time.
//!
//! This module hands out the threads (`spawn_in`, `run_in`: a thread the namespace
//! itself enters, see `Netns::spawn`; `Background`); `tcp` and `udp`
//! own the traffic itself, `sctp` SCTP's (`bulk`: one-way transfers checked byte for byte); `probe` runs the one client that must be a process of its
//! own (in a cgroup); `iperf` runs iperf3; `spoof` sends what an attacker in a pod would.

pub mod bulk;
pub mod iperf;
mod probe;
mod raw;
pub mod sctp;
pub mod spoof;
mod tcp;
mod udp;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

pub use self::{
    probe::probe,
    raw::RawSocket,
    tcp::{EchoServer, Stream, many_connections, round_trip, round_trip_from},
    udp::{UdpEcho, udp_round_trip},
};
use crate::netns::Netns;

/// The longest any helper here keeps a thread alive (stretched in a slow guest: a test
/// restarting the daemon three times under a stream takes about four minutes there).
fn max_lifetime() -> Duration {
    crate::scaled(Duration::from_secs(60))
}

/// How long a helper waits for a connection, a read or a write.
fn io_timeout() -> Duration {
    crate::scaled(Duration::from_secs(5))
}

/// Runs `work` on a new thread inside `netns`.
pub fn spawn_in<T, F>(netns: &Netns, work: F) -> JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    netns.spawn(work)
}

/// Runs `work` inside `netns` and waits for it.
pub fn run_in<T, F>(netns: &Netns, work: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    netns.run_inside(work)
}

/// A thread inside a namespace that works until asked to stop, stopped and joined on
/// drop. Its work gets the stop flag and checks it in every loop; those loops stay
/// bounded in time too, so a thread that misses the flag cannot hang a test.
pub struct Background<T> {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<T>>,
}

impl<T: Send + 'static> Background<T> {
    /// Runs `work` on a new thread inside `netns`, handing it the stop flag.
    pub fn start<F>(netns: &Netns, work: F) -> Self
    where
        F: FnOnce(Arc<AtomicBool>) -> T + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        Self {
            stop,
            handle: Some(spawn_in(netns, move || work(flag))),
        }
    }
}

impl<T> Background<T> {
    /// Sets the stop flag and waits for the thread; `None` if the thread panicked or
    /// was already finished.
    pub fn finish(&mut self) -> Option<T> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take()?.join().ok()
    }
}

impl<T> Drop for Background<T> {
    fn drop(&mut self) {
        self.finish();
    }
}
