//! [`Work`]: the handle of a call started on an
//! [`AsyncCommunicator`](super::AsyncCommunicator), which owns the call's
//! buffers until it has finished with them.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use super::error::CommError;

/// A finished call: the buffers it owned and how it ended.
pub(super) struct Outcome<B> {
    pub buffers: B,
    pub result: Result<(), CommError>,
}

/// A call in flight on a progress thread.
///
/// The handle owns the call's buffers (it took them by value when the call
/// started), so nothing else can read or write them while communication
/// runs; [`wait`](Work::wait) gives them back. Dropping a `Work` does not
/// cancel the call: it still runs, in issue order, and its buffers are
/// dropped once it ends.
#[must_use = "a started call's buffers come back only through `wait`"]
pub struct Work<B> {
    state: State<B>,
}

enum State<B> {
    Pending(Receiver<Outcome<B>>),
    Done(Outcome<B>),
    /// The progress thread ended without running the call (it cannot
    /// start, or a caller's closure panicked and took the buffers with it).
    Lost(CommError),
}

impl<B> std::fmt::Debug for Work<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Pending(_) => "pending".to_owned(),
            State::Done(o) => match &o.result {
                Ok(()) => "complete".to_owned(),
                Err(e) => format!("failed: {e}"),
            },
            State::Lost(e) => format!("lost: {e}"),
        };
        write!(f, "Work({state})")
    }
}

/// A call that failed, with the buffers it owned: a failure loses nothing
/// the caller handed over. `?` turns it into its [`CommError`].
#[derive(Debug)]
pub struct Failed<B> {
    /// Why.
    pub error: CommError,
    /// The call's buffers, unless the call's own closure panicked while it
    /// held them ([`AsyncCommunicator::start`](super::AsyncCommunicator::start)).
    pub buffers: Option<B>,
}

impl<B> std::fmt::Display for Failed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<B: std::fmt::Debug> std::error::Error for Failed<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B> From<Failed<B>> for CommError {
    fn from(failed: Failed<B>) -> Self {
        failed.error
    }
}

impl<B> Work<B> {
    pub(super) fn pending(outcome: Receiver<Outcome<B>>) -> Self {
        Work {
            state: State::Pending(outcome),
        }
    }

    pub(super) fn lost(error: CommError) -> Self {
        Work {
            state: State::Lost(error),
        }
    }

    /// Take the outcome if it has arrived, waiting at most `timeout`
    /// (`None`: do not wait).
    fn poll(&mut self, timeout: Option<Duration>) -> bool {
        let State::Pending(rx) = &self.state else {
            return true;
        };
        let got = match timeout {
            None => rx.try_recv().map_err(|e| matches!(e, TryRecvError::Empty)),
            Some(t) => rx
                .recv_timeout(t)
                .map_err(|e| matches!(e, RecvTimeoutError::Timeout)),
        };
        self.state = match got {
            Ok(outcome) => State::Done(outcome),
            Err(true) => return false,
            Err(false) => State::Lost(thread_gone()),
        };
        true
    }

    /// True once the call has finished, successfully or not (never blocks).
    pub fn is_complete(&mut self) -> bool {
        self.poll(None)
    }

    /// Wait up to `timeout` for the call to finish; true if it has.
    pub fn wait_timeout(&mut self, timeout: Duration) -> bool {
        self.poll(Some(timeout))
    }

    /// The call's error, once it has finished and failed (never blocks).
    pub fn error(&mut self) -> Option<&CommError> {
        self.poll(None);
        match &self.state {
            State::Pending(_) => None,
            State::Done(o) => o.result.as_ref().err(),
            State::Lost(e) => Some(e),
        }
    }

    /// Wait for the call to finish and take its buffers back.
    pub fn wait(mut self) -> Result<B, Failed<B>> {
        if let State::Pending(rx) = &self.state {
            self.state = match rx.recv() {
                Ok(outcome) => State::Done(outcome),
                Err(_) => State::Lost(thread_gone()),
            };
        }
        match self.state {
            State::Done(Outcome {
                buffers,
                result: Ok(()),
            }) => Ok(buffers),
            State::Done(Outcome {
                buffers,
                result: Err(error),
            }) => Err(Failed {
                error,
                buffers: Some(buffers),
            }),
            State::Lost(error) => Err(Failed {
                error,
                buffers: None,
            }),
            State::Pending(_) => unreachable!("waited above"),
        }
    }
}

fn thread_gone() -> CommError {
    CommError::Capacity {
        what: "the communicator's progress thread ended before the call ran".into(),
    }
}
