//! The HTTP cache (RFC 9111, shared cache): a library with no knowledge of
//! sockets. `key` names objects, `object` is their stored metadata,
//! `policy` decides what may be stored and served, `status` writes the
//! `Cache-Status` field, `memory` and `disk` are the two tiers; `told`
//! carries what one worker process removes to the others' memory tiers;
//! `admin` holds the offline operations of `portico cache`.

pub mod admin;
pub mod disk;
pub(crate) mod flight;
pub mod key;
pub(crate) mod memory;
pub mod object;
pub(crate) mod partial;
pub(crate) mod policy;
pub(crate) mod range;
pub(crate) mod status;
mod tiers;
pub mod told;

pub use key::{CacheKey, ObjectId};
pub(crate) use status::is_sf_token;
pub(crate) use tiers::{Cache, StoreSink, Stored, slice_variant};
