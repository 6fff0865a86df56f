//! One module per verb; each has its `Args` and an async `run`.

pub mod up;
pub mod server;
pub mod agent;
pub mod apply;
pub mod get;
pub mod describe;
pub mod delete;
pub mod logs;
pub mod run;
pub mod topology;
pub mod discover;
pub mod plan;
pub mod image;
pub mod completions;
pub mod shim;
