//! The store's server, run by rank 0 on a background thread.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use crate::MAX_LEN;
use crate::error::StoreError;

/// A running store server; it serves until the process exits.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
}

type Map = Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>;

impl Server {
    /// Listen on `addr` (port 0 picks a free port) and serve on a
    /// background thread. A port already in use is
    /// [`StoreError::AddressInUse`].
    pub fn start(addr: SocketAddr) -> Result<Server, StoreError> {
        let listener = TcpListener::bind(addr).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => StoreError::AddressInUse { addr },
            _ => StoreError::Io(format!("binding {addr}: {e}")),
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let map: Map = Arc::new(Mutex::new(HashMap::new()));
        std::thread::Builder::new()
            .name("ferrocoll-store".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    let map = map.clone();
                    let _ = std::thread::Builder::new()
                        .name("ferrocoll-store-conn".into())
                        .spawn(move || {
                            if let Err(e) = serve(conn, &map) {
                                tracing::trace!("store connection ended: {e}");
                            }
                        });
                }
            })
            .map_err(|e| StoreError::Io(e.to_string()))?;
        Ok(Server { addr })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_blob(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let len = read_u32(r)?;
    if len > MAX_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "length too large",
        ));
    }
    let mut v = vec![0u8; len as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn serve(conn: TcpStream, map: &Map) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut writer = BufWriter::new(conn);
    loop {
        let mut op = [0u8; 1];
        if reader.read(&mut op)? == 0 {
            return Ok(());
        }
        let key = read_blob(&mut reader)?;
        let value = read_blob(&mut reader)?;
        let reply: (u8, Vec<u8>) = {
            let mut m = map.lock().unwrap_or_else(|e| e.into_inner());
            match op[0] {
                1 => {
                    m.insert(key, value);
                    (0, Vec::new())
                }
                2 => match m.get(&key) {
                    Some(v) => (0, v.clone()),
                    None => (1, Vec::new()),
                },
                3 => {
                    let delta = value.try_into().map(i64::from_le_bytes).unwrap_or(0);
                    let now = m
                        .get(&key)
                        .and_then(|v| v.as_slice().try_into().ok().map(i64::from_le_bytes))
                        .unwrap_or(0)
                        .wrapping_add(delta);
                    m.insert(key, now.to_le_bytes().to_vec());
                    (0, now.to_le_bytes().to_vec())
                }
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "unknown op",
                    ));
                }
            }
        };
        writer.write_all(&[reply.0])?;
        writer.write_all(&(reply.1.len() as u32).to_le_bytes())?;
        writer.write_all(&reply.1)?;
        writer.flush()?;
    }
}
