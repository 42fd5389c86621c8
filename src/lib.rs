//! Portico: a caching web proxy server.
//!
//! A request's path, and the module of each step: accept (`listen`) ->
//! parse (`http1`; between requests the connection waits in the
//! `keepalive` set) -> the pipeline in `proxy`, one module per step:
//! `proxy::admission` (a service slot or the connection queue),
//! `proxy::access` (allow-list, `auth` credentials, the `acl` decision),
//! `proxy::classify` (what the request asks for), `proxy::route` (the
//! `rules` engine's verdict), `proxy::cache` (the `cache` library, whose
//! disk I/O runs on the `blocking` pool), upstream (`proxy::forward`
//! through the `upstream` client, or `proxy::tunnel` for CONNECT) ->
//! respond (`http1`'s response writer, `proxy::reply` for Portico's own
//! answers) -> `log`. Every step counts into `stats`.
//!
//! Around it, the control plane: `server` starts a serving process
//! (`sizing`, `privdrop`, `notify`, `signals`, `reload`, `drain`), or with
//! `server.processes > 1` the `supervisor` starts the workers (`worker`
//! tells a process which one it is; `shared_buckets` holds the limits they
//! keep together). `config` is read at start and on
//! reload. docs/ARCHITECTURE.md walks through it all.

#![warn(missing_docs)]

pub mod acl;
pub mod array;
pub(crate) mod auth;
pub(crate) mod blocking;
pub mod cache;
pub(crate) mod client_bandwidth;
pub(crate) mod client_limit;
pub(crate) mod client_rate;
pub mod config;
pub(crate) mod drain;
pub(crate) mod handover;
pub mod http1;
pub(crate) mod keepalive;
pub(crate) mod listen;
pub(crate) mod log;
pub(crate) mod notify;
pub mod privdrop;
pub mod proxy;
pub(crate) mod reload;
pub mod rules;
pub mod server;
pub(crate) mod shared_buckets;
pub(crate) mod shared_conns;
pub(crate) mod signals;
pub mod sizing;
pub mod stats;
pub(crate) mod supervisor;
pub mod tls;
pub mod tls_resume;
pub(crate) mod upstream;
/// Response heads from origins (the upstream client's parser), public for
/// the fuzz targets like `http1::head`.
pub use upstream::response as origin_response;
pub mod util;
pub(crate) mod worker;
