"""The TLS and HTTP/2 scenarios of bench/run: Portico beside nginx (at its
latency and at its throughput settings) with the same certificate, the same
protocol versions and the same session settings.

- `tls-full` and `tls-resume`: the `close` scenario over HTTPS: hits over
  the 10,000 cached objects, a new TLS connection per request (wrk with
  `Connection: close`). wrk keeps the session of a connection and offers
  it on the next one (OpenSSL's SSL_clear keeps it), so what decides
  between a full and a resumed handshake is the server: session resumption
  off on both servers for `tls-full` (Portico `session_tickets = false`,
  `session_cache_entries = 0`; nginx `ssl_session_cache off`,
  `ssl_session_tickets off`), on for `tls-resume` (Portico's `[tls]`
  defaults; nginx `ssl_session_cache shared:SSL:10m`, `ssl_session_tickets
  on`). Checked: a second connection offering the first one's session is
  resumed or not as the scenario says (every server), and Portico's own
  handshake counters (full, resumed) over the run.
- `tls-hits`: the `hits` scenario over HTTPS (keep-alive, 64 connections).
- `h2-hits`: the hits over HTTP/2 (TLS, ALPN h2): h2load, 8 connections of
  100 concurrent streams, the 10,000 URLs in a seeded shuffled order.
- `h2c-hits`: the same over cleartext HTTP/2 (h2c by prior knowledge) on a
  port of its own (Portico `h2c = true`, nginx `listen ... http2` without
  `ssl`); no TLS, the same h2load load.
- `tls-roundtrips`: the Oracle HTTP Server tuning guide's experiment: "the
  elapsed time for 5 connections was 11.4 seconds without SSL session
  caching. With SSL session caching enabled, the elapsed time for 5 round
  trips was 1.9 seconds". Here: 5 connections one after another (connect,
  handshake, GET the cached page, close), the client offering the previous
  connection's session, against each server with session caching off and
  on, RSA 2048 and ECDSA P-256, TLS 1.2 and 1.3; the median of many such
  sets.

The certificate of the throughput scenarios is RSA 2048 (`--tls-key`; the
kind most sites still serve); both servers sign with it on every full
handshake, which is what resumption saves.
"""

import os
import shutil
import socket
import ssl
import statistics
import subprocess
import time

SCENARIOS = {
    "tls-full": "hits over the 10,000 cached objects over HTTPS, a new TLS connection per "
                "request (Connection: close), session resumption off on the server: a full "
                "handshake per request, 64 connections",
    "tls-resume": "as tls-full with session resumption on (tickets and a session cache): wrk "
                  "offers each connection's session on its next one, which resumes it",
    "tls-hits": "hits over the 10,000 cached objects over HTTPS, keep-alive, 64 connections",
    "h2-hits": "hits over the 10,000 cached objects over HTTP/2 (TLS, ALPN h2): h2load, "
               "8 connections of 100 concurrent streams",
    "h2c-hits": "hits over the 10,000 cached objects over cleartext HTTP/2 (h2c, prior "
                "knowledge): h2load, 8 connections of 100 concurrent streams",
    "tls-roundtrips": "the Oracle HTTP Server tuning guide's experiment: 5 connect/disconnect "
                      "round trips to an HTTPS server, elapsed time without and with session "
                      "caching (RSA 2048 and ECDSA P-256, TLS 1.2 and 1.3)",
}
# The servers that terminate TLS here; the others sit out (bench.SITS_OUT says why).
SUBJECTS = ("portico", "nginx", "nginx-tput")
TLS_PORTS = {"portico": 28181, "nginx": 28182, "nginx-tput": 28187}
# h2c-hits: the cleartext HTTP/2 ports (nginx's `http2` port speaks nothing else).
H2C_PORTS = {"portico": 28191, "nginx": 28192, "nginx-tput": 28197}
SNI = "www.test"
H2_CONNECTIONS, H2_STREAMS = 8, 100
ROUNDTRIPS = 5                       # the Oracle guide's 5 connections
ROUNDTRIP_SETS, ROUNDTRIP_SETS_SMOKE = 200, 10
# The Oracle guide's figures: 5 round trips, seconds, without and with session caching.
ORACLE = (11.4, 1.9)
THROUGHPUT = ("tls-full", "tls-resume", "tls-hits", "h2-hits", "h2c-hits")
H2LOAD = ("h2-hits", "h2c-hits")
# Medians of this invocation's runs, by scenario and subject: the tls-resume
# report sets them against tls-full's (the "resumption at least 5x").
MEDIANS = {}
# The scenarios whose client --tls-max caps (wrk and the harness's checks).
CAPPED = ("tls-full", "tls-resume", "tls-hits")


def stem(scenario, args):
    """The results file name of a scenario: `tls-resume-tls12` when the
    client was held to TLS 1.2, so that it sits beside the default run."""
    return f"{scenario}-tls12" if client_max(scenario, args) else scenario


def client_max(scenario, args):
    """The version the harness's own client pins (None: what both offer)."""
    if scenario in CAPPED and args.tls_max == "1.2":
        return ssl.TLSVersion.TLSv1_2
    return None


def wrk_env(scenario, tmp, args):
    """wrk's environment for --tls-max 1.2: an OpenSSL config whose
    system_default section sets MaxProtocol, which OpenSSL applies to every
    SSL_CTX wrk makes (wrk has no option of its own for it)."""
    if client_max(scenario, args) is None:
        return None
    path = os.path.join(tmp, "openssl-tls12.cnf")
    with open(path, "w") as f:
        f.write("openssl_conf = openssl_init\n[openssl_init]\nssl_conf = ssl_sect\n"
                "[ssl_sect]\nsystem_default = system_default_sect\n"
                "[system_default_sect]\nMaxProtocol = TLSv1.2\n")
    return {"OPENSSL_CONF": path}


def make_cert(tmp, kind):
    """A self-signed certificate for www.test in tmp/tls-KIND/: (cert, key)."""
    d = os.path.join(tmp, f"tls-{kind}")
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    if os.path.exists(cert):
        return cert, key
    os.makedirs(d, exist_ok=True)
    newkey = (["-newkey", "rsa:2048"] if kind == "rsa" else
              ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"])
    p = subprocess.run(["openssl", "req", "-x509", *newkey, "-nodes", "-keyout", key,
                        "-out", cert, "-days", "30", "-subj", f"/CN={SNI}",
                        "-addext", f"subjectAltName=DNS:{SNI}"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"openssl req failed: {p.stderr[-500:]}")
    os.chmod(d, 0o755)
    for f in (cert, key):
        os.chmod(f, 0o644)   # nginx reads them as root before dropping privileges; harmless
    return cert, key


# Portico's order of cipher suites (src/tls.rs: AES-128-GCM, then ChaCha20-Poly1305,
# then AES-256-GCM, the server's choice over the client's), given to nginx too, so
# that both run the same suite: with OpenSSL's defaults wrk would get AES-256-GCM
# (its own first choice) from nginx and AES-128-GCM from Portico.
NGINX_SUITES = (
    "    ssl_prefer_server_ciphers on;\n"
    "    ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384;\n"
    "    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:"
    "TLS_AES_256_GCM_SHA384;\n")


def nginx_tls_conf(b, d, tput, cert, key, resume):
    """The peer's usual config (bench.nginx_conf) with a TLS + HTTP/2 listen
    and a cleartext HTTP/2 one (h2c-hits) on the same server block, and the
    session settings in the http block."""
    conf = b.nginx_conf(d, tput=tput)
    peer = "nginx-tput" if tput else "nginx"
    port, tport, cport = b.PORTS[peer], TLS_PORTS[peer], H2C_PORTS[peer]
    listen = f"        listen 127.0.0.1:{port} backlog=4096;\n"
    assert listen in conf
    conf = conf.replace(listen, listen +
                        f"        listen 127.0.0.1:{cport} http2 backlog=4096;\n"
                        f"        listen 127.0.0.1:{tport} ssl http2 backlog=4096;\n"
                        f"        ssl_certificate {cert};\n"
                        f"        ssl_certificate_key {key};\n")
    session = ("    ssl_session_cache shared:SSL:10m;\n    ssl_session_timeout 1d;\n"
               "    ssl_session_tickets on;\n" if resume else
               "    ssl_session_cache off;\n    ssl_session_tickets off;\n")
    anchor = "    upstream origin {\n"
    assert anchor in conf
    return conf.replace(anchor, "    ssl_protocols TLSv1.2 TLSv1.3;\n" + NGINX_SUITES + session + anchor)


def start(b, peer, tmp, args, kind, resume):
    """`peer` with a fresh cache, its plain port as usual, a TLS port
    (TLS_PORTS) with the `kind` certificate (session resumption on or off)
    and a cleartext HTTP/2 port (H2C_PORTS)."""
    cert, key = make_cert(tmp, kind)
    d = os.path.join(tmp, peer)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    os.chmod(d, 0o777)
    if peer == "portico":
        conf = b.portico_conf(d)
        conf["listener"].append({"address": f"127.0.0.1:{TLS_PORTS[peer]}", "mode": "reverse",
                                 "certificate": [{"cert": cert, "key": key}]})
        conf["listener"].append({"address": f"127.0.0.1:{H2C_PORTS[peer]}", "mode": "reverse",
                                 "h2c": True})
        conf["tls"] = ({} if resume else {"session_tickets": False, "session_cache_entries": 0})
        if b.PORTICO_EXTRA:
            b.merge_conf(conf, b.PORTICO_EXTRA)
        path = os.path.join(d, "portico.toml")
        with open(path, "w") as f:
            f.write(b.toml_dump(conf, "# Portico under test (bench/peers/portico.md), "
                                      "with a TLS listener (bench/tls_bench.py)"))
        b.portico_check(args.portico_bin, path)
        argv = [args.portico_bin, "run", "-c", path]
    elif peer in ("nginx", "nginx-tput"):
        path = os.path.join(d, "nginx.conf")
        with open(path, "w") as f:
            f.write(nginx_tls_conf(b, d, peer == "nginx-tput", cert, key, resume))
        argv = ["nginx", "-e", f"{d}/error.log", "-p", d, "-c", path]
    else:
        raise ValueError(peer)
    for port in (b.PORTS[peer], TLS_PORTS[peer], H2C_PORTS[peer]):
        if not b.port_free(port):
            raise RuntimeError(f"port {port} is in use")
    daemon = b.Daemon(peer, argv, b.PROXY_CPU, d)
    try:
        b.wait_ready(b.PORTS[peer], daemon)
        b.pin_threads(daemon.pid)
    except Exception:
        daemon.stop()
        raise
    return daemon


def round_trip(port, ctx, session=None, path="/page"):
    """One connection: connect, handshake (offering `session`), GET `path`,
    read the whole response by its Content-Length, close. Returns (status,
    body bytes, resumed, the session to offer next, protocol, cipher)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    # As curl and browsers do: without it, the request written right after
    # the client's last handshake flight waits for that flight's ACK, which
    # a server with nothing to send back (TLS 1.2 resumed, TLS 1.3 without
    # tickets) delays by 40 ms, and that timer would be all the table shows.
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        s = ctx.wrap_socket(raw, server_hostname=SNI, session=session)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {SNI}\r\nConnection: close\r\n\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"connection closed before the response head: {buf[:200]!r}")
            buf += chunk
        head, body = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next((int(v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:])
                       if k.strip().lower() == "content-length"), None)
        if length is None:
            raise RuntimeError(f"no Content-Length in the response: {lines[:5]}")
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        # Reading the response also read TLS 1.3's tickets (sent after the handshake).
        out = (status, len(body), s.session_reused, s.session, s.version(), s.cipher()[0])
        s.close()
        return out
    finally:
        raw.close()


def resumption_check(b, port, version=None):
    """(resumed, protocol, cipher): a second connection offering the first
    one's session (the protocol versions both servers default to, or
    `version` alone)."""
    ctx = b.client_tls(version)
    _, _, _, sess, proto, cipher = round_trip(port, ctx)
    _, _, resumed, _, _, _ = round_trip(port, ctx, sess)
    return resumed, proto, cipher


def portico_tls(b, port):
    try:
        t = b.portico_stats(port)["tls"]
        return {k: t[k] for k in ("full", "resumed", "handshakes")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_h2load(b, port, paths, duration, proxy_pid, origin_pid, tmp, scheme="https"):
    """h2load on the load CPU, over TLS (ALPN h2) or, with `scheme` http,
    cleartext HTTP/2 by prior knowledge (h2load's way for http URLs): the
    paths as full URLs in a seeded shuffled order (each client walks the
    list). Per-request times from its --log-file give the percentiles."""
    import random
    order = list(paths)
    random.Random(b.SEED).shuffle(order)
    uris = os.path.join(tmp, "h2-uris.txt")
    with open(uris, "w") as f:
        f.write("\n".join(f"{scheme}://127.0.0.1:{port}{p}" for p in order) + "\n")
    logf = os.path.join(tmp, "h2load.log")
    argv = ["taskset", "-c", b.LOAD_CPU, "h2load", "-t1", f"-c{H2_CONNECTIONS}",
            f"-m{H2_STREAMS}", f"-D{duration}", "-i", uris, "--log-file", logf]
    or0 = b.origin_requests()
    cpu = b.CpuMeter(proxy_pid, origin_pid)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    c = cpu.stop()
    or1 = b.origin_requests()
    text = out.stdout
    req = next((ln for ln in text.splitlines() if ln.startswith("requests:")), None)
    codes = next((ln for ln in text.splitlines() if ln.startswith("status codes:")), None)
    if out.returncode != 0 or req is None or codes is None:
        raise RuntimeError(f"h2load failed ({out.returncode}): {text[-800:]} {out.stderr[-500:]}")
    n = {w: int(v) for v, w in zip(req.split()[1::2], req.replace(",", "").split()[2::2])}
    # "status codes: 102469 2xx, 0 3xx, 0 4xx, 0 5xx"
    by_class = {w.strip(","): int(v) for v, w in zip(codes.split()[2::2], codes.split()[3::2])}
    not2xx = sum(v for k, v in by_class.items() if k != "2xx")
    durations = []
    with open(logf) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1].isdigit():
                durations.append(int(parts[2]))
    durations.sort()
    pct = (lambda q: durations[min(len(durations) - 1, int(q * len(durations)))]
           if durations else 0)
    done = n.get("succeeded", 0)
    return {
        "requests": done, "rps": done / c["wall_s"], "p50_us": pct(0.50), "p99_us": pct(0.99),
        "proxy_cpu": c["proxy_cpu"],
        "rps_per_core": done / c["proxy_s"] if c["proxy_s"] > 0 else 0.0,
        "cpu_us_per_req": c["proxy_s"] * 1e6 / done if done else 0.0,
        "wrk_cpu": c["load_cpu"], "other_cpu": c["other_cpu"],
        "origin_requests": or1 - or0 - 1,
        "errors": n.get("failed", 0) + n.get("errored", 0) + n.get("timeout", 0) + not2xx,
    }


def run(b, scenario, peer, tmp, args, ctx, origin):
    if scenario == "tls-roundtrips":
        return run_roundtrips(b, peer, tmp, args)
    resume = scenario != "tls-full"
    daemon = start(b, peer, tmp, args, args.tls_key, resume)
    try:
        tport, paths = TLS_PORTS[peer], ctx["paths"]
        h2c = scenario == "h2c-hits"
        info, problems = {}, []
        t = time.time()
        # h2c-hits: warmed (and sampled) over HTTP/1, for Portico on the h2c
        # port itself (which also speaks HTTP/1; its cache keys carry the
        # port the client named), for nginx on the plain port (its `http2`
        # port speaks nothing else; its keys name the upstream); no TLS, so
        # no resumption check.
        warm_port = (H2C_PORTS[peer] if peer == "portico" else b.PORTS[peer]) if h2c else tport
        info["warm_bad"] = b.warm_hits(warm_port, paths, tls=not h2c)
        info["warm_s"] = round(time.time() - t, 1)
        if h2c:
            resumed, info["tls"] = False, "none (h2c)"
        else:
            resumed, proto, cipher = resumption_check(b, tport, client_max(scenario, args))
            info["tls"] = f"{proto} {cipher}"
            if client_max(scenario, args) and proto != "TLSv1.2":
                problems.append(f"the client held to TLS 1.2 negotiated {proto}")
        info["check_resumed"] = resumed
        if scenario in ("tls-full", "tls-resume") and resumed != resume:
            problems.append(f"a connection offering the previous one's session was "
                            f"{'not ' if not resumed else ''}resumed (session resumption is "
                            f"{'on' if resume else 'off'} in this scenario)")
        tiers0 = b.portico_tiers(b.PORTS[peer]) if peer == "portico" else None
        hs0 = portico_tls(b, b.PORTS[peer]) if peer == "portico" else None
        if scenario == "h2-hits":
            r = run_h2load(b, tport, paths, args.duration, daemon.pid, origin.pid, tmp)
        elif h2c:
            r = run_h2load(b, H2C_PORTS[peer], paths, args.duration, daemon.pid, origin.pid, tmp,
                           scheme="http")
        else:
            headers = ["Connection: close"] if scenario in ("tls-full", "tls-resume") else []
            r = b.run_wrk(tport, "/", ctx["scripts"]["hits"], args.duration, args.connections,
                          daemon.pid, origin.pid, headers, scheme="https",
                          env=wrk_env(scenario, tmp, args))
        r["rss_mib"] = b.tree_rss_kib(daemon.pid) / 1024
        b.check_portico_hits(b.PORTS[peer], tiers0, r, info, problems)
        if hs0 is not None:
            hs1 = portico_tls(b, b.PORTS[peer])
            full, res = hs1["full"] - hs0["full"], hs1["resumed"] - hs0["resumed"]
            info["handshakes"] = f"{full:,} full, {res:,} resumed"
            if scenario == "tls-full" and (res or full < r["requests"] * 0.95):
                problems.append(f"Portico counted {full:,} full and {res:,} resumed handshakes "
                                f"for {r['requests']:,} requests: want one full each")
            if scenario == "tls-resume" and res < r["requests"] * 0.95:
                problems.append(f"Portico counted {full:,} full and {res:,} resumed handshakes "
                                f"for {r['requests']:,} requests: want nearly all resumed")
        r["origin_during"] = r["origin_requests"]
        b.check_hit_sample(warm_port, paths, info, problems, tls=not h2c)
        if r["origin_during"] != 0:
            problems.append(f"origin saw {r['origin_during']} requests during a hit run")
        b.check_completed(r, problems, "h2load" if scenario in H2LOAD else "wrk")
        r.update(info)
        r["problems"] = problems
        r["summary"] = (f"{r['rps']:,.0f} req/s, p50 {r['p50_us']/1000:.2f} ms, "
                        f"p99 {r['p99_us']/1000:.2f} ms, proxy CPU {r['proxy_cpu']:.2f}, "
                        f"{r['rps_per_core']:,.0f} req/s/core, errors {r['errors']}, "
                        f"{info['tls']}"
                        + ("" if h2c else f", resumption check {'resumed' if resumed else 'full'}")
                        + (f", handshakes {info['handshakes']}" if "handshakes" in info else "")
                        + f", other CPU {r['other_cpu']:.2f}, X-Cache {info['sample_hits']}")
        if not daemon.alive():
            raise RuntimeError(f"{peer} died during the run: {daemon.tail()}")
        return r
    finally:
        daemon.stop()


def run_roundtrips(b, peer, tmp, args):
    """The Oracle experiment against `peer`: for each certificate kind and
    session caching off then on, a fresh server; for TLS 1.2 and 1.3, many
    sets of 5 connections one after another (the first of a set offers no
    session, each next one offers its predecessor's). Elapsed time per set."""
    sets = ROUNDTRIP_SETS_SMOKE if args.smoke else ROUNDTRIP_SETS
    cells, problems = [], []
    t_cpu = time.time()
    busy0, self0, server_s = b.machine_busy_jiffies(), time.process_time(), 0.0
    for kind in ("rsa", "ec"):
        for resume in (False, True):
            daemon = start(b, peer, tmp, args, kind, resume)
            try:
                jiffies0 = b.tree_jiffies(daemon.pid)
                for label, version in (("1.2", ssl.TLSVersion.TLSv1_2),
                                       ("1.3", ssl.TLSVersion.TLSv1_3)):
                    ctx = b.client_tls(version)
                    round_trip(TLS_PORTS[peer], ctx)          # the page is cached now
                    times, resumed, wrong = [], 0, 0
                    for _ in range(sets):
                        sess = None
                        t0 = time.perf_counter()
                        for i in range(ROUNDTRIPS):
                            status, n, reused, sess, _, _ = round_trip(TLS_PORTS[peer], ctx, sess)
                            wrong += status != 200 or n != b.PAGE_SIZE
                            resumed += reused
                        times.append(time.perf_counter() - t0)
                    want = sets * (ROUNDTRIPS - 1) if resume else 0
                    if resumed != want:
                        problems.append(f"{kind} TLS {label} caching {'on' if resume else 'off'}: "
                                        f"{resumed} connections resumed, want {want}")
                    if wrong:
                        problems.append(f"{kind} TLS {label}: {wrong} responses not the "
                                        f"{b.PAGE_SIZE}-byte page")
                    times.sort()
                    cells.append({"key": kind, "tls": label, "caching": resume,
                                  "median_ms": statistics.median(times) * 1000,
                                  "p90_ms": times[int(0.9 * (len(times) - 1))] * 1000,
                                  "sets": sets, "resumed": resumed})
                server_s += (b.tree_jiffies(daemon.pid) - jiffies0) / b.CLK_TCK
                if not daemon.alive():
                    raise RuntimeError(f"{peer} died during the run: {daemon.tail()}")
            finally:
                daemon.stop()
    # Everything else on the machine, in cores: what neither the server nor
    # this client used (the starts and stops of the servers count as other).
    wall = time.time() - t_cpu
    busy = (b.machine_busy_jiffies() - busy0) / b.CLK_TCK
    other = max(0.0, busy - server_s - (time.process_time() - self0)) / wall
    r = {"cells": cells, "problems": problems, "other_cpu": other}
    show = [c for c in cells if c["key"] == "rsa"]
    r["summary"] = "; ".join(f"RSA TLS {c['tls']} caching {'on' if c['caching'] else 'off'}: "
                             f"{c['median_ms']:.1f} ms" for c in show)
    return r


def report(b, scenario, results, peers, args):
    if scenario == "tls-roundtrips":
        return report_roundtrips(b, results, peers, args)
    L, extra = b.report_wrk(scenario, results, peers, args)
    if scenario in H2LOAD:
        load = (f"- Load: `h2load -t1 -c{H2_CONNECTIONS} -m{H2_STREAMS} -D{args.duration}` over "
                + ("cleartext HTTP/2 (h2c, prior knowledge)" if scenario == "h2c-hits"
                   else "TLS (ALPN h2)") + f" on CPU {b.LOAD_CPU}")
    else:
        load = (f"- Load: `wrk -t1 -c{args.connections} -d{args.duration}s --latency"
                + (" -H 'Connection: close'" if scenario in ("tls-full", "tls-resume") else "")
                + f" https://...` on CPU {b.LOAD_CPU}"
                + (" with `OPENSSL_CONF` setting `MaxProtocol = TLSv1.2`"
                   if client_max(scenario, args) else ""))
    extra[0] = (load + f" (with the origin); proxy under test on CPU {b.PROXY_CPU}; "
                f"{args.rounds} interleaved round(s), fresh cache per run")
    key = {"rsa": "RSA 2048", "ec": "ECDSA P-256"}[args.tls_key]
    suites = ", ".join(f"{p} {results[p][0].get('tls', '?')}" for p in peers if results[p])
    notes = (["No TLS: Portico's listener with `h2c = true`, nginx's `listen ... http2` "
              "without `ssl`, each on a port of its own; warmed and sampled over HTTP/1 "
              "(Portico on its h2c port, which speaks both and whose cache keys carry the "
              "port; nginx on its plain port, whose cache the `http2` port shares).\n"]
             if scenario == "h2c-hits" else
             [f"Same {key} certificate on every server (self-signed, made by `openssl req`); "
             + ("TLS 1.2 and 1.3 offered by the servers, **the client held to TLS 1.2** "
                "(`--tls-max 1.2`: a TLS 1.2 session resumes by its ticket or session ID "
                "alone, where TLS 1.3's `psk_dhe_ke` runs a key exchange again), "
                if client_max(scenario, args) else "TLS 1.2 and 1.3 offered, ")
             + f"the same cipher suites in the same order (Portico's "
             f"default: AES-128-GCM, ChaCha20-Poly1305, AES-256-GCM, the server's choice; "
             f"nginx `ssl_prefer_server_ciphers on` with that order), negotiated with the "
             f"harness's client: {suites}; "
             + ("session resumption **off** on every server (Portico `[tls] session_tickets = "
                "false`, `session_cache_entries = 0`; nginx `ssl_session_cache off`, "
                "`ssl_session_tickets off`), so each request pays a full handshake."
                if scenario == "tls-full" else
                "session resumption on (Portico's `[tls]` defaults: tickets and a 10,000-entry "
                "session cache; nginx `ssl_session_cache shared:SSL:10m`, `ssl_session_timeout "
                "1d`, `ssl_session_tickets on`).") + "\n"])
    if scenario in ("tls-full", "tls-resume"):
        hs = [f"{p} round {i + 1}: {r['handshakes']}" for p in peers
              for i, r in enumerate(results[p]) if "handshakes" in r]
        notes.append("Resumption check (a connection offering the previous one's session): " +
                     ", ".join(f"{p} {'resumed' if results[p][0].get('check_resumed') else 'full'}"
                               for p in peers if results[p]) +
                     (". Portico's handshake counters over the runs: " + "; ".join(hs)
                      if hs else "") + ".\n")
    if scenario in ("tls-full", "tls-resume"):
        cycle = ", ".join(f"{p} {args.connections / statistics.median(r['rps'] for r in results[p]) * 1000:.1f} ms"
                          for p in peers if results[p])
        notes.append("wrk starts a request's clock when it writes the request, after the "
                     "handshake, so its p50 and p99 leave the handshake out (a server that "
                     "finishes handshakes first and answers later looks slow; one that answers "
                     "first looks fast). What a client waits for a new connection's answer, "
                     "connect to response, is on average connections / req/s (Little's law): "
                     f"{cycle}.\n")
    MEDIANS[scenario] = {p: statistics.median(r["rps_per_core"] for r in results[p])
                         for p in peers if results[p]}
    if scenario == "tls-resume" and "tls-full" in MEDIANS:
        full = MEDIANS["tls-full"]
        rows = [f"{p} {MEDIANS[scenario][p] / full[p]:.1f}x ({full[p]:,.0f} → "
                f"{MEDIANS[scenario][p]:,.0f} req/s per core)"
                for p in MEDIANS[scenario] if full.get(p)]
        if rows:
            notes.append("Resumed against full handshakes (this run's `tls-full`, requests per "
                         "proxy core): " + ", ".join(rows) + ". The goal is Portico at 5x.\n")
    return notes + L, extra


def report_roundtrips(b, results, peers, args):
    sets = ROUNDTRIP_SETS_SMOKE if args.smoke else ROUNDTRIP_SETS
    extra = [f"- Load: the harness's Python client (OpenSSL, certificate not verified) on CPU "
             f"{b.LOAD_CPU}, server on CPU {b.PROXY_CPU}: {sets} sets of {ROUNDTRIPS} "
             f"connections one after another per cell; each connection: connect, handshake "
             f"(offering the previous connection's session), `GET /page` (the cached "
             f"{b.PAGE_SIZE:,}-byte page, whole), close"]
    L = ["The Oracle HTTP Server tuning guide: \"in a simple test to connect and disconnect to "
         "an SSL-enabled server, the elapsed time for 5 connections was 11.4 seconds without SSL "
         "session caching. With SSL session caching enabled, the elapsed time for 5 round trips "
         "was 1.9 seconds\" (6.0x). The same experiment on loopback: `without` is the server "
         "with session resumption off (Portico `session_tickets = false`, "
         "`session_cache_entries = 0`; nginx `ssl_session_cache off`, `ssl_session_tickets "
         "off`), `with` its defaults (Portico) or `shared:SSL:10m` and tickets (nginx); the "
         "client offers a session either way. Median (and 90th percentile) elapsed time of a "
         "set of 5, over rounds the median of the medians.\n",
         "| certificate | TLS | server | without caching, ms (p90) | with caching, ms (p90) | "
         "without / with | resumed |",
         "|---|---|---|---:|---:|---:|---:|",
         f"| (Oracle HTTP Server, 2000s hardware, its network) | ? | Oracle HTTP Server | "
         f"{ORACLE[0] * 1000:,.0f} | {ORACLE[1] * 1000:,.0f} | {ORACLE[0] / ORACLE[1]:.1f}x | — |"]
    names = {"rsa": "RSA 2048", "ec": "ECDSA P-256"}
    for kind in ("rsa", "ec"):
        for tls in ("1.2", "1.3"):
            for p in peers:
                def cell(caching):
                    cs = [c for r in results[p] for c in r["cells"]
                          if c["key"] == kind and c["tls"] == tls and c["caching"] == caching]
                    return cs
                off, on = cell(False), cell(True)
                if not off or not on:
                    continue
                m_off = statistics.median(c["median_ms"] for c in off)
                m_on = statistics.median(c["median_ms"] for c in on)
                p_off = statistics.median(c["p90_ms"] for c in off)
                p_on = statistics.median(c["p90_ms"] for c in on)
                res = sum(c["resumed"] for c in on)
                tot = sum(c["sets"] * ROUNDTRIPS for c in on)
                L.append(f"| {names[kind]} | {tls} | {p} | {m_off:.2f} ({p_off:.2f}) | "
                         f"{m_on:.2f} ({p_on:.2f}) | {m_off / m_on:.1f}x | {res:,} of {tot:,} |")
    L.append("")
    L.append("`resumed`: connections the client saw resumed with caching on (the first of each "
             "set of 5 cannot be); with caching off none may be, and none was (else the run "
             "fails its check). Loopback takes the network out: what is left is the handshake's "
             "computation on both ends, which is what session caching saves; the Oracle figures "
             "include a 2000s network and CPUs, so only the ratio compares.\n")
    return L, extra
