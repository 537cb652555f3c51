//! A bulk TCP transfer one way, checked byte for byte: a sink that reads a connection to
//! its end, and a sender of a known pattern. (An echo of megabytes written whole before
//! reading back deadlocks once both sides' buffers are full.)

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    thread::JoinHandle,
    time::Duration,
};

use super::{run_in, spawn_in};
use crate::netns::Netns;

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The byte at offset `n` of every transfer.
fn pattern(n: usize) -> u8 {
    (n % 251) as u8
}

/// Accepts one connection on `port` inside `netns` and reads it to the end; returns
/// the peer and whether exactly `size` bytes of the pattern arrived, in order.
pub fn sink(netns: &Netns, port: u16, size: usize) -> JoinHandle<(SocketAddr, bool)> {
    let listener = run_in(netns, move || {
        TcpListener::bind(("0.0.0.0", port)).expect("bind the sink")
    });
    std::thread::spawn(move || {
        let (mut stream, peer) = listener.accept().expect("a connection");
        stream
            .set_read_timeout(Some(crate::scaled(IO_TIMEOUT)))
            .expect("timeout");
        let mut buffer = vec![0u8; 1 << 16];
        let (mut received, mut intact) = (0usize, true);
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    intact &= buffer[..n]
                        .iter()
                        .enumerate()
                        .all(|(at, byte)| *byte == pattern(received + at));
                    received += n;
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(_) => return (peer, false),
            }
        }
        (peer, intact && received == size)
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
