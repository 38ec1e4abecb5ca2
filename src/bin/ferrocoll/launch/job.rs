//! What makes one launch a job of its own: a secret its ranks
//! authenticate with, and an id its shared-memory segments are named by,
//! so the launcher can remove whatever ranks killed during setup left.

use ferrocoll::rendezvous::JobSecret;

/// The job's identity, handed to every rank through the environment.
pub(crate) struct Job {
    /// `FERROCOLL_JOB_SECRET`: the caller's own if set, else a fresh one.
    pub secret: JobSecret,
    /// `FERROCOLL_JOB_ID`: 16 random hex digits.
    pub id: String,
}

impl Job {
    pub fn new() -> Job {
        let secret = JobSecret::from_env().unwrap_or_else(JobSecret::generate);
        let id = ferrocoll::rendezvous::random_hex::<8>();
        Job { secret, id }
    }

    /// The job `id` (the watchdog's view: it removes segments, nothing else).
    pub fn with_id(id: String) -> Job {
        Job {
            secret: JobSecret::generate(),
            id,
        }
    }

    /// Remove the segments of this job that are still named in tmpfs (a
    /// group unlinks its own once formed; only deaths during setup leave
    /// any). Returns how many were removed.
    pub fn remove_segments(&self) -> usize {
        // Only ids this launcher makes: a hand-passed one must not widen
        // the pattern (an empty id would match every job's segments).
        if self.id.is_empty() || !self.id.chars().all(|c| c.is_ascii_hexdigit()) {
            return 0;
        }
        let prefix = format!("ferrocoll-{}.", self.id);
        let Ok(dir) = std::fs::read_dir("/dev/shm") else {
            return 0;
        };
        dir.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .filter(|e| std::fs::remove_file(e.path()).is_ok())
            .count()
    }
}
