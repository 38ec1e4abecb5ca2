//! The store's client.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::MAX_LEN;
use crate::error::StoreError;
use crate::server::Server;

/// A connection to the store.
#[derive(Debug)]
pub struct Store {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    timeout: Duration,
    /// Kept alive on rank 0 for the life of the store.
    _server: Option<Server>,
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

impl Store {
    /// Join the store at `addr` (`host:port`): rank 0 starts the server
    /// there first. Connecting retries until `timeout`.
    pub fn join(addr: &str, rank: u32, timeout: Duration) -> Result<Store, StoreError> {
        let resolved: SocketAddr = addr
            .to_socket_addrs()
            .map_err(|_| StoreError::BadAddress(addr.to_owned()))?
            .next()
            .ok_or_else(|| StoreError::BadAddress(addr.to_owned()))?;
        let server = if rank == 0 {
            Some(Server::start(resolved)?)
        } else {
            None
        };
        let target = server.as_ref().map_or(resolved, Server::addr);
        let deadline = Instant::now() + timeout;
        let conn = loop {
            match TcpStream::connect_timeout(&target, Duration::from_millis(500)) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(_) => {
                    return Err(StoreError::Unreachable {
                        addr: addr.to_owned(),
                        timeout,
                    });
                }
            }
        };
        conn.set_nodelay(true).map_err(io)?;
        conn.set_read_timeout(Some(timeout)).map_err(io)?;
        conn.set_write_timeout(Some(timeout)).map_err(io)?;
        Ok(Store {
            reader: BufReader::new(conn.try_clone().map_err(io)?),
            writer: BufWriter::new(conn),
            timeout,
            _server: server,
        })
    }

    /// This end of the connection to the store: the address other ranks
    /// can reach this process at (the interface that routes to rank 0).
    pub fn local_addr(&self) -> Result<SocketAddr, StoreError> {
        self.reader.get_ref().local_addr().map_err(io)
    }

    /// The address rank 0 serves on (rank 0 only; port 0 resolved).
    pub fn server_addr(&self) -> Option<SocketAddr> {
        self._server.as_ref().map(Server::addr)
    }

    fn request(&mut self, op: u8, key: &str, value: &[u8]) -> Result<(bool, Vec<u8>), StoreError> {
        if key.len() > MAX_LEN as usize || value.len() > MAX_LEN as usize {
            return Err(StoreError::Io("key or value too large".into()));
        }
        self.writer.write_all(&[op]).map_err(io)?;
        self.writer
            .write_all(&(key.len() as u32).to_le_bytes())
            .map_err(io)?;
        self.writer.write_all(key.as_bytes()).map_err(io)?;
        self.writer
            .write_all(&(value.len() as u32).to_le_bytes())
            .map_err(io)?;
        self.writer.write_all(value).map_err(io)?;
        self.writer.flush().map_err(io)?;
        let mut status = [0u8; 1];
        self.reader.read_exact(&mut status).map_err(io)?;
        let mut len = [0u8; 4];
        self.reader.read_exact(&mut len).map_err(io)?;
        let len = u32::from_le_bytes(len);
        if len > MAX_LEN {
            return Err(StoreError::Io("reply too large".into()));
        }
        let mut v = vec![0u8; len as usize];
        self.reader.read_exact(&mut v).map_err(io)?;
        Ok((status[0] == 0, v))
    }

    /// Store `value` under `key`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.request(1, key, value).map(|_| ())
    }

    /// The value under `key`, if set.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (found, v) = self.request(2, key, &[])?;
        Ok(found.then_some(v))
    }

    /// Add `delta` to the counter `key` (0 if unset); returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let (_, v) = self.request(3, key, &delta.to_le_bytes())?;
        v.try_into()
            .map(i64::from_le_bytes)
            .map_err(|_| StoreError::Io("bad counter reply".into()))
    }

    /// The value under `key`, waiting for it up to the store's timeout.
    pub fn wait(&mut self, key: &str) -> Result<Vec<u8>, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_micros(200);
        loop {
            if let Some(v) = self.get(key)? {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Timeout {
                    key: key.to_owned(),
                    timeout: self.timeout,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Wait until `world_size` ranks have called `barrier(name)`.
    pub fn barrier(&mut self, name: &str, world_size: u32) -> Result<(), StoreError> {
        let key = format!("barrier/{name}");
        self.add(&key, 1)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if self.add(&key, 0)? >= i64::from(world_size) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Timeout {
                    key,
                    timeout: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn ranks_meet_exchange_and_count() {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let t = Duration::from_secs(10);
        let mut zero = Store::join(&addr, 0, t).unwrap();
        let handles: Vec<_> = (1..4u32)
            .map(|r| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut s = Store::join(&addr, r, t).unwrap();
                    s.set(&format!("rank/{r}"), &r.to_le_bytes()).unwrap();
                    s.barrier("ready", 4).unwrap();
                    s.wait("rank/0").unwrap()
                })
            })
            .collect();
        zero.set("rank/0", b"zero").unwrap();
        zero.barrier("ready", 4).unwrap();
        for r in 1..4u32 {
            assert_eq!(zero.wait(&format!("rank/{r}")).unwrap(), r.to_le_bytes());
        }
        for h in handles {
            assert_eq!(h.join().unwrap(), b"zero");
        }
        assert_eq!(zero.add("n", 5).unwrap(), 5);
        assert_eq!(zero.add("n", -2).unwrap(), 3);
        assert_eq!(zero.get("missing").unwrap(), None);
    }

    #[test]
    fn failures_are_typed_and_bounded() {
        let t = Duration::from_millis(300);
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let _zero = Store::join(&addr, 0, t).unwrap();
        // A second rank 0 on the same port.
        let err = Store::join(&addr, 0, t).unwrap_err();
        assert!(matches!(err, StoreError::AddressInUse { .. }), "{err}");
        // Nobody home.
        let started = Instant::now();
        let err = Store::join(&format!("127.0.0.1:{}", free_port()), 1, t).unwrap_err();
        assert!(matches!(err, StoreError::Unreachable { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
        // A key that never comes.
        let mut s = Store::join(&addr, 1, t).unwrap();
        let err = s.wait("never").unwrap_err();
        assert!(matches!(err, StoreError::Timeout { .. }), "{err}");
        assert!(matches!(
            Store::join("no such host:x", 1, t),
            Err(StoreError::BadAddress(_))
        ));
    }
}
