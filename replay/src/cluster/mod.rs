//! The cluster: N instances on one clock behind a gateway
//! (`../shared/design/cluster-architecture.md`). [`control`] admits, queues
//! and routes each request; [`admission`], [`routing`] (policies and their
//! scorers; [`tree`], decision-tree routing; [`code`], evolved-code routing in a sandbox), [`priority`] and [`prefix_index`] (the router's view of each
//! instance's prefix cache) are its policies; [`policy`] reads them from a
//! policy bundle; [`disaggregation`] splits the cluster into prefill and
//! decode pools; [`autoscale`] adds and removes replicas.

pub mod admission;
pub mod autoscale;
pub mod code;
pub mod control;
pub mod disaggregation;
pub mod error;
pub mod policy;
pub mod prefix_index;
pub mod priority;
pub mod routing;
pub mod rules;
pub mod scheduling;
pub mod signals;
pub mod tree;

pub use control::{ClusterSummary, Control, DecisionRecord};
pub use error::PolicyError;
pub use policy::PolicyBundle;
