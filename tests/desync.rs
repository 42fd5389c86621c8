//! Framing of what origins send back, through the real binary to a
//! recording origin (tests/common/raw_origin.rs).

mod common;

use common::*;

/// Finding 7 of issue 13: a response with both Content-Length and
/// Transfer-Encoding was read as chunked, stored, and its connection
/// reused. It is refused (502), never stored, and its connection closed:
/// the same request reaches the origin again, on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_with_both_lengths_is_refused_not_stored_and_its_connection_closed() {
    let origin = RecordingOrigin::scripted(|rec| {
        (rec.target() == "/both").then(|| Reply {
            bytes: b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 5\r\n\
                     Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
            close: false,
        })
    })
    .await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"reverse\"\n\n[cache]\ndisk = \"0\"\n\n\
         [[upstream]]\nname = \"o\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"o\"\n",
        free_addr(),
        origin.addr()
    ))
    .await;
    for path in ["/both", "/both", "/after"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let resp = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
        let want = if path == "/both" { 502 } else { 200 };
        assert_eq!(resp.status, want, "{path}: {resp:?}");
    }
    let got = origin.take().await;
    let lines: Vec<&str> = got.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        lines,
        ["GET /both HTTP/1.1", "GET /both HTTP/1.1", "GET /after HTTP/1.1"]
    );
    let conns: Vec<usize> = got.iter().map(|r| r.conn).collect();
    assert_eq!(conns, [0, 1, 2], "a connection was reused after the ambiguous response");
    assert_eq!(origin.connections(), 3);
}
