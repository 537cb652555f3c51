//! A bulk TCP transfer one way, checked byte for byte: a sink that reads a connection to
//! its end, and a sender of a known pattern. (An echo of megabytes written whole before
//! reading back deadlocks once both sides' buffers are full.)

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{run_in, spawn_in};
use crate::netns::Netns;

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The byte at offset `n` of every transfer.
fn pattern(n: usize) -> u8 {
    (n % 251) as u8
}

/// What a [`sink`] received.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// The sender, as the sink saw it.
    pub peer: SocketAddr,
    /// Exactly the expected size of the pattern arrived, in order.
    pub intact: bool,
    /// From the first byte read to the end of the stream: how long the data took to
    /// flow, whatever the connection's set-up and the sender's start cost.
    pub flowing: Duration,
}

/// Accepts one connection on `port` inside `netns` and reads it to the end; returns
/// what arrived (see [`Received`]) against the `size` bytes of the pattern expected.
pub fn sink(netns: &Netns, port: u16, size: usize) -> JoinHandle<Received> {
    let listener = run_in(netns, move || {
        TcpListener::bind(("0.0.0.0", port)).expect("bind the sink")
    });
    std::thread::spawn(move || {
        // Made before the first byte: each read is then one memcmp, whose cost (even in
        // a debug build, even emulated) stays out of `flowing`.
        let expected: Vec<u8> = (0..size).map(pattern).collect();
        let (mut stream, peer) = listener.accept().expect("a connection");
        stream
            .set_read_timeout(Some(crate::scaled(IO_TIMEOUT)))
            .expect("timeout");
        let mut buffer = vec![0u8; 1 << 16];
        let (mut received, mut intact) = (0usize, true);
        let mut first = None;
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    first.get_or_insert_with(Instant::now);
                    intact &= expected.get(received..received + n) == Some(&buffer[..n]);
                    received += n;
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    intact = false;
                    break;
                }
            }
        }
        Received {
            peer,
            intact: intact && received == size,
            flowing: first.map_or(Duration::ZERO, |first| first.elapsed()),
        }
    })
}

/// Sends `size` bytes of the pattern from inside `netns` to `to`, closes its side, and
/// waits for the sink's close (every byte acknowledged).
pub fn send(netns: &Netns, to: SocketAddr, size: usize) -> std::io::Result<()> {
    spawn_in(netns, move || -> std::io::Result<()> {
        let mut stream = TcpStream::connect_timeout(&to, crate::scaled(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(crate::scaled(IO_TIMEOUT)))?;
        let data: Vec<u8> = (0..size).map(pattern).collect();
        stream.write_all(&data)?;
        stream.shutdown(Shutdown::Write)?;
        stream.set_read_timeout(Some(crate::scaled(IO_TIMEOUT)))?;
        let _ = stream.read(&mut [0u8; 1])?;
        Ok(())
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("the sender thread panicked")))
}
