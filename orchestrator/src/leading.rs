//! Which controller the API tells of changes. On one server (sled) it is
//! always this server's own. On a store shared by several servers (etcd) only
//! the leader runs one, and only while it leads:
//! - the calls a node makes (register, heartbeat, status report, a pod's
//!   status or rejection) feed the controller's in-memory view of the nodes
//!   (last heartbeat, bindings in flight), so a server that does not lead
//!   answers them 503 `NotLeader` before writing anything, and the node's
//!   client moves on to the next server until it reaches the leader;
//! - the calls a user makes (create or delete a pod, delete a node) are served
//!   by every server, and the leader's controller learns of them from the
//!   store's watch (`Controller::follow`), one path for every server's writes.

use std::sync::{Arc, RwLock};

use crate::cluster::ClusterError;
use crate::controller::Controller;

pub struct Leading {
    current: RwLock<Option<Arc<Controller>>>,
    shared: bool,
}

impl Leading {
    /// One server: its controller, for good.
    pub fn single(controller: Arc<Controller>) -> Leading {
        Leading { current: RwLock::new(Some(controller)), shared: false }
    }

    /// One of several servers: no controller until it leads.
    pub fn elected() -> Leading {
        Leading { current: RwLock::new(None), shared: true }
    }

    pub fn set(&self, controller: Option<Arc<Controller>>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = controller;
    }

    /// The controller while this server runs one.
    pub fn current(&self) -> Option<Arc<Controller>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The controller to tell directly of a user's change; `None` on a shared
    /// store, where the leader follows the store's watch instead.
    pub fn direct(&self) -> Option<Arc<Controller>> {
        if self.shared {
            None
        } else {
            self.current()
        }
    }

    /// The controller for a node's call; `NotLeader` on a server that does not lead.
    pub fn required(&self) -> Result<Arc<Controller>, ClusterError> {
        self.current().ok_or(ClusterError::NotLeader)
    }
}
