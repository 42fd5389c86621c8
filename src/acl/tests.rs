use super::*;
use crate::config::parse_str;

fn acl(text: &str) -> Acl {
    let c = parse_str(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    Acl::compile(&c).unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> String {
    parse_str(text, "t.toml").map(|_| ()).unwrap_err().to_string()
}

static GET: Method = Method::GET;

fn get<'a>(host: &'a str, pq: &'a str, headers: &'a HeaderMap) -> Request<'a> {
    Request {
        client: "192.0.2.10".parse().unwrap(),
        method: &GET,
        scheme: "http",
        host,
        port: 80,
        path_and_query: pq,
        headers,
        mode: Mode::Forward,
        user: None,
    }
}

/// 2026-11-24 is a Tuesday.
fn at(text: &str) -> jiff::Timestamp {
    text.parse().unwrap()
}

fn noon() -> jiff::Timestamp {
    at("2026-11-24T12:00:00Z")
}

fn entry(d: &Decision) -> Option<usize> {
    match d {
        Decision::Allow { entry } | Decision::Deny { entry, .. } => *entry,
        Decision::NeedAuth { entry } => Some(*entry),
    }
}

fn denied(d: &Decision) -> bool {
    matches!(d, Decision::Deny { .. })
}

#[test]
fn first_match_wins_and_default_applies() {
    let a = acl(r#"
[[acl]]
action = "allow"
host = "ok.blocked.test"
[[acl]]
action = "deny"
host = ["*.blocked.test", "bad.test"]
reason = "blocked site"
status = 451
[[acl]]
action = "allow"
client = "192.0.2.0/24"
"#);
    let h = HeaderMap::new();
    let d = |host| a.decide(&get(host, "/", &h), noon());
    assert_eq!(d("ok.blocked.test"), Decision::Allow { entry: Some(0) });
    assert_eq!(
        d("x.blocked.test"),
        Decision::Deny {
            entry: Some(1),
            status: StatusCode::from_u16(451).unwrap(),
            reason: Arc::from("blocked site")
        }
    );
    assert!(denied(&d("bad.test")));
    assert_eq!(
        d("blocked.test"),
        Decision::Allow { entry: Some(2) },
        "*.x needs a label before"
    );
    let mut other = get("else.test", "/", &h);
    other.client = "198.51.100.1".parse().unwrap();
    assert_eq!(a.decide(&other, noon()), Decision::Allow { entry: None });
    let strict = acl("[access]\nacl_default = \"deny\"\n[[acl]]\naction = \"allow\"\nhost = \"a.test\"\n");
    assert_eq!(
        strict.decide(&get("b.test", "/", &h), noon()),
        Decision::Deny {
            entry: None,
            status: StatusCode::FORBIDDEN,
            reason: Arc::from(DEFAULT_REASON)
        }
    );
    // No entries: the default, which is allow unless said otherwise.
    assert_eq!(
        acl("").decide(&get("b.test", "/", &h), noon()),
        Decision::Allow { entry: None }
    );
}

#[test]
fn ip_hosts_in_entries_are_compared_in_canonical_form() {
    // Requests reach `decide` with canonical hosts (`util::canonical_host`);
    // an entry may spell the address any way the connector reads it.
    let a = acl(r#"
[[acl]]
action = "deny"
host = ["127.1", "::1", "[0:0::2]"]
"#);
    let h = HeaderMap::new();
    let d = |host| a.decide(&get(host, "/", &h), noon());
    assert!(denied(&d("127.0.0.1")));
    assert!(denied(&d("[::1]")));
    assert!(denied(&d("[::2]")));
    assert!(!denied(&d("127.0.0.2")));
}

#[test]
fn each_matcher_kind() {
    let a = acl(r#"
[[acl]]
action = "deny"
method = ["POST", "PUT"]
[[acl]]
action = "deny"
scheme = "https"
[[acl]]
action = "deny"
port = [8080, 8443]
[[acl]]
action = "deny"
path = ["/admin/", "/private"]
[[acl]]
action = "deny"
regex = "\\.exe(\\?|$)"
[[acl]]
action = "deny"
host_regex = "^ads[0-9]*\\."
[[acl]]
action = "deny"
header = [{ name = "X-Block" }, { name = "User-Agent", regex = "^BadBot" }]
[[acl]]
action = "deny"
mode = "reverse"
[[acl]]
action = "deny"
client = ["10.0.0.0/8", "::1"]
"#);
    let mut h = HeaderMap::new();
    let e = |r: &Request<'_>| entry(&a.decide(r, noon()));
    assert_eq!(e(&get("a.test", "/", &h)), None);
    static POST: Method = Method::POST;
    let mut r = get("a.test", "/", &h);
    r.method = &POST;
    assert_eq!(e(&r), Some(0));
    let mut r = get("a.test", "/", &h);
    r.scheme = "https";
    assert_eq!(e(&r), Some(1));
    r.scheme = "http";
    r.port = 8443;
    assert_eq!(e(&r), Some(2));
    assert_eq!(e(&get("a.test", "/admin/x", &h)), Some(3));
    assert_eq!(e(&get("a.test", "/privateer", &h)), Some(3));
    assert_eq!(e(&get("a.test", "/x?/admin/", &h)), None, "path prefix is the path's");
    assert_eq!(e(&get("a.test", "/get/setup.exe?x=1", &h)), Some(4));
    assert_eq!(e(&get("a.test", "/setup.exes", &h)), None);
    assert_eq!(e(&get("ads12.example", "/", &h)), Some(5));
    assert_eq!(e(&get("x.ads.example", "/", &h)), None);
    h.insert("x-block", "1".parse().unwrap());
    assert_eq!(e(&get("a.test", "/", &h)), None, "every header condition must hold");
    h.insert("user-agent", "BadBot/2".parse().unwrap());
    assert_eq!(e(&get("a.test", "/", &h)), Some(6));
    let h = HeaderMap::new();
    let mut r = get("a.test", "/", &h);
    r.mode = Mode::Reverse;
    assert_eq!(e(&r), Some(7));
    r.mode = Mode::Transparent;
    r.client = "::ffff:10.9.8.7".parse().unwrap();
    assert_eq!(e(&r), Some(8), "IPv4-mapped clients match IPv4 networks");
}

#[test]
fn non_utf8_header_values_never_match_a_regex_but_match_presence_and_bytes() {
    let a = acl(r#"
[[acl]]
action = "deny"
header = { name = "X-A", regex = ".*" }
[[acl]]
action = "deny"
header = { name = "X-B", value = "caf\u00e9" }
"#);
    let mut h = HeaderMap::new();
    h.insert("x-a", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
    assert_eq!(entry(&a.decide(&get("a.test", "/", &h), noon())), None);
    let mut h = HeaderMap::new();
    h.insert("x-b", HeaderValue::from_bytes("café".as_bytes()).unwrap());
    assert_eq!(entry(&a.decide(&get("a.test", "/", &h), noon())), Some(1));
}

use http::HeaderValue;

#[test]
fn connect_matches_host_and_port_never_scheme_or_path() {
    let a = acl(r#"
[[acl]]
action = "deny"
path = "/"
[[acl]]
action = "deny"
regex = ".*"
[[acl]]
action = "deny"
scheme = ["http", "https"]
[[acl]]
action = "deny"
host = "*.blocked.test"
[[acl]]
action = "deny"
method = "CONNECT"
port = 25
[[acl]]
action = "allow"
method = "CONNECT"
"#);
    let h = HeaderMap::new();
    let c = |host, port| {
        a.decide(
            &Request::tunnel(host, port, "127.0.0.1".parse().unwrap(), &h, Mode::Forward, None),
            noon(),
        )
    };
    assert_eq!(entry(&c("www.blocked.test", 443)), Some(3));
    assert_eq!(entry(&c("mail.test", 25)), Some(4));
    assert_eq!(c("ok.test", 443), Decision::Allow { entry: Some(5) });
}

#[test]
fn user_matchers_need_a_user_and_are_plain_matchers_with_one() {
    let a = acl(r#"
[[acl]]
action = "deny"
host = "never.test"
[[acl]]
action = "allow"
group = "admins"
path = "/admin/"
[[acl]]
action = "deny"
path = "/admin/"
[[acl]]
action = "allow"
user = ["alice", "bob"]
[[acl]]
action = "deny"
authenticated = true
"#);
    let h = HeaderMap::new();
    let d = |pq, user| {
        let mut r = get("a.test", pq, &h);
        r.user = user;
        a.decide(&r, noon())
    };
    // Entry 0 does not hold, so the user is not asked for there.
    assert_eq!(d("/admin/x", None), Decision::NeedAuth { entry: 1 });
    let admins = ["staff".to_string(), "admins".to_string()];
    let staff = ["staff".to_string()];
    let carol = Identity {
        name: "carol",
        groups: &admins,
    };
    assert_eq!(d("/admin/x", Some(carol)), Decision::Allow { entry: Some(1) });
    let alice = Identity {
        name: "alice",
        groups: &staff,
    };
    assert_eq!(entry(&d("/admin/x", Some(alice))), Some(2));
    assert_eq!(d("/x", Some(alice)), Decision::Allow { entry: Some(3) });
    assert_eq!(d("/x", None), Decision::NeedAuth { entry: 3 });
    let dave = Identity {
        name: "dave",
        groups: &[],
    };
    assert_eq!(entry(&d("/x", Some(dave))), Some(4));
    let anon = acl("[[acl]]\naction = \"deny\"\nauthenticated = false\nreason = \"log in\"\n");
    assert!(denied(&anon.decide(&get("a.test", "/", &h), noon())));
    let mut r = get("a.test", "/", &h);
    r.user = Some(dave);
    assert_eq!(anon.decide(&r, noon()), Decision::Allow { entry: None });
}

#[test]
fn time_and_days_are_read_in_the_configured_zone() {
    let a = acl(r#"
[access]
time_zone = "Europe/Paris"
[[acl]]
action = "deny"
time = "22:00-06:00"
reason = "night"
[[acl]]
action = "allow"
days = ["mon", "tue", "wed", "thu", "friday"]
time = "08:00-18:00"
[[acl]]
action = "deny"
"#);
    let h = HeaderMap::new();
    let d = |t| entry(&a.decide(&get("a.test", "/", &h), at(t)));
    // Paris is UTC+1 in November.
    assert_eq!(d("2026-11-24T07:00:00Z"), Some(1), "08:00 Tuesday in Paris");
    assert_eq!(d("2026-11-24T06:59:00Z"), Some(2), "07:59: before the window");
    assert_eq!(d("2026-11-24T16:59:00Z"), Some(1), "17:59");
    assert_eq!(d("2026-11-24T17:00:00Z"), Some(2), "18:00: the end is excluded");
    assert_eq!(d("2026-11-24T21:00:00Z"), Some(0), "22:00: night wraps midnight");
    assert_eq!(d("2026-11-25T04:59:00Z"), Some(0), "05:59 the next day");
    assert_eq!(d("2026-11-28T10:00:00Z"), Some(2), "Saturday");
    // Summer time: UTC+2.
    assert_eq!(d("2026-07-07T06:00:00Z"), Some(1), "08:00 Tuesday in July");
}

#[test]
fn entries_outside_the_window_are_skipped_not_decided() {
    // The clock is only read when an entry with time or days is reached.
    let a = acl("[[acl]]\naction = \"deny\"\nhost = \"a.test\"\ndays = \"sun\"\n");
    let h = HeaderMap::new();
    assert_eq!(
        a.decide(&get("a.test", "/", &h), noon()),
        Decision::Allow { entry: None }
    );
    assert!(denied(&a.decide(&get("a.test", "/", &h), at("2026-11-29T12:00:00Z"))));
}

#[test]
fn many_host_entries_index_to_the_right_one() {
    let mut text = String::new();
    for i in 0..5000 {
        text += &format!(
            "[[acl]]\naction = \"deny\"\nhost = \"h{i}.test\"\n[[acl]]\naction = \"deny\"\nhost = \"*.d{i}.test\"\n"
        );
    }
    text += "[[acl]]\naction = \"allow\"\nhost = \"h4999.test\"\n";
    let a = acl(&text);
    let h = HeaderMap::new();
    assert_eq!(entry(&a.decide(&get("h4999.test", "/", &h), noon())), Some(9998));
    assert_eq!(entry(&a.decide(&get("x.y.d17.test", "/", &h), noon())), Some(35));
    assert_eq!(entry(&a.decide(&get("d17.test", "/", &h), noon())), None);
}

#[test]
fn time_windows_parse() {
    use super::compile::time_window;
    assert_eq!(time_window("08:00-18:00"), Ok((480, 1080)));
    assert_eq!(time_window("22:30-06:00"), Ok((1350, 360)));
    assert_eq!(time_window("9:05-24:00"), Ok((545, 1440)));
    for bad in [
        "25:00-18:00",
        "08:00",
        "08:60-09:00",
        "24:00-01:00",
        "8-9",
        "08:00-08:00",
        "00:00-24:00",
        "a:bc-d:ef",
    ] {
        assert!(time_window(bad).is_err(), "{bad}");
    }
}

#[test]
fn errors_name_the_entry_line_and_key() {
    let e = error("[[acl]]\naction = \"allow\"\n\n[[acl]]\naction = \"deny\"\nregex = \"(unclosed\"\n");
    assert!(
        e.starts_with("t.toml:6: key `acl[1].regex`: invalid regular expression"),
        "{e}"
    );
    let e = error("[[acl]]\naction = \"deny\"\ntime = \"25:00-26:00\"\n");
    assert!(e.starts_with("t.toml:3: key `acl[0].time`"), "{e}");
    let e = error("[[acl]]\naction = \"deny\"\ndays = [\"mon\", \"funday\"]\n");
    assert!(
        e.starts_with("t.toml:3: key `acl[0].days`: unknown day \"funday\""),
        "{e}"
    );
    let e = error("[access]\ntime_zone = \"Mars/Olympus\"\n");
    assert!(
        e.starts_with("t.toml:2: key `access.time_zone`: unknown time zone"),
        "{e}"
    );
    let e = error("[[acl]]\naction = \"deny\"\nstatus = 200\n");
    assert!(e.starts_with("t.toml:3: key `acl[0].status`"), "{e}");
    let e = error("[[acl]]\naction = \"allow\"\nstatus = 403\n");
    assert!(e.contains("deny\" only"), "{e}");
    let e = error("[[acl]]\naction = \"deny\"\nheader = { name = \"X\", regex = \"[\" }\n");
    assert!(e.contains("key `acl[0].header[0].regex`"), "{e}");
    let e = error("[[acl]]\naction = \"maybe\"\n");
    assert!(e.contains("acl[0].action"), "{e}");
    let e = error("[[acl]]\naction = \"deny\"\nhost_regex = \"(a{1000}){1000}\"\n");
    assert!(e.contains("key `acl[0].host_regex`") && e.contains("size limit"), "{e}");
    // Users and groups without an authentication back-end are accepted:
    // such entries answer "authentication required".
    assert!(parse_str("[[acl]]\naction = \"allow\"\ngroup = \"admins\"\n", "t.toml").is_ok());
}

#[test]
fn every_acl_key_survives_print_config() {
    let text = r#"
[access]
acl_default = "deny"
time_zone = "America/New_York"

[auth]
realm = "Office"

[[acl]]
action = "deny"
status = 451
reason = "r"
client = "10.0.0.0/8"
user = "u"
group = ["g"]
authenticated = true
method = "GET"
scheme = "http"
host = ["a.test", "*.b.test"]
host_regex = "^c"
port = 80
path = "/p"
regex = "q"
header = { name = "X", value = "1" }
mode = "forward"
time = "08:00-09:00"
days = ["mon"]
"#;
    let c = parse_str(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let printed = c.to_toml();
    let again = parse_str(&printed, "printed").unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(again.to_toml(), printed);
    assert_eq!(again.acl[0].host.len(), 2);
    assert_eq!(again.auth.realm, "Office");
}

mod lists {
    use super::super::lists::{from_text, url_of};
    use super::*;
    use crate::config::AclListKind;

    fn req<'a>(scheme: &'a str, host: &'a str, port: u16, pq: &'a str, headers: &'a HeaderMap) -> Request<'a> {
        Request {
            scheme,
            port,
            ..get(host, pq, headers)
        }
    }

    #[test]
    fn domains_match_the_host_and_dotted_entries_every_subdomain() {
        let l = from_text(AclListKind::Domains, "exact.test\n.wide.test\nboth.test\n.both.test\n").unwrap();
        let h = HeaderMap::new();
        let hit = |host: &str| l.hit(&get(host, "/", &h)).map(|x| (x.line, x.pattern));
        assert_eq!(hit("exact.test"), Some((1, "exact.test".into())));
        assert_eq!(hit("www.exact.test"), None);
        assert_eq!(hit("wide.test"), Some((2, ".wide.test".into())));
        assert_eq!(hit("a.b.wide.test"), Some((2, ".wide.test".into())));
        assert_eq!(hit("notwide.test"), None);
        assert_eq!(hit("test"), None);
        assert_eq!(hit(""), None);
        // Listed both ways: the wider entry and its line decide.
        assert_eq!(hit("www.both.test"), Some((4, ".both.test".into())));
        // A listed top-level domain is still looked up for its subdomains.
        let l = from_text(AclListKind::Domains, "a.b.test\n.example\n").unwrap();
        assert!(l.matches(&get("www.example", "/", &h)));
        assert!(l.matches(&get("a.b.test", "/", &h)));
        assert!(!l.matches(&get("b.test", "/", &h)));
    }

    #[test]
    fn url_prefixes_compare_scheme_host_port_and_path() {
        let l = from_text(AclListKind::Urls, "https://Ex.test/a/\nhttp://ex.test:8080\n").unwrap();
        let h = HeaderMap::new();
        assert!(l.matches(&req("https", "ex.test", 443, "/a/b", &h)));
        assert!(!l.matches(&req("http", "ex.test", 80, "/a/b", &h)), "scheme");
        assert!(!l.matches(&req("https", "ex.test", 8443, "/a/b", &h)), "port");
        assert!(!l.matches(&req("https", "ex.test", 443, "/A/b", &h)), "path case");
        assert!(
            l.matches(&req("http", "ex.test", 8080, "/anything", &h)),
            "no path: the whole site"
        );
        let tunnel = Request::tunnel("ex.test", 443, "192.0.2.10".parse().unwrap(), &h, Mode::Forward, None);
        assert!(!l.matches(&tunnel), "a CONNECT has no URL");
    }

    #[test]
    fn regexes_see_the_url_with_a_non_default_port_and_connect_as_host_port() {
        let h = HeaderMap::new();
        assert_eq!(url_of(&req("http", "a.test", 80, "/x?y", &h)), "http://a.test/x?y");
        assert_eq!(url_of(&req("https", "a.test", 8443, "/", &h)), "https://a.test:8443/");
        let tunnel = Request::tunnel("a.test", 443, "192.0.2.10".parse().unwrap(), &h, Mode::Forward, None);
        assert_eq!(url_of(&tunnel), "a.test:443");
        let l = from_text(AclListKind::Regex, "# c\n^x\n\n:443$\n").unwrap();
        assert_eq!(l.hit(&tunnel).map(|x| x.line), Some(4));
    }
}

#[test]
fn a_path_read_two_ways_goes_through_only_if_both_readings_are_allowed() {
    // An allow list: /public/ for everyone, the rest denied by default.
    let a = acl(r#"
[access]
acl_default = "deny"
[[acl]]
action = "allow"
path = "/public/"
[[acl]]
action = "allow"
path = "/team/"
user = "alice"
"#);
    let h = HeaderMap::new();
    let d = |pq: &str| a.decide(&get("ok.test", pq, &h), noon());
    assert_eq!(entry(&d("/public/x")), Some(0));
    assert!(
        !denied(&d("/public/x;jsessionid=1")),
        "both readings are under /public/"
    );
    // To nginx a directory named `public;v=1`, not /public/.
    assert!(denied(&d("/public;v=1/x")));
    // Under /public/ to nginx, /admin to Tomcat or IIS: the stricter wins.
    assert!(denied(&d("/public/..;/admin")));
    assert!(denied(&d("/public/x\\..\\..\\admin")));
    // Allowed one way, needing a user the other: the client must log in.
    assert!(matches!(d("/public/..;/team/x"), Decision::NeedAuth { entry: 1 }));
}

#[test]
fn an_allow_entry_grants_its_destination_exception_and_equal_sets_share_one() {
    let a = acl(r#"
[proxy]
deny_destinations = ["10.0.0.0/8"]
[[acl]]
action = "allow"
host = "a.corp.test"
allow_destinations = "10.1.0.0/16"
[[acl]]
action = "allow"
host = "b.corp.test"
allow_destinations = ["10.2.0.0/16"]
[[acl]]
action = "allow"
host = "c.corp.test"
allow_destinations = ["10.1.0.0/16"]
[[acl]]
action = "allow"
host = "plain.test"
"#);
    let h = HeaderMap::new();
    let reach = |host| a.reach(&a.decide(&get(host, "/", &h), noon()));
    assert_eq!(reach("a.corp.test"), 1);
    assert_eq!(reach("b.corp.test"), 2);
    assert_eq!(reach("c.corp.test"), 1, "the same networks: the same client");
    assert_eq!(reach("plain.test"), 0);
    assert_eq!(reach("other.test"), 0, "the default grants none");
    assert_eq!(a.reach_sets().len(), 2);
    assert_eq!(a.reach_sets()[1], vec!["10.2.0.0/16".parse::<ipnet::IpNet>().unwrap()]);
    assert!(
        a.describe(0).contains("allow_destinations = [\"10.1.0.0/16\"]"),
        "{}",
        a.describe(0)
    );
}

#[test]
fn without_denied_destinations_an_exception_is_no_exception() {
    let a = acl(r#"
[proxy]
deny_destinations = []
[[acl]]
action = "allow"
allow_destinations = "10.0.0.0/8"
"#);
    let h = HeaderMap::new();
    assert_eq!(a.reach(&a.decide(&get("x.test", "/", &h), noon())), 0);
    assert!(a.reach_sets().is_empty());
}

/// A path both readings allow, by different entries: the exception holds
/// only if the entry of each reading grants it.
#[test]
fn when_the_two_readings_of_a_path_are_allowed_by_different_entries_the_narrower_reach_wins() {
    let a = acl(r#"
[[acl]]
action = "allow"
path = "/intranet/"
allow_destinations = "10.0.0.0/8"
[[acl]]
action = "allow"
"#);
    let h = HeaderMap::new();
    let d = |pq| a.decide(&get("x.test", pq, &h), noon());
    assert_eq!(a.reach(&d("/intranet/x")), 1);
    // nginx reads `/intranet/..;/x` as under /intranet/; Tomcat as `/x`.
    assert_eq!(a.reach(&d("/intranet/..;/x")), 0);
    // `/x/..;/intranet/y` is /intranet/y to Tomcat, /x/..;/... to nginx.
    assert_eq!(a.reach(&d("/x/..;/intranet/y")), 0);
    // Two exceptions, one for each reading: neither.
    let a = acl(r#"
[[acl]]
action = "allow"
path = "/a/"
allow_destinations = "10.1.0.0/16"
[[acl]]
action = "allow"
path = "/b/"
allow_destinations = "10.2.0.0/16"
"#);
    let d = |pq| a.decide(&get("x.test", pq, &h), noon());
    assert_eq!(a.reach(&d("/a/x")), 1);
    assert_eq!(a.reach(&d("/b/x")), 2);
    assert_eq!(d("/a/..;/b/x"), Decision::Allow { entry: None });
    assert_eq!(a.reach(&d("/b/..;/a/x")), 0);
    // The same exception under both readings holds.
    assert_eq!(a.reach(&d("/a/x;v=1/y")), 1);
}

#[test]
fn allow_destinations_belongs_to_allow_request_entries() {
    let e = error("[[acl]]\naction = \"deny\"\nallow_destinations = \"10.0.0.0/8\"\n");
    assert!(e.contains("acl[0].allow_destinations"), "{e}");
    let e = error("[[acl]]\naction = \"allow\"\ncontent_type = \"video/*\"\nallow_destinations = \"10.0.0.0/8\"\n");
    assert!(e.contains("response entry"), "{e}");
}
