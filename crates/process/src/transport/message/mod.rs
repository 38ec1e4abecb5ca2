//! What the transports that carry whole messages (TCP, MPI) share: the
//! frames on the wire and the checks that trust none of their fields
//! (`frame`), what arriving frames leave behind — queues per link,
//! credits, failures and departures heard of (`mailbox`) — and the
//! one-shot inputs announcements carry (`staging`).
//!
//! A shared-memory link hands the executor a slot its peer wrote; these
//! transports hand it a received buffer instead, and keep the verifier's
//! bounded links with credits: a sender has at most `slots`
//! unacknowledged messages per link.

pub(crate) mod frame;
pub(crate) mod mailbox;
pub(crate) mod staging;
