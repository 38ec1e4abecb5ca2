//! A file in shared memory mapped into this process: one rank's segment.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// A `MAP_SHARED` mapping of a whole file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    path: PathBuf,
    _file: File,
}

// SAFETY: the mapping is plain memory shared with other processes; every
// access through it is either atomic or follows the slot protocol of the
// shared-memory transport, which does not depend on which thread accesses.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` only hands out the base address.
unsafe impl Sync for Segment {}

/// Where segments live: tmpfs when the system has it.
pub(crate) fn directory() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

impl Segment {
    /// Create `path` (which must not exist) with `len` zeroed bytes, backed
    /// now rather than on first touch, so a full tmpfs is an error here and
    /// not a SIGBUS in the middle of a collective.
    /// Only this user may open it (mode 0600): the segment holds the
    /// group's data and its control words.
    pub fn create(path: &Path, len: usize) -> std::io::Result<Segment> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        // A failure past this point must not leave the file behind.
        let made = file
            .set_len(len as u64)
            .and_then(|()| reserve(&file, len))
            .and_then(|()| Segment::map(file, path, len));
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// Map an existing segment, which must hold exactly `len` bytes (every
    /// rank lays its segment out from the same settings).
    /// A segment another user made (planted under a name this group
    /// will use) is refused: its owner could read or rewrite every call.
    pub fn open(path: &Path, len: usize) -> std::io::Result<Segment> {
        use std::os::unix::fs::MetadataExt;
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let meta = file.metadata()?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to uid {} with mode {:o}, not to this user alone (uid {me})",
                    path.display(),
                    meta.uid(),
                    meta.mode() & 0o777
                ),
            ));
        }
        let actual = meta.len();
        if actual != len as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} holds {actual} bytes, expected {len} (ranks configured differently?)",
                    path.display()
                ),
            ));
        }
        Segment::map(file, path, len)
    }

    fn map(file: File, path: &Path, len: usize) -> std::io::Result<Segment> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared read-write mapping of `len` bytes of an
        // open file at least that long; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Segment {
            base: base as *mut u8,
            len,
            path: path.to_path_buf(),
            _file: file,
        })
    }

    /// The first byte; page aligned.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Remove the file; mappings stay valid until each process unmaps.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what `mmap` returned and nothing
        // borrowed from the mapping outlives the segment (the transport
        // owns both).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len.max(1));
        }
    }
}

/// Bytes free to unprivileged users in the filesystem holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer of the right type for
    // the kernel to fill; read only when the call succeeds.
    let stat = unsafe {
        if libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        stat.assume_init()
    };
    Some((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(target_os = "linux")]
fn reserve(file: &File, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        // Filesystems without fallocate: fall back to touching on first use.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

#[cfg(not(target_os = "linux"))]
fn reserve(_file: &File, _len: usize) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn segments_are_this_users_alone_and_others_are_refused() {
        let path = directory().join(format!("ferrocoll-test-perm.{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let seg = Segment::create(&path, 4096).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        // Before: 0644 under the usual umask, readable by every user.
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        drop(Segment::open(&path, 4096).unwrap());
        // A segment others may read or write is not opened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = Segment::open(&path, 4096).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        seg.unlink();
    }
}
