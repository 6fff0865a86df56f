//! What the controller's deciders ask of the store, carried out by its one
//! executor (`Controller::execute`), each write through a `cluster` command.

use std::sync::Arc;

use specs::Pod;

use crate::cluster::pods::{GangPlace, Waiting};
use crate::scheduler::Binding;

#[derive(Debug)]
pub(super) enum Effect {
    /// Bind the pod as the scheduler placed it (`cluster::pods::bind`).
    Bind { pod: Arc<Pod>, binding: Binding },
    /// Bind a gang's members together, in one write, or none of them.
    BindGang(Vec<GangBind>),
    /// Say why a queued pod waits (`cluster::pods::say_waiting`).
    SayWaiting { pod: String, why: Waiting },
    /// A binding no node confirmed in time: the pod goes back to the queue
    /// (`cluster::pods::expire_binding`).
    ExpireBinding { pod: String, node: String },
    /// A finished pod's time to live ran out (`cluster::pods::remove_finished`).
    RemoveFinished { pod: String, uid: String },
    /// A member of the job changed: judge the job again (`cluster::jobs::reconcile`).
    ReconcileJob(String),
    /// A Deployment or one of its pods changed, or its time came: its plan
    /// (`rollout::decide`), carried out by `cluster::deployments::carry_out`.
    ReconcileDeployment(String),
    /// A DaemonSet, one of its pods or a node changed, or its time came: its
    /// plan (`daemonsets::decide`), carried out by
    /// `cluster::daemonsets::carry_out`.
    ReconcileDaemonSet(String),
    /// A Ready node fell silent past the grace (`cluster::nodes::mark_lost`).
    MarkLost(String),
}

#[derive(Debug)]
pub(super) struct GangBind {
    pub(super) pod: Arc<Pod>,
    pub(super) binding: Binding,
    pub(super) place: GangPlace,
}
