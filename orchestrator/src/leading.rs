//! Which controller serves the node's calls. On one server (sled) it is
//! always this server's own. On a store shared by several servers (etcd) only
//! the leader runs one, and only while it leads: the calls a node makes
//! (register, heartbeat, status report, a pod's status or rejection) feed the
//! controller's in-memory view of the nodes (last heartbeat, bindings in
//! flight), so a server that does not lead answers them 503 `NotLeader`
//! before writing anything, and the node's client moves on to the next server
//! until it reaches the leader. The users' changes (pods and jobs created or
//! deleted, nodes deleted) reach a controller only through the store's watch
//! (`Controller::follow`), on either store.

use std::sync::{Arc, RwLock};

use crate::cluster::ClusterError;
use crate::controller::Controller;

pub struct Leading {
    current: RwLock<Option<Arc<Controller>>>,
}

impl Leading {
    /// One server: its controller, for good.
    pub fn single(controller: Arc<Controller>) -> Leading {
        Leading { current: RwLock::new(Some(controller)) }
    }

    /// One of several servers: no controller until it leads.
    pub fn elected() -> Leading {
        Leading { current: RwLock::new(None) }
    }

    pub fn set(&self, controller: Option<Arc<Controller>>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = controller;
    }

    /// The controller while this server runs one.
    pub fn current(&self) -> Option<Arc<Controller>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The controller for a node's call; `NotLeader` on a server that does not lead.
    pub fn required(&self) -> Result<Arc<Controller>, ClusterError> {
        self.current().ok_or(ClusterError::NotLeader)
    }
}
