//! The decisions of an RFC 9111 **shared** cache, as pure functions over
//! `http` types: no I/O, no async and no clock (every function that needs
//! "now" takes it as a parameter). All times and ages are whole seconds, as
//! RFC 9111 computes them.
//!
//! How the pieces fit, for one client request:
//!
//! 1. **lookup**: the caller builds the [`CacheKey`] and finds the stored
//!    response. When it varies, [`vary_fields`] of the stored headers and
//!    [`variant_of`] the request give the [`StoredMeta::variant`] to look up
//!    (`CacheKey::variant_id`); [`variant_matches`] confirms a candidate.
//!    Nothing stored: a miss; answer 504 if [`only_if_cached`], else fetch (5).
//! 2. **evaluate**: [`Policy::evaluate`] gives a [`Decision`]:
//!    `Fresh` / `Stale` serve (3); `StaleWhileRevalidate` serves (3) and
//!    starts one background revalidation (4); `Revalidate` revalidates (4)
//!    before answering; `GatewayTimeout` answers 504.
//! 3. **serve**: [`check_preconditions`] may turn the answer into a 304
//!    (headers from [`not_modified_headers`]) or a 412; otherwise
//!    [`crate::cache::range::plan`] picks 200, 206 or 416. Every answer from
//!    the cache carries `Age: `[`age_header`]. `HEAD` is served from the
//!    stored `GET` response.
//! 4. **revalidate**: send the request upstream with
//!    [`conditional_headers`] and classify the answer with [`revalidation`]:
//!    `NotModified` → [`update_from_304`], store the updated metadata, serve
//!    it (3); `Replace` → a fetched response (5); `ServerError` (or no
//!    answer at all: [`is_origin_error`]) → serve the stored response while
//!    `now <= stale_if_error_until`, else pass the error on; `Mismatch` →
//!    update nothing and serve the stored response as it is (3).
//! 5. **fetch and store**: [`Policy::storable`] says whether an origin
//!    response may be stored, or why not; store it as a [`StoredMeta`] whose
//!    `variant` is `variant_of(vary_fields(response), request)` and whose
//!    `request_time` / `response_time` are taken as RFC 9111 4.2.3 defines
//!    them (just before sending the request, just after the response head).
//! 6. **invalidate**: after an unsafe request succeeds,
//!    [`Policy::invalidations`] lists the keys to remove (every variant).
//!
//! 7. **cookies**: a response's `Set-Cookie` is meant for the client it
//!    was fetched for. RFC 9111 lets a shared cache store and replay it
//!    unless `private` or `no-cache="Set-Cookie"` say otherwise; by
//!    `cache.set_cookie` Portico does not store such a response (`no-store`,
//!    the default, in [`Policy::storable`]), or stores it without the field
//!    (`strip`), or replays it (`store`). [`Policy::take_unshared`] takes the
//!    fields that must not reach another client (those cookies, and the
//!    fields a qualified `no-cache="..."` or `private="..."` names) out of
//!    what is stored, shared with collapsed requests, merged from a 304 or
//!    served.
//!
//! Configuration (refresh patterns, the overrides that break the spec) is
//! compiled once into a [`Policy`]; the functions that need none are free.

use crate::cache::key::{CacheKey, url_of};
use crate::cache::object::StoredMeta;
use crate::config::{CacheConfig, SetCookie};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use regex::{Regex, RegexSet};
use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// RFC 9111 1.2.2: a delta-seconds value too large to represent, or a
/// calculation that overflows, counts as 2^31 seconds.
const DELTA_MAX: u64 = 1 << 31;

// ---------------------------------------------------------------------------
// Policy: the configured part.
// ---------------------------------------------------------------------------

/// One compiled refresh pattern (all in seconds).
#[derive(Debug, Clone, Copy)]
struct Refresh {
    min: u64,
    percent: u64,
    max: u64,
}

/// The cache configuration compiled for the decisions that depend on it:
/// storability, freshness lifetime, evaluation and invalidation.
#[derive(Debug, Clone)]
pub struct Policy {
    patterns: RegexSet,
    refresh: Vec<Refresh>,
    /// For URLs no refresh pattern matches (`heuristic_percent`, `heuristic_max`).
    default_heuristic: Refresh,
    ignore_reload: bool,
    ignore_no_store: bool,
    cache_query: bool,
    ignore_query_in_key: bool,
    min_ttl: u64,
    max_ttl: Option<u64>,
    set_cookie: SetCookie,
    /// `cache.max_stale_on_error` in seconds; 0: none beyond `stale-if-error`.
    max_stale_on_error: u64,
    /// The targeted cache-control fields (RFC 9213) this policy obeys, in
    /// order of precedence: `cache.targeted_fields` for the policies of
    /// reverse listeners ([`Policy::targeted`]), none for the others.
    targeted: Vec<HeaderName>,
    /// `cache.strip_targeted_fields` (acts only with `targeted`).
    strip_targeted: bool,
    /// `cache.slice` in bytes; 0: objects are fetched and stored whole.
    slice: u64,
    /// A hash of everything above: tags the conclusions this policy keeps
    /// with a stored response ([`StoredFacts`]), so that another policy
    /// (another listener's, or the one a reload built from a changed
    /// config) never takes them for its own. An unchanged config reloaded
    /// gives the same fingerprint, and the kept conclusions stay good.
    fingerprint: u64,
}

/// What a policy concludes from a stored response's fields alone, worked
/// out on the response's first evaluation and kept with its metadata
/// ([`crate::cache::object::Derived`]): a hit then compares numbers instead
/// of parsing `Cache-Control` (or a targeted field, RFC 9213) again.
#[derive(Debug, Clone, Copy)]
pub struct StoredFacts {
    /// The [`Policy`] fingerprint they hold for.
    policy: u64,
    /// Freshness lifetime in seconds (4.2.1).
    lifetime: u64,
    /// `no-cache`, `must-revalidate`, `proxy-revalidate` or `s-maxage`:
    /// never served stale (4.2.4).
    no_stale: bool,
    /// `no-cache` without field names (5.2.2.4).
    no_cache: bool,
    /// `stale-if-error` (RFC 5861 4), when valid.
    stale_if_error: Option<u64>,
    /// `stale-while-revalidate` (RFC 5861 3), when valid.
    stale_while_revalidate: Option<u64>,
    /// [`Policy::has_unshared`] of the stored fields.
    unshared: bool,
}

/// The fields that carry a cookie for one client: `Set-Cookie` and the
/// obsolete `Set-Cookie2` (RFC 2965).
const COOKIE_FIELDS: [HeaderName; 2] = [header::SET_COOKIE, HeaderName::from_static("set-cookie2")];

/// Fields a qualified `no-cache` or `private` may name but that are kept
/// ([`Policy::take_unshared`]): without them the stored response could not be
/// framed, told apart from other variants, or judged fresh.
const NEVER_UNSHARED: [HeaderName; 4] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::VARY,
    header::CACHE_CONTROL,
];

/// Why a response may not be stored (for logs and cache-status debugging).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotStorable(pub &'static str);

impl std::fmt::Display for NotStorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// What to do with a stored response for a request ([`Policy::evaluate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Fresh and acceptable to the request: serve it.
    Fresh,
    /// Stale, but the request's `max-stale` accepts it: serve it without
    /// contacting the origin.
    Stale,
    /// Stale within the response's `stale-while-revalidate` window (RFC
    /// 5861): serve it now and start one background revalidation.
    StaleWhileRevalidate,
    /// Validate with the origin before serving ([`conditional_headers`]).
    Revalidate {
        /// Why.
        reason: RevalidateReason,
        /// When `stale-if-error` (RFC 5861, response or request) or
        /// `cache.max_stale_on_error` (RFC 9111 4.2.4, disconnected) applies:
        /// if the origin cannot be reached or answers 500, 502, 503 or 504
        /// ([`is_origin_error`]) at a time `<=` this one, serve the stored
        /// response instead. `None` when the stored response must not be
        /// served on errors (`no-cache`, `must-revalidate`,
        /// `proxy-revalidate`, `s-maxage`; or no window).
        stale_if_error_until: Option<SystemTime>,
    },
    /// The request has `only-if-cached` (RFC 9111 5.2.1.7) and the stored
    /// response cannot be used without the origin: answer 504.
    GatewayTimeout,
}

/// Why a stored response must be validated before it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevalidateReason {
    /// It is stale (RFC 9111 4.2) and nothing lets it be served so.
    Stale,
    /// The response's unqualified `no-cache` (5.2.2.4).
    ResponseNoCache,
    /// The request's `no-cache` or `Pragma: no-cache` (5.2.1.4).
    RequestNoCache,
    /// The request's `max-age` is below the response's age (5.2.1.1).
    RequestMaxAge,
    /// The request's `min-fresh` asks for more freshness than is left (5.2.1.3).
    RequestMinFresh,
}

impl RevalidateReason {
    /// The request's own directives, not the stored response, sent it to
    /// the origin (RFC 9211 2.2's `fwd=request`).
    pub fn by_request(self) -> bool {
        matches!(
            self,
            RevalidateReason::RequestNoCache | RevalidateReason::RequestMaxAge | RevalidateReason::RequestMinFresh
        )
    }
}

impl Policy {
    /// Compiles the refresh patterns and reads the overrides of `[cache]`.
    /// Fails on an invalid regular expression or a `min` above `max`.
    pub fn new(cfg: &CacheConfig) -> Result<Policy, String> {
        let mut refresh = Vec::with_capacity(cfg.refresh.len());
        for (i, p) in cfg.refresh.iter().enumerate() {
            Regex::new(&p.pattern).map_err(|e| format!("cache.refresh[{i}].pattern: {e}"))?;
            if p.min.get() > p.max.get() {
                return Err(format!(
                    "cache.refresh[{i}]: min ({}) is greater than max ({})",
                    p.min, p.max
                ));
            }
            refresh.push(Refresh {
                min: p.min.get().as_secs(),
                percent: u64::from(p.percent),
                max: p.max.get().as_secs(),
            });
        }
        let patterns =
            RegexSet::new(cfg.refresh.iter().map(|p| &p.pattern)).map_err(|e| format!("cache.refresh: {e}"))?;
        let max_ttl = (!cfg.max_ttl.get().is_zero()).then(|| cfg.max_ttl.get().as_secs());
        if max_ttl.is_some_and(|max| cfg.min_ttl.get().as_secs() > max) {
            return Err(format!(
                "cache.min_ttl ({}) is greater than cache.max_ttl ({})",
                cfg.min_ttl, cfg.max_ttl
            ));
        }
        Ok(Policy {
            patterns,
            refresh,
            default_heuristic: Refresh {
                min: 0,
                percent: u64::from(cfg.heuristic_percent),
                max: cfg.heuristic_max.get().as_secs(),
            },
            ignore_reload: cfg.ignore_reload,
            ignore_no_store: cfg.ignore_no_store,
            cache_query: cfg.cache_query,
            ignore_query_in_key: cfg.ignore_query_in_key,
            min_ttl: cfg.min_ttl.get().as_secs(),
            max_ttl,
            set_cookie: cfg.set_cookie,
            max_stale_on_error: cfg.max_stale_on_error.get().as_secs(),
            targeted: Vec::new(),
            strip_targeted: cfg.strip_targeted_fields,
            slice: cfg.slice.bytes(),
            fingerprint: 0,
        }
        .fingerprinted())
    }

    /// Sets [`Policy::fingerprint`] from the other fields: their `Debug`
    /// form (the regular expressions print their patterns) hashed.
    fn fingerprinted(mut self) -> Policy {
        use std::hash::{Hash, Hasher};
        self.fingerprint = 0;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        format!("{self:?}").hash(&mut h);
        self.fingerprint = h.finish();
        self
    }

    /// `cache.slice`: the size of the slices objects are fetched and stored
    /// in, None when they are fetched and stored whole.
    pub fn slice_size(&self) -> Option<u64> {
        (self.slice > 0).then_some(self.slice)
    }

    /// This policy, obeying the targeted cache-control fields of `cfg`
    /// (`cache.targeted_fields`, RFC 9213) as a CDN does: the policy of
    /// reverse listeners. Fails on a name that is not a field name.
    pub fn targeted(mut self, cfg: &CacheConfig) -> Result<Policy, String> {
        self.targeted = cfg
            .targeted_fields
            .iter()
            .map(|name| {
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("cache.targeted_fields: {name:?} is not a header field name"))
            })
            .collect::<Result<_, _>>()?;
        Ok(self.fingerprinted())
    }

    /// Removes the targeted fields this policy obeys from a response about
    /// to be sent, when `cache.strip_targeted_fields` says so (they were
    /// meant for this cache alone); else they are passed on, as RFC 9213
    /// lets every CDN on the way use `CDN-Cache-Control`.
    pub fn strip_targeted(&self, headers: &mut HeaderMap) {
        if self.strip_targeted {
            for name in &self.targeted {
                headers.remove(name);
            }
        }
    }

    /// Identifies the settings: two policies with the same fingerprint
    /// decide alike (what is kept with a stored response is tagged with it).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether `name` is a targeted field [`Policy::strip_targeted`]
    /// takes out of responses (a head written without a copy skips it).
    pub fn strips(&self, name: &HeaderName) -> bool {
        self.strip_targeted && self.targeted.contains(name)
    }

    /// The response's cache directives (RFC 9213 2.2): those of the first
    /// targeted field, in the order of [`Policy::targeted`], with a valid
    /// (RFC 8941 Dictionary), non-empty value; else `Cache-Control`'s.
    fn response_directives<'h>(&self, headers: &'h HeaderMap) -> Directives<'h> {
        self.targeted
            .iter()
            .find_map(|name| targeted_directives(headers, name))
            .unwrap_or_else(|| Directives::of(headers))
    }

    /// Takes out of `headers` the fields that must not reach any client
    /// but the one the response was fetched for, and returns them: the
    /// cookie fields, unless `set_cookie = "store"` (the operator's choice
    /// to replay them, as RFC 9111 allows). What is left may be stored,
    /// shared with collapsed requests, merged from a 304 into a stored
    /// response, or served from the cache.
    pub fn take_unshared(&self, headers: &mut HeaderMap) -> HeaderMap {
        let mut taken = HeaderMap::new();
        for name in self.unshared_fields(headers) {
            if let header::Entry::Occupied(e) = headers.entry(name) {
                let (name, values) = e.remove_entry_mult();
                for value in values {
                    taken.append(name.clone(), value);
                }
            }
        }
        taken
    }

    /// Whether `headers` hold a field [`Policy::take_unshared`] would take.
    pub fn has_unshared(&self, headers: &HeaderMap) -> bool {
        // Asked on every hit: the cookie fields first, and no list built.
        if self.set_cookie != SetCookie::Store && COOKIE_FIELDS.iter().any(|n| headers.contains_key(n)) {
            return true;
        }
        // Only a `no-cache` or `private` directive can name fields: when no
        // field the directives may come from has either word, there is
        // nothing to parse (the usual `max-age=N`, `public`).
        let may_name = |name: &HeaderName| {
            headers
                .get_all(name)
                .iter()
                .any(|v| mentions(v.as_bytes(), b"no-cache") || mentions(v.as_bytes(), b"private"))
        };
        if !may_name(&header::CACHE_CONTROL) && !self.targeted.iter().any(may_name) {
            return false;
        }
        let rs = self.response_directives(headers);
        ["no-cache", "private"]
            .into_iter()
            .flat_map(|d| rs.qualified_fields(d))
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .any(|n| !NEVER_UNSHARED.contains(&n) && headers.contains_key(&n))
    }

    /// The fields [`Policy::take_unshared`] takes: the cookie fields unless
    /// `set_cookie = "store"`, and those the response's qualified `no-cache`
    /// (RFC 9111 5.2.2.4) or `private` (5.2.2.7) name, which a shared cache
    /// may store and reuse only without them. Framing, `Vary` and
    /// `Cache-Control` are never taken even if named: the stored response
    /// needs them to be served at all, or to the right clients.
    fn unshared_fields(&self, headers: &HeaderMap) -> Vec<HeaderName> {
        let rs = self.response_directives(headers);
        let mut names: Vec<HeaderName> = ["no-cache", "private"]
            .into_iter()
            .flat_map(|d| rs.qualified_fields(d))
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .filter(|n| !NEVER_UNSHARED.contains(n))
            .collect();
        if self.set_cookie != SetCookie::Store {
            names.extend(COOKIE_FIELDS);
        }
        names
    }

    /// Whether the response to a request may be stored (RFC 9111 section 3,
    /// shared cache), or why not. `key` is the request's cache key (its URL
    /// decides `cache_query` and the refresh pattern).
    ///
    /// Only complete responses to `GET` are stored (HEAD is served from
    /// them); `no-store` and `private` forbid storing unless
    /// `ignore_no_store`; `Authorization` needs `public`, `s-maxage` or
    /// `must-revalidate` (3.5); the status must be cacheable by default or
    /// the response carry explicit freshness or `public`; `Vary: *` is never
    /// stored; a response with neither explicit freshness nor a validator is
    /// stored only when the refresh patterns or `min_ttl` give it a lifetime.
    /// A response with `Set-Cookie` is not stored with `set_cookie =
    /// "no-store"` (the default; `ignore_no_store` does not change it).
    pub fn storable(
        &self,
        method: &Method,
        key: &CacheKey,
        req_headers: &HeaderMap,
        status: StatusCode,
        resp_headers: &HeaderMap,
    ) -> Result<(), NotStorable> {
        if method != Method::GET {
            return Err(NotStorable("request method is not GET"));
        }
        if status.is_informational() {
            return Err(NotStorable("interim response"));
        }
        if status == StatusCode::PARTIAL_CONTENT {
            return Err(NotStorable("partial content"));
        }
        if status == StatusCode::NOT_MODIFIED {
            return Err(NotStorable("304 carries no content"));
        }
        // A 412 to a request with preconditions (RFC 9110 13.1.1, 13.1.4)
        // or a 416 to one with `Range` (15.5.17) answers that request, not
        // the URL: stored with the freshness an origin puts on every status,
        // it would refuse every later request (a denial of service by one
        // client's header; nginx strips these fields from what it fetches
        // to store, Varnish fetches misses unconditionally).
        if status == StatusCode::PRECONDITION_FAILED
            && (req_headers.contains_key(header::IF_MATCH) || req_headers.contains_key(header::IF_UNMODIFIED_SINCE))
        {
            return Err(NotStorable("412 answers the request's preconditions"));
        }
        if status == StatusCode::RANGE_NOT_SATISFIABLE && req_headers.contains_key(header::RANGE) {
            return Err(NotStorable("416 answers the request's Range"));
        }
        if !self.cache_query && key.url().contains('?') {
            return Err(NotStorable("URL has a query string (cache_query = false)"));
        }
        let rq = Directives::of(req_headers);
        let rs = self.response_directives(resp_headers);
        if !self.ignore_no_store {
            if rq.has("no-store") {
                return Err(NotStorable("request Cache-Control: no-store"));
            }
            if rs.has("no-store") {
                return Err(NotStorable("response Cache-Control: no-store"));
            }
            // 5.2.2.7: the qualified form private="field" allows storing
            // without the named fields (`take_unshared`).
            if rs.unqualified("private") {
                return Err(NotStorable("response Cache-Control: private"));
            }
        }
        // Not RFC 9111 (which allows it), but nginx's and Varnish's default:
        // another client must not get this client's cookie.
        if self.set_cookie == SetCookie::NoStore && COOKIE_FIELDS.iter().any(|n| resp_headers.contains_key(n)) {
            return Err(NotStorable("response has Set-Cookie (cache.set_cookie = \"no-store\")"));
        }
        // 3.5: a shared cache stores responses to authenticated requests only
        // when the response says a shared cache may.
        if req_headers.contains_key(header::AUTHORIZATION)
            && !(rs.has("public") || rs.has("s-maxage") || rs.has("must-revalidate"))
        {
            return Err(NotStorable("request has Authorization"));
        }
        if vary_fields(resp_headers).is_none() {
            return Err(NotStorable("Vary: *"));
        }
        let explicit = rs.has("s-maxage") || rs.has("max-age") || (!rs.1 && resp_headers.contains_key(header::EXPIRES));
        if !(heuristically_cacheable(status) || explicit || rs.has("public")) {
            return Err(NotStorable("status not cacheable by default and no explicit freshness"));
        }
        let validator = resp_headers.contains_key(header::ETAG) || resp_headers.contains_key(header::LAST_MODIFIED);
        // Without explicit freshness or Last-Modified the date does not enter
        // the lifetime: only a refresh pattern's min or min_ttl can give one.
        if !explicit && !validator && self.lifetime(key.url(), status, resp_headers, 0) == 0 {
            return Err(NotStorable("no freshness information and no validator"));
        }
        Ok(())
    }

    /// The freshness lifetime of a stored response (RFC 9111 4.2.1):
    /// `s-maxage`, else `max-age`, else `Expires - Date`, else the heuristic
    /// of the first refresh pattern matching the key URL (4.2.2, only for
    /// statuses cacheable by default or `public`): `percent`% of
    /// `Date - Last-Modified` clamped to `[min, max]`, or `min` when there is
    /// no `Last-Modified` (Squid's rule); when no pattern matches, the
    /// default heuristic (`heuristic_percent`% of the same, at most
    /// `heuristic_max`, nothing without `Last-Modified`). Finally the
    /// `min_ttl` / `max_ttl` overrides clamp it (breaking the spec).
    ///
    /// `max-age` / `s-maxage` are read by their leading digits (`3600.5` is
    /// 3600); a value without them or an invalid `Expires` date gives 0
    /// (stale); of duplicated directives the smallest counts.
    pub fn freshness_lifetime(&self, meta: &StoredMeta) -> Duration {
        Duration::from_secs(self.lifetime(url_of(&meta.key), meta.status, &meta.headers, date_value(meta)))
    }

    /// Lifetime in seconds; `date` is the Date value in seconds.
    fn lifetime(&self, key: &str, status: StatusCode, headers: &HeaderMap, date: u64) -> u64 {
        self.lifetime_with(key, status, headers, &self.response_directives(headers), date)
    }

    /// `lifetime` with the response's Cache-Control already parsed.
    fn lifetime_with(&self, key: &str, status: StatusCode, headers: &HeaderMap, cc: &Directives, date: u64) -> u64 {
        let base = match explicit_lifetime(cc, headers, date) {
            Some(explicit) => explicit,
            None => self.heuristic(key, status, cc, headers, date),
        };
        let base = base.max(self.min_ttl);
        self.max_ttl.map_or(base, |max| base.min(max))
    }

    /// RFC 9111 4.2.2 with Squid-style refresh patterns.
    fn heuristic(&self, key: &str, status: StatusCode, cc: &Directives, headers: &HeaderMap, date: u64) -> u64 {
        if !(heuristically_cacheable(status) || cc.has("public")) {
            return 0;
        }
        let rule = match self.patterns.matches(key).iter().next() {
            Some(index) => self.refresh[index],
            None => self.default_heuristic,
        };
        match headers.get(header::LAST_MODIFIED).and_then(parse_http_date) {
            Some(last_modified) => {
                let since = date.saturating_sub(last_modified);
                (since.saturating_mul(rule.percent) / 100).clamp(rule.min, rule.max)
            }
            None => rule.min,
        }
    }

    /// What this policy concludes from `meta`'s fields alone: kept with the
    /// metadata on first use, worked out again only for another policy.
    fn facts(&self, meta: &StoredMeta) -> StoredFacts {
        if let Some(kept) = meta.derived.facts()
            && kept.policy == self.fingerprint
        {
            return *kept;
        }
        let rs = self.response_directives(&meta.headers);
        let facts = StoredFacts {
            policy: self.fingerprint,
            lifetime: self.lifetime_with(url_of(&meta.key), meta.status, &meta.headers, &rs, date_value(meta)),
            // 4.2.4: these forbid serving the response stale, whatever the client says.
            no_stale: rs.has("no-cache")
                || rs.has("must-revalidate")
                || rs.has("proxy-revalidate")
                || rs.has("s-maxage"),
            no_cache: rs.unqualified("no-cache"),
            stale_if_error: rs.delta("stale-if-error").flatten(),
            stale_while_revalidate: rs.delta("stale-while-revalidate").flatten(),
            unshared: self.has_unshared(&meta.headers),
        };
        meta.derived.keep_facts(facts);
        facts
    }

    /// [`Policy::has_unshared`] of a stored response's fields, kept with it.
    pub fn stored_has_unshared(&self, meta: &StoredMeta) -> bool {
        self.facts(meta).unshared
    }

    /// Decides how a stored response may answer a request (RFC 9111 4.2,
    /// 5.2.1, 5.2.2, RFC 5861). The caller has already selected the right
    /// variant ([`variant_matches`]).
    ///
    /// In order: response `no-cache` (any form), request `no-cache` (or
    /// `Pragma: no-cache` without Cache-Control; both ignored with
    /// `ignore_reload`), request `max-age` (`max-age=0` always revalidates)
    /// and `min-fresh` force revalidation; a fresh response is served; a
    /// stale one is served when the request's `max-stale` allows it, or
    /// served while revalidating within `stale-while-revalidate`, unless the
    /// response has `must-revalidate`, `proxy-revalidate` or `s-maxage`
    /// (4.2.4); otherwise it is revalidated. With `only-if-cached`, a
    /// revalidation becomes `GatewayTimeout`.
    pub fn evaluate(&self, req_headers: &HeaderMap, meta: &StoredMeta, now: SystemTime) -> Decision {
        let rq = Directives::of(req_headers);
        let facts = self.facts(meta);
        let age = current_age_secs(meta, now);
        let lifetime = facts.lifetime;
        let no_stale = facts.no_stale;
        let stale_if_error_until = if no_stale {
            None
        } else {
            // RFC 5861 4: stale-if-error in the response or the request;
            // 4.2.4: a disconnected cache may serve stale, for as long as the
            // operator allows (`max_stale_on_error`), within the request's
            // `max-stale=N` when it sets one (the staleness it accepts).
            let configured = (self.max_stale_on_error > 0).then(|| match rq.value("max-stale") {
                Some(Some(value)) => parse_delta(value.as_bytes())
                    .map_or(self.max_stale_on_error, |max| max.min(self.max_stale_on_error)),
                _ => self.max_stale_on_error,
            });
            let window = [facts.stale_if_error, rq.delta("stale-if-error").flatten(), configured]
                .into_iter()
                .flatten()
                .max();
            window.map(|window| {
                let stale_at = secs(now).saturating_add(lifetime).saturating_sub(age);
                UNIX_EPOCH + Duration::from_secs(stale_at.saturating_add(window))
            })
        };
        let revalidate = |reason: RevalidateReason| {
            if rq.has("only-if-cached") {
                Decision::GatewayTimeout
            } else {
                Decision::Revalidate {
                    reason,
                    stale_if_error_until,
                }
            }
        };

        // 5.2.2.4: no-cache without field names; the qualified form lets the
        // response be reused without the named fields (`take_unshared`).
        if facts.no_cache {
            return revalidate(RevalidateReason::ResponseNoCache);
        }
        if !self.ignore_reload && request_no_cache(req_headers, &rq) {
            return revalidate(RevalidateReason::RequestNoCache);
        }
        // 5.2.1.1: an invalid request max-age is ignored.
        if let Some(max_age) = rq.delta("max-age").flatten()
            && (max_age == 0 || age > max_age)
        {
            return revalidate(RevalidateReason::RequestMaxAge);
        }
        if lifetime > age {
            // 5.2.1.3: min-fresh wants at least that much freshness left.
            if let Some(min_fresh) = rq.delta("min-fresh").flatten()
                && lifetime - age < min_fresh
            {
                return revalidate(RevalidateReason::RequestMinFresh);
            }
            return Decision::Fresh;
        }
        let staleness = age - lifetime;
        if !no_stale {
            // 5.2.1.2: max-stale without a value accepts any staleness; an
            // invalid value is ignored.
            match rq.value("max-stale") {
                Some(None) => return Decision::Stale,
                Some(Some(value)) if parse_delta(value.as_bytes()).is_some_and(|max| staleness <= max) => {
                    return Decision::Stale;
                }
                _ => {}
            }
            if let Some(window) = facts.stale_while_revalidate
                && staleness < window
            {
                return Decision::StaleWhileRevalidate;
            }
        }
        revalidate(RevalidateReason::Stale)
    }

    /// The keys whose stored responses must be removed after a request with
    /// an unsafe method (anything but GET, HEAD, OPTIONS, TRACE) got a 2xx
    /// or 3xx response (RFC 9111 4.4): the target, and the `Location` and
    /// `Content-Location` URIs (relative references resolved against the
    /// target) when they share its origin, as fetched from the target's
    /// upstream group if it has one. Empty otherwise.
    pub fn invalidations(
        &self,
        method: &Method,
        target: &CacheKey,
        status: StatusCode,
        resp_headers: &HeaderMap,
    ) -> Vec<CacheKey> {
        let safe = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method);
        if safe || !(status.is_success() || status.is_redirection()) {
            return Vec::new();
        }
        let mut keys = vec![target.clone()];
        let origin = origin_of(target.url());
        for name in [header::LOCATION, header::CONTENT_LOCATION] {
            if let Some(value) = resp_headers.get(&name)
                && let Ok(text) = value.to_str()
                && let Some(url) = resolve_reference(target.url(), text)
                && let Some(key) = CacheKey::from_url(&url, self.ignore_query_in_key)
                && origin_of(key.url()) == origin
                // Fetched from the same place as the target (its upstream group).
                && let key = target.same_upstream(key)
                && !keys.contains(&key)
            {
                keys.push(key);
            }
        }
        keys
    }
}

/// Whether the request says `only-if-cached` (RFC 9111 5.2.1.7): on a miss
/// the caller answers 504 without contacting the origin.
pub fn only_if_cached(req_headers: &HeaderMap) -> bool {
    Directives::of(req_headers).has("only-if-cached")
}

impl Policy {
    /// Whether a request bypasses the cache (RFC 9111 5.2.1.5): with
    /// `Cache-Control: no-store` no part of the request or its response may
    /// be stored, and it is not answered from what is stored either, as the
    /// cache-tests suite's `ccreq-no-store` expects and Squid, Apache Traffic
    /// Server and Apache httpd do: the client asks for the origin's answer.
    /// `ignore_no_store` (which stores such responses) turns this off.
    pub fn bypasses_cache(&self, req_headers: &HeaderMap) -> bool {
        !self.ignore_no_store && Directives::of(req_headers).has("no-store")
    }
}

/// Request `no-cache`, or `Pragma: no-cache` when there is no Cache-Control (5.4).
fn request_no_cache(req_headers: &HeaderMap, rq: &Directives) -> bool {
    if req_headers.contains_key(header::CACHE_CONTROL) {
        return rq.has("no-cache");
    }
    req_headers.get_all(header::PRAGMA).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|item| item.trim_ascii().eq_ignore_ascii_case(b"no-cache"))
    })
}

/// Statuses cacheable by default, i.e. open to heuristic freshness (RFC 9110 15.1).
fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// `s-maxage`, `max-age` or `Expires - Date`, in seconds; `None` when the
/// response has none of them.
fn explicit_lifetime(cc: &Directives, headers: &HeaderMap, date: u64) -> Option<u64> {
    // 4.2.1: invalid freshness information makes the response stale.
    if let Some(value) = cc.freshness_delta("s-maxage") {
        return Some(value);
    }
    if let Some(value) = cc.freshness_delta("max-age") {
        return Some(value);
    }
    // RFC 9213 2.2: a targeted field's directives replace Expires too.
    if cc.1 {
        return None;
    }
    // 5.3: an invalid Expires (e.g. "0") means already expired; so do two
    // field lines, the field being a single date.
    let mut lines = headers.get_all(header::EXPIRES).iter();
    let expires = lines.next()?;
    if lines.next().is_some() {
        return Some(0);
    }
    Some(parse_expires(expires).map_or(0, |expires| expires.saturating_sub(date)))
}

/// A response `max-age` / `s-maxage` value read as Squid, Apache Traffic
/// Server, Apache httpd and nginx read it: the leading digits count, so
/// `3600.5` and `3600a` are 3600 (too large counts as 2^31); a value not
/// starting with a digit (`-1`, `a3600`, empty) is invalid and gives 0, i.e.
/// stale (RFC 9111 4.2.1).
fn lenient_delta(value: Option<&str>) -> u64 {
    let bytes = value.unwrap_or("").as_bytes();
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    parse_delta(&bytes[..digits]).unwrap_or(0)
}

/// An `Expires` value (RFC 9111 5.3) in one of the three HTTP-date formats
/// (RFC 9110 5.6.7), exactly as their grammar lays them out (single spaces,
/// two-digit days and hours, a four-digit year except in RFC 850's form,
/// `GMT`), but with day, month and zone names in any case and the weekday
/// not checked against the date, as Squid, Apache Traffic Server, Apache
/// httpd and nginx read it (only the date matters). `None` for anything
/// else, which the caller treats as "already expired": a two-digit year in
/// the preferred form, a missing comma, doubled spaces, dashes with a
/// four-digit year, a one-digit hour, another zone (cache-tests
/// `freshness-expires-invalid-*`).
fn parse_expires(value: &HeaderValue) -> Option<u64> {
    const WEEKDAYS: [&str; 7] = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    const MONTHS: [&[u8]; 12] = [
        b"jan", b"feb", b"mar", b"apr", b"may", b"jun", b"jul", b"aug", b"sep", b"oct", b"nov", b"dec",
    ];
    let b = value.as_bytes().trim_ascii();
    let digits = |s: &[u8]| -> Option<u64> {
        (!s.is_empty() && s.iter().all(u8::is_ascii_digit))
            .then(|| s.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
    };
    let month = |s: &[u8]| {
        MONTHS
            .iter()
            .position(|m| m.eq_ignore_ascii_case(s))
            .map(|i| i as u64 + 1)
    };
    let short_day = |s: &[u8]| WEEKDAYS.iter().any(|d| d.as_bytes()[..3].eq_ignore_ascii_case(s));
    let long_day = |s: &[u8]| WEEKDAYS.iter().any(|d| d.as_bytes().eq_ignore_ascii_case(s));
    // "08:49:37"
    let time = |s: &[u8]| -> Option<u64> {
        if s.len() != 8 || s[2] != b':' || s[5] != b':' {
            return None;
        }
        let (h, m, sec) = (digits(&s[0..2])?, digits(&s[3..5])?, digits(&s[6..8])?);
        (h <= 23 && m <= 59 && sec <= 60).then_some(h * 3600 + m * 60 + sec)
    };
    let (year, month, day, seconds) = if b.len() == 29 && b[3] == b',' {
        // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
        if !short_day(&b[..3]) || b[4] != b' ' || b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || b[25] != b' ' {
            return None;
        }
        if !b[26..].eq_ignore_ascii_case(b"GMT") {
            return None;
        }
        (
            digits(&b[12..16])?,
            month(&b[8..11])?,
            digits(&b[5..7])?,
            time(&b[17..25])?,
        )
    } else if b.len() == 24 && b[3] == b' ' {
        // asctime: "Sun Nov  6 08:49:37 1994" (the day is space-padded).
        if !short_day(&b[..3]) || b[7] != b' ' || b[10] != b' ' || b[19] != b' ' {
            return None;
        }
        let day = if b[8] == b' ' {
            digits(&b[9..10])?
        } else {
            digits(&b[8..10])?
        };
        (digits(&b[20..24])?, month(&b[4..7])?, day, time(&b[11..19])?)
    } else {
        // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT".
        let comma = b.iter().position(|&c| c == b',')?;
        let rest = &b[comma + 1..];
        if !long_day(&b[..comma]) || rest.len() != 23 || rest[0] != b' ' || rest[3] != b'-' || rest[7] != b'-' {
            return None;
        }
        if rest[10] != b' ' || rest[19] != b' ' || !rest[20..].eq_ignore_ascii_case(b"GMT") {
            return None;
        }
        // RFC 9110 5.6.7: a two-digit year is the closest century
        // (simplified as httpdate does: 70-99 is 19xx, 00-69 is 20xx).
        let yy = digits(&rest[8..10])?;
        let year = if yy < 70 { 2000 + yy } else { 1900 + yy };
        (year, month(&rest[4..7])?, digits(&rest[1..3])?, time(&rest[11..19])?)
    };
    Some(days_since_epoch(year, month, day)? * 86_400 + seconds)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (Howard Hinnant's days_from_civil); None for a day the month does not
/// have (February 30, a day 0) or a year before 1970.
fn days_since_epoch(year: u64, month: u64, day: u64) -> Option<u64> {
    let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if year < 1970 || day == 0 || day > *month_days.get(usize::try_from(month).ok()?.checked_sub(1)?)? {
        return None;
    }
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y % 400;
    let doy = (153 * mo + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).checked_sub(719_468)
}

// ---------------------------------------------------------------------------
// Age (RFC 9111 4.2.3).
// ---------------------------------------------------------------------------

/// Seconds since the epoch (0 before it).
fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The `Date` value in seconds, or `response_time` when it is missing or
/// invalid (RFC 9110 6.6.1: a recipient adds the time it received it).
fn date_value(meta: &StoredMeta) -> u64 {
    derived(meta).0
}

/// [`date_value`] and [`corrected_initial_age`] in seconds, computed once
/// per stored metadata ([`crate::cache::object::Derived`]).
fn derived(meta: &StoredMeta) -> (u64, u64) {
    meta.derived.get_or_init(|| {
        let date = meta
            .headers
            .get(header::DATE)
            .and_then(parse_http_date)
            .unwrap_or_else(|| secs(meta.response_time));
        // corrected_initial_age = max(apparent_age, corrected_age_value).
        let apparent_age = secs(meta.response_time).saturating_sub(date);
        (date, apparent_age.max(corrected_age_value(meta).as_secs()))
    })
}

/// `apparent_age = max(0, response_time - date_value)` (computed within
/// [`derived`]; this form for the tests).
#[cfg(test)]
fn apparent_age(meta: &StoredMeta) -> Duration {
    Duration::from_secs(secs(meta.response_time).saturating_sub(date_value(meta)))
}

/// `response_delay = response_time - request_time`.
pub fn response_delay(meta: &StoredMeta) -> Duration {
    Duration::from_secs(secs(meta.response_time).saturating_sub(secs(meta.request_time)))
}

/// `corrected_age_value = age_value + response_delay`, where `age_value` is
/// the stored `Age` header as [`age_value`] reads it.
pub fn corrected_age_value(meta: &StoredMeta) -> Duration {
    Duration::from_secs(age_value(&meta.headers)).saturating_add(response_delay(meta))
}

/// The `Age` header's value (RFC 9111 5.1): "a cache encountering a message
/// with a list-based Age field value SHOULD use the first member of the
/// field value, discarding subsequent ones" (of several field lines, the
/// first line's first member); a parameter after the number
/// (`7200;foo=bar`) is left out, the number stands. "If the field value
/// (after discarding additional members ...) is invalid (e.g., it contains
/// something other than a non-negative integer), a cache SHOULD ignore the
/// field": 0, as when it is absent (`abc`, `-7200`, `7200.0`).
pub fn age_value(headers: &HeaderMap) -> u64 {
    let Some(line) = headers.get(header::AGE) else {
        return 0;
    };
    let bytes = line.as_bytes();
    let first = bytes.split(|&b| b == b',').next().unwrap_or(bytes);
    let number = first.split(|&b| b == b';').next().unwrap_or(first);
    parse_delta(number.trim_ascii()).unwrap_or(0)
}

/// `corrected_initial_age = max(apparent_age, corrected_age_value)`.
pub fn corrected_initial_age(meta: &StoredMeta) -> Duration {
    Duration::from_secs(derived(meta).1)
}

/// `resident_time = now - response_time`.
pub fn resident_time(meta: &StoredMeta, now: SystemTime) -> Duration {
    Duration::from_secs(secs(now).saturating_sub(secs(meta.response_time)))
}

/// `current_age = corrected_initial_age + resident_time`.
pub fn current_age(meta: &StoredMeta, now: SystemTime) -> Duration {
    corrected_initial_age(meta).saturating_add(resident_time(meta, now))
}

fn current_age_secs(meta: &StoredMeta, now: SystemTime) -> u64 {
    current_age(meta, now).as_secs()
}

/// The `Age` header value to send with a response served from the cache:
/// `current_age` in whole seconds, at most 2^31 (RFC 9111 5.1).
pub fn age_header(meta: &StoredMeta, now: SystemTime) -> HeaderValue {
    HeaderValue::from(age_secs(meta, now))
}

/// The number [`age_header`] sends (a hit head writes it without a
/// `HeaderValue`).
pub fn age_secs(meta: &StoredMeta, now: SystemTime) -> u64 {
    current_age_secs(meta, now).min(DELTA_MAX)
}

// ---------------------------------------------------------------------------
// Revalidation (RFC 9111 4.3).
// ---------------------------------------------------------------------------

/// The conditional header fields for revalidating a stored response (4.3.1):
/// `If-None-Match` from its `ETag` and `If-Modified-Since` from its
/// `Last-Modified`. Insert them into the upstream request, replacing any the
/// client sent. Empty when the response has no validator (the request is
/// then an ordinary fetch).
pub fn conditional_headers(meta: &StoredMeta) -> HeaderMap {
    let mut out = HeaderMap::new();
    if let Some(etag) = meta.headers.get(header::ETAG) {
        out.insert(header::IF_NONE_MATCH, etag.clone());
    }
    if let Some(last_modified) = meta.headers.get(header::LAST_MODIFIED) {
        out.insert(header::IF_MODIFIED_SINCE, last_modified.clone());
    }
    out
}

/// How to treat the origin's answer to a revalidation ([`revalidation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revalidation {
    /// A 304 for the stored response: apply [`update_from_304`], store the
    /// updated metadata and serve the stored response.
    NotModified,
    /// A 304 whose validators do not match the stored response: it selects
    /// no stored response, so it updates nothing (RFC 9111 4.3.4). It still
    /// answers the conditional request made for the stored response, which
    /// is served as it is; the 304 itself never reaches a client that did
    /// not send the conditional.
    Mismatch,
    /// 500, 502, 503 or 504: serve the stored response if
    /// `Decision::Revalidate::stale_if_error_until` allows, else this answer.
    ServerError,
    /// Any other answer replaces the stored response: send it to the client,
    /// store it if [`Policy::storable`], else remove the stored one.
    Replace,
}

/// Classifies the origin's answer to a revalidation of `meta`.
///
/// A 304 applies (RFC 9111 4.3.4, simplified for one stored response per
/// variant) when its `ETag` matches the stored one (a strong 304 tag needs a
/// strong, equal stored tag; a weak one compares weakly), else when its
/// `Last-Modified` equals the stored one, else when it has no validator at
/// all (it answers the conditional request we made for this response).
pub fn revalidation(meta: &StoredMeta, status: StatusCode, resp_headers: &HeaderMap) -> Revalidation {
    match status.as_u16() {
        304 => {
            let applies = if let Some(new) = first_etag(resp_headers) {
                first_etag(&meta.headers).is_some_and(|old| {
                    if new.weak {
                        old.weak_eq(&new)
                    } else {
                        old.strong_eq(&new)
                    }
                })
            } else if let Some(new) = resp_headers.get(header::LAST_MODIFIED) {
                let old = meta.headers.get(header::LAST_MODIFIED).and_then(parse_http_date);
                old.is_some() && old == parse_http_date(new)
            } else {
                true
            };
            if applies {
                Revalidation::NotModified
            } else {
                Revalidation::Mismatch
            }
        }
        _ if is_origin_error(status) => Revalidation::ServerError,
        _ => Revalidation::Replace,
    }
}

/// Whether `status`, answered by the origin or made by Portico for an origin
/// that could not be reached (502 refused, reset or closed without an
/// answer; 504 timed out), is an error a stored response may stand in for:
/// 500, 502, 503 or 504, the errors of RFC 5861 4 (`stale-if-error`), which
/// RFC 9111 4.2.4 calls being disconnected. Not 4xx, nor 508 (a forwarding
/// loop is a configuration error, not the origin's).
pub fn is_origin_error(status: StatusCode) -> bool {
    matches!(status.as_u16(), 500 | 502 | 503 | 504)
}

/// Fields a 304 never updates: `Content-Length` (RFC 9111 3.2 names it) and
/// the framing and hop-by-hop fields, which are not stored (3.1).
/// `Content-Encoding` and `Content-Range` are updated: 3.2 lets a cache keep
/// only the fields its stored response depends upon, and Portico stores the
/// body as received (it decodes no content coding) and stores no 206.
const NOT_UPDATED: [HeaderName; 8] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// Applies a 304 to the stored response (RFC 9111 3.2, 4.3.4): every field
/// in the 304 replaces the stored field of that name, except the framing
/// and hop-by-hop ones (`Content-Length`, `Transfer-Encoding`, `Connection`
/// and the fields it names, ...); other stored fields are kept. The stored `Age` is dropped
/// when the 304 has none, and `Date` becomes `response_time` when the 304
/// has none, so the age is computed afresh from the new times.
pub fn update_from_304(
    meta: &mut StoredMeta,
    not_modified: &HeaderMap,
    request_time: SystemTime,
    response_time: SystemTime,
) {
    let connection_named: Vec<Vec<u8>> = not_modified
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|name| name.trim_ascii().to_ascii_lowercase())
        .collect();
    for name in not_modified.keys() {
        if NOT_UPDATED.contains(name) || connection_named.iter().any(|n| n == name.as_str().as_bytes()) {
            continue;
        }
        meta.headers.remove(name);
        for value in not_modified.get_all(name) {
            meta.headers.append(name.clone(), value.clone());
        }
    }
    if !not_modified.contains_key(header::AGE) {
        meta.headers.remove(header::AGE);
    }
    if !not_modified.contains_key(header::DATE) {
        let date = HeaderValue::from_str(&httpdate::fmt_http_date(response_time));
        if let Ok(date) = date {
            meta.headers.insert(header::DATE, date);
        }
    }
    meta.request_time = request_time;
    meta.response_time = response_time;
    meta.derived.clear();
}

/// What a response to a `HEAD` the cache forwarded does to the stored `GET`
/// response it could have been served from ([`head_update`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadUpdate {
    /// Its fields update the stored response as a 304's do ([`update_from_304`]).
    Update,
    /// It describes another representation: the stored response goes.
    Invalidate,
    /// Not a 200: the stored response is left as it is.
    Leave,
}

/// RFC 9111 4.3.5: a 200 to a `HEAD` updates the stored `GET` response
/// (`meta`, with a body of `len` bytes) when every validator it carries
/// (`ETag`, `Last-Modified`) matches the stored one and its `Content-Length`,
/// if any, is `len`; otherwise the stored response is invalidated. The
/// cache-tests suite's `head-200-freshness-update` and `head-200-update`.
pub fn head_update(meta: &StoredMeta, len: u64, status: StatusCode, resp_headers: &HeaderMap) -> HeadUpdate {
    if status != StatusCode::OK {
        return HeadUpdate::Leave;
    }
    let etag_matches = match first_etag(resp_headers) {
        Some(new) => first_etag(&meta.headers).is_some_and(|old| old.weak == new.weak && old.weak_eq(&new)),
        None => true,
    };
    let lm_matches = match resp_headers.get(header::LAST_MODIFIED) {
        Some(new) => {
            let old = meta.headers.get(header::LAST_MODIFIED).and_then(parse_http_date);
            old.is_some() && old == parse_http_date(new)
        }
        None => true,
    };
    let length_matches = match resp_headers.get(header::CONTENT_LENGTH) {
        Some(n) => n.to_str().ok().and_then(|n| n.trim().parse::<u64>().ok()) == Some(len),
        None => true,
    };
    if etag_matches && lm_matches && length_matches {
        HeadUpdate::Update
    } else {
        HeadUpdate::Invalidate
    }
}

// ---------------------------------------------------------------------------
// Client conditional requests answered from the cache (RFC 9110 13).
// ---------------------------------------------------------------------------

/// The outcome of a client's preconditions against a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// No precondition stops the request: serve the stored response
    /// (then `Range` / `If-Range`, see `range::plan`).
    Proceed,
    /// Answer 304 with [`not_modified_headers`] (and `Age`).
    NotModified,
    /// Answer 412 Precondition Failed.
    Failed,
}

/// Evaluates `If-Match`, `If-Unmodified-Since`, `If-None-Match` and
/// `If-Modified-Since` in the order of RFC 9110 13.2.2 against a stored
/// response. Preconditions are ignored when the stored status is not 2xx
/// (13.2.1). `If-None-Match` uses the weak comparison (`*` matches any
/// stored response) and gives 304 for GET/HEAD, 412 otherwise;
/// `If-Modified-Since` counts only without `If-None-Match`, for GET/HEAD,
/// with a valid date, and compares `Last-Modified`, else `Date`, else the
/// time received (RFC 9111 4.3.2). `If-Match` (strong comparison) and
/// `If-Unmodified-Since` give 412 when they fail.
pub fn check_preconditions(method: &Method, req_headers: &HeaderMap, meta: &StoredMeta) -> Precondition {
    // Most requests carry no precondition: one look at the request's few
    // field names, and the stored validators are not parsed at all.
    let conditional = req_headers.keys().any(|k| {
        k == header::IF_MATCH
            || k == header::IF_NONE_MATCH
            || k == header::IF_MODIFIED_SINCE
            || k == header::IF_UNMODIFIED_SINCE
    });
    if !conditional || !meta.status.is_success() {
        return Precondition::Proceed;
    }
    let stored_etag = first_etag(&meta.headers);
    let last_modified = meta.headers.get(header::LAST_MODIFIED).and_then(parse_http_date);
    let get_or_head = method == Method::GET || method == Method::HEAD;

    // 13.1.1 If-Match: strong comparison; "*" matches any current representation.
    if req_headers.contains_key(header::IF_MATCH) {
        let values = req_headers.get_all(header::IF_MATCH);
        let star = values.iter().any(is_star);
        let matched = star
            || stored_etag.is_some_and(|stored| {
                values
                    .iter()
                    .any(|v| etag_list(v.as_bytes()).iter().any(|t| t.strong_eq(&stored)))
            });
        if !matched {
            return Precondition::Failed;
        }
    } else if let Some(since) = req_headers.get(header::IF_UNMODIFIED_SINCE).and_then(parse_http_date) {
        // 13.1.4: ignored when the representation has no modification date.
        if last_modified.is_some_and(|lm| lm > since) {
            return Precondition::Failed;
        }
    }

    if req_headers.contains_key(header::IF_NONE_MATCH) {
        // 13.1.2: weak comparison.
        let values = req_headers.get_all(header::IF_NONE_MATCH);
        let star = values.iter().any(is_star);
        let matched = star
            || stored_etag.is_some_and(|stored| {
                values
                    .iter()
                    .any(|v| etag_list(v.as_bytes()).iter().any(|t| t.weak_eq(&stored)))
            });
        if matched {
            return if get_or_head {
                Precondition::NotModified
            } else {
                Precondition::Failed
            };
        }
    } else if get_or_head && let Some(since) = req_headers.get(header::IF_MODIFIED_SINCE).and_then(parse_http_date) {
        let modified = last_modified.unwrap_or_else(|| date_value(meta));
        if modified <= since {
            return Precondition::NotModified;
        }
    }
    Precondition::Proceed
}

/// The stored fields a 304 answered from the cache carries (RFC 9110
/// 15.4.5): `Cache-Control`, `Content-Location`, `Date`, `ETag`, `Expires`,
/// `Vary` and `Last-Modified`. The caller adds `Age` and its own fields.
pub fn not_modified_headers(stored: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in [
        header::CACHE_CONTROL,
        header::CONTENT_LOCATION,
        header::DATE,
        header::ETAG,
        header::EXPIRES,
        header::VARY,
        header::LAST_MODIFIED,
    ] {
        for value in stored.get_all(&name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

fn is_star(value: &HeaderValue) -> bool {
    value.as_bytes().trim_ascii() == b"*"
}

// ---------------------------------------------------------------------------
// Vary (RFC 9111 4.1).
// ---------------------------------------------------------------------------

/// The field names of a response's `Vary`, lower-cased, deduplicated and
/// sorted (so the same set always gives the same variant id); empty when the
/// response does not vary; `None` when `Vary` contains `*` (never matches,
/// never stored).
pub fn vary_fields(resp_headers: &HeaderMap) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for value in resp_headers.get_all(header::VARY) {
        for item in value.as_bytes().split(|&b| b == b',') {
            let item = item.trim_ascii();
            if item == b"*" {
                return None;
            }
            if !item.is_empty() {
                names.push(String::from_utf8_lossy(item).to_ascii_lowercase());
            }
        }
    }
    names.sort();
    names.dedup();
    Some(names)
}

/// The request's value of each varying field, exactly as
/// [`StoredMeta::variant`] stores it: `(name, None)` when the request lacks
/// the field, else its field lines, each trimmed, joined with `", "`.
pub fn variant_of(fields: &[String], req_headers: &HeaderMap) -> Vec<(String, Option<String>)> {
    fields
        .iter()
        .map(|name| (name.clone(), normalised_value(name, req_headers)))
        .collect()
}

/// A request's value of a varying field, as the origin got it: none for a
/// hop-by-hop field (one the client named in `Connection` never reaches
/// the origin, so the response it selects is the one for its absence;
/// read as sent, `X-Tenant: acme` with `Connection: X-Tenant` stored the
/// tenant-less answer for `acme`). Lines joined with ", ". A value that is
/// not UTF-8 is kept byte for byte (a NUL, which no field value holds,
/// then hex), so two such values never select one variant.
fn normalised_value(name: &str, headers: &HeaderMap) -> Option<String> {
    let mut lines = headers.get_all(name).iter().peekable();
    lines.peek()?;
    if crate::http1::head::is_hop_by_hop(name, headers) {
        return None;
    }
    let parts: Vec<String> = lines
        .map(|v| {
            let v = v.as_bytes().trim_ascii();
            match std::str::from_utf8(v) {
                Ok(s) => s.to_owned(),
                Err(_) => std::iter::once("\0".to_owned())
                    .chain(v.iter().map(|b| format!("{b:02x}")))
                    .collect(),
            }
        })
        .filter(|s| !s.is_empty())
        .collect();
    Some(parts.join(", "))
}

/// Whether a stored variant was selected by the same values of its varying
/// fields as this request has (RFC 9111 4.1). A response that does not vary
/// matches every request.
pub fn variant_matches(meta: &StoredMeta, req_headers: &HeaderMap) -> bool {
    meta.variant
        .iter()
        .all(|(name, value)| normalised_value(name, req_headers) == *value)
}

// ---------------------------------------------------------------------------
// Invalidation helpers (RFC 9111 4.4, RFC 3986 5.2).
// ---------------------------------------------------------------------------

/// `scheme://authority` of a normalised URL.
fn origin_of(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    &url[..end]
}

/// Resolves a URI reference against an absolute base URL (RFC 3986 5.2.2,
/// fragment dropped). `None` when the base is not absolute.
fn resolve_reference(base: &str, reference: &str) -> Option<String> {
    let reference = reference.trim();
    let reference = reference.split('#').next().unwrap_or("");
    if has_scheme(reference) {
        return Some(reference.to_string());
    }
    let (scheme, rest) = base.split_once("://")?;
    if let Some(network_path) = reference.strip_prefix("//") {
        return Some(format!("{scheme}://{network_path}"));
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(authority_end);
    let path_and_query = path_and_query.split('#').next().unwrap_or("");
    let (base_path, base_query) = path_and_query.split_at(path_and_query.find('?').unwrap_or(path_and_query.len()));
    let base_path = if base_path.is_empty() { "/" } else { base_path };
    let (ref_path, ref_query) = reference.split_at(reference.find('?').unwrap_or(reference.len()));
    let target = if reference.is_empty() {
        format!("{base_path}{base_query}")
    } else if ref_path.is_empty() {
        format!("{base_path}{ref_query}")
    } else if ref_path.starts_with('/') {
        format!("{}{ref_query}", remove_dot_segments(ref_path))
    } else {
        let dir = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
        format!("{}{ref_query}", remove_dot_segments(&format!("{dir}{ref_path}")))
    };
    let target = if target.starts_with('/') {
        target
    } else {
        format!("/{target}")
    };
    Some(format!("{scheme}://{authority}{target}"))
}

/// `scheme ":"` at the start (RFC 3986 3.1).
fn has_scheme(reference: &str) -> bool {
    match reference.find(':') {
        Some(colon) if colon > 0 => {
            let scheme = &reference.as_bytes()[..colon];
            scheme[0].is_ascii_alphabetic()
                && scheme
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        }
        _ => false,
    }
}

/// RFC 3986 5.2.4 for an absolute path.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate().skip(1) {
        match *segment {
            "." => {}
            ".." => {
                out.pop();
            }
            s => {
                out.push(s);
                continue;
            }
        }
        if i == last {
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}

// ---------------------------------------------------------------------------
// Field parsing shared with `range`.
// ---------------------------------------------------------------------------

/// An HTTP-date (any of the three formats) as seconds since the epoch.
pub(crate) fn parse_http_date(value: &HeaderValue) -> Option<u64> {
    let text = value.to_str().ok()?.trim();
    // A hit reads its stored Date several times (age, lifetime) and often
    // Last-Modified: the usual form is read by position here, and anything
    // the fast path does not fully vouch for goes to httpdate.
    imf_fixdate(text.as_bytes()).or_else(|| httpdate::parse_http_date(text).ok().map(secs))
}

/// The preferred HTTP-date form (RFC 9110 5.6.7, IMF-fixdate:
/// `Sun, 06 Nov 1994 08:49:37 GMT`) read by position, as seconds since
/// the epoch. None for anything else, including a date httpdate would
/// refuse (a weekday that does not match, February 30, a time past
/// 23:59:59, a year before 1970), which the caller then gives httpdate.
fn imf_fixdate(b: &[u8]) -> Option<u64> {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
    ];
    if b.len() != 29 || &b[3..5] != b", " || b[7] != b' ' || b[11] != b' ' || b[16] != b' ' {
        return None;
    }
    if b[19] != b':' || b[22] != b':' || &b[25..] != b" GMT" {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        b[r].iter()
            .try_fold(0u64, |n, d| d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0')))
    };
    let (day, year) = (num(5..7)?, num(12..16)?);
    let (hour, minute, second) = (num(17..19)?, num(20..22)?, num(23..25)?);
    let month = MONTHS.iter().position(|m| m[..] == b[8..11])? as u64 + 1;
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = days_since_epoch(year, month, day)?;
    if DAYS[(days % 7) as usize][..] != b[0..3] {
        return None;
    }
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

/// delta-seconds (RFC 9111 1.2.2): digits only; too large counts as 2^31.
fn parse_delta(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: u64 = 0;
    for &digit in text {
        n = n * 10 + u64::from(digit - b'0');
        if n >= DELTA_MAX {
            return Some(DELTA_MAX);
        }
    }
    Some(n)
}

/// An entity tag (RFC 9110 8.8.3), the opaque part without its quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ETag<'a> {
    /// `W/` prefix.
    pub weak: bool,
    /// Between the quotes (or the whole value for a non-conforming unquoted tag).
    pub tag: &'a [u8],
}

impl ETag<'_> {
    /// Strong comparison: both strong and equal (RFC 9110 8.8.3.2).
    pub fn strong_eq(&self, other: &ETag<'_>) -> bool {
        !self.weak && !other.weak && self.tag == other.tag
    }

    /// Weak comparison: equal opaque tags.
    pub fn weak_eq(&self, other: &ETag<'_>) -> bool {
        self.tag == other.tag
    }
}

/// Parses a comma-separated list of entity tags; commas inside quotes are
/// part of the tag. Unquoted items are accepted as opaque tags (lenient).
pub(crate) fn etag_list(s: &[u8]) -> Vec<ETag<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        while i < s.len() && (s[i] == b',' || s[i].is_ascii_whitespace()) {
            i += 1;
        }
        if i >= s.len() {
            break;
        }
        let weak = s[i..].starts_with(b"W/");
        if weak {
            i += 2;
        }
        if i < s.len() && s[i] == b'"' {
            let start = i + 1;
            let end = s[start..]
                .iter()
                .position(|&b| b == b'"')
                .map_or(s.len(), |p| start + p);
            out.push(ETag {
                weak,
                tag: &s[start..end],
            });
            i = end + 1;
            // Skip anything up to the next comma.
            while i < s.len() && s[i] != b',' {
                i += 1;
            }
        } else {
            let start = i;
            while i < s.len() && s[i] != b',' {
                i += 1;
            }
            out.push(ETag {
                weak,
                tag: s[start..i].trim_ascii(),
            });
        }
    }
    out
}

/// The stored response's entity tag (its first `ETag` field).
pub(crate) fn first_etag(headers: &HeaderMap) -> Option<ETag<'_>> {
    headers
        .get(header::ETAG)
        .and_then(|v| etag_list(v.as_bytes()).into_iter().next())
}

/// Whether `word` (lower-case ASCII) occurs in `text`, ignoring ASCII case.
fn mentions(text: &[u8], word: &[u8]) -> bool {
    text.windows(word.len()).any(|w| w.eq_ignore_ascii_case(word))
}

/// The directives of the targeted field `name` (RFC 9213): all its field
/// lines as one RFC 8941 Dictionary (2.1); `None` when absent, empty or
/// invalid (a parse failure ignores the whole field, which then does not
/// count). A member's value is kept as text: an Integer as its digits, a
/// String or Token as itself; a member without a value (`private`, Boolean
/// true) has none, one set to false (`?0`) is left out, and any other value
/// (Decimal, Byte Sequence, Inner List, ...) is kept as text no directive
/// accepts (`max-age=1.5` is an invalid `max-age`: stale). A directive
/// whose value is delta-seconds with any other type than an Integer
/// (`max-age="10000"`, a String) makes the field invalid as a whole: it is
/// ignored (RFC 9213 2.1, cache-tests `cdn-cc-invalid-sh-type-wrong`).
fn targeted_directives(headers: &HeaderMap, name: &HeaderName) -> Option<Directives<'static>> {
    const DELTAS: [&str; 4] = ["max-age", "s-maxage", "stale-while-revalidate", "stale-if-error"];
    let mut lines = headers.get_all(name).iter();
    let first = lines.next()?;
    let mut text = first.as_bytes().to_vec();
    for line in lines {
        text.extend_from_slice(b", ");
        text.extend_from_slice(line.as_bytes());
    }
    let dict = sfv::Parser::new(&text).parse::<sfv::Dictionary>().ok()?;
    if dict.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(dict.len());
    for (key, entry) in &dict {
        let integer = matches!(entry, sfv::ListEntry::Item(i) if matches!(i.bare_item, sfv::BareItem::Integer(_)));
        if DELTAS.contains(&key.as_str()) && !integer {
            return None;
        }
        let value = match entry {
            sfv::ListEntry::Item(item) => match &item.bare_item {
                sfv::BareItem::Boolean(true) => None,
                sfv::BareItem::Boolean(false) => continue,
                sfv::BareItem::Integer(n) => Some(Cow::Owned(n.to_string())),
                sfv::BareItem::String(v) => Some(Cow::Owned(v.as_str().to_string())),
                sfv::BareItem::Token(v) => Some(Cow::Owned(v.as_str().to_string())),
                _ => Some(Cow::Borrowed("?")),
            },
            sfv::ListEntry::InnerList(_) => Some(Cow::Borrowed("?")),
        };
        out.push((Cow::Owned(key.as_str().to_string()), value));
    }
    Some(Directives(out, true))
}

/// Cache-Control directives of all field lines, in order: lower-cased names
/// and unquoted values, borrowed from the field values where they are
/// already so (the usual `max-age=600`: no allocation but the list's).
/// The second field: the directives come from a targeted field (RFC 9213),
/// so `Expires` is ignored with `Cache-Control`.
struct Directives<'a>(Vec<Directive<'a>>, bool);

/// A directive's name and value (see [`Directives`]).
type Directive<'a> = (Cow<'a, str>, Option<Cow<'a, str>>);

impl<'a> Directives<'a> {
    fn of(headers: &'a HeaderMap) -> Directives<'a> {
        let mut out = Vec::new();
        for value in headers.get_all(header::CACHE_CONTROL) {
            parse_directives(value.as_bytes(), &mut out);
        }
        Directives(out, false)
    }

    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }

    /// The first occurrence: `Some(None)` present without a value.
    fn value(&self, name: &str) -> Option<Option<&str>> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_deref())
    }

    /// Whether `name` occurs unqualified: without a value, or with one that
    /// is no list of field names (`private =x`, `no-cache=""`), which counts
    /// as the unqualified, stricter form.
    fn unqualified(&self, name: &str) -> bool {
        self.0
            .iter()
            .any(|(n, v)| n == name && v.as_deref().and_then(field_names).is_none())
    }

    /// The field names of the qualified occurrences of `name`
    /// (`no-cache="Set-Cookie, X-User"`, `private=x-user`), lower-cased.
    fn qualified_fields(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, v)| v.as_deref().and_then(field_names))
            .flatten()
            .collect()
    }

    /// The first occurrence as delta-seconds: `Some(None)` when present but
    /// missing or invalid.
    fn delta(&self, name: &str) -> Option<Option<u64>> {
        self.value(name).map(|v| v.and_then(|v| parse_delta(v.as_bytes())))
    }

    /// A response freshness directive (`max-age`, `s-maxage`) in seconds,
    /// each occurrence read by [`lenient_delta`]: of several (on one line or
    /// several) the smallest counts, the most restrictive (RFC 9111 4.2.1
    /// allows the first or "stale"; the smallest never extends what any of
    /// them grants). `None` when absent.
    fn freshness_delta(&self, name: &str) -> Option<u64> {
        self.0
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| lenient_delta(v.as_deref()))
            .min()
    }
}

/// A directive's value as a non-empty list of field names (RFC 9110 5.1
/// tokens), lower-cased; `None` for anything else, including a value with
/// leading whitespace (the parser keeps it for `name= value`).
fn field_names(value: &str) -> Option<Vec<String>> {
    if value.starts_with([' ', '\t']) {
        return None;
    }
    let names: Vec<String> = value.split(',').map(|n| n.trim().to_ascii_lowercase()).collect();
    let token = |n: &String| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    names.iter().all(token).then_some(names)
}

/// Parses one Cache-Control field line: `name[=token|"quoted"]` items
/// separated by commas, whitespace tolerated around names and values.
fn parse_directives<'a>(s: &'a [u8], out: &mut Vec<Directive<'a>>) {
    let mut i = 0;
    while i < s.len() {
        while i < s.len() && (s[i] == b',' || s[i].is_ascii_whitespace()) {
            i += 1;
        }
        let start = i;
        while i < s.len() && s[i] != b'=' && s[i] != b',' {
            i += 1;
        }
        let name = String::from_utf8_lossy(s[start..i].trim_ascii());
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(name.to_ascii_lowercase())
        } else {
            name
        };
        let mut value = None;
        if i < s.len() && s[i] == b'=' {
            // RFC 9111 5.2 allows no whitespace around "=": an unquoted value
            // keeps one leading space then, so it is no valid delta-seconds
            // (`max-age =3600` and `max-age= 3600` count as invalid, i.e.
            // stale, as the cache-tests suite expects), while the name still
            // matches (`private =x` still prevents storing).
            let spaced = s[start..i].last().is_some_and(u8::is_ascii_whitespace)
                || s.get(i + 1).is_some_and(u8::is_ascii_whitespace);
            i += 1;
            while i < s.len() && (s[i] == b' ' || s[i] == b'\t') {
                i += 1;
            }
            if i < s.len() && s[i] == b'"' {
                i += 1;
                let mut v = Vec::new();
                while i < s.len() && s[i] != b'"' {
                    if s[i] == b'\\' && i + 1 < s.len() {
                        i += 1;
                    }
                    v.push(s[i]);
                    i += 1;
                }
                value = Some(Cow::Owned(String::from_utf8_lossy(&v).into_owned()));
                while i < s.len() && s[i] != b',' {
                    i += 1;
                }
            } else {
                let vstart = i;
                while i < s.len() && s[i] != b',' {
                    i += 1;
                }
                let text = String::from_utf8_lossy(s[vstart..i].trim_ascii());
                value = Some(if spaced { Cow::Owned(format!(" {text}")) } else { text });
            }
        }
        if !name.is_empty() {
            out.push((name, value));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_imf_fixdate_read_by_position_is_what_httpdate_reads() {
        // Every 768,143rd second from 1970 to 2100, and the edges.
        let mut t: u64 = 0;
        let mut checked = 0;
        while t < 4_102_444_800 {
            let text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(t));
            assert_eq!(imf_fixdate(text.as_bytes()), Some(t), "{text}");
            t += 768_143;
            checked += 1;
        }
        assert!(checked > 5_000);
        for (text, want) in [
            ("Thu, 01 Jan 1970 00:00:00 GMT", Some(0)),
            ("Sun, 06 Nov 1994 08:49:37 GMT", Some(784_111_777)),
            ("Thu, 29 Feb 2024 23:59:59 GMT", Some(1_709_251_199)),
            ("Fri, 31 Dec 9999 23:59:59 GMT", Some(253_402_300_799)),
        ] {
            assert_eq!(imf_fixdate(text.as_bytes()), want, "{text}");
        }
    }

    #[test]
    fn a_date_the_fast_path_does_not_vouch_for_is_left_to_httpdate() {
        let good = "Sun, 06 Nov 1994 08:49:37 GMT";
        // Each byte changed to each of a few others: wherever the fast path
        // answers, httpdate agrees, and parse_http_date always equals httpdate.
        let mut answered = 0;
        for i in 0..good.len() {
            for c in [b'0', b'9', b'x', b' ', b'S', b'a', b':', b',', b'7'] {
                let mut b = good.as_bytes().to_vec();
                b[i] = c;
                let text = String::from_utf8(b).unwrap();
                let reference = httpdate::parse_http_date(text.trim()).ok().map(secs);
                if let Some(fast) = imf_fixdate(text.as_bytes()) {
                    assert_eq!(Some(fast), reference, "{text}");
                    answered += 1;
                }
                let value = HeaderValue::from_str(&text).unwrap();
                assert_eq!(parse_http_date(&value), reference, "{text}");
            }
        }
        assert!(answered > 0);
        for text in [
            "Mon, 06 Nov 1994 08:49:37 GMT", // the weekday does not match
            "Wed, 30 Feb 2000 00:00:00 GMT",
            "Fri, 29 Feb 2019 00:00:00 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 06 Nov 1994 08:49:60 GMT",
            "Wed, 31 Dec 1969 23:59:59 GMT",
            "sun, 06 nov 1994 08:49:37 gmt",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT ",
            "Sun, 0\u{e9} Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(imf_fixdate(text.as_bytes()), None, "{text:?}");
            let reference = httpdate::parse_http_date(text.trim()).ok().map(secs);
            if let Ok(value) = HeaderValue::from_str(text) {
                assert_eq!(parse_http_date(&value), reference, "{text}");
            }
        }
    }

    use super::*;
    use crate::config::{Dur, RefreshPattern};

    /// A fixed "epoch" for the tests, on a whole second.
    const T0: u64 = 1_700_000_000;

    fn t(s: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(T0.checked_add_signed(s).unwrap())
    }

    fn http_date(s: i64) -> String {
        httpdate::fmt_http_date(t(s))
    }

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    /// A 200 for http://example.com/a fetched at t(0) (request sent and
    /// response received in the same second).
    fn meta(headers: &[(&str, &str)]) -> StoredMeta {
        meta_with(StatusCode::OK, headers)
    }

    fn meta_with(status: StatusCode, headers: &[(&str, &str)]) -> StoredMeta {
        StoredMeta {
            key: "http://example.com/a".into(),
            variant: Vec::new(),
            status,
            headers: hm(headers),
            request_time: t(0),
            response_time: t(0),
            origin: None,
            derived: Default::default(),
        }
    }

    /// The defaults, but no `max_stale_on_error`: most tests compare whole
    /// decisions, and the window it adds to every revalidation has tests of
    /// its own (`a_disconnected_cache_*`).
    fn policy() -> Policy {
        policy_with(|c| c.max_stale_on_error = Dur::secs(0))
    }

    fn policy_with(f: impl FnOnce(&mut CacheConfig)) -> Policy {
        let mut cfg = CacheConfig::default();
        f(&mut cfg);
        Policy::new(&cfg).unwrap()
    }

    fn pattern(re: &str, min: u64, percent: u32, max: u64) -> RefreshPattern {
        RefreshPattern {
            pattern: re.into(),
            min: Dur::secs(min),
            percent,
            max: Dur::secs(max),
        }
    }

    fn key() -> CacheKey {
        CacheKey::new("http", "example.com", "/a", false)
    }

    fn store(p: &Policy, req: &[(&str, &str)], status: u16, resp: &[(&str, &str)]) -> Result<(), NotStorable> {
        p.storable(
            &Method::GET,
            &key(),
            &hm(req),
            StatusCode::from_u16(status).unwrap(),
            &hm(resp),
        )
    }

    fn lifetime(p: &Policy, m: &StoredMeta) -> u64 {
        p.freshness_lifetime(m).as_secs()
    }

    fn revalidate(reason: RevalidateReason) -> Decision {
        Decision::Revalidate {
            reason,
            stale_if_error_until: None,
        }
    }

    // ----- Policy::new

    #[test]
    fn policy_new_rejects_bad_patterns_and_inverted_limits() {
        let bad = Policy::new(&CacheConfig {
            refresh: vec![pattern("(", 0, 10, 10)],
            ..CacheConfig::default()
        });
        assert!(bad.unwrap_err().contains("cache.refresh[0].pattern"));
        let inverted = Policy::new(&CacheConfig {
            refresh: vec![pattern(".", 20, 10, 10)],
            ..CacheConfig::default()
        });
        assert!(inverted.unwrap_err().contains("min"));
        let ttl = Policy::new(&CacheConfig {
            min_ttl: Dur::secs(60),
            max_ttl: Dur::secs(10),
            ..CacheConfig::default()
        });
        assert!(ttl.unwrap_err().contains("min_ttl"));
        // max_ttl 0 means no limit, so any min_ttl is fine.
        assert!(
            Policy::new(&CacheConfig {
                min_ttl: Dur::secs(60),
                ..CacheConfig::default()
            })
            .is_ok()
        );
    }

    // ----- Storability (RFC 9111 3)

    #[test]
    fn stores_get_responses_with_freshness_or_validator() {
        let p = policy();
        assert_eq!(store(&p, &[], 200, &[("cache-control", "max-age=60")]), Ok(()));
        assert_eq!(store(&p, &[], 200, &[("etag", "\"x\"")]), Ok(()));
        assert_eq!(store(&p, &[], 200, &[("last-modified", &http_date(-100))]), Ok(()));
        assert_eq!(store(&p, &[], 404, &[("expires", &http_date(60))]), Ok(()));
        assert_eq!(store(&p, &[], 200, &[("cache-control", "max-age=0")]), Ok(()));
    }

    #[test]
    fn only_get_is_stored() {
        let p = policy();
        for method in [Method::HEAD, Method::POST, Method::PUT, Method::OPTIONS] {
            let r = p.storable(
                &method,
                &key(),
                &HeaderMap::new(),
                StatusCode::OK,
                &hm(&[("cache-control", "max-age=60")]),
            );
            assert_eq!(r, Err(NotStorable("request method is not GET")), "{method}");
        }
    }

    #[test]
    fn interim_partial_and_not_modified_are_not_stored() {
        let p = policy();
        let fresh = [("cache-control", "max-age=60")];
        assert!(store(&p, &[], 100, &fresh).is_err());
        assert_eq!(store(&p, &[], 206, &fresh), Err(NotStorable("partial content")));
        assert!(store(&p, &[], 304, &fresh).is_err());
    }

    #[test]
    fn a_412_or_416_caused_by_the_requests_own_preconditions_or_range_is_not_stored() {
        let p = policy();
        let fresh = [("cache-control", "public, max-age=300")];
        for cond in [
            ("if-match", "\"nope\""),
            ("if-unmodified-since", &http_date(-86400)[..]),
        ] {
            assert_eq!(
                store(&p, &[cond], 412, &fresh),
                Err(NotStorable("412 answers the request's preconditions")),
                "{cond:?}"
            );
        }
        assert_eq!(
            store(&p, &[("range", "bytes=9999-")], 416, &fresh),
            Err(NotStorable("416 answers the request's Range"))
        );
        // Not caused by the request: the origin's answer for the URL.
        assert_eq!(store(&p, &[], 412, &fresh), Ok(()));
        assert_eq!(store(&p, &[], 416, &fresh), Ok(()));
        // And the full response to a request with Range is the URL's.
        assert_eq!(store(&p, &[("range", "bytes=0-1")], 200, &fresh), Ok(()));
    }

    #[test]
    fn no_store_in_request_or_response_prevents_storing() {
        let p = policy();
        let fresh = [("cache-control", "max-age=60")];
        assert_eq!(
            store(&p, &[("cache-control", "no-store")], 200, &fresh),
            Err(NotStorable("request Cache-Control: no-store"))
        );
        assert_eq!(
            store(&p, &[], 200, &[("cache-control", "max-age=60, no-store")]),
            Err(NotStorable("response Cache-Control: no-store"))
        );
    }

    #[test]
    fn private_without_field_names_prevents_storing() {
        let p = policy();
        for cc in [
            "private",
            "max-age=60, private",
            "PRIVATE",
            "private =x, max-age=60",
            "private=\"\", max-age=60",
            "private=\"x-user, \", max-age=60",
            "private=x-user, private, max-age=60",
        ] {
            assert_eq!(
                store(&p, &[], 200, &[("cache-control", cc)]),
                Err(NotStorable("response Cache-Control: private")),
                "{cc}"
            );
        }
    }

    #[test]
    fn ignore_no_store_override_stores_no_store_and_private() {
        let p = policy_with(|c| c.ignore_no_store = true);
        assert_eq!(
            store(
                &p,
                &[("cache-control", "no-store")],
                200,
                &[("cache-control", "max-age=60")]
            ),
            Ok(())
        );
        assert_eq!(
            store(&p, &[], 200, &[("cache-control", "no-store, max-age=60")]),
            Ok(())
        );
        assert_eq!(store(&p, &[], 200, &[("cache-control", "private, max-age=60")]), Ok(()));
    }

    // ----- Set-Cookie (cache.set_cookie; RFC 9111 allows storing it)

    #[test]
    fn a_response_with_set_cookie_is_not_stored_unless_the_operator_says_so() {
        let cookie = [("cache-control", "max-age=60"), ("set-cookie", "id=1")];
        let refused = Err(NotStorable("response has Set-Cookie (cache.set_cookie = \"no-store\")"));
        assert_eq!(store(&policy(), &[], 200, &cookie), refused);
        // The obsolete Set-Cookie2 (RFC 2965) is a cookie too.
        assert_eq!(
            store(
                &policy(),
                &[],
                200,
                &[("cache-control", "max-age=60"), ("set-cookie2", "id=1")]
            ),
            refused
        );
        // ignore_no_store is about Cache-Control, not cookies.
        assert_eq!(
            store(&policy_with(|c| c.ignore_no_store = true), &[], 200, &cookie),
            refused
        );
        for mode in [SetCookie::Strip, SetCookie::Store] {
            assert_eq!(store(&policy_with(|c| c.set_cookie = mode), &[], 200, &cookie), Ok(()));
        }
        // No cookie, nothing to refuse.
        assert_eq!(store(&policy(), &[], 200, &[("cache-control", "max-age=60")]), Ok(()));
    }

    #[test]
    fn set_cookie_reaches_only_the_client_the_response_was_fetched_for() {
        let fetched = hm(&[
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("set-cookie2", "c=3"),
            ("etag", "\"x\""),
        ]);
        for mode in [SetCookie::NoStore, SetCookie::Strip] {
            let p = policy_with(|c| c.set_cookie = mode);
            let mut shared = fetched.clone();
            assert!(p.has_unshared(&shared));
            let own = p.take_unshared(&mut shared);
            assert_eq!(shared, hm(&[("etag", "\"x\"")]), "{mode:?}");
            assert_eq!(own.get_all("set-cookie").iter().count(), 2);
            assert_eq!(own.get("set-cookie2").unwrap(), "c=3");
            assert!(!p.has_unshared(&shared));
        }
    }

    #[test]
    fn set_cookie_store_replays_it_as_rfc_9111_allows() {
        let p = policy_with(|c| c.set_cookie = SetCookie::Store);
        let mut shared = hm(&[("set-cookie", "a=1")]);
        assert!(!p.has_unshared(&shared));
        assert!(p.take_unshared(&mut shared).is_empty());
        assert_eq!(shared, hm(&[("set-cookie", "a=1")]));
    }

    #[test]
    fn authorization_needs_public_s_maxage_or_must_revalidate() {
        let p = policy();
        let auth = [("authorization", "Basic YTpi")];
        assert_eq!(
            store(&p, &auth, 200, &[("cache-control", "max-age=60")]),
            Err(NotStorable("request has Authorization"))
        );
        for cc in [
            "public, max-age=60",
            "s-maxage=60",
            "max-age=60, must-revalidate",
            "Public, max-age=60",
        ] {
            assert_eq!(store(&p, &auth, 200, &[("cache-control", cc)]), Ok(()), "{cc}");
        }
    }

    #[test]
    fn status_must_be_cacheable_by_default_or_explicitly_fresh_or_public() {
        let p = policy();
        for status in [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501] {
            assert_eq!(store(&p, &[], status, &[("etag", "\"v\"")]), Ok(()), "{status}");
        }
        for status in [201, 302, 307, 400, 403, 500, 503] {
            assert_eq!(
                store(&p, &[], status, &[("etag", "\"v\"")]),
                Err(NotStorable("status not cacheable by default and no explicit freshness")),
                "{status}"
            );
        }
        assert_eq!(store(&p, &[], 302, &[("cache-control", "max-age=60")]), Ok(()));
        assert_eq!(store(&p, &[], 500, &[("cache-control", "s-maxage=60")]), Ok(()));
        assert_eq!(store(&p, &[], 307, &[("expires", &http_date(60))]), Ok(()));
        assert_eq!(
            store(&p, &[], 302, &[("cache-control", "public"), ("etag", "\"v\"")]),
            Ok(())
        );
    }

    #[test]
    fn vary_star_is_not_stored() {
        let p = policy();
        let r = store(
            &p,
            &[],
            200,
            &[("cache-control", "max-age=60"), ("vary", "accept-encoding, *")],
        );
        assert_eq!(r, Err(NotStorable("Vary: *")));
        let r = store(
            &p,
            &[],
            200,
            &[("cache-control", "max-age=60"), ("vary", "accept-encoding")],
        );
        assert_eq!(r, Ok(()));
    }

    #[test]
    fn query_strings_follow_cache_query() {
        let with_query = CacheKey::new("http", "example.com", "/a?b=1", false);
        let fresh = hm(&[("cache-control", "max-age=60")]);
        let check = |p: &Policy| p.storable(&Method::GET, &with_query, &HeaderMap::new(), StatusCode::OK, &fresh);
        assert_eq!(check(&policy()), Ok(()));
        let p = policy_with(|c| c.cache_query = false);
        assert!(check(&p).unwrap_err().0.contains("query"));
        assert_eq!(store(&p, &[], 200, &[("cache-control", "max-age=60")]), Ok(()));
    }

    #[test]
    fn no_freshness_and_no_validator_needs_a_refresh_lifetime() {
        // Nothing configured: no heuristic freshness, nothing to revalidate with.
        let why = Err(NotStorable("no freshness information and no validator"));
        assert_eq!(store(&policy(), &[], 200, &[("content-type", "text/plain")]), why);
        // A matching pattern with a min gives a lifetime.
        let p = policy_with(|c| c.refresh = vec![pattern(r"^http://example\.com/", 60, 20, 3600)]);
        assert_eq!(store(&p, &[], 200, &[]), Ok(()));
        // A pattern with min 0 does not; nor does one that does not match.
        let p = policy_with(|c| c.refresh = vec![pattern(".", 0, 20, 3600)]);
        assert_eq!(store(&p, &[], 200, &[]), why);
        let p = policy_with(|c| c.refresh = vec![pattern("other", 60, 20, 3600)]);
        assert_eq!(store(&p, &[], 200, &[]), why);
        // The min_ttl override also gives one.
        let p = policy_with(|c| c.min_ttl = Dur::secs(30));
        assert_eq!(store(&p, &[], 200, &[]), Ok(()));
    }

    #[test]
    fn directives_are_case_insensitive_and_span_field_lines() {
        let p = policy();
        assert!(
            store(
                &p,
                &[],
                200,
                &[("cache-control", "Max-Age=60"), ("cache-control", "No-Store")]
            )
            .is_err()
        );
        assert!(
            store(
                &p,
                &[("cache-control", "max-age=0"), ("cache-control", "NO-STORE")],
                200,
                &[]
            )
            .is_err()
        );
    }

    // ----- Freshness lifetime (RFC 9111 4.2.1, 4.2.2)

    #[test]
    fn s_maxage_beats_max_age_beats_expires() {
        let p = policy();
        let expires = http_date(1000);
        let date = http_date(0);
        let m = meta(&[
            ("date", &date),
            ("expires", &expires),
            ("cache-control", "max-age=100, s-maxage=10"),
        ]);
        assert_eq!(lifetime(&p, &m), 10);
        let m = meta(&[("date", &date), ("expires", &expires), ("cache-control", "max-age=100")]);
        assert_eq!(lifetime(&p, &m), 100);
        let m = meta(&[("date", &date), ("expires", &expires)]);
        assert_eq!(lifetime(&p, &m), 1000);
    }

    #[test]
    fn expires_is_relative_to_date_or_response_time() {
        let p = policy();
        // Date is 10 s behind our clock: the lifetime is Expires - Date.
        let m = meta(&[("date", &http_date(-10)), ("expires", &http_date(50))]);
        assert_eq!(lifetime(&p, &m), 60);
        // No Date: response_time stands in for it.
        let m = meta(&[("expires", &http_date(50))]);
        assert_eq!(lifetime(&p, &m), 50);
    }

    #[test]
    fn expires_in_the_past_or_invalid_is_already_expired() {
        let p = policy();
        let m = meta(&[("date", &http_date(0)), ("expires", &http_date(-60))]);
        assert_eq!(lifetime(&p, &m), 0);
        for bad in ["0", "-1", "yesterday", ""] {
            let m = meta(&[("date", &http_date(0)), ("expires", bad)]);
            assert_eq!(lifetime(&p, &m), 0, "{bad:?}");
        }
        // Obsolete date formats are valid (RFC 9110 5.6.7).
        let m = meta(&[
            ("date", "Sunday, 06-Nov-94 08:49:37 GMT"),
            ("expires", "Sun Nov  6 08:50:37 1994"),
        ]);
        assert_eq!(lifetime(&p, &m), 60);
    }

    #[test]
    fn max_age_zero_and_invalid_max_age_are_stale() {
        let p = policy();
        assert_eq!(lifetime(&p, &meta(&[("cache-control", "max-age=0")])), 0);
        for cc in [
            "max-age=abc",
            "max-age=",
            "max-age",
            "max-age=-1",
            "max-age=a3600",
            "max-age =3600",
            "max-age= 3600",
            "s-maxage=x, max-age=60",
        ] {
            let m = meta(&[("cache-control", cc), ("expires", &http_date(3600))]);
            assert_eq!(lifetime(&p, &m), 0, "{cc}");
        }
    }

    #[test]
    fn quoted_duplicated_and_huge_delta_seconds() {
        let p = policy();
        assert_eq!(lifetime(&p, &meta(&[("cache-control", "max-age=\"3600\"")])), 3600);
        // The smallest occurrence counts, across field lines too.
        assert_eq!(lifetime(&p, &meta(&[("cache-control", "max-age=10, max-age=20")])), 10);
        let m = meta(&[
            ("cache-control", "public"),
            ("cache-control", "max-age=9"),
            ("cache-control", "max-age=5"),
        ]);
        assert_eq!(lifetime(&p, &m), 5);
        // Overflowing values count as 2^31 (RFC 9111 1.2.2).
        let m = meta(&[("cache-control", "max-age=99999999999999999999999999")]);
        assert_eq!(lifetime(&p, &m), 1 << 31);
        // A quoted value may contain commas without splitting the list.
        let m = meta(&[("cache-control", "no-cache=\"a, max-age=1\", max-age=7")]);
        assert_eq!(lifetime(&p, &m), 7);
    }

    #[test]
    fn max_age_is_read_by_its_leading_digits_as_squid_ats_httpd_and_nginx_read_it() {
        let p = policy();
        for (cc, want) in [
            ("max-age=3600.0", 3600),
            ("max-age=3600.5", 3600),
            ("max-age=3600a", 3600),
            ("max-age=003600", 3600),
            ("s-maxage=60.9, max-age=5", 60),
        ] {
            assert_eq!(lifetime(&p, &meta(&[("cache-control", cc)])), want, "{cc}");
        }
    }

    #[test]
    fn of_several_max_age_or_s_maxage_values_the_most_restrictive_counts() {
        let p = policy();
        for lines in [
            &[("cache-control", "max-age=1800, max-age=1")][..],
            &[("cache-control", "max-age=1, max-age=1800")],
            &[("cache-control", "max-age=1800"), ("cache-control", "max-age=1")],
            &[("cache-control", "max-age=1"), ("cache-control", "max-age=1800")],
            &[("cache-control", "s-maxage=1800, max-age=9000, s-maxage=1")],
            &[("cache-control", "s-maxage=1"), ("cache-control", "s-maxage=1800")],
        ] {
            assert_eq!(lifetime(&p, &meta(lines)), 1, "{lines:?}");
        }
        // An invalid occurrence is 0: stale.
        assert_eq!(lifetime(&p, &meta(&[("cache-control", "max-age=60, max-age=junk")])), 0);
    }

    #[test]
    fn expires_with_a_wrong_weekday_or_odd_case_names_is_still_a_date() {
        let p = policy();
        let date = http_date(0);
        // http_date(0) is 2023-11-14T22:13:20Z, a Tuesday.
        for expires in [
            "Mon, 14 Nov 2023 23:13:20 GMT",
            "tue, 14 nov 2023 23:13:20 gmt",
            "TUE, 14 NOV 2023 23:13:20 GMT",
            "Friday, 14-Nov-23 23:13:20 GMT",
            "sun NOV 14 23:13:20 2023",
        ] {
            let m = meta(&[("date", &date), ("expires", expires)]);
            assert_eq!(lifetime(&p, &m), 3600, "{expires}");
        }
        // An invalid Expires still means already expired (RFC 9111 5.3).
        for expires in [
            "Tue, 31 Nov 2023 23:13:20 GMT",
            "Tue, 14 Nov 2023 23:13:20 CET",
            "Tue, 14 Nov 2023 24:13:20 GMT",
            "Tue, 14 Foo 2023 23:13:20 GMT",
            "14 Nov 2023 23:13:20 GMT",
            "Tue, 14 Nov 2023 23:13 GMT",
            "Tue, 14 Nov 1969 23:13:20 GMT",
            "Tue, +4 Nov 2023 23:13:20 GMT",
            "0",
            "",
            // Not laid out as any of the three formats (cache-tests
            // freshness-expires-invalid-*): a two-digit year in the
            // preferred form, no comma, doubled spaces, dashes with a
            // four-digit year, a one-digit hour, dots in the time, UTC.
            "Tue, 14 Nov 23 23:13:20 GMT",
            "Tue 14 Nov 2023 23:13:20 GMT",
            "Tue, 14  Nov  2023 23:13:20 GMT",
            "Tue, 14-Nov-2023 23:13:20 GMT",
            "Tue, 14 Nov 2023 3:13:20 GMT",
            "Tue, 14 Nov 2023 23.13.20 GMT",
            "Tue, 14 Nov 2023 23:13:20 UTC",
            "Tue, 14 Nov 2023 23:13:20 AEST",
            "Tue, 14-Nov-23 23:13:20 GMT",
            "Sun Nov 14 23:13:20 23",
        ] {
            let m = meta(&[("date", &date), ("expires", expires)]);
            assert_eq!(lifetime(&p, &m), 0, "{expires:?}");
        }
    }

    #[test]
    fn expires_on_two_field_lines_is_invalid_so_already_expired() {
        // RFC 9111 5.3: Expires is one HTTP-date (cache-tests
        // freshness-expires-invalid-multiple-lines).
        let p = policy();
        let one = http_date(3600);
        let m = meta(&[("date", &http_date(0)), ("expires", &one), ("expires", &one)]);
        assert_eq!(lifetime(&p, &m), 0);
    }

    #[test]
    fn heuristic_freshness_uses_the_first_matching_refresh_pattern() {
        let p = policy_with(|c| {
            c.refresh = vec![
                pattern(r"\.gif$", 0, 50, 100_000),
                pattern(r"^http://example\.com/", 60, 10, 3600),
                pattern(".", 0, 100, 1_000_000),
            ]
        });
        let lm_1000 = http_date(-1000);
        let date = http_date(0);
        // 10% of 1000 s.
        let m = meta(&[("date", &date), ("last-modified", &lm_1000)]);
        assert_eq!(lifetime(&p, &m), 100);
        // Clamped to min and max.
        let m = meta(&[("date", &date), ("last-modified", &http_date(-100))]);
        assert_eq!(lifetime(&p, &m), 60);
        let m = meta(&[("date", &date), ("last-modified", &http_date(-1_000_000))]);
        assert_eq!(lifetime(&p, &m), 3600);
        // The first pattern wins for .gif.
        let mut gif = meta(&[("date", &date), ("last-modified", &lm_1000)]);
        gif.key = "http://example.com/x.gif".into();
        assert_eq!(lifetime(&p, &gif), 500);
        // Patterns match the URL, not the upstream group the key names.
        gif.key = "http://example.com/x.gif upstream=images".into();
        assert_eq!(lifetime(&p, &gif), 500);
        // Without Last-Modified: the pattern's min (Squid's rule).
        assert_eq!(lifetime(&p, &meta(&[("date", &date)])), 60);
        // Date missing: response_time.
        let m = meta(&[("last-modified", &lm_1000)]);
        assert_eq!(lifetime(&p, &m), 100);
        // Last-Modified after Date: zero age, so min.
        let m = meta(&[("date", &date), ("last-modified", &http_date(50))]);
        assert_eq!(lifetime(&p, &m), 60);
        // Explicit freshness wins over the heuristic.
        let m = meta(&[
            ("date", &date),
            ("last-modified", &lm_1000),
            ("cache-control", "max-age=5"),
        ]);
        assert_eq!(lifetime(&p, &m), 5);
    }

    #[test]
    fn heuristic_needs_a_cacheable_status_or_public() {
        let lm = http_date(-1000);
        let date = http_date(0);
        let p = policy_with(|c| c.refresh = vec![pattern(".", 0, 20, 3600)]);
        assert_eq!(
            lifetime(
                &p,
                &meta_with(StatusCode::NOT_FOUND, &[("date", &date), ("last-modified", &lm)])
            ),
            200
        );
        assert_eq!(
            lifetime(
                &p,
                &meta_with(StatusCode::FOUND, &[("date", &date), ("last-modified", &lm)])
            ),
            0
        );
        let public = meta_with(
            StatusCode::FOUND,
            &[("date", &date), ("last-modified", &lm), ("cache-control", "public")],
        );
        assert_eq!(lifetime(&p, &public), 200);
    }

    #[test]
    fn without_a_matching_pattern_a_cache_uses_ten_percent_of_the_time_since_last_modified() {
        // RFC 9111 4.2.2: "a typical setting of this fraction might be 10%".
        let date = http_date(0);
        let m = |since: i64| meta(&[("date", &date), ("last-modified", &http_date(-since))]);
        assert_eq!(lifetime(&policy(), &m(1000)), 100);
        let p = policy_with(|c| c.refresh = vec![pattern("nomatch", 0, 50, 3600)]);
        assert_eq!(lifetime(&p, &m(1000)), 100);
        // Capped by heuristic_max (a day by default).
        assert_eq!(lifetime(&policy(), &m(100 * 86_400)), 86_400);
        let p = policy_with(|c| c.heuristic_max = Dur::secs(60));
        assert_eq!(lifetime(&p, &m(1000)), 60);
        // No Last-Modified, no heuristic; 0 percent turns it off.
        assert_eq!(lifetime(&policy(), &meta(&[("date", &date)])), 0);
        let p = policy_with(|c| c.heuristic_percent = 0);
        assert_eq!(lifetime(&p, &m(1000)), 0);
        // A matching pattern overrides it.
        let p = policy_with(|c| c.refresh = vec![pattern(".", 0, 50, 3600)]);
        assert_eq!(lifetime(&p, &m(1000)), 500);
    }

    #[test]
    fn min_and_max_ttl_overrides_clamp_the_lifetime() {
        let p = policy_with(|c| {
            c.min_ttl = Dur::secs(30);
            c.max_ttl = Dur::secs(600);
        });
        assert_eq!(lifetime(&p, &meta(&[("cache-control", "max-age=0")])), 30);
        assert_eq!(lifetime(&p, &meta(&[("cache-control", "max-age=100")])), 100);
        assert_eq!(lifetime(&p, &meta(&[("cache-control", "max-age=86400")])), 600);
        assert_eq!(lifetime(&p, &meta(&[])), 30);
    }

    // ----- Age (RFC 9111 4.2.3)

    #[test]
    fn age_calculation_follows_4_2_3() {
        // Request sent at -5, response received at 0 with Date -3 and Age 10.
        let mut m = meta(&[("date", &http_date(-3)), ("age", "10")]);
        m.request_time = t(-5);
        assert_eq!(apparent_age(&m).as_secs(), 3);
        assert_eq!(response_delay(&m).as_secs(), 5);
        assert_eq!(corrected_age_value(&m).as_secs(), 15);
        assert_eq!(corrected_initial_age(&m).as_secs(), 15);
        assert_eq!(resident_time(&m, t(100)).as_secs(), 100);
        assert_eq!(current_age(&m, t(100)).as_secs(), 115);
        assert_eq!(age_header(&m, t(100)), "115");
        // A Date far behind dominates a small Age.
        let m = meta(&[("date", &http_date(-60)), ("age", "1")]);
        assert_eq!(corrected_initial_age(&m).as_secs(), 60);
    }

    #[test]
    fn age_with_missing_or_odd_fields() {
        // No Date, no Age: age is the resident time.
        let m = meta(&[]);
        assert_eq!(current_age(&m, t(42)).as_secs(), 42);
        // Date in the future (clock skew): apparent age 0.
        let m = meta(&[("date", &http_date(30))]);
        assert_eq!(apparent_age(&m).as_secs(), 0);
        // Invalid Age is ignored; now before response_time gives 0.
        let m = meta(&[("age", "soon")]);
        assert_eq!(current_age(&m, t(-10)).as_secs(), 0);
        // The Age header is capped at 2^31.
        let m = meta(&[("age", "99999999999999")]);
        assert_eq!(age_header(&m, t(1_000_000)), "2147483648");
    }

    #[test]
    fn what_a_policy_concludes_from_stored_fields_is_kept_for_that_policy_alone() {
        // max-age=60: stale a minute on under the defaults, fresh under a
        // `cache.min_ttl` of an hour.
        let mut m = meta(&[("cache-control", "max-age=60"), ("date", &http_date(0))]);
        let defaults = policy();
        let an_hour = policy_with(|c| c.min_ttl = Dur::secs(3600));
        let stale = revalidate(RevalidateReason::Stale);
        assert_eq!(defaults.evaluate(&HeaderMap::new(), &m, t(61)), stale);
        assert!(m.derived.facts().is_some(), "kept after the first evaluation");
        // Another policy (another listener's, or a changed config reloaded)
        // draws its own conclusions, and the first policy keeps its.
        assert_eq!(an_hour.evaluate(&HeaderMap::new(), &m, t(61)), Decision::Fresh);
        assert_eq!(defaults.evaluate(&HeaderMap::new(), &m, t(61)), stale);
        assert_ne!(an_hour.fingerprint, defaults.fingerprint);
        // The same config built again (a reload that changed nothing)
        // finds them good.
        assert_eq!(policy().fingerprint, defaults.fingerprint);
        // New fields from a 304 (RFC 9111 4.3.4) are judged anew.
        update_from_304(&mut m, &hm(&[("cache-control", "max-age=3600")]), t(60), t(60));
        assert!(m.derived.facts().is_none());
        assert_eq!(defaults.evaluate(&HeaderMap::new(), &m, t(61)), Decision::Fresh);
    }

    #[test]
    fn a_list_based_age_uses_its_first_member_and_an_invalid_age_is_ignored() {
        let p = policy();
        let fresh = ("cache-control", "max-age=3600");
        let date = http_date(0);
        // The decision one second after the response, and the Age sent then.
        let at = |age: &[&str]| {
            let mut fields = vec![fresh, ("date", date.as_str())];
            fields.extend(age.iter().map(|a| ("age", *a)));
            let m = meta(&fields);
            let sent = age_header(&m, t(1)).to_str().unwrap_or("?").to_string();
            (p.evaluate(&HeaderMap::new(), &m, t(1)), sent)
        };
        // "SHOULD use the first member of the field value, discarding
        // subsequent ones" (cache-tests age-parse-prefix, -suffix, -dup-*).
        assert_eq!(at(&["0, 7200"]), (Decision::Fresh, "1".to_string()));
        assert_eq!(at(&["7200, 0"]).0, revalidate(RevalidateReason::Stale));
        assert_eq!(at(&["0", "7200"]).0, Decision::Fresh);
        assert_eq!(at(&["7200", "0"]).0, revalidate(RevalidateReason::Stale));
        assert_eq!(at(&["0, 0"]).0, Decision::Fresh);
        assert_eq!(
            at(&["3600", "3600"]),
            (revalidate(RevalidateReason::Stale), "3601".to_string())
        );
        assert_eq!(at(&["60", "60"]), (Decision::Fresh, "61".to_string()));
        // "If the field value ... is invalid ... a cache SHOULD ignore the
        // field" (age-parse-nonnumeric, -negative, -float): as if absent.
        for invalid in ["abc", "-7200", "7200.0", ""] {
            assert_eq!(at(&[invalid]), (Decision::Fresh, "1".to_string()), "{invalid:?}");
        }
        // A parameter after the number leaves the number (age-parse-parameter).
        assert_eq!(at(&["7200;foo=bar"]).0, revalidate(RevalidateReason::Stale));
        assert_eq!(at(&["7200;foo=111"]).0, revalidate(RevalidateReason::Stale));
        // Valid values, a huge one clamped, keep working.
        assert_eq!(at(&[" 10 "]), (Decision::Fresh, "11".to_string()));
        let m = meta(&[fresh, ("age", "99999999999999")]);
        assert_eq!(age_header(&m, t(1)), "2147483648");
    }

    // ----- Evaluation (RFC 9111 4.2, 5.2)

    #[test]
    fn fresh_then_stale() {
        let p = policy();
        let m = meta(&[("date", &http_date(0)), ("cache-control", "max-age=60")]);
        assert_eq!(p.evaluate(&HeaderMap::new(), &m, t(59)), Decision::Fresh);
        assert_eq!(
            p.evaluate(&HeaderMap::new(), &m, t(60)),
            revalidate(RevalidateReason::Stale)
        );
        // max-age=0: stale at once.
        let m = meta(&[("cache-control", "max-age=0")]);
        assert_eq!(
            p.evaluate(&HeaderMap::new(), &m, t(0)),
            revalidate(RevalidateReason::Stale)
        );
        // Age from upstream counts.
        let m = meta(&[("cache-control", "max-age=60"), ("age", "50")]);
        assert_eq!(
            p.evaluate(&HeaderMap::new(), &m, t(10)),
            revalidate(RevalidateReason::Stale)
        );
    }

    #[test]
    fn request_no_cache_and_pragma_force_revalidation_unless_ignore_reload() {
        let p = policy();
        let m = meta(&[("cache-control", "max-age=600")]);
        let no_cache = hm(&[("cache-control", "no-cache")]);
        assert_eq!(
            p.evaluate(&no_cache, &m, t(1)),
            revalidate(RevalidateReason::RequestNoCache)
        );
        let pragma = hm(&[("pragma", "no-cache")]);
        assert_eq!(
            p.evaluate(&pragma, &m, t(1)),
            revalidate(RevalidateReason::RequestNoCache)
        );
        // Pragma is ignored when Cache-Control is present (RFC 9111 5.4).
        let both = hm(&[("pragma", "no-cache"), ("cache-control", "max-stale=10")]);
        assert_eq!(p.evaluate(&both, &m, t(1)), Decision::Fresh);
        let ignoring = policy_with(|c| c.ignore_reload = true);
        assert_eq!(ignoring.evaluate(&no_cache, &m, t(1)), Decision::Fresh);
        assert_eq!(ignoring.evaluate(&pragma, &m, t(1)), Decision::Fresh);
    }

    #[test]
    fn a_cache_must_not_store_any_part_of_a_no_store_request_or_use_a_stored_response_for_it() {
        // RFC 9111 5.2.1.5; cache-tests ccreq-no-store.
        let p = policy();
        assert!(p.bypasses_cache(&hm(&[("cache-control", "no-store")])));
        assert!(p.bypasses_cache(&hm(&[("cache-control", "max-age=5, NO-STORE")])));
        assert!(!p.bypasses_cache(&hm(&[("cache-control", "no-cache")])));
        assert!(!p.bypasses_cache(&hm(&[("pragma", "no-store")])));
        assert!(!p.bypasses_cache(&HeaderMap::new()));
        let ignoring = policy_with(|c| c.ignore_no_store = true);
        assert!(!ignoring.bypasses_cache(&hm(&[("cache-control", "no-store")])));
    }

    #[test]
    fn request_max_age() {
        let p = policy();
        let m = meta(&[("cache-control", "max-age=600")]);
        let req = hm(&[("cache-control", "max-age=30")]);
        assert_eq!(p.evaluate(&req, &m, t(30)), Decision::Fresh);
        assert_eq!(p.evaluate(&req, &m, t(31)), revalidate(RevalidateReason::RequestMaxAge));
        let zero = hm(&[("cache-control", "max-age=0")]);
        assert_eq!(p.evaluate(&zero, &m, t(0)), revalidate(RevalidateReason::RequestMaxAge));
        let invalid = hm(&[("cache-control", "max-age=soon")]);
        assert_eq!(p.evaluate(&invalid, &m, t(31)), Decision::Fresh);
    }

    #[test]
    fn request_max_stale_with_and_without_value() {
        let p = policy();
        let m = meta(&[("cache-control", "max-age=60")]);
        let any = hm(&[("cache-control", "max-stale")]);
        assert_eq!(p.evaluate(&any, &m, t(100_000)), Decision::Stale);
        let ten = hm(&[("cache-control", "max-stale=10")]);
        assert_eq!(p.evaluate(&ten, &m, t(70)), Decision::Stale);
        assert_eq!(p.evaluate(&ten, &m, t(71)), revalidate(RevalidateReason::Stale));
        let invalid = hm(&[("cache-control", "max-stale=x")]);
        assert_eq!(p.evaluate(&invalid, &m, t(61)), revalidate(RevalidateReason::Stale));
        // Fresh stays Fresh.
        assert_eq!(p.evaluate(&ten, &m, t(1)), Decision::Fresh);
    }

    #[test]
    fn request_min_fresh() {
        let p = policy();
        let m = meta(&[("cache-control", "max-age=60")]);
        let req = hm(&[("cache-control", "min-fresh=20")]);
        assert_eq!(p.evaluate(&req, &m, t(40)), Decision::Fresh);
        assert_eq!(
            p.evaluate(&req, &m, t(41)),
            revalidate(RevalidateReason::RequestMinFresh)
        );
    }

    #[test]
    fn response_no_cache_without_field_names_forces_revalidation() {
        let p = policy();
        for cc in [
            "no-cache, max-age=600",
            "max-age=600, NO-CACHE",
            "no-cache=\"\", max-age=600",
        ] {
            let m = meta(&[("cache-control", cc)]);
            assert_eq!(
                p.evaluate(&HeaderMap::new(), &m, t(1)),
                revalidate(RevalidateReason::ResponseNoCache),
                "{cc}"
            );
        }
    }

    #[test]
    fn the_qualified_form_of_no_cache_or_private_allows_a_cache_to_store_and_reuse_the_response_without_the_listed_fields()
     {
        // RFC 9111 5.2.2.4 and 5.2.2.7 (a shared cache).
        let p = policy();
        for cc in [
            "no-cache=\"X-User, x-team\", max-age=600",
            "max-age=600, NO-CACHE=x-user, no-cache=X-Team",
            "private=\"x-user,x-team\", max-age=600",
        ] {
            let resp = [
                ("cache-control", cc),
                ("x-user", "alice"),
                ("x-team", "a"),
                ("x-other", "kept"),
                ("content-length", "4"),
                ("vary", "accept"),
            ];
            assert_eq!(store(&p, &[], 200, &resp), Ok(()), "{cc}");
            let mut headers = hm(&resp);
            assert!(p.has_unshared(&headers), "{cc}");
            let taken = p.take_unshared(&mut headers);
            assert_eq!(taken.get("x-user").unwrap(), "alice", "{cc}");
            assert_eq!(taken.get("x-team").unwrap(), "a", "{cc}");
            for kept in ["x-other", "content-length", "vary", "cache-control"] {
                assert!(headers.contains_key(kept), "{cc}: {kept}");
            }
            assert!(!p.has_unshared(&headers), "{cc}");
            let m = meta_with(StatusCode::OK, &[("cache-control", cc)]);
            assert_eq!(p.evaluate(&HeaderMap::new(), &m, t(1)), Decision::Fresh, "{cc}");
        }
        // Naming the fields the stored response needs strips none of them.
        let mut headers = hm(&[("cache-control", "no-cache=\"content-length, vary, cache-control\"")]);
        headers.insert("content-length", HeaderValue::from_static("4"));
        assert!(p.take_unshared(&mut headers).is_empty());
        assert_eq!(headers.len(), 2);
    }

    #[test]
    fn whether_a_stored_response_has_fields_to_take_out_is_answered_as_taking_them_would() {
        // `has_unshared` skips the parse when no field the directives may
        // come from mentions `no-cache` or `private`: it must still agree
        // with `take_unshared` on every response, targeted fields included.
        let plain = policy_with(|c| c.set_cookie = SetCookie::Store);
        let cdn = policy_with(|c| c.set_cookie = SetCookie::Store)
            .targeted(&CacheConfig {
                targeted_fields: vec!["cdn-cache-control".into()],
                ..CacheConfig::default()
            })
            .unwrap();
        let values = [
            None,
            Some("max-age=600"),
            Some("public, max-age=60"),
            Some("no-cache"),
            Some("No-Cache=\"X-User\""),
            Some("max-age=1, PRIVATE=x-user"),
            Some("private=\"x-team, x-user\""),
            Some("no-cache=x-absent"),
            Some("x-private-thing=1, max-age=5"),
        ];
        for p in [&plain, &cdn] {
            for cc in values {
                for cdn_cc in values {
                    for with_field in [false, true] {
                        let mut h = HeaderMap::new();
                        if let Some(v) = cc {
                            h.insert(header::CACHE_CONTROL, HeaderValue::from_str(v).unwrap());
                        }
                        if let Some(v) = cdn_cc {
                            h.insert("cdn-cache-control", HeaderValue::from_str(v).unwrap());
                        }
                        if with_field {
                            h.insert("x-user", HeaderValue::from_static("alice"));
                        }
                        let taken = p.take_unshared(&mut h.clone());
                        assert_eq!(
                            p.has_unshared(&h),
                            !taken.is_empty(),
                            "{cc:?} / {cdn_cc:?} / {with_field}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn must_revalidate_proxy_revalidate_and_s_maxage_forbid_serving_stale() {
        let p = policy();
        let max_stale = hm(&[("cache-control", "max-stale, stale-if-error=600")]);
        for cc in [
            "max-age=60, must-revalidate, stale-while-revalidate=600, stale-if-error=600",
            "max-age=60, proxy-revalidate, stale-while-revalidate=600",
            "s-maxage=60, stale-while-revalidate=600, stale-if-error=600",
        ] {
            let m = meta(&[("cache-control", cc)]);
            assert_eq!(p.evaluate(&max_stale, &m, t(30)), Decision::Fresh, "{cc}");
            assert_eq!(
                p.evaluate(&max_stale, &m, t(61)),
                revalidate(RevalidateReason::Stale),
                "{cc}"
            );
        }
    }

    #[test]
    fn stale_while_revalidate_window() {
        let p = policy();
        let m = meta(&[("cache-control", "max-age=60, stale-while-revalidate=30")]);
        assert_eq!(p.evaluate(&HeaderMap::new(), &m, t(59)), Decision::Fresh);
        assert_eq!(p.evaluate(&HeaderMap::new(), &m, t(60)), Decision::StaleWhileRevalidate);
        assert_eq!(p.evaluate(&HeaderMap::new(), &m, t(89)), Decision::StaleWhileRevalidate);
        assert_eq!(
            p.evaluate(&HeaderMap::new(), &m, t(90)),
            revalidate(RevalidateReason::Stale)
        );
        // A request that insists on validation does not get the stale response.
        let no_cache = hm(&[("cache-control", "no-cache")]);
        assert_eq!(
            p.evaluate(&no_cache, &m, t(61)),
            revalidate(RevalidateReason::RequestNoCache)
        );
    }

    #[test]
    fn stale_if_error_from_response_or_request() {
        let p = policy();
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=60, stale-if-error=300"),
        ]);
        assert_eq!(
            p.evaluate(&HeaderMap::new(), &m, t(100)),
            Decision::Revalidate {
                reason: RevalidateReason::Stale,
                stale_if_error_until: Some(t(360)),
            }
        );
        // From the request only; the larger window wins when both say.
        let m = meta(&[("cache-control", "max-age=60")]);
        let req = hm(&[("cache-control", "stale-if-error=100")]);
        assert_eq!(
            p.evaluate(&req, &m, t(70)),
            Decision::Revalidate {
                reason: RevalidateReason::Stale,
                stale_if_error_until: Some(t(160)),
            }
        );
        let m = meta(&[("cache-control", "max-age=60, stale-if-error=10")]);
        let Decision::Revalidate {
            stale_if_error_until, ..
        } = p.evaluate(&req, &m, t(61))
        else {
            panic!("expected revalidation");
        };
        assert_eq!(stale_if_error_until, Some(t(160)));
        // Also attached when a fresh response is revalidated at the client's request.
        let m = meta(&[("cache-control", "max-age=60, stale-if-error=10")]);
        let Decision::Revalidate {
            stale_if_error_until, ..
        } = p.evaluate(&hm(&[("cache-control", "no-cache")]), &m, t(5))
        else {
            panic!("expected revalidation");
        };
        assert_eq!(stale_if_error_until, Some(t(70)));
        // Response no-cache forbids it.
        let m = meta(&[("cache-control", "no-cache, stale-if-error=300")]);
        assert_eq!(
            p.evaluate(&HeaderMap::new(), &m, t(1)),
            revalidate(RevalidateReason::ResponseNoCache)
        );
    }

    fn stale_on_error_until(p: &Policy, req: &HeaderMap, m: &StoredMeta, now: SystemTime) -> Option<SystemTime> {
        match p.evaluate(req, m, now) {
            Decision::Revalidate {
                stale_if_error_until, ..
            } => stale_if_error_until,
            other => panic!("expected a revalidation, got {other:?}"),
        }
    }

    #[test]
    fn a_disconnected_cache_may_serve_a_stale_response_for_max_stale_on_error_past_its_expiry() {
        let p = policy_with(|c| c.max_stale_on_error = Dur::secs(3600));
        let m = meta(&[("date", &http_date(0)), ("cache-control", "max-age=60")]);
        // Stale at 60: servable on error until 60 + 3600, whenever asked.
        assert_eq!(stale_on_error_until(&p, &HeaderMap::new(), &m, t(100)), Some(t(3660)));
        assert_eq!(stale_on_error_until(&p, &HeaderMap::new(), &m, t(3000)), Some(t(3660)));
        // A fresh response revalidated at the client's request, too.
        let no_cache = hm(&[("cache-control", "no-cache")]);
        assert_eq!(stale_on_error_until(&p, &no_cache, &m, t(5)), Some(t(3660)));
        // A response without any lifetime (a validator only) is stale at once.
        let m = meta(&[("date", &http_date(0)), ("etag", "\"v1\"")]);
        assert_eq!(stale_on_error_until(&p, &HeaderMap::new(), &m, t(10)), Some(t(3600)));
        // The defaults allow a week, as Squid's max_stale.
        let m = meta(&[("date", &http_date(0)), ("cache-control", "max-age=60")]);
        assert_eq!(
            stale_on_error_until(&policy_with(|_| {}), &HeaderMap::new(), &m, t(100)),
            Some(t(60 + 7 * 24 * 3600))
        );
    }

    #[test]
    fn a_disconnected_cache_must_not_serve_stale_when_must_revalidate_proxy_revalidate_s_maxage_or_no_cache_forbid_it()
    {
        let p = policy_with(|c| c.max_stale_on_error = Dur::secs(3600));
        for cc in [
            "max-age=60, must-revalidate",
            "max-age=60, proxy-revalidate",
            "s-maxage=60",
            "max-age=60, s-maxage=2",
            "max-age=60, no-cache",
            "no-cache=\"set-cookie\", max-age=60",
        ] {
            let m = meta(&[("date", &http_date(0)), ("cache-control", cc)]);
            assert_eq!(stale_on_error_until(&p, &HeaderMap::new(), &m, t(100)), None, "{cc}");
            // Not even when the client asks for it.
            let req = hm(&[("cache-control", "stale-if-error=600")]);
            assert_eq!(stale_on_error_until(&p, &req, &m, t(100)), None, "{cc}");
        }
    }

    #[test]
    fn max_stale_on_error_of_zero_leaves_only_what_stale_if_error_allows() {
        let p = policy();
        let m = meta(&[("date", &http_date(0)), ("cache-control", "max-age=60")]);
        assert_eq!(stale_on_error_until(&p, &HeaderMap::new(), &m, t(100)), None);
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=60, stale-if-error=30"),
        ]);
        assert_eq!(stale_on_error_until(&p, &HeaderMap::new(), &m, t(100)), Some(t(90)));
    }

    #[test]
    fn the_longest_of_stale_if_error_and_max_stale_on_error_applies_within_the_requests_max_stale() {
        let p = policy_with(|c| c.max_stale_on_error = Dur::secs(100));
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=60, stale-if-error=300"),
        ]);
        assert_eq!(stale_on_error_until(&p, &HeaderMap::new(), &m, t(100)), Some(t(360)));
        let m = meta(&[("date", &http_date(0)), ("cache-control", "max-age=60")]);
        let req = hm(&[("cache-control", "stale-if-error=500")]);
        assert_eq!(stale_on_error_until(&p, &req, &m, t(100)), Some(t(560)));
        // RFC 9111 5.2.1.2: a client that accepts only so much staleness
        // (max-stale=N) is not served more on error by the configuration.
        let req = hm(&[("cache-control", "max-stale=20")]);
        assert_eq!(stale_on_error_until(&p, &req, &m, t(100)), Some(t(80)));
        // An invalid max-stale is ignored.
        let req = hm(&[("cache-control", "max-stale=x")]);
        assert_eq!(stale_on_error_until(&p, &req, &m, t(100)), Some(t(160)));
    }

    #[test]
    fn errors_a_stored_response_may_stand_in_for_are_500_502_503_and_504() {
        for code in [500, 502, 503, 504] {
            assert!(is_origin_error(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [200, 304, 400, 404, 408, 413, 501, 505, 508] {
            assert!(!is_origin_error(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    /// A reverse listener's policy: `targets` (none: `cache.targeted_fields`'s default).
    fn cdn(targets: &[&str]) -> Policy {
        let mut cfg = CacheConfig::default();
        if !targets.is_empty() {
            cfg.targeted_fields = targets.iter().map(|t| t.to_string()).collect();
        }
        Policy::new(&cfg).unwrap().targeted(&cfg).unwrap()
    }

    #[test]
    fn a_cache_uses_the_targeted_field_and_ignores_cache_control_and_expires() {
        // RFC 9213 2.2: the first targeted field with a valid, non-empty value
        // determines the caching policy; Cache-Control and Expires are ignored.
        let p = cdn(&[]);
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=10"),
            ("expires", &http_date(1000)),
            ("cdn-cache-control", "max-age=600"),
        ]);
        assert_eq!(lifetime(&p, &m), 600);
        assert_eq!(p.evaluate(&HeaderMap::new(), &m, t(500)), Decision::Fresh);
        // Shorter than Cache-Control's, and Expires alone is ignored too.
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=600"),
            ("cdn-cache-control", "max-age=5"),
        ]);
        assert_eq!(lifetime(&p, &m), 5);
        let m = meta(&[
            ("date", &http_date(0)),
            ("expires", &http_date(1000)),
            ("cdn-cache-control", "public"),
        ]);
        assert_eq!(lifetime(&p, &m), 0);
        // Several field lines make one Dictionary.
        let mut m = meta(&[("date", &http_date(0)), ("cdn-cache-control", "public")]);
        m.headers
            .append("cdn-cache-control", HeaderValue::from_static("max-age=60"));
        assert_eq!(lifetime(&p, &m), 60);
    }

    #[test]
    fn a_cache_that_is_not_a_target_ignores_the_targeted_field() {
        // A forward proxy is no CDN: its policy has no targets.
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=10"),
            ("cdn-cache-control", "max-age=600"),
        ]);
        assert_eq!(lifetime(&policy(), &m), 10);
        // Nor does a CDN obey a field that is not on its target list.
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=10"),
            ("other-cdn-cache-control", "max-age=600"),
        ]);
        assert_eq!(lifetime(&cdn(&[]), &m), 10);
    }

    #[test]
    fn the_first_field_in_target_list_order_with_a_valid_non_empty_value_is_used() {
        let p = cdn(&["Portico-Cache-Control", "CDN-Cache-Control"]);
        let both = meta(&[
            ("date", &http_date(0)),
            ("cdn-cache-control", "max-age=60"),
            ("portico-cache-control", "max-age=30"),
        ]);
        assert_eq!(lifetime(&p, &both), 30);
        let invalid_first = meta(&[
            ("date", &http_date(0)),
            ("cdn-cache-control", "max-age=60"),
            ("portico-cache-control", "max-age =30"),
        ]);
        assert_eq!(lifetime(&p, &invalid_first), 60);
    }

    #[test]
    fn a_targeted_field_that_fails_to_parse_as_a_dictionary_or_is_empty_is_ignored() {
        // RFC 9213 2.1: invalid fields are ignored, as if absent: Cache-Control
        // applies.
        let p = cdn(&[]);
        for bad in [
            "max-age =600",
            "max-age= 600",
            "max-age=600,",
            "Max-Age=600",
            "max-age=\"600",
            "max-age=600;;",
            "",
            "   ",
            "max-age=99999999999999999",
            "\u{7f}",
        ] {
            let Ok(value) = HeaderValue::from_str(bad) else {
                continue;
            };
            let mut m = meta(&[("date", &http_date(0)), ("cache-control", "max-age=10")]);
            m.headers.insert("cdn-cache-control", value);
            assert_eq!(lifetime(&p, &m), 10, "{bad:?}");
        }
        let mut m = meta(&[("date", &http_date(0)), ("cache-control", "max-age=10")]);
        m.headers.insert(
            "cdn-cache-control",
            HeaderValue::from_bytes(b"max-age=600, \xff").unwrap(),
        );
        assert_eq!(lifetime(&p, &m), 10);
        // Valid structure, a delta-seconds directive of another type than
        // an Integer (a String, Decimal, Byte Sequence, Inner List,
        // Boolean): the field is invalid and ignored, Cache-Control applies
        // (cache-tests cdn-cc-invalid-sh-type-wrong: `max-age="10000"`).
        for odd in [
            "max-age=\"10000\"",
            "max-age=1.5",
            "max-age=:AAA=:",
            "max-age=(1 2)",
            "max-age=?1",
            "max-age",
            "s-maxage=\"60\"",
            "no-cache, stale-if-error=1.5",
        ] {
            let m = meta(&[
                ("date", &http_date(0)),
                ("cache-control", "max-age=10"),
                ("cdn-cache-control", odd),
            ]);
            assert_eq!(lifetime(&p, &m), 10, "{odd:?}");
        }
        // An Integer out of range is an invalid max-age: stale.
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=10"),
            ("cdn-cache-control", "max-age=-1"),
        ]);
        assert_eq!(lifetime(&p, &m), 0);
        // Other directives' Strings and Tokens are values as in Cache-Control.
        let m = meta(&[
            ("date", &http_date(0)),
            ("cdn-cache-control", "max-age=60, no-cache=\"set-cookie\""),
        ]);
        assert_eq!(lifetime(&p, &m), 60);
    }

    #[test]
    fn a_cache_implements_max_age_must_revalidate_no_store_no_cache_and_private_in_the_targeted_field() {
        let p = cdn(&[]);
        assert!(
            store(
                &p,
                &[],
                200,
                &[("cache-control", "max-age=60"), ("cdn-cache-control", "no-store")]
            )
            .is_err()
        );
        assert!(
            store(
                &p,
                &[],
                200,
                &[("cache-control", "max-age=60"), ("cdn-cache-control", "private")]
            )
            .is_err()
        );
        // Cache-Control's no-store and private are ignored when the targeted field is used.
        assert!(
            store(
                &p,
                &[],
                200,
                &[("cache-control", "no-store"), ("cdn-cache-control", "max-age=60")]
            )
            .is_ok()
        );
        assert!(
            store(
                &p,
                &[],
                200,
                &[("cache-control", "private"), ("cdn-cache-control", "max-age=60")]
            )
            .is_ok()
        );
        // A private or no-store the cache is not a target of still holds.
        assert!(
            store(
                &policy(),
                &[],
                200,
                &[("cache-control", "private"), ("cdn-cache-control", "max-age=60")]
            )
            .is_err()
        );
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=600"),
            ("cdn-cache-control", "max-age=600, no-cache"),
        ]);
        assert_eq!(
            p.evaluate(&HeaderMap::new(), &m, t(1)),
            revalidate(RevalidateReason::ResponseNoCache)
        );
        let p = policy_with(|c| c.max_stale_on_error = Dur::secs(0))
            .targeted(&CacheConfig::default())
            .unwrap();
        let m = meta(&[
            ("date", &http_date(0)),
            ("cache-control", "max-age=60, stale-while-revalidate=600"),
            ("cdn-cache-control", "max-age=60, must-revalidate"),
        ]);
        assert_eq!(
            p.evaluate(&hm(&[("cache-control", "max-stale")]), &m, t(61)),
            revalidate(RevalidateReason::Stale)
        );
        assert!(
            Policy::new(&CacheConfig::default())
                .unwrap()
                .targeted(&CacheConfig {
                    targeted_fields: vec!["bad name".into()],
                    ..CacheConfig::default()
                })
                .is_err()
        );
    }

    #[test]
    fn only_if_cached_turns_revalidation_into_504() {
        let p = policy();
        let req = hm(&[("cache-control", "only-if-cached")]);
        assert!(only_if_cached(&req));
        assert!(!only_if_cached(&hm(&[("cache-control", "no-cache")])));
        let m = meta(&[("cache-control", "max-age=60")]);
        assert_eq!(p.evaluate(&req, &m, t(1)), Decision::Fresh);
        assert_eq!(p.evaluate(&req, &m, t(61)), Decision::GatewayTimeout);
        let req = hm(&[("cache-control", "only-if-cached, max-stale")]);
        assert_eq!(p.evaluate(&req, &m, t(61)), Decision::Stale);
    }

    // ----- Revalidation (RFC 9111 4.3)

    #[test]
    fn conditional_headers_from_validators() {
        let lm = http_date(-100);
        let m = meta(&[("etag", "W/\"v1\""), ("last-modified", &lm)]);
        let h = conditional_headers(&m);
        assert_eq!(h.get(header::IF_NONE_MATCH).unwrap(), "W/\"v1\"");
        assert_eq!(h.get(header::IF_MODIFIED_SINCE).unwrap(), lm.as_str());
        assert!(conditional_headers(&meta(&[("cache-control", "max-age=1")])).is_empty());
    }

    #[test]
    fn revalidation_outcomes() {
        let lm = http_date(-100);
        let strong = meta(&[("etag", "\"v1\""), ("last-modified", &lm)]);
        let weak = meta(&[("etag", "W/\"v1\"")]);
        let not_modified = StatusCode::NOT_MODIFIED;
        assert_eq!(
            revalidation(&strong, not_modified, &hm(&[("etag", "\"v1\"")])),
            Revalidation::NotModified
        );
        assert_eq!(
            revalidation(&strong, not_modified, &hm(&[("etag", "\"v2\"")])),
            Revalidation::Mismatch
        );
        assert_eq!(
            revalidation(&strong, not_modified, &hm(&[("etag", "W/\"v1\"")])),
            Revalidation::NotModified
        );
        assert_eq!(
            revalidation(&weak, not_modified, &hm(&[("etag", "\"v1\"")])),
            Revalidation::Mismatch
        );
        assert_eq!(
            revalidation(&weak, not_modified, &hm(&[("etag", "W/\"v1\"")])),
            Revalidation::NotModified
        );
        assert_eq!(
            revalidation(&strong, not_modified, &hm(&[("last-modified", &lm)])),
            Revalidation::NotModified
        );
        let other = http_date(-50);
        assert_eq!(
            revalidation(&strong, not_modified, &hm(&[("last-modified", &other)])),
            Revalidation::Mismatch
        );
        assert_eq!(
            revalidation(&weak, not_modified, &hm(&[("last-modified", &lm)])),
            Revalidation::Mismatch
        );
        assert_eq!(
            revalidation(&strong, not_modified, &HeaderMap::new()),
            Revalidation::NotModified
        );
        for status in [500, 502, 503, 504] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                revalidation(&strong, status, &HeaderMap::new()),
                Revalidation::ServerError
            );
        }
        for status in [200, 404, 501, 302] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(revalidation(&strong, status, &HeaderMap::new()), Revalidation::Replace);
        }
    }

    #[test]
    fn the_date_and_age_worked_out_once_are_not_carried_into_a_changed_clone() {
        let m = meta(&[("date", &http_date(-100)), ("age", "30")]);
        assert_eq!(current_age(&m, t(0)).as_secs(), 100);
        assert_eq!(current_age(&m, t(5)).as_secs(), 105, "kept, plus the resident time");
        let mut changed = m.clone();
        changed
            .headers
            .insert(header::DATE, HeaderValue::from_str(&http_date(0)).unwrap());
        assert_eq!(
            current_age(&changed, t(0)).as_secs(),
            30,
            "from the new Date, the same Age"
        );
        // m has its facts, its clone none: still equal.
        assert_eq!(m, m.clone());
    }

    #[test]
    fn update_from_304_replaces_fields_but_not_content_length_or_framing() {
        let mut m = meta(&[
            ("date", &http_date(-100)),
            ("age", "30"),
            ("cache-control", "max-age=10"),
            ("etag", "\"v1\""),
            ("content-length", "1234"),
            ("content-encoding", "gzip"),
            ("content-type", "text/html"),
            ("x-multi", "a"),
            ("x-multi", "b"),
        ]);
        let update = hm(&[
            ("cache-control", "max-age=600"),
            ("content-length", "0"),
            ("content-encoding", "br"),
            ("x-multi", "c"),
            ("x-new", "n"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
        ]);
        // Worked out once and kept (Derived): the update must drop it.
        assert_eq!(current_age(&m, t(0)).as_secs(), 100);
        update_from_304(&mut m, &update, t(1000), t(1001));
        assert_eq!(m.headers.get("cache-control").unwrap(), "max-age=600");
        assert_eq!(m.headers.get("content-length").unwrap(), "1234");
        assert_eq!(m.headers.get("content-encoding").unwrap(), "br");
        assert_eq!(m.headers.get("content-type").unwrap(), "text/html");
        assert_eq!(m.headers.get("etag").unwrap(), "\"v1\"");
        let multi: Vec<_> = m.headers.get_all("x-multi").iter().collect();
        assert_eq!(multi, ["c"]);
        assert_eq!(m.headers.get("x-new").unwrap(), "n");
        for hop in ["connection", "x-hop", "keep-alive"] {
            assert!(!m.headers.contains_key(hop), "{hop}");
        }
        // The old Age is gone, Date is the new response time, times reset.
        assert!(!m.headers.contains_key("age"));
        assert_eq!(m.headers.get("date").unwrap(), http_date(1001).as_str());
        assert_eq!((m.request_time, m.response_time), (t(1000), t(1001)));
        assert_eq!(current_age(&m, t(1001)).as_secs(), 1);
        assert_eq!(policy().evaluate(&HeaderMap::new(), &m, t(1001)), Decision::Fresh);
        // A 304 with its own Date and Age keeps them.
        update_from_304(
            &mut m,
            &hm(&[("date", &http_date(1999)), ("age", "3")]),
            t(2000),
            t(2000),
        );
        assert_eq!(m.headers.get("date").unwrap(), http_date(1999).as_str());
        assert_eq!(m.headers.get("age").unwrap(), "3");
    }

    #[test]
    fn the_cache_must_add_each_header_field_in_the_provided_response_replacing_content_encoding_and_content_range() {
        // RFC 9111 3.2; cache-tests 304-etag-update-response-Content-Encoding
        // and -Content-Range. Portico stores the body as received, so its
        // stored response depends on neither field.
        let mut m = meta(&[
            ("etag", "\"v1\""),
            ("content-encoding", "gzip"),
            ("content-range", "bytes 0-9/10"),
            ("content-length", "10"),
        ]);
        let update = hm(&[
            ("etag", "\"v1\""),
            ("content-encoding", "x-other"),
            ("content-range", "bytes 0-19/20"),
            ("content-length", "20"),
        ]);
        update_from_304(&mut m, &update, t(10), t(10));
        assert_eq!(m.headers.get("content-encoding").unwrap(), "x-other");
        assert_eq!(m.headers.get("content-range").unwrap(), "bytes 0-19/20");
        assert_eq!(m.headers.get("content-length").unwrap(), "10");
    }

    #[test]
    fn if_none_of_the_stored_responses_contain_the_same_strong_validator_the_304_updates_nothing() {
        // RFC 9111 4.3.4; cache-tests 304-etag-update-response-ETag.
        let m = meta(&[("etag", "\"abcdef\""), ("last-modified", &http_date(-100))]);
        let not_modified = StatusCode::NOT_MODIFIED;
        let other = hm(&[("etag", "\"ghijkl\"")]);
        assert_eq!(revalidation(&m, not_modified, &other), Revalidation::Mismatch);
        let same = hm(&[("etag", "\"abcdef\"")]);
        assert_eq!(revalidation(&m, not_modified, &same), Revalidation::NotModified);
        let other_date = hm(&[("last-modified", &http_date(-50))]);
        let lm_only = meta(&[("last-modified", &http_date(-100))]);
        assert_eq!(
            revalidation(&lm_only, not_modified, &other_date),
            Revalidation::Mismatch
        );
    }

    #[test]
    fn a_200_to_head_updates_the_stored_get_response_when_its_validators_and_content_length_match() {
        // RFC 9111 4.3.5; cache-tests head-200-freshness-update, head-200-update.
        let lm = http_date(-100);
        let m = meta(&[("etag", "\"v1\""), ("last-modified", &lm), ("content-length", "4")]);
        let ok = StatusCode::OK;
        let update = |h: &[(&str, &str)]| head_update(&m, 4, ok, &hm(h));
        assert_eq!(update(&[("cache-control", "max-age=1000")]), HeadUpdate::Update);
        assert_eq!(
            update(&[("etag", "\"v1\""), ("last-modified", &lm), ("content-length", "4")]),
            HeadUpdate::Update
        );
        // Any received validator or length that differs: invalidate.
        assert_eq!(update(&[("etag", "\"v2\"")]), HeadUpdate::Invalidate);
        assert_eq!(update(&[("etag", "W/\"v1\"")]), HeadUpdate::Invalidate);
        assert_eq!(update(&[("last-modified", &http_date(-50))]), HeadUpdate::Invalidate);
        assert_eq!(update(&[("content-length", "5")]), HeadUpdate::Invalidate);
        assert_eq!(update(&[("content-length", "four")]), HeadUpdate::Invalidate);
        let bare = meta(&[]);
        assert_eq!(
            head_update(&bare, 4, ok, &hm(&[("etag", "\"v1\"")])),
            HeadUpdate::Invalidate
        );
        // Only a 200 counts.
        assert_eq!(
            head_update(&m, 4, StatusCode::GONE, &HeaderMap::new()),
            HeadUpdate::Leave
        );
        assert_eq!(
            head_update(&m, 4, StatusCode::NOT_FOUND, &HeaderMap::new()),
            HeadUpdate::Leave
        );
    }

    // ----- Client conditionals (RFC 9110 13)

    #[test]
    fn if_none_match_uses_weak_comparison_lists_and_star() {
        let m = meta(&[("etag", "W/\"v1\"")]);
        let get = Method::GET;
        let check = |inm: &str| check_preconditions(&get, &hm(&[("if-none-match", inm)]), &m);
        assert_eq!(check("W/\"v1\""), Precondition::NotModified);
        assert_eq!(check("\"v1\""), Precondition::NotModified);
        assert_eq!(check("\"a\", \"b,c\" , W/\"v1\""), Precondition::NotModified);
        assert_eq!(check("\"v2\""), Precondition::Proceed);
        assert_eq!(check("*"), Precondition::NotModified);
        // Several field lines.
        let req = hm(&[("if-none-match", "\"x\""), ("if-none-match", "W/\"v1\"")]);
        assert_eq!(check_preconditions(&get, &req, &m), Precondition::NotModified);
        // HEAD too; other methods fail.
        let req = hm(&[("if-none-match", "*")]);
        assert_eq!(check_preconditions(&Method::HEAD, &req, &m), Precondition::NotModified);
        assert_eq!(check_preconditions(&Method::POST, &req, &m), Precondition::Failed);
        // No stored ETag: only * matches.
        let plain = meta(&[]);
        assert_eq!(
            check_preconditions(&get, &hm(&[("if-none-match", "\"v1\"")]), &plain),
            Precondition::Proceed
        );
        assert_eq!(
            check_preconditions(&get, &hm(&[("if-none-match", "*")]), &plain),
            Precondition::NotModified
        );
    }

    #[test]
    fn if_modified_since() {
        let lm = http_date(-100);
        let m = meta(&[("last-modified", &lm), ("etag", "\"v1\"")]);
        let get = Method::GET;
        let ims = |d: &str| hm(&[("if-modified-since", d)]);
        assert_eq!(check_preconditions(&get, &ims(&lm), &m), Precondition::NotModified);
        assert_eq!(
            check_preconditions(&get, &ims(&http_date(0)), &m),
            Precondition::NotModified
        );
        assert_eq!(
            check_preconditions(&get, &ims(&http_date(-101)), &m),
            Precondition::Proceed
        );
        assert_eq!(check_preconditions(&get, &ims("not a date"), &m), Precondition::Proceed);
        assert_eq!(check_preconditions(&Method::POST, &ims(&lm), &m), Precondition::Proceed);
        // Ignored when If-None-Match is present.
        let req = hm(&[("if-none-match", "\"other\""), ("if-modified-since", &lm)]);
        assert_eq!(check_preconditions(&get, &req, &m), Precondition::Proceed);
        // No Last-Modified: Date, else the time received (RFC 9111 4.3.2).
        let dated = meta(&[("date", &http_date(-50))]);
        assert_eq!(
            check_preconditions(&get, &ims(&http_date(-50)), &dated),
            Precondition::NotModified
        );
        assert_eq!(
            check_preconditions(&get, &ims(&http_date(-51)), &dated),
            Precondition::Proceed
        );
        let undated = meta(&[]);
        assert_eq!(
            check_preconditions(&get, &ims(&http_date(0)), &undated),
            Precondition::NotModified
        );
    }

    #[test]
    fn if_match_and_if_unmodified_since_fail_with_412() {
        let lm = http_date(-100);
        let m = meta(&[("etag", "\"v1\""), ("last-modified", &lm)]);
        let weak = meta(&[("etag", "W/\"v1\"")]);
        let get = Method::GET;
        let im = |v: &str| hm(&[("if-match", v)]);
        assert_eq!(check_preconditions(&get, &im("\"v1\""), &m), Precondition::Proceed);
        assert_eq!(
            check_preconditions(&get, &im("\"v0\", \"v1\""), &m),
            Precondition::Proceed
        );
        assert_eq!(check_preconditions(&get, &im("*"), &m), Precondition::Proceed);
        assert_eq!(check_preconditions(&get, &im("\"v2\""), &m), Precondition::Failed);
        assert_eq!(check_preconditions(&get, &im("W/\"v1\""), &m), Precondition::Failed);
        assert_eq!(check_preconditions(&get, &im("\"v1\""), &weak), Precondition::Failed);
        let ius = |d: &str| hm(&[("if-unmodified-since", d)]);
        assert_eq!(check_preconditions(&get, &ius(&lm), &m), Precondition::Proceed);
        assert_eq!(
            check_preconditions(&get, &ius(&http_date(-101)), &m),
            Precondition::Failed
        );
        assert_eq!(check_preconditions(&get, &ius("garbage"), &m), Precondition::Proceed);
        // If-Match takes precedence over If-Unmodified-Since.
        let req = hm(&[("if-match", "\"v1\""), ("if-unmodified-since", &http_date(-101))]);
        assert_eq!(check_preconditions(&get, &req, &m), Precondition::Proceed);
        // If-Match passes, If-None-Match then decides.
        let req = hm(&[("if-match", "\"v1\""), ("if-none-match", "\"v1\"")]);
        assert_eq!(check_preconditions(&get, &req, &m), Precondition::NotModified);
    }

    #[test]
    fn preconditions_are_ignored_for_non_2xx_stored_responses() {
        let m = meta_with(StatusCode::NOT_FOUND, &[("etag", "\"v1\"")]);
        let req = hm(&[("if-none-match", "\"v1\""), ("if-match", "\"zz\"")]);
        assert_eq!(check_preconditions(&Method::GET, &req, &m), Precondition::Proceed);
    }

    #[test]
    fn not_modified_headers_keep_only_the_listed_fields() {
        let stored = hm(&[
            ("cache-control", "max-age=60"),
            ("content-location", "/a.en"),
            ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
            ("etag", "\"v1\""),
            ("expires", "Tue, 14 Nov 2023 22:14:20 GMT"),
            ("vary", "accept"),
            ("vary", "accept-encoding"),
            ("last-modified", "Tue, 14 Nov 2023 22:00:00 GMT"),
            ("content-type", "text/html"),
            ("content-length", "99"),
            ("set-cookie", "a=b"),
        ]);
        let h = not_modified_headers(&stored);
        assert_eq!(h.len(), 8);
        assert_eq!(h.get_all("vary").iter().count(), 2);
        for gone in ["content-type", "content-length", "set-cookie"] {
            assert!(!h.contains_key(gone), "{gone}");
        }
    }

    // ----- Vary (RFC 9111 4.1)

    #[test]
    fn vary_fields_are_lowercased_sorted_and_star_detected() {
        let h = hm(&[
            ("vary", "Accept-Encoding, User-Agent"),
            ("vary", "accept-encoding,Accept"),
        ]);
        assert_eq!(
            vary_fields(&h).unwrap(),
            ["accept", "accept-encoding", "user-agent"].map(String::from)
        );
        assert_eq!(vary_fields(&HeaderMap::new()).unwrap(), Vec::<String>::new());
        assert_eq!(vary_fields(&hm(&[("vary", "accept"), ("vary", " * ")])), None);
    }

    #[test]
    fn variant_values_combine_lines_and_trim() {
        let fields = ["accept-encoding", "accept-language", "x-absent"].map(String::from);
        let req = hm(&[
            ("accept-encoding", " gzip"),
            ("accept-encoding", "br  "),
            ("accept-language", "en"),
        ]);
        assert_eq!(
            variant_of(&fields, &req),
            vec![
                ("accept-encoding".into(), Some("gzip, br".into())),
                ("accept-language".into(), Some("en".into())),
                ("x-absent".into(), None),
            ]
        );
        // Present but empty differs from absent.
        let empty = hm(&[("accept-language", "")]);
        assert_eq!(
            variant_of(&fields[1..2], &empty),
            vec![("accept-language".into(), Some(String::new()))]
        );
    }

    #[test]
    fn a_field_that_does_not_reach_the_origin_selects_the_variant_for_its_absence() {
        let fields = ["x-tenant", "te"].map(String::from);
        let req = hm(&[
            ("x-tenant", "acme"),
            ("te", "trailers"),
            ("connection", "keep-alive, X-Tenant"),
        ]);
        assert_eq!(
            variant_of(&fields, &req),
            vec![("x-tenant".into(), None), ("te".into(), None)]
        );
        let plain = hm(&[("x-tenant", "acme")]);
        assert_eq!(
            variant_of(&fields[..1], &plain),
            vec![("x-tenant".into(), Some("acme".into()))]
        );
    }

    #[test]
    fn values_that_are_not_utf8_select_different_variants() {
        let fields = ["x-v".to_string()];
        let of = |b: &'static [u8]| {
            let mut h = HeaderMap::new();
            h.insert("x-v", HeaderValue::from_bytes(b).unwrap());
            variant_of(&fields, &h)
        };
        assert_ne!(of(b"\xff"), of(b"\xfe"));
        assert_ne!(of(b"\xff"), of(b"ff"));
        assert_eq!(of(b"plain"), vec![("x-v".into(), Some("plain".into()))]);
    }

    #[test]
    fn variant_matching() {
        let fields = vary_fields(&hm(&[("vary", "Accept-Encoding")])).unwrap();
        let mut m = meta(&[("vary", "Accept-Encoding")]);
        m.variant = variant_of(&fields, &hm(&[("accept-encoding", "gzip, br")]));
        assert!(variant_matches(&m, &hm(&[("accept-encoding", "gzip, br")])));
        assert!(variant_matches(
            &m,
            &hm(&[("accept-encoding", "gzip"), ("accept-encoding", " br")])
        ));
        assert!(!variant_matches(&m, &hm(&[("accept-encoding", "gzip")])));
        assert!(!variant_matches(&m, &HeaderMap::new()));
        let mut absent = meta(&[]);
        absent.variant = variant_of(&fields, &HeaderMap::new());
        assert!(variant_matches(&absent, &HeaderMap::new()));
        assert!(!variant_matches(&absent, &hm(&[("accept-encoding", "gzip")])));
        // Not varying: matches anything.
        assert!(variant_matches(&meta(&[]), &hm(&[("accept-encoding", "gzip")])));
    }

    // ----- Invalidation (RFC 9111 4.4)

    fn urls(keys: Vec<CacheKey>) -> Vec<String> {
        keys.into_iter().map(|k| k.url().to_string()).collect()
    }

    #[test]
    fn unsafe_methods_invalidate_on_success_only() {
        let p = policy();
        let target = CacheKey::new("http", "example.com", "/a/b", false);
        let none = HeaderMap::new();
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert_eq!(
                urls(p.invalidations(&method, &target, StatusCode::OK, &none)),
                ["http://example.com/a/b"]
            );
        }
        assert_eq!(
            p.invalidations(&Method::POST, &target, StatusCode::SEE_OTHER, &none)
                .len(),
            1
        );
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(p.invalidations(&method, &target, StatusCode::OK, &none).is_empty());
        }
        for status in [
            StatusCode::NOT_FOUND,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::CONTINUE,
        ] {
            assert!(p.invalidations(&Method::POST, &target, status, &none).is_empty());
        }
    }

    #[test]
    fn location_and_content_location_of_the_same_origin_are_invalidated() {
        let p = policy();
        let target = CacheKey::new("http", "example.com", "/a/b?x=1", false);
        let resp = hm(&[
            ("location", "../c?y#frag"),
            ("content-location", "http://EXAMPLE.com:80/d"),
        ]);
        assert_eq!(
            urls(p.invalidations(&Method::POST, &target, StatusCode::CREATED, &resp)),
            [
                "http://example.com/a/b?x=1",
                "http://example.com/c?y",
                "http://example.com/d"
            ]
        );
        // Other origins (host, port or scheme) are left alone.
        for other in [
            "http://other.com/a",
            "https://example.com/a",
            "http://example.com:8080/a",
            "//other.com/x",
        ] {
            let resp = hm(&[("location", other)]);
            assert_eq!(
                p.invalidations(&Method::PUT, &target, StatusCode::OK, &resp).len(),
                1,
                "{other}"
            );
        }
        // Same URL as the target is listed once.
        let resp = hm(&[("content-location", "/a/b?x=1")]);
        assert_eq!(p.invalidations(&Method::PUT, &target, StatusCode::OK, &resp).len(), 1);
        // The key follows ignore_query_in_key.
        let p = policy_with(|c| c.ignore_query_in_key = true);
        let resp = hm(&[("location", "/e?z=1")]);
        assert_eq!(
            urls(p.invalidations(&Method::POST, &target, StatusCode::OK, &resp))[1],
            "http://example.com/e"
        );
    }

    #[test]
    fn urls_invalidated_with_the_target_are_those_fetched_from_the_same_upstream() {
        let p = policy();
        let target = CacheKey::new("http", "example.com", "/a/b", false).in_upstream("backend");
        let resp = hm(&[("location", "/c")]);
        let keys = p.invalidations(&Method::POST, &target, StatusCode::CREATED, &resp);
        let texts: Vec<&str> = keys.iter().map(CacheKey::text).collect();
        assert_eq!(
            texts,
            [
                "http://example.com/a/b upstream=backend",
                "http://example.com/c upstream=backend"
            ]
        );
    }

    #[test]
    fn relative_references_resolve_per_rfc_3986() {
        let base = "http://a/b/c/d;p?q";
        for (reference, expected) in [
            ("g", "http://a/b/c/g"),
            ("./g", "http://a/b/c/g"),
            ("g/", "http://a/b/c/g/"),
            ("/g", "http://a/g"),
            ("//g", "http://g"),
            ("?y", "http://a/b/c/d;p?y"),
            ("g?y", "http://a/b/c/g?y"),
            ("#s", "http://a/b/c/d;p?q"),
            ("", "http://a/b/c/d;p?q"),
            (".", "http://a/b/c/"),
            ("..", "http://a/b/"),
            ("../g", "http://a/b/g"),
            ("../../../g", "http://a/g"),
            ("/./g", "http://a/g"),
            ("g;x=1/../y", "http://a/b/c/y"),
            ("https://x/y", "https://x/y"),
        ] {
            assert_eq!(
                resolve_reference(base, reference).as_deref(),
                Some(expected),
                "{reference:?}"
            );
        }
        assert_eq!(origin_of("http://h:81/x?y"), "http://h:81");
        assert_eq!(origin_of("http://h?y"), "http://h");
    }

    // ----- Parsing helpers

    #[test]
    fn entity_tag_lists() {
        let tags = etag_list(b"\"a\", W/\"b,c\",  \"\" ,unquoted");
        let view: Vec<(bool, &[u8])> = tags.iter().map(|t| (t.weak, t.tag)).collect();
        assert_eq!(
            view,
            [
                (false, &b"a"[..]),
                (true, &b"b,c"[..]),
                (false, &b""[..]),
                (false, &b"unquoted"[..])
            ]
        );
        let strong = ETag { weak: false, tag: b"x" };
        let weak = ETag { weak: true, tag: b"x" };
        assert!(strong.strong_eq(&strong) && !strong.strong_eq(&weak) && !weak.strong_eq(&weak));
        assert!(strong.weak_eq(&weak) && weak.weak_eq(&weak));
    }

    #[test]
    fn directive_parsing() {
        let mut out = Vec::new();
        parse_directives(
            br#"Max-Age=5, no-cache="a, b", private, x="q\"uote", ,s-maxage = 7 "#,
            &mut out,
        );
        let view: Vec<(&str, Option<&str>)> = out.iter().map(|(n, v)| (n.as_ref(), v.as_deref())).collect();
        assert_eq!(
            view,
            [
                ("max-age", Some("5")),
                ("no-cache", Some("a, b")),
                ("private", None),
                ("x", Some("q\"uote")),
                ("s-maxage", Some(" 7")),
            ]
        );
        assert_eq!(parse_delta(b"0"), Some(0));
        assert_eq!(parse_delta(b"2147483647"), Some(2_147_483_647));
        assert_eq!(parse_delta(b"2147483649"), Some(1 << 31));
        assert_eq!(parse_delta(b"+5"), None);
        assert_eq!(parse_delta(b""), None);
    }
}
