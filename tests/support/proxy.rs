//! A TCP proxy that can forward, blackhole (stop forwarding in both directions while keeping
//! every socket open, like a partition) and cut (close every connection).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const FORWARD: u8 = 0;
const BLACKHOLE: u8 = 1;

pub struct Proxy {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

fn pump(mut from: TcpStream, mut to: TcpStream, mode: Arc<AtomicU8>) {
    from.set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if mode.load(Ordering::Acquire) == BLACKHOLE {
            // Leave the bytes in the kernel's buffers: nothing gets through, nothing closes.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

impl Proxy {
    /// Listens on 127.0.0.1 (any free port) and forwards each connection to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(FORWARD));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let (m, st) = (mode.clone(), streams.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                {
                    let mut all = st.lock().unwrap();
                    all.push(client.try_clone().unwrap());
                    all.push(server.try_clone().unwrap());
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (m1, m2) = (m.clone(), m.clone());
                std::thread::spawn(move || pump(client, server, m1));
                std::thread::spawn(move || pump(s2, c2, m2));
            }
        });
        Proxy {
            addr,
            mode,
            streams,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn forward(&self) {
        self.mode.store(FORWARD, Ordering::Release);
    }

    pub fn blackhole(&self) {
        self.mode.store(BLACKHOLE, Ordering::Release);
    }

    /// Closes every connection made so far.
    #[allow(dead_code)]
    pub fn cut(&self) {
        for stream in self.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}
