//! The route table: one place that lists every (method, path) the server
//! answers. The router matches against it and a test compares it with
//! `openapi.yaml`, so the contract file cannot drift from the code.

use hyper::Method;

/// What a route does; the parser turns (route, request) into an `Action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteId {
    Health,
    Version,
    Metrics,
    Join,
    ListPods,
    CreatePod,
    GetPod,
    DeletePod,
    UpdatePodStatus,
    RejectPod,
    PodLog,
    AttachPod,
    ExecPod,
    ExecInput,
    ListNodes,
    RegisterNode,
    GetNode,
    DeleteNode,
    Heartbeat,
    ReportNodeStatus,
    ListEvents,
    ListJobs,
    CreateJob,
    GetJob,
    DeleteJob,
    HoldJob,
    ReleaseJob,
    ListDeployments,
    ApplyDeployment,
    GetDeployment,
    DeleteDeployment,
    ScaleDeployment,
    UndoDeployment,
    RestartDeployment,
    ListDaemonSets,
    ApplyDaemonSet,
    GetDaemonSet,
    DeleteDaemonSet,
    UndoDaemonSet,
    RestartDaemonSet,
    ListPartitions,
    ApplyPartition,
    GetPartition,
    DeletePartition,
    ListShares,
    ListAcct,
    ListUsers,
    CreateUser,
    RevokeUser,
    Renew,
    ListTokens,
    CreateToken,
    RevokeToken,
}

pub struct Route {
    pub method: Method,
    /// `{name}` marks the one path parameter.
    pub path: &'static str,
    pub id: RouteId,
}

pub fn routes() -> Vec<Route> {
    use RouteId::*;
    let r = |method: Method, path: &'static str, id: RouteId| Route { method, path, id };
    vec![
        r(Method::GET, "/healthz", Health),
        r(Method::GET, "/version", Version),
        r(Method::GET, "/metrics", Metrics),
        r(Method::POST, "/api/v1/join", Join),
        r(Method::GET, "/api/v1/pods", ListPods),
        r(Method::POST, "/api/v1/pods", CreatePod),
        r(Method::GET, "/api/v1/pods/{name}", GetPod),
        r(Method::DELETE, "/api/v1/pods/{name}", DeletePod),
        r(Method::PUT, "/api/v1/pods/{name}/status", UpdatePodStatus),
        r(Method::POST, "/api/v1/pods/{name}/rejection", RejectPod),
        r(Method::GET, "/api/v1/pods/{name}/log", PodLog),
        r(Method::GET, "/api/v1/pods/{name}/attach", AttachPod),
        r(Method::POST, "/api/v1/pods/{name}/exec", ExecPod),
        r(Method::POST, "/api/v1/pods/{name}/exec/input", ExecInput),
        r(Method::GET, "/api/v1/nodes", ListNodes),
        r(Method::POST, "/api/v1/nodes", RegisterNode),
        r(Method::GET, "/api/v1/nodes/{name}", GetNode),
        r(Method::DELETE, "/api/v1/nodes/{name}", DeleteNode),
        r(Method::POST, "/api/v1/nodes/{name}/heartbeat", Heartbeat),
        r(Method::PUT, "/api/v1/nodes/{name}/status", ReportNodeStatus),
        r(Method::GET, "/api/v1/events", ListEvents),
        r(Method::GET, "/api/v1/jobs", ListJobs),
        r(Method::POST, "/api/v1/jobs", CreateJob),
        r(Method::GET, "/api/v1/jobs/{name}", GetJob),
        r(Method::DELETE, "/api/v1/jobs/{name}", DeleteJob),
        r(Method::POST, "/api/v1/jobs/{name}/hold", HoldJob),
        r(Method::POST, "/api/v1/jobs/{name}/release", ReleaseJob),
        r(Method::GET, "/api/v1/deployments", ListDeployments),
        r(Method::POST, "/api/v1/deployments", ApplyDeployment),
        r(Method::GET, "/api/v1/deployments/{name}", GetDeployment),
        r(Method::DELETE, "/api/v1/deployments/{name}", DeleteDeployment),
        r(Method::PUT, "/api/v1/deployments/{name}/scale", ScaleDeployment),
        r(Method::POST, "/api/v1/deployments/{name}/undo", UndoDeployment),
        r(Method::POST, "/api/v1/deployments/{name}/restart", RestartDeployment),
        r(Method::GET, "/api/v1/daemonsets", ListDaemonSets),
        r(Method::POST, "/api/v1/daemonsets", ApplyDaemonSet),
        r(Method::GET, "/api/v1/daemonsets/{name}", GetDaemonSet),
        r(Method::DELETE, "/api/v1/daemonsets/{name}", DeleteDaemonSet),
        r(Method::POST, "/api/v1/daemonsets/{name}/undo", UndoDaemonSet),
        r(Method::POST, "/api/v1/daemonsets/{name}/restart", RestartDaemonSet),
        r(Method::GET, "/api/v1/partitions", ListPartitions),
        r(Method::POST, "/api/v1/partitions", ApplyPartition),
        r(Method::GET, "/api/v1/partitions/{name}", GetPartition),
        r(Method::DELETE, "/api/v1/partitions/{name}", DeletePartition),
        r(Method::GET, "/api/v1/shares", ListShares),
        r(Method::GET, "/api/v1/acct", ListAcct),
        r(Method::GET, "/api/v1/users", ListUsers),
        r(Method::POST, "/api/v1/users", CreateUser),
        r(Method::DELETE, "/api/v1/users/{name}", RevokeUser),
        r(Method::POST, "/api/v1/renew", Renew),
        r(Method::GET, "/api/v1/tokens", ListTokens),
        r(Method::POST, "/api/v1/tokens", CreateToken),
        r(Method::DELETE, "/api/v1/tokens/{name}", RevokeToken),
    ]
}

/// The outcome of matching a request path.
#[derive(Debug, PartialEq, Eq)]
pub enum Matched {
    Route(RouteId, Option<String>),
    /// The path exists with other methods.
    MethodNotAllowed,
    NotFound,
}

fn match_path(pattern: &str, path: &str) -> Option<Option<String>> {
    let (mut p, mut s) = (pattern.split('/'), path.split('/'));
    let mut param = None;
    loop {
        match (p.next(), s.next()) {
            (None, None) => return Some(param),
            (Some("{name}"), Some(seg)) if !seg.is_empty() => param = Some(seg.to_string()),
            (Some(a), Some(b)) if a == b => {}
            _ => return None,
        }
    }
}

/// The methods a path is served with, for a 405's `Allow` header (RFC 9110
/// requires it there).
pub fn allowed_methods(table: &[Route], path: &str) -> Vec<Method> {
    table.iter().filter(|r| match_path(r.path, path).is_some()).map(|r| r.method.clone()).collect()
}

pub fn match_route(table: &[Route], method: &Method, path: &str) -> Matched {
    let mut path_known = false;
    for r in table {
        if let Some(param) = match_path(r.path, path) {
            if r.method == *method {
                return Matched::Route(r.id, param);
            }
            path_known = true;
        }
    }
    if path_known {
        Matched::MethodNotAllowed
    } else {
        Matched::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(method: Method, path: &str, expected: Matched) {
        assert_eq!(match_route(&routes(), &method, path), expected, "{method} {path}");
    }

    #[test]
    fn matching() {
        check(Method::GET, "/api/v1/pods", Matched::Route(RouteId::ListPods, None));
        check(Method::GET, "/api/v1/pods/web", Matched::Route(RouteId::GetPod, Some("web".into())));
        check(Method::PUT, "/api/v1/pods/web/status", Matched::Route(RouteId::UpdatePodStatus, Some("web".into())));
        check(Method::GET, "/api/v1/pods/web/attach", Matched::Route(RouteId::AttachPod, Some("web".into())));
        check(Method::POST, "/api/v1/pods/web/exec", Matched::Route(RouteId::ExecPod, Some("web".into())));
        check(Method::GET, "/api/v1/pods/web/exec", Matched::MethodNotAllowed);
        check(Method::POST, "/api/v1/pods/web/exec/input", Matched::Route(RouteId::ExecInput, Some("web".into())));
        check(Method::PATCH, "/api/v1/pods/web", Matched::MethodNotAllowed);
        check(Method::GET, "/api/v1/pods/", Matched::NotFound);
        check(Method::GET, "/api/v2/pods", Matched::NotFound);
        assert_eq!(allowed_methods(&routes(), "/api/v1/pods/web"), [Method::GET, Method::DELETE]);
        assert_eq!(allowed_methods(&routes(), "/healthz"), [Method::GET]);
    }
}
