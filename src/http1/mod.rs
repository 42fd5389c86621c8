//! Portico's own client-facing HTTP/1 layer, on `httparse`.
//!
//! Why our own: an idle keep-alive connection here holds no buffer (it waits
//! for readability first, then takes one), and per-connection state is a few
//! hundred bytes; see docs/ARCHITECTURE.md. It is also the most
//! security-sensitive code in the server: `head` and `chunked` enforce the
//! RFC 9112 framing rules and are fuzzed (fuzz/).

mod body;
pub mod chunked;
mod conn;
pub mod h2;
pub mod head;
mod io;
mod response;
pub mod tls;

pub(crate) use body::{BodyError, BodyFrame, BodyReader};
pub(crate) use conn::{
    ConnSettings, Exchange, Handler, LocalAddr, Outcome, RejectInfo, Start, client_closed, lingering_close, serve,
};
pub use head::{BodyFraming, HeadError, HeadLimits, RequestHead};
pub(crate) use io::{ClientStream, Tally, read_at_most, read_buf, try_read_drained, write_all};
pub(crate) use response::{BodyLen, PARTS_PER_WRITE, ResponseWriter, StoredLines, stored_field_lines};
