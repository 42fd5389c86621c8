//! Portico: a caching web proxy server.
//!
//! The modules follow a request's path through the server:
//! `listen` (accept) -> `http1` (read the request, write the response;
//! between requests the connection is in the `keepalive` set) -> `proxy`
//! (the pipeline: `admit` to service or queue, `access` check, `route` to a
//! target, the cache, whose disk I/O runs on the `blocking` pool, forward
//! through `upstream` or tunnel) -> `log`. `config` is read once at start,
//! and `sizing` fills in the limits derived from the machine.
//! docs/ARCHITECTURE.md walks through it.

pub mod access;
pub mod acl;
pub mod admit;
pub mod array;
pub mod auth;
pub mod blocking;
pub mod cache;
pub mod config;
pub mod drain;
pub mod http1;
pub mod keepalive;
pub mod listen;
pub mod log;
pub mod notify;
pub mod privdrop;
pub mod proxy;
pub mod reload;
pub mod route;
pub mod rules;
pub mod server;
pub mod sizing;
pub mod stats;
pub mod supervisor;
pub mod upstream;
pub mod util;
