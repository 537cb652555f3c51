//! The process's one rtnetlink connection for the datapath's synchronous work (the
//! pods' TC block, clsact filters), on a thread of its own with a small runtime.
//!
//! The callers are synchronous and may hold the node's lock: they run on blocking
//! threads (the socket server and the address watcher hand requests to
//! `spawn_blocking`), at start, or in the CLI, where there is no runtime at all. Driving
//! the connection on a thread of its own keeps it independent of whichever runtime, if
//! any, the caller is on, and the connection is opened once, not per operation.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Mutex, mpsc},
};

use rtnetlink::Handle;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

type Job = Box<dyn FnOnce(Handle) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The running connection's job queue; `None` until first use, and again after the
/// thread ended (a new one is started then).
static JOBS: Mutex<Option<UnboundedSender<Job>>> = Mutex::new(None);

/// Runs `work` with the connection's handle on the netlink thread and waits for it. A
/// connection or thread that cannot be started is `work`'s error type's I/O error.
pub(super) fn with_netlink<T, E, F, Fut>(work: F) -> Result<T, E>
where
    T: Send + 'static,
    E: From<io::Error> + Send + 'static,
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    let (done, outcome) = mpsc::sync_channel(1);
    let job: Job = Box::new(move |handle| {
        Box::pin(async move {
            // The caller waits on the other end; if it went away, nobody needs this.
            let _ = done.send(work(handle).await);
        })
    });
    submit(job)?;
    outcome.recv().unwrap_or_else(|_| Err(stopped().into()))
}

fn submit(job: Job) -> io::Result<()> {
    let mut jobs = JOBS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let job = match jobs.as_ref() {
        Some(running) => match running.send(job) {
            Ok(()) => return Ok(()),
            // The thread ended: its queue hands the job back.
            Err(unsent) => unsent.0,
        },
        None => job,
    };
    let started = start()?;
    started.send(job).map_err(|_| stopped())?;
    *jobs = Some(started);
    Ok(())
}

/// Opens the connection and starts the thread that drives it and runs the jobs, one at
/// a time, in the order they came.
fn start() -> io::Result<UnboundedSender<Job>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (connection, handle, _) = {
        let _context = runtime.enter();
        rtnetlink::new_connection()?
    };
    let (jobs, mut queue) = unbounded_channel::<Job>();
    std::thread::Builder::new()
        .name("netlink".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let connection = tokio::spawn(connection);
                while let Some(job) = queue.recv().await {
                    job(handle.clone()).await;
                }
                connection.abort();
            });
        })?;
    Ok(jobs)
}

fn stopped() -> io::Error {
    io::Error::other("the netlink thread stopped")
}

/// Adds `route`, replacing one to the same destination (`ip route replace`).
pub(super) fn replace_route(route: rtnetlink::packet_route::route::RouteMessage) -> io::Result<()> {
    with_netlink(move |handle| async move {
        handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(io::Error::other)
    })
}
