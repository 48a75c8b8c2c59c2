//! Registry traffic on the wire, for the tests that stand between crius and a registry:
//! piping a connection (optionally throttled), telling HTTP from a TLS hello, reading a request
//! head and forwarding it, and incompressible test data.

#![allow(clippy::unwrap_used)] // test scaffolding: a failure here is the test's failure

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub fn pipe(mut from: TcpStream, mut to: TcpStream, rate: Option<Arc<AtomicU64>>) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(r) = &rate {
            let bps = r.load(Ordering::Relaxed);
            if bps > 0 {
                std::thread::sleep(Duration::from_secs_f64(n as f64 / bps as f64));
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Whether a new connection starts with HTTP rather than a TLS hello (crius tries TLS first
/// on a loopback registry, then falls back to plain HTTP when it is closed unanswered).
pub fn speaks_http(c: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    c.peek(&mut first).unwrap_or(0) == 1 && first[0] != 0x16
}

/// A request's head, through its blank line; none when the connection ends first.
pub fn request_head(c: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if c.read(&mut b).unwrap_or(0) != 1 {
            return None;
        }
        head.push(b[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Sends a request whose `head` was read from `client` on to the registry on loopback `port`,
/// closing after its answer (no body: crius only GETs), and pipes the answer back.
pub fn forward(head: &str, client: TcpStream, port: u16) {
    let mut lines: Vec<&str> = head
        .trim_end()
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    lines.push("Connection: close");
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let _ = write!(server, "{}\r\n\r\n", lines.join("\r\n"));
    pipe(server, client, None);
}

/// Incompressible bytes, the same for the same seed.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
