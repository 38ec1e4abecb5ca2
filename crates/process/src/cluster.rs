//! The network between a group's hosts, in the selector: a group that
//! knows its network's rate (or is handed a whole cluster's topology)
//! plans each call by what a simulation of that network predicts, not by
//! a fixed rule.
//!
//! The process crate knows no topology: a [`ClusterModel`] (the facade's,
//! over `ferrocoll-topo`) turns the group's [`HostLayout`] into a text
//! only rank 0 writes, and that text into a selector every rank builds.
//! Hosts measure their own memory differently, so each building its own
//! description would select differently; one description, published
//! through the store while the group forms, makes every rank select the
//! same.

use std::fmt;
use std::sync::Arc;

use ferrocoll_core::select::SharedSelector;

use crate::layout::HostLayout;

/// A model of the network between a group's hosts.
pub trait ClusterModel: Send + Sync + fmt::Debug {
    /// What ranks must agree on (compared when the group forms, like
    /// every other setting): the rate, the file.
    fn settings(&self) -> String;

    /// On rank 0: the group's network as a text every rank can build from
    /// (a topology), from the layout the ranks agreed on.
    fn describe(&self, layout: &HostLayout) -> Result<String, String>;

    /// On every rank: the selector of a group of `world_size` ranks whose
    /// links hold `slots_per_link` messages, from rank 0's description.
    fn selector(
        &self,
        description: &str,
        world_size: u32,
        slots_per_link: u32,
    ) -> Result<SharedSelector, String>;
}

/// A shared cluster model in a configuration; two are equal when they
/// are the same object.
#[derive(Clone)]
pub struct SharedClusterModel(pub Arc<dyn ClusterModel>);

impl PartialEq for SharedClusterModel {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl Eq for SharedClusterModel {}

impl fmt::Debug for SharedClusterModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What rank 0 publishes in place of a description it could not make, so
/// the others fail with its reason instead of waiting.
const REFUSED: &str = "refused: ";

/// Rank 0's side: the description, or the reason there is none, as it
/// goes into the store.
pub(crate) fn publishable(model: &dyn ClusterModel, layout: &HostLayout) -> String {
    match model.describe(layout) {
        Ok(text) => text,
        Err(why) => format!("{REFUSED}{why}"),
    }
}

/// Every rank's side: rank 0's published text as a description, or its
/// reason for having none.
pub(crate) fn read_published(text: String) -> Result<String, String> {
    match text.strip_prefix(REFUSED) {
        Some(why) => Err(why.to_owned()),
        None => Ok(text),
    }
}
