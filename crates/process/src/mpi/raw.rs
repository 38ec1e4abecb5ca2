//! Every call into the MPI library, behind functions that check the
//! return codes that matter (not those of the best-effort cleanup calls):
//! the rest of the crate never touches `mpi::ffi`.
//!
//! Communicators are set to return errors (`MPI_ERRORS_RETURN`) as soon
//! as they are made, so a failed call on them is a [`MpiError`], not an
//! abort of the process by the library.

use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use mpi::ffi;

use super::MpiError;

/// The tag `MPI_Comm_create_group` matches the members' calls with.
const SUBSET_TAG: c_int = 0x5eb;

/// Which threads may call MPI: the level `MPI_Init_thread` granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Threading {
    /// One thread only.
    Single,
    /// Only the thread that initialized MPI.
    Funneled,
    /// Any thread, one at a time.
    Serialized,
    /// Any thread, at any time.
    Multiple,
}

/// The `MPI_THREAD_*` constant of a level.
fn level(threading: Threading) -> c_int {
    // SAFETY: reading constants the rsmpi shim defines once at load time.
    unsafe {
        match threading {
            Threading::Single => ffi::RSMPI_THREAD_SINGLE,
            Threading::Funneled => ffi::RSMPI_THREAD_FUNNELED,
            Threading::Serialized => ffi::RSMPI_THREAD_SERIALIZED,
            Threading::Multiple => ffi::RSMPI_THREAD_MULTIPLE,
        }
    }
}

fn threading_of(level_granted: c_int) -> Threading {
    [
        Threading::Multiple,
        Threading::Serialized,
        Threading::Funneled,
    ]
    .into_iter()
    .find(|&t| level(t) == level_granted)
    .unwrap_or(Threading::Single)
}

/// MPI's words for an error code.
pub fn error_text(code: c_int) -> String {
    let mut text = [0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as the
    // call requires; it writes `len` of them.
    let rc = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr(), &mut len) };
    if rc != 0 || len <= 0 {
        return format!("MPI error {code}");
    }
    let len = (len as usize).min(text.len());
    let bytes: Vec<u8> = text[..len].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `Ok` when `rc` is `MPI_SUCCESS`, else the call's error.
fn check(call: &'static str, rc: c_int) -> Result<(), MpiError> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(MpiError::Call {
            call,
            reason: error_text(rc),
        })
    }
}

/// Whether `MPI_Init` has run in this process, and whether
/// `MPI_Finalize` has.
pub fn state() -> (bool, bool) {
    let (mut init, mut fini) = (0, 0);
    // SAFETY: both may be called at any time, before init and after
    // finalize included; each writes one int.
    unsafe {
        ffi::MPI_Initialized(&mut init);
        ffi::MPI_Finalized(&mut fini);
    }
    (init != 0, fini != 0)
}

/// Initialize MPI asking for `wanted`; the level granted.
pub fn init(wanted: Threading) -> Result<Threading, MpiError> {
    let mut granted: c_int = 0;
    // SAFETY: null argc/argv are allowed by MPI-2 and later; called once,
    // before MPI was initialized (the caller checked `state`).
    let rc = unsafe {
        ffi::MPI_Init_thread(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            level(wanted),
            &mut granted,
        )
    };
    check("MPI_Init_thread", rc)?;
    Ok(threading_of(granted))
}

/// The level of an MPI someone else initialized.
pub fn threading() -> Threading {
    let mut granted: c_int = 0;
    // SAFETY: called after MPI_Init; writes one int.
    unsafe { ffi::MPI_Query_thread(&mut granted) };
    threading_of(granted)
}

/// Finalize MPI (once, after every communicator this crate made is freed).
pub fn finalize() {
    // SAFETY: the caller initialized MPI and frees nothing of MPI's after.
    unsafe { ffi::MPI_Finalize() };
}

/// The MPI library's own name and version.
pub fn library_version() -> String {
    let mut text = [0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: 8192 bytes exceed MPI_MAX_LIBRARY_VERSION_STRING for every
    // MPI we know of; the call may run before init.
    let rc = unsafe { ffi::MPI_Get_library_version(text.as_mut_ptr(), &mut len) };
    if rc != 0 || len <= 0 {
        return "an MPI library (version unknown)".to_owned();
    }
    let len = (len as usize).min(text.len());
    let bytes: Vec<u8> = text[..len].iter().map(|&c| c as u8).collect();
    let text = String::from_utf8_lossy(&bytes);
    // The length some libraries report counts the terminating NUL.
    let line = text.lines().next().unwrap_or("");
    line.trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .to_owned()
}

/// Ranks in `MPI_COMM_WORLD`.
pub fn world_size() -> Result<u32, MpiError> {
    let mut size: c_int = 0;
    // SAFETY: MPI is initialized (an `Mpi` exists); writes one int.
    let rc = unsafe { ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size) };
    check("MPI_Comm_size", rc)?;
    Ok(size as u32)
}

/// A communicator this crate owns: freed when dropped.
pub struct Comm {
    handle: ffi::MPI_Comm,
    rank: u32,
    size: u32,
    /// Not to be freed (see [`Comm::keep`]).
    kept: std::sync::atomic::AtomicBool,
}

// SAFETY: an MPI communicator handle names library state, not memory of
// this process; MPI is initialized with MPI_THREAD_MULTIPLE where more
// than one thread calls it (see `MpiTransport`), and a handle used by one
// thread at a time needs nothing more.
unsafe impl Send for Comm {}
// SAFETY: as above; shared handles are only used under MPI_THREAD_MULTIPLE.
unsafe impl Sync for Comm {}

impl Comm {
    /// A duplicate of `MPI_COMM_WORLD`, returning errors; collective, and
    /// given up at `deadline` (a rank that never joins is a typed error,
    /// not a hang).
    pub fn dup_world(deadline: Instant) -> Result<Comm, MpiError> {
        // On the heap: MPI writes the handle when the request completes,
        // which may be after a timeout (then the box is leaked).
        let mut out = Box::new(MaybeUninit::<ffi::MPI_Comm>::uninit());
        let mut req = MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: the world communicator; MPI writes the request now and
        // the new handle once the request completes.
        let rc = unsafe {
            ffi::MPI_Comm_idup(ffi::RSMPI_COMM_WORLD, out.as_mut_ptr(), req.as_mut_ptr())
        };
        check("MPI_Comm_idup", rc)?;
        // SAFETY: MPI_Comm_idup succeeded, so it wrote the request.
        let req = Request(unsafe { req.assume_init() });
        if let Err(e) = req.wait_until(deadline, "MPI_Comm_idup of MPI_COMM_WORLD") {
            std::mem::forget(out);
            return Err(e);
        }
        // SAFETY: the request completed, so the handle is written and valid.
        adopt(*unsafe { out.assume_init() })
    }

    /// The communicator of `members` (ranks here, in the new rank order):
    /// collective over the members only, so ranks left out of a split take
    /// no part.
    pub fn subset(&self, members: &[u32]) -> Result<Comm, MpiError> {
        let ranks: Vec<c_int> = members.iter().map(|&r| r as c_int).collect();
        let mut all = MaybeUninit::<ffi::MPI_Group>::uninit();
        // SAFETY: a live communicator; MPI writes its group.
        let rc = unsafe { ffi::MPI_Comm_group(self.handle, all.as_mut_ptr()) };
        check("MPI_Comm_group", rc)?;
        // SAFETY: the call succeeded, so it wrote the group.
        let mut all = unsafe { all.assume_init() };
        let mut part = MaybeUninit::<ffi::MPI_Group>::uninit();
        // SAFETY: `ranks` holds `len` ranks of this communicator (the
        // agreed members, each below its size).
        let rc = unsafe {
            ffi::MPI_Group_incl(all, ranks.len() as c_int, ranks.as_ptr(), part.as_mut_ptr())
        };
        // SAFETY: a group MPI made for us, freed once.
        unsafe { ffi::MPI_Group_free(&mut all) };
        check("MPI_Group_incl", rc)?;
        // SAFETY: the call succeeded, so it wrote the group.
        let mut part = unsafe { part.assume_init() };
        let mut out = MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: a live communicator and a group of its ranks this rank
        // belongs to; MPI writes the new handle.
        let rc =
            unsafe { ffi::MPI_Comm_create_group(self.handle, part, SUBSET_TAG, out.as_mut_ptr()) };
        // SAFETY: a group MPI made for us, freed once.
        unsafe { ffi::MPI_Group_free(&mut part) };
        check("MPI_Comm_create_group", rc)?;
        // SAFETY: the call succeeded, so it wrote a handle.
        adopt(unsafe { out.assume_init() })
    }

    /// This process's rank in it.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Its number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Never free the communicator: for one whose requests could not all
    /// be completed (freeing it would leave MPI with operations on a
    /// communicator that is gone); MPI reclaims it when it finalizes.
    pub fn keep(&self) {
        self.kept.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Rank `root`'s `bytes` on every rank (collective; every rank passes
    /// a buffer of the same size, the root's with its content), given up
    /// at `deadline`.
    pub fn broadcast(
        &self,
        root: u32,
        mut bytes: Vec<u8>,
        deadline: Instant,
    ) -> Result<Vec<u8>, MpiError> {
        let len = count(bytes.len())?;
        let mut req = MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: `len` bytes on every rank; the buffer outlives the wait
        // below, or is leaked when it is given up (MPI may still write it).
        let rc = unsafe {
            ffi::MPI_Ibcast(
                bytes.as_mut_ptr().cast::<c_void>(),
                len,
                ffi::RSMPI_UINT8_T,
                root as c_int,
                self.handle,
                req.as_mut_ptr(),
            )
        };
        check("MPI_Ibcast", rc)?;
        // SAFETY: MPI_Ibcast succeeded, so it wrote the request.
        let req = Request(unsafe { req.assume_init() });
        match req.wait_until(deadline, "MPI_Ibcast of the store's address") {
            Ok(()) => Ok(bytes),
            Err(e) => {
                std::mem::forget(bytes);
                Err(e)
            }
        }
    }

    /// Start sending `len` bytes at `buf` to `to` with `tag`.
    ///
    /// # Safety
    /// `buf` must stay valid and unchanged for `len` bytes until the
    /// request completes (or is cancelled and completes).
    pub unsafe fn isend(
        &self,
        buf: *const u8,
        len: usize,
        to: u32,
        tag: i32,
    ) -> Result<Request, MpiError> {
        let count = count(len)?;
        let mut req = MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: the caller keeps the buffer; MPI writes the request.
        let rc = unsafe {
            ffi::MPI_Isend(
                buf.cast::<c_void>(),
                count,
                ffi::RSMPI_UINT8_T,
                to as c_int,
                tag,
                self.handle,
                req.as_mut_ptr(),
            )
        };
        check("MPI_Isend", rc)?;
        // SAFETY: MPI_Isend succeeded, so it wrote the request.
        Ok(Request(unsafe { req.assume_init() }))
    }

    /// The next message from anyone, with any tag, if one has arrived
    /// (matched: no other probe sees it again): its sender, tag and size.
    /// Messages from one sender match in the order they were sent.
    pub fn probe(&self) -> Result<Option<Matched>, MpiError> {
        let mut flag: c_int = 0;
        let mut message = MaybeUninit::<ffi::MPI_Message>::uninit();
        let mut status = MaybeUninit::<ffi::MPI_Status>::uninit();
        // SAFETY: a live communicator; MPI writes the flag, and the
        // message and status when the flag is set.
        let rc = unsafe {
            ffi::MPI_Improbe(
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                self.handle,
                &mut flag,
                message.as_mut_ptr(),
                status.as_mut_ptr(),
            )
        };
        check("MPI_Improbe", rc)?;
        if flag == 0 {
            return Ok(None);
        }
        // SAFETY: the flag is set, so both were written.
        let (message, status) = unsafe { (message.assume_init(), status.assume_init()) };
        let mut bytes: c_int = 0;
        // SAFETY: a status MPI just filled in; writes one int.
        let rc = unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut bytes) };
        check("MPI_Get_count", rc)?;
        Ok(Some(Matched {
            message,
            from: status.MPI_SOURCE as u32,
            tag: status.MPI_TAG,
            bytes: bytes.max(0) as usize,
        }))
    }
}

/// A message matched by [`Comm::probe`], to be received exactly once.
pub struct Matched {
    message: ffi::MPI_Message,
    /// Its sender.
    pub from: u32,
    /// Its tag.
    pub tag: i32,
    /// Its size in bytes.
    pub bytes: usize,
}

impl Matched {
    /// Start receiving the message into `len` bytes at `buf` (at least
    /// its size, or MPI reports truncation).
    ///
    /// # Safety
    /// `buf` must stay valid for writes of `len` bytes, touched by
    /// nothing else, until the request completes.
    pub unsafe fn receive(mut self, buf: *mut u8, len: usize) -> Result<Request, MpiError> {
        let count = count(len)?;
        let mut req = MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: the caller keeps the buffer; the message handle was
        // matched by a probe and is received once (this consumes it).
        let rc = unsafe {
            ffi::MPI_Imrecv(
                buf.cast::<c_void>(),
                count,
                ffi::RSMPI_UINT8_T,
                &mut self.message,
                req.as_mut_ptr(),
            )
        };
        check("MPI_Imrecv", rc)?;
        // SAFETY: MPI_Imrecv succeeded, so it wrote the request.
        Ok(Request(unsafe { req.assume_init() }))
    }
}

/// A pending send or receive.
pub struct Request(ffi::MPI_Request);

// SAFETY: a request handle names library state; it moves between
// threads only under MPI_THREAD_MULTIPLE (the aborter's sends).
unsafe impl Send for Request {}

impl Request {
    /// Wait for a collective's request until `deadline`, looking every
    /// 100 µs; past it the request is left to MPI (a collective cannot be
    /// cancelled) and `what` timed out.
    fn wait_until(mut self, deadline: Instant, what: &'static str) -> Result<(), MpiError> {
        loop {
            if self.test()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                // The handle is left to MPI: a collective cannot be
                // cancelled or freed before it completes.
                return Err(MpiError::Timeout { what });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Whether MPI already freed the request (it may, on an error).
    fn is_null(&self) -> bool {
        // SAFETY: reading the shim's constant.
        self.0 == unsafe { ffi::RSMPI_REQUEST_NULL }
    }

    /// Whether it completed (then it is spent); `Err` when it failed.
    pub fn test(&mut self) -> Result<bool, MpiError> {
        let mut flag: c_int = 0;
        let mut status = MaybeUninit::<ffi::MPI_Status>::uninit();
        // SAFETY: a live request (tested again only while not complete);
        // MPI writes the flag and status.
        let rc = unsafe { ffi::MPI_Test(&mut self.0, &mut flag, status.as_mut_ptr()) };
        check("MPI_Test", rc)?;
        Ok(flag != 0)
    }

    /// Give up on it: cancel, then let MPI free it when it is done. The
    /// buffer must still outlive it (the caller leaks it or keeps it).
    pub fn abandon(mut self) {
        if self.is_null() {
            return;
        }
        // SAFETY: a live request (not null: MPI did not free it); cancel
        // may fail for a send already under way, and freeing an active
        // request is allowed (MPI frees it once it completes).
        unsafe {
            ffi::MPI_Cancel(&mut self.0);
            ffi::MPI_Request_free(&mut self.0);
        }
    }
}

/// A byte count MPI can take (an `int`).
fn count(len: usize) -> Result<c_int, MpiError> {
    c_int::try_from(len).map_err(|_| MpiError::Call {
        call: "MPI_Isend",
        reason: format!(
            "{len} bytes do not fit an MPI count (at most {} per message)",
            c_int::MAX
        ),
    })
}

/// Take ownership of a new communicator: errors returned, rank and size read.
fn adopt(handle: ffi::MPI_Comm) -> Result<Comm, MpiError> {
    // SAFETY: a live communicator this crate just made; the handler is
    // MPI's predefined one.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(handle, ffi::RSMPI_ERRORS_RETURN) };
    let mut comm = Comm {
        handle,
        rank: 0,
        size: 0,
        kept: std::sync::atomic::AtomicBool::new(false),
    };
    check("MPI_Comm_set_errhandler", rc)?;
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: a live communicator; each writes one int.
    let rc = unsafe { ffi::MPI_Comm_rank(handle, &mut rank) };
    check("MPI_Comm_rank", rc)?;
    // SAFETY: as above.
    let rc = unsafe { ffi::MPI_Comm_size(handle, &mut size) };
    check("MPI_Comm_size", rc)?;
    comm.rank = rank as u32;
    comm.size = size as u32;
    Ok(comm)
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.kept.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // SAFETY: a communicator this crate made and nothing uses any
        // more (its transport waited for its requests); MPI is still
        // initialized, since every owner of a communicator also holds the
        // `Mpi` handle that finalizes.
        unsafe { ffi::MPI_Comm_free(&mut self.handle) };
    }
}
