//! One module per verb; each has its `Args` and an async `run`.

pub mod agent;
pub mod alloc;
pub mod apply;
pub mod batch;
pub mod completions;
pub mod delete;
pub mod describe;
pub mod discover;
pub mod down;
pub mod exec;
pub mod get;
pub mod image;
pub mod install;
pub mod logs;
pub mod plan;
pub mod queue;
pub mod rollout;
pub mod run;
pub mod server;
pub mod server_opts;
pub mod shim;
pub mod step;
pub mod token;
pub mod topology;
pub mod up;
pub mod user;
