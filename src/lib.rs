//! Portico: a caching web proxy server.
//!
//! The modules follow a request's path through the server:
//! `listen` (accept) -> `http1` (read the request, write the response) ->
//! `proxy` (the pipeline: `access` check, `route` to a target, forward
//! through `upstream` or tunnel) -> `log`. `config` is read once at start.
//! docs/ARCHITECTURE.md walks through it.

pub mod access;
pub mod cache;
pub mod config;
pub mod http1;
pub mod listen;
pub mod log;
pub mod proxy;
pub mod route;
pub mod rules;
pub mod server;
pub mod upstream;
pub mod util;
