#!/usr/bin/env python3
"""Portico benchmark suite. Entry point: bench/run (see bench/README.md).

Runs Portico, nginx (at its latency and at its throughput settings), Varnish,
Squid, HAProxy and Apache Traffic Server as caching reverse proxies for the same
origin (nginx serving a generated object set from a work dir) on loopback
ports, pins the proxy under test to CPU 0 and the load generator (wrk, or oha
for `rate`), the origin and this script to CPU 1, interleaves the runs and
writes medians to bench/results/<scenario>.md (.json, .png). Scenarios: hot,
hits, disk-hits, close, miss (wrk), idle (sockets from this script), rate (oha), rules
(Portico only, wrk). What each measures: bench/README.md. Peer
configurations: bench/peers/*.md.
"""
import argparse
import base64
import asyncio
import concurrent.futures
import contextlib
import datetime
import http.client
import json
import os
import random
import resource
import select
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import soak  # noqa: E402  (bench/soak.py: the soak scenario's origin, load and rule)
import ldap  # noqa: E402  (bench/ldap.py: the auth-ldap scenario's slapd and LDAP client)
import array_bench  # noqa: E402  (bench/array_bench.py: the array scenario)
import hitratio_bench  # noqa: E402  (bench/hitratio_bench.py: the hitratio scenario)
import polygraph_bench  # noqa: E402  (bench/polygraph_bench.py: the polygraph scenario)
import tls_bench  # noqa: E402  (bench/tls_bench.py: the TLS and HTTP/2 scenarios)
REPO = os.path.dirname(HERE)
PEERS_DIR = os.path.join(HERE, "peers")

SCENARIOS = {
    "hot": "the single 38,314-byte page, keep-alive, 64 connections",
    "hits": "uniform random over 10,000 cached objects (exp. sizes, mean 13 KiB), keep-alive, "
            "64 connections",
    "close": "hits without keep-alive: uniform random over the 10,000 cached objects, "
             "a new connection per request (Connection: close), 64 connections",
    "disk-hits": "hits over the 10,000 objects, 16 MiB memory caches: hits from the disk "
                 "caches (page cache), keep-alive, 64 connections",
    "miss": "every request a miss: uniform random over the 10,000 objects served by the origin "
            "with Cache-Control: no-store, keep-alive, 64 connections",
    "store": "every request a miss that is stored: one of the 10,000 objects (fresh for 120 s) "
             "under a query string no request used before, keep-alive, 64 connections",
    "busy": "hits as in `hits` from 1,000 keep-alive connections at once (issue 17 item 7: "
            "the tail when many connections are busy)",
    "idle": "memory per idle keep-alive connection: 10,000 connections held open, "
            "before any request and after one request each",
    "rate": "open-loop fixed-rate load (oha) at 25-150% of the closed-loop peak, hits over "
            "the 10,000 objects (also issue 6's overload benchmark)",
    "rules": "Portico only: 10, 100, 1,000, 10,000 [[rule]] entries, every request matching "
             "the last rule (the Sun proxy's assign-name table)",
    "auth": "Portico only: cache hits on the single page from clients sending Basic credentials "
            "(a bcrypt htpasswd entry, verified once, then from the user cache) against the same "
            "hits without [auth], interleaved",
    "auth-ldap": "Portico only: first-login latency against a local OpenLDAP slapd (user cache "
                 "miss: search, bind, group search) against the directory's own time for the "
                 "same operations and against logins found in the user cache",
    "array": "Portico only: a 3-node proxy array (CARP) against one node with the same total "
             "memory: hit ratio of one Zipf request stream, and the cost of the extra hop through "
             "a member that does not own the URL",
    "hitratio": "hit ratio and byte hit ratio at equal budgets (64 MiB memory + 1 GiB disk): "
                "one Zipf stream over 1,000,000 URLs (exp. sizes, mean 13 KiB, 0.1% of 1-100 MiB) "
                "from a counting origin",
    "polygraph": "response times of hits under a PolyMix-like open-loop load (55% offered hits, "
                 "exp. 13 KiB bodies, origin think time normal(2.5 s, 1 s)): mean, median, p90, "
                 "p99 of hits, where a hit can wait on an in-flight miss",
    "soak": "Portico only: mixed open-loop load (hits, misses, revalidations, CONNECT, aborted "
            "clients, origin resets and stalls), an hour by default; RSS, fds, connections and disk "
            "use must not trend upward, every body must be the origin's",
}
SCENARIOS.update(tls_bench.SCENARIOS)
# Run only when named (soak: an hour; hitratio: ~15 min a round; polygraph: ~1.5 min a proxy) or by --smoke: not part of a plain `bench/run`.
NAMED_ONLY = ("soak", "hitratio", "polygraph")
WRK_SCENARIOS = ("hot", "hits", "close", "miss", "store", "disk-hits", "busy")
# Scenarios that serve the 10,000 cached objects at random (wrk script `hits`).
HIT_SCENARIOS = ("hits", "close", "disk-hits", "busy")
BUSY_CONNECTIONS = 1000
RULE_COUNTS = [10, 100, 1000, 10000]
# The Sun proxy's assign-name table (Sun Java System Web Proxy Server 4.0.11 Performance
# Tuning, Sizing, and Scaling Guide, chapter 6 "Scalability Studies"):
# response time in ms for a single request, cache enabled, content server on the local network.
SEED_RULES_MS = {10: 1.05, 100: 1.45, 1000: 4.3, 10000: 32.5}
RATE_STEPS = [25, 50, 75, 100, 120, 150]   # percent of the closed-loop peak
# nginx runs twice: `nginx` with its latency settings (tcp_nopush off) and `nginx-tput` with
# its throughput settings (tcp_nopush on, open_file_cache); the faster counts as the peer.
PEERS = ["portico", "nginx", "nginx-tput", "varnish", "squid", "haproxy", "ats"]
PORTS = {"origin": 28080, "portico": 28081, "nginx": 28082, "varnish": 28083, "squid": 28084,
         "haproxy": 28085, "ats": 28086, "nginx-tput": 28087}
# Scenarios a peer sits out, and why (said in the log and in the report).
SITS_OUT = {
    "haproxy": {"disk-hits": "HAProxy's cache is in shared memory only (no disk tier): with a "
                             "memory cache as small as the others' it would miss, not hit "
                             "(bench/peers/haproxy.md)"},
}
_NO_TLS = {
    "varnish": "open-source Varnish does not terminate TLS (Varnish Software's hitch does, as a "
               "separate process in front)",
    "squid": "Debian's squid package is built without TLS (squid-openssl has it): an HTTPS "
             "accelerator (https_port) is not configured here yet",
    "haproxy": "terminates TLS and HTTP/2 but is not configured for these scenarios yet: the "
               "TLS scenarios compare Portico with nginx, same certificate and session settings",
    "ats": "terminates TLS and HTTP/2 but is not configured for these scenarios yet: the TLS "
           "scenarios compare Portico with nginx, same certificate and session settings",
}
for _p, _why in _NO_TLS.items():
    for _s in tls_bench.SCENARIOS:
        SITS_OUT.setdefault(_p, {})[_s] = _why
for _p, _why in hitratio_bench.SITS_OUT.items():
    SITS_OUT.setdefault(_p, {})["hitratio"] = _why
for _p, _why in polygraph_bench.SITS_OUT.items():
    SITS_OUT.setdefault(_p, {})["polygraph"] = _why
# disk-hits: every proxy's memory cache, far smaller than the 127 MiB object set.
DISK_HITS_MEMORY_MIB = 16
PROXY_CPU = "0"   # proxy under test
LOAD_CPU = "1"    # wrk, origin, this script

SEED = 20260314
PAGE_SIZE = 38314
N_OBJECTS = 10000
MEAN_SIZE = 13 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")

APT_PACKAGES = {"nginx": "nginx-light", "varnishd": "varnish", "squid": "squid",
                "wrk": "wrk", "curl": "curl", "taskset": "util-linux",
                "htpasswd": "apache2-utils", "slapd": "slapd", "ldapadd": "ldap-utils",
                "haproxy": "haproxy", "traffic_server": "trafficserver",
                "h2load": "nghttp2-client", "openssl": "openssl"}
# auth scenario: the one user of the htpasswd file (bcrypt, cost AUTH_COST) and its password.
AUTH_USER, AUTH_PASSWORD, AUTH_COST = "bench", "bench-secret-1", 10
AUTH_SUBJECTS = ["anonymous", "authenticated"]
# auth-ldap scenario: the directory's port and how many users log in for the first time.
LDAP_PORT, LDAP_USERS, LDAP_USERS_SMOKE = 28389, 300, 30
PEER_COMMANDS = {"nginx": "nginx", "nginx-tput": "nginx", "varnish": "varnishd", "squid": "squid",
                 "haproxy": "haproxy", "ats": "traffic_server"}


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- setup

def have(cmd):
    return shutil.which(cmd) is not None or os.path.exists(f"/usr/sbin/{cmd}")


def ensure_installed(peers, extra=()):
    """apt-get what is missing: the origin (nginx), wrk, curl, taskset, and the
    peers asked for (so a Portico-only run does not install Varnish or Squid);
    `extra` commands too (htpasswd for the auth scenario). The harness's own
    needs must install; a peer's package that cannot be installed only makes
    that peer sit out (drop_missing_peers says so)."""
    cmds = ["nginx", "wrk", "curl", "taskset"] + list(extra)
    peer_cmds = [PEER_COMMANDS[p] for p in peers if p in PEER_COMMANDS]
    missing = sorted({APT_PACKAGES[c] for c in cmds if not have(c)})
    missing_peers = sorted({APT_PACKAGES[c] for c in peer_cmds if not have(c)} - set(missing))
    if not missing and not missing_peers:
        return
    if os.geteuid() != 0:
        if missing:
            sys.exit(f"bench: missing {' '.join(missing)} and not root: apt-get install them first")
        return   # the peers' packages: drop_missing_peers skips those peers, saying so
    log(f"installing {' '.join(missing + missing_peers)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    p = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing +
                       missing_peers, env=env, stdout=subprocess.DEVNULL)
    if p.returncode != 0:
        if not missing_peers:
            sys.exit(f"bench: apt-get install {' '.join(missing)} failed")
        # Perhaps only a peer's package failed: the harness's own needs alone, then each
        # peer package alone; a peer whose package did not install sits out.
        if missing:
            subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] +
                           missing, check=True, env=env, stdout=subprocess.DEVNULL)
        for pkg in missing_peers:
            if subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                               pkg], env=env, stdout=subprocess.DEVNULL).returncode != 0:
                log(f"apt-get install {pkg} failed: the peers it provides sit out")
    # Debian's postinst may start the system services (it does not in containers with
    # policy-rc.d); stop them so nothing but our private instances runs.
    for svc in ("nginx", "varnish", "squid", "haproxy", "trafficserver"):
        if shutil.which("service") is None:
            break
        subprocess.run(["service", svc, "stop"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def drop_missing_peers(peers):
    """Peers whose program is not installed (--no-install, or its package did
    not install) sit out with a clear message instead of failing every run."""
    kept = []
    for p in peers:
        c = PEER_COMMANDS.get(p)
        if c and not have(c):
            log(f"peer {p}: `{c}` not installed (Debian package {APT_PACKAGES[c]}): skipped")
        else:
            kept.append(p)
    return kept


def find_oha():
    cargo_home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    for c in (shutil.which("oha"), os.path.join(cargo_home, "bin", "oha")):
        if c and os.access(c, os.X_OK):
            return c
    return None


def ensure_oha(install):
    """oha (open-loop fixed-rate load for `rate`), from crates.io with cargo
    install when missing (a few minutes of compiling, once)."""
    oha = find_oha()
    if oha or not install:
        return oha
    log("installing oha: cargo install oha --locked (once; compiles for a few minutes)")
    p = subprocess.run(["cargo", "install", "oha", "--locked"])
    if p.returncode != 0:
        log("cargo install oha failed: the rate scenario cannot run")
        return None
    return find_oha()


def build_portico():
    log("cargo build --release -j1")
    subprocess.run(["cargo", "build", "--release", "-j1"], cwd=REPO, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    return os.path.join(target, "release", "portico")


def generate_objects(root):
    """The object set: /page (38,314 bytes) and /o/00000../o/09999 with
    exponentially distributed sizes (mean 13 KiB), fixed seed and mtime so
    Last-Modified and ETag are the same on every run."""
    rng = random.Random(SEED)
    block = rng.randbytes(1 << 20)
    os.makedirs(os.path.join(root, "o"))
    mtime = 1767225600  # 2026-01-01T00:00:00Z

    def write(path, size):
        off = rng.randrange(0, len(block) - min(size, len(block)) + 1)
        if off + size <= len(block):   # always, for these sizes (same bytes, no copy of the block)
            data = block[off:off + size]
        else:
            data = (block * (size // len(block) + 2))[off:off + size]
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, (mtime, mtime))

    write(os.path.join(root, "page"), PAGE_SIZE)
    sizes = []
    paths = []
    for i in range(N_OBJECTS):
        size = max(1, int(round(rng.expovariate(1.0 / MEAN_SIZE))))
        name = f"o/{i:05d}"
        write(os.path.join(root, name), size)
        sizes.append(size)
        paths.append("/" + name)
    return paths, sizes


# ---------------------------------------------------------------- processes

def proc_tree(root_pid):
    """PIDs of root_pid and all its descendants."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        ppid = int(s[s.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root_pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_jiffies_split(root_pid):
    """User and system CPU of the process tree under root_pid, in jiffies."""
    user = system = 0
    for p in proc_tree(root_pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2:].split()
        user += int(fields[11])  # utime
        system += int(fields[12])  # stime
    return user, system


def tree_jiffies(root_pid):
    return sum(tree_jiffies_split(root_pid))


def machine_busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4]  # minus idle, iowait


def tree_rss_kib(root_pid, field="VmRSS"):
    """The RSS of a process tree in KiB (summed over its processes); with
    field="VmHWM", the sum of each process's peak RSS so far."""
    total = 0
    for p in proc_tree(root_pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(field):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


class Daemon:
    """A process started in its own session (setsid) pinned with taskset; its
    whole tree inherits the affinity. Stopped by its pid / process group."""

    def __init__(self, name, argv, cpu, workdir, env=None):
        self.name = name
        self.logpath = os.path.join(workdir, f"{name}.out")
        self.logf = open(self.logpath, "ab")
        self.proc = subprocess.Popen(["taskset", "-c", cpu] + argv, stdin=subprocess.DEVNULL,
                                     stdout=self.logf, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     env=dict(os.environ, **env) if env else None)
        self.pid = self.proc.pid  # taskset execs the daemon: same pid

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of its process group (e.g. Varnish's child).
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self.logf.close()

    def tail(self, n=15):
        try:
            with open(self.logpath, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def port_free(port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def client_tls(version=None):
    """The harness's TLS client context (the TLS scenarios): the bench's
    self-signed certificate is not verified; `version` (ssl.TLSVersion)
    pins the protocol version."""
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.check_hostname = False
    c.verify_mode = ssl.CERT_NONE
    if version:
        c.minimum_version = c.maximum_version = version
    return c


def connect(port, tls=False):
    """A keep-alive connection to a proxy port: plain, or HTTPS (`tls`)."""
    if tls:
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=client_tls())
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def http_get(port, path, conn=None, headers=None, tls=False):
    own = conn is None
    if own:
        conn = connect(port, tls)
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    body = r.read()
    headers = {k.lower(): v for k, v in r.getheaders()}
    if own:
        conn.close()
    return r.status, headers, body


def wait_ready(port, daemon, timeout=20, path="/page", headers=None):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if daemon is not None and not daemon.alive():
            raise RuntimeError(f"{daemon.name} exited: {daemon.tail()}")
        try:
            status, _, body = http_get(port, path, headers=headers)
            if status == 200 and len(body) == PAGE_SIZE:
                return
            last = f"status {status}, {len(body)} bytes"
        except OSError as e:
            last = str(e)
        time.sleep(0.2)
    raise RuntimeError(f"port {port} not ready after {timeout}s: {last}; "
                       f"{daemon.tail() if daemon else ''}")


# ---------------------------------------------------------------- configs

def origin_conf(d, data):
    return f"""# Origin: nginx serving the generated object set (bench/peers/origin.md)
worker_processes 1;
daemon off;
pid {d}/origin.pid;
error_log {d}/origin-error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    open_file_cache max=20000 inactive=600s;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy_temp;
    server {{
        listen 127.0.0.1:{PORTS['origin']} backlog=4096;
        root {data};
        location / {{ add_header Cache-Control "max-age=120"; }}
        # miss scenario: the same files under /ns/, never stored by a shared cache
        location /ns/ {{ alias {data}/; add_header Cache-Control "no-store"; }}
        # rules scenario: /r00042/page is /page (the route prefix is dropped)
        location ~ ^/r[0-9]+/ {{
            rewrite ^/r[0-9]+(/.*)$ $1 break;
            add_header Cache-Control "max-age=120";
        }}
        location = /__status {{ stub_status; }}
    }}
}}
"""


NGINX_TCP_NOPUSH = "off"


def nginx_conf(d, tput=False, port=None):
    """`tput`: nginx's throughput settings (the nginx-tput peer): tcp_nopush on
    (head and body in full packets), open_file_cache (cache files' descriptors
    kept open between hits) and `listen ... deferred` (TCP_DEFER_ACCEPT, which
    Portico's listeners have by default); otherwise its latency settings
    (tcp_nopush off)."""
    nopush = "on" if tput else NGINX_TCP_NOPUSH
    ofc = ("\n    open_file_cache max=20000 inactive=60s;"
           "\n    open_file_cache_valid 60s;" if tput else "")
    port = port or PORTS["nginx-tput" if tput else "nginx"]
    return f"""# Peer: nginx caching reverse proxy (bench/peers/nginx.md), {"throughput" if tput else "latency"} settings
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush {nopush};{ofc}
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy_temp;
    proxy_cache_path {d}/cache levels=1:2 keys_zone=bench:64m max_size=2g inactive=10m use_temp_path=off;
    upstream origin {{
        server 127.0.0.1:{PORTS['origin']};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096{" deferred" if tput else ""};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
            proxy_cache_lock on;
            add_header X-Cache $upstream_cache_status;
        }}
    }}
}}
"""


def squid_conf(d, disk=False):
    """`disk` (disk-hits): a 16 MB memory cache in front of an aufs cache_dir
    under the work dir, instead of the 1 GB memory-only cache."""
    if disk:
        mem = (f"cache_mem {DISK_HITS_MEMORY_MIB} MB\n"
               f"cache_dir aufs {d}/cache 1024 16 256\n")
    else:
        mem = "cache_mem 1024 MB\n"
    return f"""# Peer: Squid accelerator (bench/peers/squid.md)
http_port 127.0.0.1:{PORTS['squid']} accel defaultsite=127.0.0.1:{PORTS['origin']} no-vhost
cache_peer 127.0.0.1 parent {PORTS['origin']} 0 no-query no-digest no-netdb-exchange originserver name=origin
cache_peer_access origin allow all
never_direct allow all
http_access allow all
workers 1
{mem}maximum_object_size_in_memory 1 MB
collapsed_forwarding on
pinger_enable off
icp_port 0
htcp_port 0
access_log none
cache_store_log none
cache_log {d}/cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
netdb_filename none
client_db off
logfile_rotate 0
shutdown_lifetime 1 seconds
max_filedescriptors 65536
"""


def haproxy_conf(d):
    """HAProxy 2.6 with its `cache` (bench/peers/haproxy.md): one thread, the
    cache in shared memory (1 GiB, objects up to 1 MiB, at most max-age 120 s
    as the origin says), X-Cache from res.cache_hit for the harness's sample.
    ulimit-n and `no strict-limits`: the open-files limit the harness has;
    HAProxy would otherwise ask for 2 x maxconn + a margin (40,025) and refuse
    to start where the hard limit is lower (20,000 on the bench machine),
    although the idle scenario's 10,000 connections need only one each."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return f"""# Peer: HAProxy with its cache (bench/peers/haproxy.md)
global
    nbthread 1
    maxconn 20000
    ulimit-n {nofile}
    no strict-limits
    stats socket {d}/haproxy.sock mode 600 level admin

defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 120s
    timeout http-request 120s
    timeout http-keep-alive 120s
    timeout server 30s

cache bench
    total-max-size 1024
    max-object-size 1048576
    max-age 120

frontend fe
    bind 127.0.0.1:{PORTS['haproxy']} backlog 4096 defer-accept
    maxconn 20000
    default_backend origin
    http-after-response set-header X-Cache %[res.cache_hit,iif(HIT,MISS)]

backend origin
    http-request cache-use bench
    http-response cache-store bench
    server origin 127.0.0.1:{PORTS['origin']} pool-max-conn 64
"""


def ats_files(d, disk=False):
    """Apache Traffic Server 9.2, a private instance (bench/peers/ats.md): the
    config files in d/etc, a runroot.yaml pointing every directory at d, a RAM
    cache (1 GiB; disk-hits: 16 MiB) in front of a 1 GiB cache file in d/cache.
    Returns the runroot.yaml path (the TS_RUNROOT environment variable)."""
    etc = os.path.join(d, "etc")
    for sub in ("etc", "run", "log", "cache"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
        os.chmod(os.path.join(d, sub), 0o777)
    ram = (DISK_HITS_MEMORY_MIB if disk else 1024) << 20
    records = f"""# Peer: Apache Traffic Server (bench/peers/ats.md)
CONFIG proxy.config.http.server_ports STRING {PORTS['ats']}:ipv4:ip-in=127.0.0.1
CONFIG proxy.config.exec_thread.autoconfig INT 0
CONFIG proxy.config.exec_thread.limit INT 1
CONFIG proxy.config.exec_thread.affinity INT 0
CONFIG proxy.config.accept_threads INT 0
CONFIG proxy.config.task_threads INT 1
CONFIG proxy.config.admin.user_id STRING #-1
CONFIG proxy.config.log.logging_enabled INT 0
CONFIG proxy.config.reverse_proxy.enabled INT 1
CONFIG proxy.config.url_remap.remap_required INT 1
CONFIG proxy.config.http.insert_response_via_str INT 2
CONFIG proxy.config.cache.ram_cache.size INT {ram}
CONFIG proxy.config.cache.ram_cache_cutoff INT 4194304
CONFIG proxy.config.http.cache.required_headers INT 2
CONFIG proxy.config.http.keep_alive_no_activity_timeout_in INT 120
CONFIG proxy.config.http.accept_no_activity_timeout INT 120
CONFIG proxy.config.net.connections_throttle INT 30000
CONFIG proxy.config.net.max_connections_in INT 30000
CONFIG proxy.config.http.server_session_sharing.pool STRING thread
"""
    files = {
        "records.config": records,
        "remap.config": f"map / http://127.0.0.1:{PORTS['origin']}/\n",
        "storage.config": f"{d}/cache 1024M\n",
        "plugin.config": "",   # no plugins
        "ip_allow.yaml": "ip_allow:\n  - apply: in\n    ip_addrs: 127.0.0.0/8\n    action: allow\n"
                         "  - apply: out\n    ip_addrs: 127.0.0.0/8\n    action: allow\n",
    }
    for name in ("logging.yaml", "cache.config", "hosting.config", "volume.config",
                 "parent.config", "splitdns.config", "socks.config", "ssl_multicert.config",
                 "sni.yaml", "strategies.yaml"):
        files.setdefault(name, "")
    for name, text in files.items():
        with open(os.path.join(etc, name), "w") as f:
            f.write(text)
    bf = "/etc/trafficserver/body_factory"
    if os.path.isdir(bf):
        shutil.copytree(bf, os.path.join(etc, "body_factory"))
    runroot = os.path.join(d, "runroot.yaml")
    with open(runroot, "w") as f:
        f.write("".join(f"{k}: {v}\n" for k, v in (
            ("prefix", "/usr"), ("exec_prefix", "/usr"), ("bindir", "/usr/bin"),
            ("sbindir", "/usr/sbin"), ("sysconfdir", etc),
            ("datadir", "/usr/share/trafficserver"), ("includedir", "/usr/include"),
            ("libdir", "/usr/lib/trafficserver"),
            ("libexecdir", "/usr/lib/trafficserver/modules"),
            ("localstatedir", f"{d}/run"), ("runtimedir", f"{d}/run"),
            ("logdir", f"{d}/log"), ("cachedir", f"{d}/cache"))))
    return runroot


def portico_conf(d, rules=None, rule_kind="path"):
    """Portico's config as a dict (written as TOML by toml_dump). `rules`: None
    for the one catch-all route, or N for the rules scenario: N [[rule]]
    entries with distinct prefixes /r00000/.., all but the last routed to a
    dead decoy upstream, so only a match of the LAST rule gives a 200."""
    conf = {
        "server": {"workers": 1},
        "listener": [{"address": f"127.0.0.1:{PORTS['portico']}", "mode": "reverse"}],
        # idle scenario: connections must stay open (silent or idle) while memory is read
        "keepalive": {"max_requests": 0, "timeout": "120s", "max_connections": 20000},
        "limits": {"header_timeout": "120s"},
        "upstream": [{"name": "origin", "servers": [f"127.0.0.1:{PORTS['origin']}"]}],
        # open_files: as many cache files held open as nginx-tput's open_file_cache
        # max=20000 (the default, a quarter of the open-files limit, would hold 4,984
        # with this machine's 20,000: fewer than the 10,000 objects of hits/disk-hits)
        "cache": {"memory": "1GiB", "dir": f"{d}/cache", "open_files": 20000},
        "log": {"access": "", "level": "warn"},
    }
    if rules is None:
        conf["rule"] = [{"upstream": "origin"}]
    else:
        conf["upstream"].append({"name": "decoy", "servers": ["127.0.0.1:9"]})
        conf["rule"] = []
        for i in range(rules):
            rule = {"path": f"/r{i:05d}/"} if rule_kind == "path" else {"regex": f"^/r{i:05d}/"}
            rule["upstream"] = "origin" if i == rules - 1 else "decoy"
            conf["rule"].append(rule)
    return conf


def merge_conf(base, extra):
    """--portico-extra: tables merged key by key (extra wins), arrays of tables
    ([[rule]], [[upstream]], [[listener]]) appended."""
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge_conf(base[k], v)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v) \
                and isinstance(base.get(k), list):
            base[k] = base[k] + v
        else:
            base[k] = v
    return base


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)   # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    raise ValueError(f"cannot write {v!r} as TOML")


def toml_dump(conf, header=""):
    """The subset of TOML Portico's config uses: top-level tables, arrays of
    tables, scalars, lists and inline tables inside them."""
    out = [header] if header else []
    for k, v in conf.items():
        if not isinstance(v, (dict, list)) or (isinstance(v, list) and not
                                               all(isinstance(x, dict) for x in v)):
            out.append(f"{k} = {toml_value(v)}")
    for k, v in conf.items():
        if isinstance(v, dict):
            out.append(f"\n[{k}]")
            out.extend(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for t in v:
                out.append(f"\n[[{k}]]")
                out.extend(f"{kk} = {toml_value(vv)}" for kk, vv in t.items())
    return "\n".join(out) + "\n"


PORTICO_EXTRA = None   # dict from --portico-extra FILE
PORTICO_EXTRA_PATH = None


def auth_header():
    """The auth scenario's `Authorization` field (reverse listener: RFC 7617
    Basic in `Authorization`, as a browser sends it to a site)."""
    token = base64.b64encode(f"{AUTH_USER}:{AUTH_PASSWORD}".encode()).decode()
    return f"Basic {token}"


def write_htpasswd(d):
    """An htpasswd file with one bcrypt entry written by Apache's htpasswd
    (the format issue 14 asks to be compatible with)."""
    path = os.path.join(d, "users")
    p = subprocess.run(["htpasswd", "-nbB", "-C", str(AUTH_COST), AUTH_USER, AUTH_PASSWORD],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0 or not p.stdout.startswith(f"{AUTH_USER}:$2"):
        raise RuntimeError(f"htpasswd -nbB failed: {p.stdout} {p.stderr}")
    with open(path, "w") as f:
        f.write(p.stdout.strip() + "\n")
    return path


def write_portico_conf(d, rules=None, rule_kind="path", auth=False, disk=False):
    conf = portico_conf(d, rules, rule_kind)
    if disk:
        # disk-hits: a memory tier far smaller than the 127 MiB object set, so most hits
        # come from the disk tier (1 GiB, its files in the page cache).
        conf["cache"].update({"memory": f"{DISK_HITS_MEMORY_MIB}MiB", "disk": "1GiB"})
    if auth == "ldap":
        # Users from the scenario's slapd: a search for the DN, a bind, a
        # group search (groupOfNames), as the service account.
        conf["auth"] = {"required": True, "realm": "bench", "ldap": {
            "url": f"ldap://127.0.0.1:{LDAP_PORT}", "bind_dn": ldap.SERVICE_DN,
            "bind_password": ldap.SERVICE_PW, "base_dn": ldap.PEOPLE,
            "group_base": ldap.GROUPS, "group_filter": "(member={dn})"}}
    elif auth:
        # Every request must authenticate; the user cache holds the one user.
        conf["auth"] = {"htpasswd": write_htpasswd(d), "required": True, "realm": "bench"}
    header = "# Portico under test (bench/peers/portico.md)"
    if PORTICO_EXTRA:
        merge_conf(conf, PORTICO_EXTRA)
        header += f"\n# with --portico-extra {PORTICO_EXTRA_PATH} merged in"
    path = os.path.join(d, "portico.toml")
    with open(path, "w") as f:
        f.write(toml_dump(conf, header))
    return path


def portico_check(portico_bin, conf_path, rule_kind="path"):
    """`portico check` before starting, so a config this build does not know
    (a key from an unmerged branch) fails with Portico's own message."""
    p = subprocess.run([portico_bin, "check", "-c", conf_path], capture_output=True, text=True,
                       timeout=120)
    if p.returncode == 0:
        return
    msg = (p.stdout + p.stderr).strip()
    hint = ""
    if rule_kind == "regex" and "regex" in msg:
        hint = ("\nthis Portico build has no `regex` matcher on [[rule]] (issue 7's rules "
                "engine is not merged into it): use --rule-kind path, or a newer --portico-bin")
    elif PORTICO_EXTRA:
        hint = (f"\nthe config includes --portico-extra {PORTICO_EXTRA_PATH}: a key this build "
                f"does not know? (e.g. [server] max_requests / queue_size before issue 6 lands)")
    raise RuntimeError(f"portico check rejected the generated config {conf_path}:\n"
                       f"{msg[-1500:]}{hint}")


def start_peer(name, tmp, portico_bin, rules=None, rule_kind="path", auth=False, disk=False):
    """Start one proxy with a fresh cache. `disk` (the disk-hits scenario): its
    small-memory-cache + disk-cache configuration (DISK_HITS_MEMORY_MIB)."""
    d = os.path.join(tmp, name)
    if os.path.exists(d):
        shutil.rmtree(d)   # fresh cache for every run
    os.makedirs(d)
    os.chmod(d, 0o777)     # nginx workers / squid / varnish child drop privileges
    ready_path, ready_headers, env = "/page", None, None
    if name == "portico":
        conf = write_portico_conf(d, rules, rule_kind, auth, disk)
        if auth == "ldap":
            ready_headers = {"Authorization": ldap_header(ctx_ldap_ready_user())}
        elif auth:
            ready_headers = {"Authorization": auth_header()}
        portico_check(portico_bin, conf, rule_kind)
        argv = [portico_bin, "run", "-c", conf]
        if rules is not None:
            ready_path = f"/r{rules - 1:05d}/page"
    elif name in ("nginx", "nginx-tput"):
        # nginx's cache is on disk (its files in the page cache) in every scenario
        conf = os.path.join(d, "nginx.conf")
        open(conf, "w").write(nginx_conf(d, tput=name == "nginx-tput"))
        argv = ["nginx", "-e", f"{d}/error.log", "-p", d, "-c", conf]
    elif name == "varnish":
        # disk-hits: file storage (an mmap'd file under the work dir; its pages are the
        # page cache) instead of malloc (bench/peers/varnish.md)
        storage = f"file,{d}/storage.bin,1G" if disk else "malloc,1G"
        argv = ["varnishd", "-F", "-n", f"{d}/varnish", "-a", f"127.0.0.1:{PORTS['varnish']}",
                "-b", f"127.0.0.1:{PORTS['origin']}", "-s", storage, "-T", "none",
                "-p", "thread_pools=1", "-p", "thread_pool_min=200",
                "-p", "thread_pool_max=1000", "-p", "timeout_idle=120"]
    elif name == "squid":
        conf = os.path.join(d, "squid.conf")
        open(conf, "w").write(squid_conf(d, disk))
        if disk:   # create the cache_dir's swap directories first (squid -z), then start
            z = subprocess.run(["squid", "-N", "-z", "-f", conf], capture_output=True,
                               text=True, timeout=60)
            if z.returncode != 0:
                raise RuntimeError(f"squid -z failed: {(z.stdout + z.stderr)[-800:]}")
        argv = ["squid", "-N", "-f", conf]
    elif name == "haproxy":
        conf = os.path.join(d, "haproxy.cfg")
        open(conf, "w").write(haproxy_conf(d))
        argv = ["haproxy", "-db", "-f", conf]   # -db: foreground, we own the pid
    elif name == "ats":
        env = {"TS_RUNROOT": ats_files(d, disk)}
        argv = ["traffic_server"]              # alone (no traffic_manager), foreground
    else:
        raise ValueError(name)
    if not port_free(PORTS[name]):
        raise RuntimeError(f"port {PORTS[name]} is in use")
    daemon = Daemon(name, argv, PROXY_CPU, d, env)
    try:
        wait_ready(PORTS[name], daemon, path=ready_path, headers=ready_headers)
        pin_threads(daemon.pid)
    except Exception:
        daemon.stop()
        raise
    return daemon


def pin_threads(root_pid):
    """Every thread of the proxy's process tree on the proxy CPU. taskset pins
    the process and what it starts, but a proxy may set its threads' affinity
    itself: ATS with exec_thread.affinity 0 binds its event thread to all CPUs
    (through hwloc). Re-pinned once it is ready (threads started later inherit
    their creator's CPU), then checked."""
    want = {int(PROXY_CPU)}
    for pid in proc_tree(root_pid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                if os.sched_getaffinity(tid) != want:
                    os.sched_setaffinity(tid, want)
                if os.sched_getaffinity(tid) != want:
                    raise RuntimeError(f"thread {tid} of pid {pid} is not pinned to CPU "
                                       f"{PROXY_CPU}")
            except ProcessLookupError:
                continue


def start_origin(tmp, data):
    d = os.path.join(tmp, "origin")
    os.makedirs(d)
    os.chmod(d, 0o777)
    conf = os.path.join(d, "nginx.conf")
    open(conf, "w").write(origin_conf(d, data))
    if not port_free(PORTS["origin"]):
        raise RuntimeError(f"origin port {PORTS['origin']} is in use")
    daemon = Daemon("origin", ["nginx", "-e", f"{d}/origin-error.log", "-p", d, "-c", conf],
                    LOAD_CPU, d)
    wait_ready(PORTS["origin"], daemon)
    return daemon


def origin_requests():
    """Requests served by the origin so far (nginx stub_status), not counting
    this status request itself."""
    _, _, body = http_get(PORTS["origin"], "/__status")
    lines = body.decode().splitlines()
    return int(lines[2].split()[2]) - 1


# ---------------------------------------------------------------- load

WRK_DONE = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%.0f,"duration_us":%.0f,"bytes":%.0f,' ..
    '"connect":%.0f,"read":%.0f,"write":%.0f,"status":%.0f,"timeout":%.0f,' ..
    '"p50_us":%.0f,"p90_us":%.0f,"p99_us":%.0f,"max_us":%.0f,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean))
end
"""

# What every script that picks URLs at random starts with: the paths, and a
# random seed of each thread's own.
WRK_PATHS = r"""
local paths = {}
for line in io.lines("%(paths)s") do paths[#paths + 1] = line end
local counter = 0
setup = function(thread)
  counter = counter + 1
  thread:set("tid", counter)
end
init = function(args)
  math.randomseed(%(seed)d + (tid or 0))
end
"""

WRK_RANDOM = WRK_PATHS + r"""
request = function()
  return wrk.format("GET", paths[math.random(#paths)])
end
"""

# miss scenario: the same paths under /ns/, which the origin serves no-store.
WRK_MISS = WRK_RANDOM.replace("paths[#paths + 1] = line", 'paths[#paths + 1] = "/ns" .. line')

# store scenario: every request a new URL (a query string no request used before: the
# thread's number and its own count), for an object the origin says is fresh for 120 s,
# so every proxy fetches it and stores it.
WRK_STORE = WRK_PATHS + r"""
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", paths[math.random(#paths)] .. "?store=" .. (tid or 0) .. "." .. n)
end
"""


def write_wrk_scripts(tmp, paths):
    pfile = os.path.join(tmp, "paths.txt")
    with open(pfile, "w") as f:
        f.write("\n".join(paths) + "\n")
    out = {}
    for name, body in (("hot", WRK_DONE),
                       ("hits", WRK_RANDOM % {"paths": pfile, "seed": SEED} + WRK_DONE),
                       ("miss", WRK_MISS % {"paths": pfile, "seed": SEED} + WRK_DONE),
                       ("store", WRK_STORE % {"paths": pfile, "seed": SEED} + WRK_DONE)):
        out[name] = os.path.join(tmp, f"{name}.lua")
        with open(out[name], "w") as f:
            f.write(body)
    out["close"] = out["hits"]
    out["disk-hits"] = out["hits"]
    out["busy"] = out["hits"]
    return out


def wrk_connections(scenario, args):
    """wrk's connections: `busy` has its own 1,000, the others --connections."""
    return BUSY_CONNECTIONS if scenario == "busy" else args.connections


class CpuMeter:
    """CPU used over an interval by the proxy tree, the origin tree, this
    script's children (the load generator), this script, and everything else."""

    def __init__(self, proxy_pid, origin_pid):
        self.proxy_pid, self.origin_pid = proxy_pid, origin_pid
        self.ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.self0 = resource.getrusage(resource.RUSAGE_SELF)
        self.p0_split = tree_jiffies_split(proxy_pid)
        self.p0, self.o0 = sum(self.p0_split), tree_jiffies(origin_pid)
        self.m0 = machine_busy_jiffies()
        self.t0 = time.time()

    def stop(self):
        p1_split = tree_jiffies_split(self.proxy_pid)
        p1, o1, m1 = sum(p1_split), tree_jiffies(self.origin_pid), machine_busy_jiffies()
        proxy_sys = p1_split[1] - self.p0_split[1]
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.time() - self.t0
        proxy_s = (p1 - self.p0) / CLK_TCK
        load_s = (ru1.ru_utime + ru1.ru_stime) - (self.ru0.ru_utime + self.ru0.ru_stime)
        self_s = (self1.ru_utime + self1.ru_stime) - (self.self0.ru_utime + self.self0.ru_stime)
        origin_s = (o1 - self.o0) / CLK_TCK
        other_s = (m1 - self.m0) / CLK_TCK - proxy_s - load_s - origin_s - self_s
        return {"wall_s": wall, "proxy_s": proxy_s, "proxy_cpu": proxy_s / wall,
                "load_cpu": load_s / wall, "origin_cpu": origin_s / wall,
                "other_cpu": max(0.0, other_s / wall),
                "proxy_sys_share": proxy_sys / (p1 - self.p0) if p1 > self.p0 else 0.0}


def run_wrk(port, path, script, duration, conns, proxy_pid, origin_pid, headers=(),
            scheme="http", env=None):
    argv = ["taskset", "-c", LOAD_CPU, "wrk", "-t1", f"-c{conns}", f"-d{duration}s",
            "--latency", "--timeout", "5s", "-s", script]
    for h in headers:
        argv += ["-H", h]
    argv.append(f"{scheme}://127.0.0.1:{port}{path}")
    or0 = origin_requests()
    cpu = CpuMeter(proxy_pid, origin_pid)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60,
                         env=None if env is None else {**os.environ, **env})
    c = cpu.stop()
    or1 = origin_requests()
    line = [x for x in out.stdout.splitlines() if x.startswith("WRKJSON ")]
    if out.returncode != 0 or not line:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-500:]} {out.stderr[-500:]}")
    r = json.loads(line[0][8:])
    secs = r["duration_us"] / 1e6
    r.update({
        "rps": r["requests"] / secs,
        "proxy_cpu": c["proxy_cpu"],               # cores
        "rps_per_core": r["requests"] / c["proxy_s"] if c["proxy_s"] > 0 else 0.0,
        "cpu_us_per_req": c["proxy_s"] * 1e6 / r["requests"] if r["requests"] else 0.0,
        "wrk_cpu": c["load_cpu"],
        "other_cpu": c["other_cpu"],
        "proxy_sys_share": c["proxy_sys_share"],
        "origin_requests": or1 - or0 - 1,  # minus the first status request
        "errors": r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"],
    })
    return r


@contextlib.contextmanager
def objects_and_origin(prefix):
    """For the hand-run tools beside bench/run (cpu_split.py,
    busy_seconds.py): a work dir under default_tmp_dir() with bench/run's
    object set and its origin started; yields (work dir, paths). The origin
    is stopped and the dir removed on the way out."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir=default_tmp_dir())
    os.chmod(tmp, 0o755)
    origin = None
    try:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        paths, _sizes = generate_objects(data)
        origin = start_origin(tmp, data)
        yield tmp, paths
    finally:
        if origin:
            origin.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def running_peer(peer, tmp, portico_bin):
    """start_peer with a fresh cache, stopped on the way out (half a second
    for its port and CPU to settle before the next)."""
    daemon = start_peer(peer, tmp, portico_bin)
    try:
        yield daemon
    finally:
        daemon.stop()
        time.sleep(0.5)


def warm_hits(port, paths, workers=8, tls=False):
    """Fetch each object once through the proxy: `workers` keep-alive
    connections (HTTPS with `tls`), each walking its share of the list in
    order."""
    def walk(share):
        conn = connect(port, tls)
        bad = 0
        for p in share:
            for attempt in range(2):
                try:
                    status, _, _ = http_get(port, p, conn)
                    break
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = connect(port, tls)
            else:
                status = 0
            if status != 200:
                bad += 1
        conn.close()
        return bad
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return sum(ex.map(walk, [paths[i::workers] for i in range(workers)]))


def cache_status(h):
    """HIT/MISS/... from a response's headers, or None if the proxy does not say."""
    xc = h.get("x-cache")
    if xc is None and "x-varnish" in h:   # Varnish: two XIDs on a hit, one on a miss
        xc = "HIT" if len(h["x-varnish"].split()) == 2 else "MISS"
    if xc is None and "ApacheTrafficServer" in h.get("via", ""):
        # ATS: the Via codes (insert_response_via_str 2), e.g. "[cHs f ]": after `c`, the
        # cache lookup result: H = fresh hit, R = fresh hit from the RAM cache.
        via = h["via"]
        i = via.find("[c")
        code = via[i + 2:i + 3] if i >= 0 else None
        xc = None if code is None else "HIT-RAM" if code == "R" else "HIT" if code == "H" \
            else "MISS"
    return xc


def peer_hit_counter(peer, tmp):
    """The proxy's own count of cache hits so far, for the peers whose
    counters the harness reads (None for the others): HAProxy's `cache_hits`
    (stats socket, `show stat`). Checks that hits really are served from its
    cache. (ATS run alone, without traffic_manager, does not publish its
    counters while it runs: its Via codes say hit or miss, RAM or disk.)"""
    try:
        if peer == "haproxy":
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(os.path.join(tmp, "haproxy", "haproxy.sock"))
            s.sendall(b"show stat\n")
            buf = b""
            while True:
                c = s.recv(65536)
                if not c:
                    break
                buf += c
            s.close()
            lines = buf.decode().splitlines()
            head = lines[0].lstrip("# ").split(",")
            total = 0
            for line in lines[1:]:
                row = dict(zip(head, line.split(",")))
                if row.get("svname") == "BACKEND" and row.get("cache_hits"):
                    total += int(row["cache_hits"])
            return total
    except (OSError, ValueError, KeyError, IndexError) as e:
        log(f"{peer}: could not read its hit counter: {e}")
    return None


SAMPLE_RAM_HITS = {}   # port -> hits of the last sample that said they came from RAM (ATS)


def portico_tiers(port):
    """(cache hits, disk-tier reads) so far, from Portico's /.stats.json, or
    None when the statistics pages are off (e.g. --portico-extra stats-off.toml)."""
    try:
        c = portico_stats(port)["cache"]
        return c["hits"], c["disk"]["reads"]
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        return None


def sample_hits(port, paths, n=200, prefix="", tls=False):
    """X-Cache on a seeded sample of responses: (hits, sampled, header seen)."""
    rng = random.Random(SEED + 1)
    conn = connect(port, tls)
    hits = seen = ram = 0
    for _ in range(n):
        _, h, _ = http_get(port, prefix + rng.choice(paths), conn)
        xc = cache_status(h)
        if xc is not None:
            seen += 1
            if xc.upper().startswith("HIT"):
                hits += 1
                ram += xc == "HIT-RAM"
    conn.close()
    SAMPLE_RAM_HITS[port] = ram
    return hits, n, seen


def check_portico_hits(port, tiers0, r, info, problems):
    """Portico's own counters over a hit run (`tiers0`: portico_tiers before
    it, None for another proxy or with the statistics pages off): its hits,
    and how many read the disk tier. Fewer hits than responses fails."""
    tiers1 = portico_tiers(port) if tiers0 is not None else None
    if tiers1 is None:
        return
    info["peer_hits"] = tiers1[0] - tiers0[0]
    info["disk_reads"] = tiers1[1] - tiers0[1]
    if info["peer_hits"] < r["requests"]:
        problems.append(f"portico counted {info['peer_hits']:,} cache hits for "
                        f"{r['requests']:,} responses")


def check_hit_sample(port, paths, info, problems, tls=False):
    """After a hit run: 200 sampled responses must all say HIT (where the
    proxy says), and the warm-up (info["warm_bad"]) must have passed."""
    h, n, seen = sample_hits(port, paths, tls=tls)
    info["sample_hits"] = f"{h}/{n}" if seen else "no X-Cache"
    if seen and h != n:
        problems.append(f"X-Cache sample: {h}/{n} HIT")
    if info["warm_bad"]:
        problems.append(f"{info['warm_bad']} warm-up requests failed")


def portico_stored(port):
    """Responses Portico's cache has stored so far (/.stats.json), or None when
    the statistics pages are off."""
    try:
        return portico_stats(port)["cache"]["stored"]
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        return None


def check_stored(port, paths, stored0, r, info, problems, n=20):
    """After a store run: Portico's own count of stored responses grew by at
    least the responses wrk counted (`stored0`: that count before the run,
    None for another proxy), and the proxy stores such URLs (n new ones,
    each asked for twice: the second must say HIT where the proxy says)."""
    if stored0 is not None:
        # Read before the sample below, whose URLs it would count too.
        stored1 = portico_stored(port)
        if stored1 is None:
            problems.append("portico's count of stored responses could not be read after the run")
        else:
            info["stored"] = stored1 - stored0
            if info["stored"] < r["requests"]:
                problems.append(f"portico stored {info['stored']:,} responses for "
                                f"{r['requests']:,} responses wrk counted")
    rng = random.Random(SEED + 2)
    conn = connect(port)
    hits = seen = 0
    for i in range(n):
        url = f"{rng.choice(paths)}?store=check.{i}"
        http_get(port, url, conn)
        _, h, _ = http_get(port, url, conn)
        xc = cache_status(h)
        if xc is not None:
            seen += 1
            hits += xc.upper().startswith("HIT")
    conn.close()
    info["sample_hits"] = f"{hits}/{n} asked again HIT" if seen else "no X-Cache"
    if seen and hits != n:
        problems.append(f"only {hits} of {n} new URLs asked for twice were hits the second "
                        "time: the proxy does not store these responses")


def check_completed(r, problems, load="wrk"):
    """No errors from the load generator, and some requests done."""
    if r["errors"]:
        problems.append(f"{r['errors']} {load} errors (socket errors or non-2xx)")
    if r["requests"] == 0:
        problems.append("no requests completed")


def run_wrk_scenario(scenario, peer, tmp, args, ctx, origin):
    """hot, hits, close, miss, store, disk-hits, busy: one wrk run against a freshly started peer, with
    the scenario's checks. Returns the result with `problems` (failed checks)."""
    daemon = start_peer(peer, tmp, args.portico_bin, disk=scenario == "disk-hits")
    try:
        info, problems, headers = {}, [], []
        port, paths = PORTS[peer], ctx["paths"]
        if scenario == "hot":
            http_get(port, "/page")            # warm-up: the miss
            _, h, _ = http_get(port, "/page")  # should be a hit
            info["warm_xcache"] = cache_status(h)
            path = "/page"
        elif scenario in HIT_SCENARIOS:
            t = time.time()
            info["warm_bad"] = warm_hits(port, paths)
            info["warm_s"] = round(time.time() - t, 1)
            path = "/"
            if scenario == "close":
                headers = ["Connection: close"]
        else:  # miss, store: nothing to warm; every request must reach the origin
            path = "/"
        misses = scenario in ("miss", "store")
        hits0 = peer_hit_counter(peer, tmp) if not misses else None
        tiers0 = portico_tiers(port) if peer == "portico" and not misses else None
        stored0 = portico_stored(port) if peer == "portico" and scenario == "store" else None
        r = run_wrk(port, path, ctx["scripts"][scenario], args.duration,
                    wrk_connections(scenario, args), daemon.pid, origin.pid, headers)
        r["rss_mib"] = tree_rss_kib(daemon.pid) / 1024
        check_portico_hits(port, tiers0, r, info, problems)
        if hits0 is not None:
            hits1 = peer_hit_counter(peer, tmp)
            if hits1 is not None:
                # the proxy's own count of hits during the run; requests in flight when wrk
                # stops are hits wrk did not count, so it may pass wrk's count a little
                info["peer_hits"] = hits1 - hits0
                if info["peer_hits"] < r["requests"]:
                    problems.append(f"{peer} counted {info['peer_hits']:,} cache hits for "
                                    f"{r['requests']:,} responses")
        r["origin_during"] = r["origin_requests"]
        if scenario in HIT_SCENARIOS:
            check_hit_sample(port, paths, info, problems)
            if peer == "ats":   # its Via codes tell RAM-cache hits from disk-cache hits
                info["sample_hits"] += f" ({SAMPLE_RAM_HITS.get(port, 0)} from RAM)"
        elif scenario == "hot":
            xc = info["warm_xcache"]
            info["sample_hits"] = xc or "no X-Cache"
            if xc is not None and not xc.upper().startswith("HIT"):
                problems.append(f"second request for /page was not a hit: X-Cache {xc}")
        if scenario == "miss":
            h, n, seen = sample_hits(port, paths, n=20, prefix="/ns")
            info["sample_hits"] = f"{h}/{n} HIT" if seen else "no X-Cache"
            if h:
                problems.append(f"{h} of {n} sampled no-store responses were hits")
        if scenario == "store":
            check_stored(port, paths, stored0, r, info, problems)
        if misses:
            # wrk counts completed responses; requests still in flight when it
            # stops reached the origin but are not counted, so origin >= requests.
            if r["origin_during"] < r["requests"]:
                problems.append(f"origin saw {r['origin_during']} requests for "
                                f"{r['requests']} responses: not every request was a miss")
        elif r["origin_during"] != 0:
            problems.append(f"origin saw {r['origin_during']} requests during a hit run")
        check_completed(r, problems)
        r.update(info)
        r["problems"] = problems
        r["summary"] = (f"{r['rps']:,.0f} req/s, p50 {r['p50_us']/1000:.2f} ms, "
                        f"p99 {r['p99_us']/1000:.2f} ms, proxy CPU {r['proxy_cpu']:.2f}, "
                        f"{r['rps_per_core']:,.0f} req/s/core, errors {r['errors']}, "
                        f"origin reqs during run {r['origin_during']}, "
                        f"other CPU {r['other_cpu']:.2f}, X-Cache {info.get('sample_hits')}"
                        + (f", its own hit counter +{info['peer_hits']:,}"
                           if "peer_hits" in info else "")
                        + (f", its own count of stored responses +{info['stored']:,}"
                           if "stored" in info else "")
                        + (f" ({info['disk_reads']:,} disk-tier reads)"
                           if "disk_reads" in info else ""))
        if not daemon.alive():
            raise RuntimeError(f"{peer} died during the run: {daemon.tail()}")
        return r
    finally:
        daemon.stop()


# ---- idle

def listen_backlog(port):
    """Connections waiting in the accept queue of the listener on 127.0.0.1:port
    (rx_queue of the LISTEN socket in /proc/net/tcp), or None."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == want and fields[3] == "0A":
                return int(fields[4].split(":")[1], 16)
    return None


def deferred_handshakes(port):
    """Connections to the listener on 127.0.0.1:port that the kernel holds in
    SYN-RECV (state 03 in /proc/net/tcp): with TCP_DEFER_ACCEPT (Portico's
    `defer_accept`, nginx's `deferred`, HAProxy's `defer-accept`) a client
    that has sent nothing is not queued for accept until about a second
    later."""
    want = f":{port:04X}"
    with open("/proc/net/tcp") as f:
        return sum(1 for line in f.readlines()[1:]
                   if (fields := line.split())[1].endswith(want) and fields[3] == "03")


def settle_rss(pid, port, max_wait=10.0):
    """The proxy's RSS once the kernel holds no connection for it (none
    deferred, the accept queue empty) and RSS has stopped moving (two reads
    0.5 s apart within 1%)."""
    deadline = time.time() + max_wait
    time.sleep(0.5)
    while (deferred_handshakes(port) > 0 or (listen_backlog(port) or 0) > 0) and time.time() < deadline:
        time.sleep(0.2)
    prev = tree_rss_kib(pid)
    while time.time() < deadline:
        time.sleep(0.5)
        cur = tree_rss_kib(pid)
        if abs(cur - prev) <= 0.01 * prev:
            return cur
        prev = cur
    return prev


def read_response(s):
    """Status of one HTTP/1.1 response read whole from socket s (Content-Length
    or chunked), or raise."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed before a response head")
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if "content-length" in hdrs:
        need = int(hdrs["content-length"]) - len(body)
        while need > 0:
            chunk = s.recv(min(need, 262144))
            if not chunk:
                raise RuntimeError("connection closed inside a response body")
            need -= len(chunk)
    elif "chunked" in hdrs.get("transfer-encoding", "").lower():
        while not body.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("connection closed inside a chunked body")
            body = body[-8:] + chunk
    return status


def run_idle(peer, tmp, args, ctx, origin):
    """RSS above baseline per idle connection: N connections opened and left
    silent (`fresh`), then one GET /page on each, read whole, connection kept
    idle (`used`)."""
    daemon = start_peer(peer, tmp, args.portico_bin)
    n = args.idle_connections
    port = PORTS[peer]
    socks = []
    try:
        for _ in range(3):                  # the page is cached before the baseline
            http_get(port, "/page")
        base = settle_rss(daemon.pid, port)
        t = time.time()
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=15)
            socks.append(s)
        open_s = time.time() - t
        fresh = settle_rss(daemon.pid, port)
        req = f"GET /page HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        bad = 0
        for i in range(0, n, 100):          # batches: no proxy sees 10,000 requests at once
            batch = socks[i:i + 100]
            for s in batch:
                s.sendall(req)
            for s in batch:
                try:
                    if read_response(s) != 200:
                        bad += 1
                except (OSError, RuntimeError):
                    bad += 1
        used = settle_rss(daemon.pid, port)
        # Still open? A connection the proxy closed is readable (EOF).
        poller = select.poll()
        for s in socks:
            poller.register(s, select.POLLIN)
        closed = len(poller.poll(0))
        problems = []
        if bad:
            problems.append(f"{bad} of {n} requests on the idle connections failed")
        if closed:
            problems.append(f"{closed} of {n} connections were closed by the proxy "
                            f"before the end of the measurement")
        if not daemon.alive():
            raise RuntimeError(f"{peer} died during the run: {daemon.tail()}")
        r = {"connections": n, "base_kib": base, "fresh_kib": fresh, "used_kib": used,
             "fresh_per_conn": (fresh - base) / n, "used_per_conn": (used - base) / n,
             "open_s": round(open_s, 1), "bad": bad, "closed": closed, "other_cpu": 0.0,
             "problems": problems}
        r["summary"] = (f"{n} connections: {r['fresh_per_conn']:.2f} KiB/conn before any "
                        f"request, {r['used_per_conn']:.2f} KiB/conn after one request "
                        f"(RSS {base/1024:.1f} -> {fresh/1024:.1f} -> {used/1024:.1f} MiB); "
                        f"failed {bad}, closed early {closed}")
        return r
    finally:
        for s in socks:
            s.close()
        daemon.stop()


# ---- rules

def run_rules(count, tmp, args, ctx, origin):
    """Portico with `count` [[rule]] entries, every request matching the last:
    throughput at --connections, and single-request latency on one connection."""
    t = time.time()
    daemon = start_peer("portico", tmp, args.portico_bin, rules=count, rule_kind=args.rule_kind)
    start_s = time.time() - t
    try:
        port, path = PORTS["portico"], f"/r{count - 1:05d}/page"
        problems = []
        st, h, body = http_get(port, path)   # warm-up (a miss), ready check already passed
        st, h, body = http_get(port, path)
        xc = cache_status(h)
        if st != 200 or len(body) != PAGE_SIZE:
            problems.append(f"{path}: status {st}, {len(body)} bytes")
        if xc is not None and not xc.upper().startswith("HIT"):
            problems.append(f"second request for {path} was not a hit: X-Cache {xc}")
        r = run_wrk(port, path, ctx["scripts"]["hot"], args.duration, args.connections,
                    daemon.pid, origin.pid)
        single = run_wrk(port, path, ctx["scripts"]["hot"], max(1, args.duration // 2), 1,
                         daemon.pid, origin.pid)
        r["single_p50_us"], r["single_p99_us"] = single["p50_us"], single["p99_us"]
        r["single_mean_us"], r["single_rps"] = single["mean_us"], single["rps"]
        r["other_cpu"] = max(r["other_cpu"], single["other_cpu"])
        r["errors"] += single["errors"]
        r["origin_during"] = r["origin_requests"] + single["origin_requests"]
        r["start_s"] = round(start_s, 2)
        r["rss_mib"] = tree_rss_kib(daemon.pid) / 1024
        r["rules"] = count
        if r["errors"]:
            problems.append(f"{r['errors']} wrk errors (a 502 means a decoy rule matched)")
        if r["origin_during"]:
            problems.append(f"origin saw {r['origin_during']} requests during a hit run")
        if not daemon.alive():
            raise RuntimeError(f"portico died during the run: {daemon.tail()}")
        r["problems"] = problems
        r["summary"] = (f"{count} rules: {r['rps']:,.0f} req/s, {r['cpu_us_per_req']:.1f} CPU "
                        f"us/request, p50 {r['p50_us']/1000:.2f} ms, p99 {r['p99_us']/1000:.2f} "
                        f"ms; one connection: p50 {r['single_p50_us']/1000:.3f} ms, p99 "
                        f"{r['single_p99_us']/1000:.3f} ms; started in {start_s:.2f} s; "
                        f"errors {r['errors']}, other CPU {r['other_cpu']:.2f}")
        return r
    finally:
        daemon.stop()


# ---- auth

def portico_stats(port):
    """Portico's /.stats.json snapshot (the monitor pages answer on the listener)."""
    _, _, body = http_get(port, "/.stats.json")
    return json.loads(body)["snapshot"]


def run_auth(subject, tmp, args, ctx, origin):
    """Cache hits on /page through Portico, `authenticated`: with [auth]
    required and every request carrying the one user's Basic credentials
    (verified against the bcrypt entry once, then found in the user cache);
    `anonymous`: the same config without [auth], no credentials."""
    authed = subject == "authenticated"
    daemon = start_peer("portico", tmp, args.portico_bin, auth=authed)
    try:
        port, problems, info = PORTS["portico"], [], {}
        hdr = {"Authorization": auth_header()} if authed else None
        http_get(port, "/page", headers=hdr)                 # warm-up (a miss)
        st, h, body = http_get(port, "/page", headers=hdr)
        xc = cache_status(h)
        if st != 200 or len(body) != PAGE_SIZE or (xc and not xc.upper().startswith("HIT")):
            problems.append(f"/page: status {st}, {len(body)} bytes, X-Cache {xc}")
        if authed:
            # Authentication really is on: no credentials and a wrong password are refused.
            st_none, _, _ = http_get(port, "/page")
            bad = base64.b64encode(f"{AUTH_USER}:wrong".encode()).decode()
            st_bad, _, _ = http_get(port, "/page", headers={"Authorization": f"Basic {bad}"})
            info["refused"] = f"{st_none}/{st_bad}"
            if (st_none, st_bad) != (401, 401):
                problems.append(f"without / with wrong credentials: {st_none} / {st_bad}, not 401")
            before = portico_stats(port).get("auth") or {}
        r = run_wrk(port, "/page", ctx["scripts"]["hot"], args.duration, args.connections,
                    daemon.pid, origin.pid,
                    headers=[f"Authorization: {auth_header()}"] if authed else ())
        r["rss_mib"] = tree_rss_kib(daemon.pid) / 1024
        r["origin_during"] = r["origin_requests"]
        if authed:
            after = portico_stats(port).get("auth") or {}
            r["auth_hits"] = after.get("hits", 0) - before.get("hits", 0)
            r["auth_misses"] = after.get("misses", 0) - before.get("misses", 0)
            r["auth_verifications"] = after.get("misses", 0)
            # Every request of the run found its user in the cache (wrk's
            # in-flight requests at the end may add a few hits it did not count).
            if r["auth_misses"] or r["auth_hits"] < r["requests"]:
                problems.append(f"user cache during the run: {r['auth_hits']} hits, "
                                f"{r['auth_misses']} misses for {r['requests']} requests")
        r.update(info)
        if r["errors"]:
            problems.append(f"{r['errors']} wrk errors (socket errors or non-2xx)")
        if r["origin_during"]:
            problems.append(f"origin saw {r['origin_during']} requests during a hit run")
        if r["requests"] == 0:
            problems.append("no requests completed")
        if not daemon.alive():
            raise RuntimeError(f"portico died during the run: {daemon.tail()}")
        r["problems"] = problems
        r["summary"] = (f"{subject}: {r['rps']:,.0f} req/s, {r['cpu_us_per_req']:.2f} CPU "
                        f"us/request, {r['rps_per_core']:,.0f} req/s/core, p99 "
                        f"{r['p99_us']/1000:.2f} ms, errors {r['errors']}, other CPU "
                        f"{r['other_cpu']:.2f}" +
                        (f", user cache {r['auth_hits']:,} hits / {r['auth_misses']} misses"
                         if authed else ""))
        return r
    finally:
        daemon.stop()


# ---- auth-ldap

def ldap_users(args):
    return LDAP_USERS_SMOKE if args.smoke else LDAP_USERS


LDAP_READY_USER = [0]


def ctx_ldap_ready_user():
    """The user whose login start_peer's readiness check spends (one more
    than those measured, so none of them is in the user cache before)."""
    return LDAP_READY_USER[0]


def ldap_header(i):
    token = base64.b64encode(f"{ldap.user(i)}:{ldap.password(i)}".encode()).decode()
    return f"Basic {token}"


def percentiles(ms):
    xs = sorted(ms)
    at = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": xs[-1], "n": len(xs)}


def run_auth_ldap(tmp, args, ctx, origin):
    """Each of N directory users logs in once through Portico (a user cache
    miss: Portico asks slapd) and then again (a user cache hit), each
    request timed on its own keep-alive connection; beforehand the same
    directory operations are timed without Portico (bench/ldap.py
    `one_login`, on one open connection, as Portico's pool keeps them),
    which also warms slapd's own caches for both."""
    n = ldap_users(args)
    LDAP_READY_USER[0] = n
    wd = os.path.join(tmp, "auth-ldap")
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    if not port_free(LDAP_PORT):
        raise RuntimeError(f"port {LDAP_PORT} (the bench's slapd) is in use")
    directory = ldap.Slapd(wd, LDAP_PORT, n + 1, LOAD_CPU)
    daemon = None
    try:
        conn = ldap.Conn(LDAP_PORT)
        direct = []
        for i in range(n):
            t = time.perf_counter()
            ldap.one_login(conn, i)
            direct.append((time.perf_counter() - t) * 1000)
        conn.close()
        daemon = start_peer("portico", tmp, args.portico_bin, auth="ldap")
        port, problems = PORTS["portico"], []
        http_get(port, "/page", headers={"Authorization": ldap_header(n)})   # cached page
        before = portico_stats(port).get("auth") or {}
        cpu0 = tree_jiffies(daemon.pid)
        first, cached = [], []
        for i in range(n):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            hdr = {"Authorization": ldap_header(i)}
            for out in (first, cached):
                t = time.perf_counter()
                st, _, body = http_get(port, "/page", conn=c, headers=hdr)
                out.append((time.perf_counter() - t) * 1000)
                if st != 200 or len(body) != PAGE_SIZE:
                    problems.append(f"{ldap.user(i)}: status {st}, {len(body)} bytes")
            c.close()
        cpu = (tree_jiffies(daemon.pid) - cpu0) / CLK_TCK
        after = portico_stats(port).get("auth") or {}
        misses = after.get("misses", 0) - before.get("misses", 0)
        hits = after.get("hits", 0) - before.get("hits", 0)
        if misses != n or hits != n:
            problems.append(f"user cache: {misses} misses and {hits} hits for {n} first and "
                            f"{n} repeated logins")
        bad = base64.b64encode(f"{ldap.user(0)}:wrong".encode()).decode()
        st_bad, _, _ = http_get(port, "/page", headers={"Authorization": f"Basic {bad}"})
        if st_bad != 401:
            problems.append(f"a wrong password got {st_bad}, not 401")
        if not daemon.alive():
            raise RuntimeError(f"portico died during the run: {daemon.tail()}")
        r = {"users": n, "loadavg": os.getloadavg()[0], "direct": percentiles(direct), "first": percentiles(first),
             "cached": percentiles(cached), "cpu_ms_per_login": cpu * 1000 / (2 * n),
             "misses": misses, "hits": hits, "wrong_password": st_bad, "other_cpu": 0.0,
             "problems": problems}
        r["summary"] = (f"{n} users: first login p50 {r['first']['p50']:.2f} ms (directory alone "
                        f"{r['direct']['p50']:.2f} ms), cached login p50 "
                        f"{r['cached']['p50']:.2f} ms")
        return r
    finally:
        if daemon:
            daemon.stop()
        directory.stop()


def classify_oha_errors(dist):
    """oha's errorDistribution (message -> count) as timeouts, connection
    errors, and requests aborted by the end of the step (not failures)."""
    out = {"timeouts": 0, "conn_errors": 0, "aborted": 0}
    for msg, n in dist.items():
        m = msg.lower()
        if "deadline" in m:
            out["aborted"] += n
        elif "timeout" in m or "timed out" in m:
            out["timeouts"] += n
        else:
            out["conn_errors"] += n
    return out


def run_oha(oha, urls, opts, duration, proxy_pid, origin_pid):
    argv = ["taskset", "-c", LOAD_CPU, oha, "--no-tui", "--output-format", "json",
            "--urls-from-file", "-z", f"{duration}s"] + opts + [urls]
    cpu = CpuMeter(proxy_pid, origin_pid)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    c = cpu.stop()
    try:
        j = json.loads(out.stdout)
    except ValueError:
        raise RuntimeError(f"oha failed ({out.returncode}): {out.stdout[-300:]} "
                           f"{out.stderr[-500:]}")
    statuses = {int(k): v for k, v in j.get("statusCodeDistribution", {}).items()}
    errs = classify_oha_errors(j.get("errorDistribution", {}))
    secs = j["summary"]["total"] or duration
    responses = sum(statuses.values())
    ok = sum(v for k, v in statuses.items() if 200 <= k < 300)
    s503 = statuses.get(503, 0)
    other = responses - ok - s503
    sent = responses + errs["timeouts"] + errs["conn_errors"]
    pct = (lambda n: 100.0 * n / sent) if sent else (lambda n: 0.0)
    lat = j.get("latencyPercentiles", {})
    return {
        "secs": secs, "responses": responses, "ok": ok, "s503": s503, "other_status": other,
        "timeouts": errs["timeouts"], "conn_errors": errs["conn_errors"],
        "aborted": errs["aborted"], "sent": sent,
        "throughput": responses / secs, "goodput": ok / secs,
        "mean_ms": (j["summary"].get("average") or 0.0) * 1000,
        "p50_ms": (lat.get("p50") or 0.0) * 1000, "p99_ms": (lat.get("p99") or 0.0) * 1000,
        "err_pct": pct(sent - ok), "s503_pct": pct(s503), "other_status_pct": pct(other),
        "timeout_pct": pct(errs["timeouts"]), "conn_err_pct": pct(errs["conn_errors"]),
        # CPU 1 holds oha and the origin: together they are the load side
        "proxy_cpu": c["proxy_cpu"], "load_cpu": c["load_cpu"] + c["origin_cpu"],
        "oha_cpu": c["load_cpu"], "other_cpu": c["other_cpu"],
        "errors_seen": j.get("errorDistribution", {}),
    }


def run_rate(peer, tmp, args, ctx, origin):
    """Closed-loop peak with oha, then open-loop fixed-rate steps at
    --rate-steps percent of it, against one freshly started, warmed peer."""
    daemon = start_peer(peer, tmp, args.portico_bin)
    try:
        port = PORTS[peer]
        prefix = "/ns" if args.rate_load == "miss" else ""
        urls = os.path.join(tmp, f"urls-{port}.txt")
        with open(urls, "w") as f:
            f.write("".join(f"http://127.0.0.1:{port}{prefix}{p}\n" for p in ctx["paths"]))
        hits = args.rate_load in ("hits", "close")
        warm_bad = warm_hits(port, ctx["paths"]) if hits else 0
        # close: a new connection per request; oha then sends `Connection:
        # close`, as wrk does in the `close` scenario
        fresh = ["--disable-keepalive"] if args.rate_load == "close" else []
        or0 = origin_requests()
        whole = CpuMeter(daemon.pid, origin.pid)
        pk = run_oha(ctx["oha"], urls, ["-c", str(args.connections)] + fresh, args.rate_peak,
                     daemon.pid, origin.pid)
        peak = pk["goodput"]
        problems = []
        if warm_bad:
            problems.append(f"{warm_bad} warm-up requests failed")
        if peak <= 0:
            raise RuntimeError(f"closed-loop peak run got no 2xx responses: {pk}")
        if pk["ok"] != pk["sent"]:
            problems.append(f"closed-loop peak run: {pk['sent'] - pk['ok']} failed requests "
                            f"({pk['errors_seen']}, statuses 503 {pk['s503']}, other "
                            f"{pk['other_status']})")
        steps = []
        for pct in args.rate_steps:
            target = peak * pct / 100.0
            s = run_oha(ctx["oha"], urls,
                        ["-q", f"{target:.0f}", "-c", str(args.rate_connections),
                         "--latency-correction", "-t", f"{args.rate_timeout}s"] + fresh,
                        args.rate_step, daemon.pid, origin.pid)
            s["pct"], s["target"] = pct, target
            s["goodput_pct"] = 100.0 * s["goodput"] / peak
            steps.append(s)
            if s["responses"] == 0:
                problems.append(f"{pct}% step: no responses")
            if not daemon.alive():
                raise RuntimeError(f"{peer} died at the {pct}% step: {daemon.tail()}")
        c = whole.stop()
        origin_during = origin_requests() - or0 - 1
        ok_total = pk["ok"] + sum(s["ok"] for s in steps)
        if hits and origin_during:
            problems.append(f"origin saw {origin_during} requests during a hit run")
        if args.rate_load == "miss" and origin_during < ok_total:
            problems.append(f"origin saw {origin_during} requests for {ok_total} 2xx "
                            f"responses: not every request was a miss")
        r = {"peak_rps": peak, "peak_p99_ms": pk["p99_ms"], "peak_load_cpu": pk["load_cpu"],
             "peak_proxy_cpu": pk["proxy_cpu"], "steps": steps, "origin_during": origin_during,
             "other_cpu": c["other_cpu"], "warm_bad": warm_bad, "problems": problems,
             "rss_mib": tree_rss_kib(daemon.pid) / 1024}
        last = steps[-1] if steps else None
        r["summary"] = (f"peak {peak:,.0f} req/s (load CPU {pk['load_cpu']:.2f}, proxy CPU "
                        f"{pk['proxy_cpu']:.2f}); " + "; ".join(
                            f"{s['pct']}%: {s['goodput']:,.0f} ok/s ({s['goodput_pct']:.0f}%), "
                            f"p99 {s['p99_ms']:.1f} ms, err {s['err_pct']:.1f}%"
                            for s in steps) + f"; other CPU {c['other_cpu']:.2f}")
        if last and (last["timeouts"] or last["conn_errors"] or last["other_status"]):
            r["summary"] += (f"; last step errors: 503 {last['s503']}, other status "
                             f"{last['other_status']}, timeouts {last['timeouts']}, conn "
                             f"{last['conn_errors']} {last['errors_seen']}")
        return r
    finally:
        daemon.stop()


# ---- soak

def free_port():
    """A loopback port nothing listens on now (bound to port 0 by the kernel,
    then released), so a soak can run beside the other scenarios' fixed ports."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def parse_size(v):
    """`--soak-disk 64MiB` etc.: an integer, or a whole number and a binary unit."""
    units = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    v = str(v).strip()
    num = v.rstrip("BKMGi ")
    unit = v[len(num):].strip()
    if not num.isdigit() or unit not in units:
        raise argparse.ArgumentTypeError(f"not a size (e.g. 64MiB): {v!r}")
    return int(num) * units[unit]


def soak_conf(d, ports, args):
    """Portico for the soak: a forward listener (absolute-form GETs and
    CONNECT) and a reverse one (origin-form GETs routed to the soak origin),
    a memory tier and a disk tier small enough that the load keeps both
    full (eviction and disk GC run all the time), and origin timeouts short
    enough that the stalling origin answers end in seconds."""
    return {
        "server": {"workers": 1},
        "listener": [{"address": f"127.0.0.1:{ports['fwd']}", "mode": "forward"},
                     {"address": f"127.0.0.1:{ports['rev']}", "mode": "reverse"}],
        "keepalive": {"timeout": "15s", "max_requests": 100},
        "proxy": {"connect_ports": [ports["echo"]], "tunnel_idle_timeout": "30s"},
        "origin": {"connect_timeout": "2s", "first_byte_timeout": "2s", "idle_timeout": "2s"},
        "upstream": [{"name": "soak-origin", "servers": [f"127.0.0.1:{ports['origin']}"]}],
        "rule": [{"mode": "reverse", "upstream": "soak-origin"}],
        "cache": {"memory": f"{args.soak_memory}B", "max_memory_object": "64KiB",
                  "dir": f"{d}/cache", "disk": f"{args.soak_disk}B", "levels": [4, 16]},
        "log": {"access": "", "level": "warn"},
    }


def write_soak_conf(d, ports, args):
    conf = soak_conf(d, ports, args)
    header = "# Portico under the soak (bench/README.md, soak)"
    if PORTICO_EXTRA:
        merge_conf(conf, PORTICO_EXTRA)
        header += f"\n# with --portico-extra {PORTICO_EXTRA_PATH} merged in"
    path = os.path.join(d, "portico.toml")
    with open(path, "w") as f:
        f.write(toml_dump(conf, header))
    return path


def wait_port(port, daemon, timeout=20, path=None):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if not daemon.alive():
            raise RuntimeError(f"{daemon.name} exited: {daemon.tail()}")
        try:
            if path is None:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return
            status, _, _ = http_get(port, path)
            if status == 200:
                return
            last = f"status {status}"
        except OSError as e:
            last = str(e)
        time.sleep(0.2)
    raise RuntimeError(f"{daemon.name}: port {port} not ready after {timeout}s: {last}; "
                       f"{daemon.tail()}")


def run_soak(tmp, args):
    """One Portico under the soak load (bench/soak.py) for --soak-duration
    seconds, sampled every --soak-interval; see bench/README.md."""
    d = os.path.join(tmp, "soak")
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    ports = {k: free_port() for k in ("fwd", "rev", "origin", "echo")}
    if len(set(ports.values())) != 4:
        raise RuntimeError(f"could not pick 4 distinct free ports: {ports}")
    origin = Daemon("soak-origin", [sys.executable, os.path.join(HERE, "soak.py"), "origin",
                                    "--port", str(ports["origin"]),
                                    "--echo-port", str(ports["echo"])], LOAD_CPU, d)
    daemon = None
    try:
        wait_port(ports["origin"], origin, path="/__stats")
        wait_port(ports["echo"], origin)
        conf = write_soak_conf(d, ports, args)
        portico_check(args.portico_bin, conf)
        daemon = Daemon("portico", [args.portico_bin, "run", "-c", conf], PROXY_CPU, d)
        wait_port(ports["fwd"], daemon, path="/.stats.json")
        warmup = args.soak_warmup if args.soak_warmup is not None else \
            max(2 * args.soak_interval, args.soak_duration / 10)

        def progress(s, load):
            log(f"soak t={s['t'] / 60:5.1f} min: RSS {s['rss_kib'] / 1024:.1f} MiB, fds "
                f"{s['fds']}, in service {s.get('active')}, idle {s.get('idle')}, disk "
                f"{s.get('disk_stats', 0) / 2**20:.1f} MiB ({s['disk_files']} files), "
                f"{load.completed:,} requests done, {len(load.wrong)} wrong bodies")

        opts = {"rate": args.soak_rate, "duration": args.soak_duration,
                "interval": args.soak_interval, "prefill_bytes": args.soak_disk,
                "prefill_max_s": 15 if args.smoke else 90,
                "progress": None if args.smoke else progress}
        cpu = CpuMeter(daemon.pid, origin.pid)
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        load, samples, notes, prefill_s, filled, elapsed = asyncio.run(soak.soak_async(
            daemon.pid, daemon.alive, ports["fwd"], ports["rev"], ports["origin"],
            ports["echo"], os.path.join(d, "cache"), opts))
        c = cpu.stop()
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        c["client_cpu"] = ((self1.ru_utime + self1.ru_stime) -
                           (self0.ru_utime + self0.ru_stime)) / c["wall_s"]
        log(f"soak: pre-fill {filled / 2**20:.0f} MiB in {prefill_s:.1f} s, load "
            f"{elapsed:.0f} s, {load.completed:,} requests")
        problems = list(notes)
        if not daemon.alive():
            problems.append(f"Portico exited during the soak: {daemon.tail()}")
        try:
            _, _, ob = http_get(ports["origin"], "/__stats")
            origin_counts = json.loads(ob)
        except (OSError, ValueError):
            origin_counts = {}
        trend, tp = soak.judge(samples, warmup, args.soak_disk, args.soak_slack)
        problems += tp
        op, total, unexpected = soak.outcome_problems(load.counts, load.wrong,
                                                      args.soak_max_unexpected)
        problems += op
        variants = soak.variant_rows(load.counts, load.xcache)
        hit = load.xcache.get("hit", {})
        if sum(hit.values()) and hit.get("HIT", 0) < 0.5 * sum(hit.values()):
            problems.append(f"hit variant: only {hit.get('HIT', 0)} of {sum(hit.values())} "
                            f"responses were HITs (cache not working?)")
        if origin_counts.get("304 sent", 0) == 0:
            problems.append("the origin never sent a 304: no revalidation happened")
        try:
            with open(daemon.logpath, errors="replace") as f:
                log_lines = sum(1 for line in f if line.strip())
        except OSError:
            log_lines = 0
        lags = sorted(load.lag) or [0.0]
        r = {"duration_s": args.soak_duration, "interval_s": args.soak_interval,
             "warmup_s": warmup, "rate": args.soak_rate, "elapsed_s": elapsed,
             "prefill_s": round(prefill_s, 1), "prefill_bytes": filled,
             "started": load.started, "completed": load.completed,
             "lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1000,
             "lag_max_ms": lags[-1] * 1000, "samples": samples, "trend": trend,
             "variants": variants, "wrong": load.wrong[:100], "origin_counts": origin_counts,
             "totals": {"total": total, "unexpected": unexpected,
                        "ok": sum(v["ok"] for v in variants),
                        "expected": sum(sum(v["expected"].values()) for v in variants),
                        "wrong": sum(v["wrong"] for v in variants)},
             "max_unexpected_pct": args.soak_max_unexpected, "disk_limit": args.soak_disk,
             "slack": args.soak_slack,
             "memory_limit": args.soak_memory, "ports": ports, "log_lines": log_lines,
             "config": soak_conf(d, ports, args),
             "cpu": c, "machine_other_cpu": c["other_cpu"],
             # never redone (an hour): the machine's other load is reported instead
             "other_cpu": 0.0}
        r["problems_all"] = list(problems)
        r["problems"] = problems
        first = samples[0] if samples else {}
        last = samples[-1] if samples else {}
        r["summary"] = (f"{load.completed:,} requests ({unexpected} unexpected, "
                        f"{len(load.wrong)} wrong bodies) in {elapsed:.0f} s; RSS "
                        f"{first.get('rss_kib', 0) / 1024:.1f} -> {last.get('rss_kib', 0) / 1024:.1f}"
                        f" MiB, fds {first.get('fds')} -> {last.get('fds')}, connections "
                        f"{first.get('conns')} -> {last.get('conns')}, disk "
                        f"{first.get('disk_stats', 0) / 2**20:.1f} -> "
                        f"{last.get('disk_stats', 0) / 2**20:.1f} MiB; other CPU "
                        f"{c['other_cpu']:.2f}")
        return r
    finally:
        if daemon:
            daemon.stop()
        origin.stop()


# ---------------------------------------------------------------- report

def versions(portico_bin, given):
    def cmd(argv):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (p.stdout + p.stderr).strip().splitlines()[0]
        except Exception as e:
            return f"? ({e})"
    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "src", "Cargo.toml",
                            "Cargo.lock"], capture_output=True, text=True).stdout.strip()
    if portico_bin is None:
        pv = f"not run; repository HEAD {rev}"
    elif given:
        st = os.stat(portico_bin)
        pv = (f"binary given with --portico-bin ({portico_bin}, built "
              f"{datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc):%Y-%m-%d %H:%M UTC}); "
              f"repository HEAD now {rev}")
    else:
        pv = (f"{rev}{' + uncommitted src changes in the working tree' if dirty else ''}, "
              f"cargo build --release")
    return {
        "portico": pv,
        "nginx": cmd(["nginx", "-v"]) + f" (latency settings: tcp_nopush {NGINX_TCP_NOPUSH})",
        "nginx-tput": cmd(["nginx", "-v"]) + " (throughput settings: tcp_nopush on, "
                                             "open_file_cache)",
        "haproxy": cmd(["haproxy", "-v"]),
        "ats": cmd(["traffic_server", "-V"]),
        "varnish": cmd(["varnishd", "-V"]),
        "squid": cmd(["squid", "-v"]),
        "wrk": cmd(["wrk", "-v"]),
        "oha": cmd([find_oha() or "oha", "--version"]),
        "h2load": cmd(["h2load", "--version"]),
        "openssl": cmd(["openssl", "version"]) + " (bench client: Python "
                   + ssl.OPENSSL_VERSION + ")",
    }


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"nproc {os.cpu_count()}, {model}, kernel {os.uname().release}"


def fmt_spread(vals, fmt):
    return f"{fmt(min(vals))}–{fmt(max(vals))}" if len(vals) > 1 else "—"


def report_stem(scenario, args):
    """A report's file name: `rate-miss` and `rate-close` for the other
    loads of `rate`, so that they sit beside the hits one, as
    `tls-resume-tls12` sits beside `tls-resume`."""
    if scenario == "rate" and args.rate_load != "hits":
        return f"rate-{args.rate_load}"
    if scenario == "hitratio":
        return hitratio_bench.stem(scenario, args)
    return tls_bench.stem(scenario, args)


def write_report(scenario, results, args, vers, outdir, command):
    os.makedirs(outdir, exist_ok=True)
    subjects = [p for p in results if results.get(p)]
    L = [f"# Scenario `{scenario}`: {SCENARIOS[scenario]}\n",
         f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
         f"- Command: `{command}`",
         f"- Machine: {machine()}"]
    body, extra = {"idle": report_idle, "rate": report_rate, "rules": report_rules,
                   "soak": report_soak, "auth": report_auth,
                   "array": lambda *a: array_bench.report(sys.modules[__name__], *a),
                   "hitratio": lambda *a: hitratio_bench.report(sys.modules[__name__], *a),
                   "polygraph": lambda *a: polygraph_bench.report(sys.modules[__name__], *a),
                   **{s: (lambda *a: tls_bench.report(sys.modules[__name__], *a))
                      for s in tls_bench.SCENARIOS},
                   "auth-ldap": report_auth_ldap}.get(scenario, report_wrk)(scenario, results, subjects,
                                                                  args)
    L += extra
    want = {"rate": tuple(PEERS) + ("oha",),
            "rules": ("portico", "wrk"), "auth": ("portico", "wrk"), "auth-ldap": ("portico",),
            "array": ("portico", "wrk"), "hitratio": tuple(PEERS), "polygraph": tuple(PEERS),
            "idle": tuple(PEERS), "soak": ("portico",),
            "h2-hits": tuple(PEERS) + ("h2load", "openssl"),
            "h2c-hits": tuple(PEERS) + ("h2load",),
            "tls-roundtrips": tuple(PEERS) + ("openssl",)}.get(
                scenario, tuple(PEERS) + ("wrk",) + (("openssl",) if scenario in
                                                      tls_bench.SCENARIOS else ()))
    for k in want:
        if k in ("portico", "wrk", "oha", "h2load", "openssl") or k in subjects:
            L.append(f"- {k}: {vers.get(k)}")
    if PORTICO_EXTRA:
        L.append(f"- Portico config: --portico-extra {PORTICO_EXTRA_PATH} merged in: "
                 f"`{json.dumps(PORTICO_EXTRA, default=str)}`")
    for p, why in sat_out(scenario, args.peers):
        L.append(f"- {p} sits this scenario out: {why}")
    L.append("")
    L += body
    L.append("Peer configurations and the reasons for each setting: `bench/peers/`.")
    stem = report_stem(scenario, args)
    path = os.path.join(outdir, f"{stem}.md")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    with open(os.path.join(outdir, f"{stem}.json"), "w") as f:
        json.dump({"command": command, "versions": vers, "portico_extra": PORTICO_EXTRA,
                   "results": results}, f, indent=1, default=str)
    log(f"wrote {path}")
    if args.chart:
        try:
            chart(scenario, results, subjects, outdir, args)
        except ImportError:
            log("matplotlib not installed (pip install matplotlib): no chart")
    return "\n".join(L)


def sat_out(scenario, peers):
    """(peer, reason) for the asked-for peers that sit `scenario` out."""
    return [(p, SITS_OUT[p][scenario]) for p in peers if scenario in SITS_OUT.get(p, {})]


def nginx_pair_note(m, best, key, label, fmt):
    """When the best peer is nginx at one of its two settings, the other
    setting's figure and p99 beside it (issue 17: nginx runs both ways, the
    faster counts)."""
    pair = {"nginx": "nginx-tput", "nginx-tput": "nginx"}
    other = pair.get(best)
    if other is None or other not in m:
        return ""
    name = {"nginx": "latency settings", "nginx-tput": "throughput settings"}
    return (f"; nginx counted at its {name[best]} (faster here), at its {name[other]}: "
            f"{label} {fmt(m[other][key])}, p99 {m[other]['p99_us']/1000:.2f} ms "
            f"(vs {m[best]['p99_us']/1000:.2f} ms)")


def med(rs, key):
    return statistics.median(r[key] for r in rs)


def report_wrk(scenario, results, peers, args):
    extra = [f"- Load: `wrk -t1 -c{wrk_connections(scenario, args)} -d{args.duration}s --latency"
             + (" -H 'Connection: close'" if scenario == "close" else "")
             + f"` on CPU {LOAD_CPU} (with the origin); proxy under test on CPU {PROXY_CPU}; "
             f"{args.rounds} interleaved round(s), fresh cache per run"]
    m = {p: {k: med(results[p], k) for k in ("rps", "p50_us", "p99_us", "proxy_cpu",
                                              "rps_per_core", "other_cpu")} for p in peers}
    others = [p for p in peers if p != "portico"]
    best = max(others, key=lambda p: m[p]["rps"]) if others else None
    best_core = max(others, key=lambda p: m[p]["rps_per_core"]) if others else None
    L = ["Medians over rounds; spread is min–max. `proxy CPU` is the proxy's whole process "
         "tree (utime+stime from /proc) over the run, in cores; `req/s per core` = "
         "requests / proxy CPU seconds. `other CPU` is everything else on the machine "
         "(not proxy, wrk, origin, this script).\n"]
    if scenario == "disk-hits":
        L.append(f"Every proxy's memory cache is {DISK_HITS_MEMORY_MIB} MiB, far smaller than "
                 "the 127 MiB object set, in front of its disk cache (files under the work dir, "
                 "in the page cache): Portico `cache.memory` 16 MiB + its 1 GiB disk tier; "
                 "nginx its usual proxy_cache files; Varnish `-s file` (1 GiB, mmap'd); Squid "
                 "`cache_mem 16 MB` + an aufs `cache_dir`; ATS a 16 MiB RAM cache + its 1 GiB "
                 "cache file. HAProxy has no disk cache and sits out (bench/peers/).\n")
    if scenario == "miss":
        L.append("Every request goes through the proxy to the origin (no-store), and the "
                 "origin (nginx, on the load CPU with wrk) is part of each request's cost: a "
                 "proxy CPU well under 1.00 means the origin or wrk was the limit.\n")
    if scenario == "store":
        L.append("Every request goes through the proxy to the origin, as in `miss`, but the "
                 "response (fresh for 120 s) is stored: the cost of a miss the cache keeps "
                 "(writing the object, and evicting others once the memory cache is full). "
                 "Each proxy stores as in the other scenarios (Portico 1 GiB of memory and "
                 "its disk tier, nginx its cache files, Varnish malloc 1 GiB, Squid and ATS "
                 "as in bench/peers/).\n")
    L.append("| proxy | req/s | spread | p50 ms | p99 ms | p99 spread | proxy CPU | "
             "req/s per proxy core | other CPU | runs |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in peers:
        rs, q = results[p], m[p]
        L.append(f"| {p} | {q['rps']:,.0f} | {fmt_spread([r['rps'] for r in rs], lambda v: f'{v:,.0f}')} "
                 f"| {q['p50_us']/1000:.2f} | {q['p99_us']/1000:.2f} "
                 f"| {fmt_spread([r['p99_us']/1000 for r in rs], lambda v: f'{v:.2f}')} "
                 f"| {q['proxy_cpu']:.2f} | {q['rps_per_core']:,.0f} | {q['other_cpu']:.2f} | {len(rs)} |")
    L.append("")
    if "portico" in m and best:
        pm = m["portico"]
        L.append(f"Portico / best peer: req/s {pm['rps']/m[best]['rps']:.2f}x ({best}), "
                 f"req/s per proxy core {pm['rps_per_core']/m[best_core]['rps_per_core']:.2f}x "
                 f"({best_core}), p99 {pm['p99_us']/m[best]['p99_us']:.2f}x of {best}'s "
                 f"(higher is better for req/s, lower for p99)"
                 + nginx_pair_note(m, best_core, "rps_per_core", "req/s per core",
                                   lambda v: f"{v:,.0f}") + ".\n")
    if "nginx" in m and "nginx-tput" in m:
        L.append("nginx runs twice: `nginx` with its latency settings (tcp_nopush off), "
                 "`nginx-tput` with its throughput settings (tcp_nopush on, open_file_cache); "
                 "the one with more req/s per proxy core counts as the peer "
                 "(bench/peers/nginx.md).\n")
    L.append("## Checks\n")
    L.append("| proxy | round | requests | errors (non-2xx/socket) | origin requests during run | "
             "X-Cache sample | hits by its own counter (store: responses stored) | RSS MiB after | proxy CPU in the kernel | "
             "wrk CPU | other CPU | attempts |")
    L.append("|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for p in peers:
        for i, r in enumerate(results[p]):
            own = f"{r['peer_hits']:,}" if "peer_hits" in r else "—"
            if "stored" in r:
                own = f"{r['stored']:,} stored"
            if "disk_reads" in r:
                own += f" ({r['disk_reads']:,} from the disk tier)"
            L.append(f"| {p} | {i+1} | {r['requests']:,} | {r['errors']} | {r['origin_during']:,} | "
                     f"{r.get('sample_hits') or '—'} | {own} | {r['rss_mib']:.0f} | "
                     f"{r.get('proxy_sys_share', 0.0):.0%} | "
                     f"{r['wrk_cpu']:.2f} | {r['other_cpu']:.2f} | {r.get('attempts', 1)} |")
    L.append("")
    if scenario == "store":
        L.append("A store run passes when the origin served at least as many requests as wrk "
                 "counted responses, 20 new URLs asked for twice after the run were hits the "
                 "second time (where the proxy says: its X-Cache or Cache-Status), and "
                 "Portico's own count of stored responses grew by at least wrk's count.\n")
    if scenario == "miss":
        L.append("A miss run passes when the origin served at least as many requests as wrk "
                 "counted responses (requests still in flight when wrk stops reach the origin "
                 "but are not counted).\n")
    noisy = [(p, i + 1) for p in peers for i, r in enumerate(results[p]) if r["other_cpu"] > 0.3]
    if noisy:
        L.append("Noisy runs (other CPU > 0.3 core): " +
                 ", ".join(f"{p} round {i}" for p, i in noisy) + ".\n")
    return L, extra


def report_idle(scenario, results, peers, args):
    n = args.idle_connections
    extra = [f"- Load: {n:,} connections opened one after another by the harness (CPU "
             f"{LOAD_CPU}) and left silent; then one `GET /page` (38,314 bytes, a cache hit) "
             f"on each, read whole, in batches of 100, the connection kept open; proxy under "
             f"test on CPU {PROXY_CPU}; {args.rounds} interleaved round(s), fresh process per run"]
    L = ["Memory per idle connection = (RSS of the proxy's process tree with the connections "
         "open − RSS before them) / connections, in KiB (1 KiB = 1,024 bytes). RSS is read once "
         "the kernel holds no connection for the listener (none deferred in SYN-RECV, the accept "
         "queue empty) and RSS has settled. Kernel socket buffers are "
         "not in RSS. **Lower is better.** Medians over rounds; spread is min–max.\n",
         "| proxy | KiB/conn, no request yet (lower is better) | spread | KiB/conn, after one "
         "request (lower is better) | spread | baseline RSS MiB | runs |",
         "|---|---:|---:|---:|---:|---:|---:|"]
    m = {p: {k: med(results[p], k) for k in ("fresh_per_conn", "used_per_conn", "base_kib")}
         for p in peers}
    for p in peers:
        rs = results[p]
        L.append(f"| {p} | {m[p]['fresh_per_conn']:.2f} | "
                 f"{fmt_spread([r['fresh_per_conn'] for r in rs], lambda v: f'{v:.2f}')} | "
                 f"{m[p]['used_per_conn']:.2f} | "
                 f"{fmt_spread([r['used_per_conn'] for r in rs], lambda v: f'{v:.2f}')} | "
                 f"{m[p]['base_kib']/1024:.1f} | {len(rs)} |")
    L.append("")
    others = [p for p in peers if p != "portico"]
    if "portico" in m and others:
        parts = []
        for k, label in (("fresh_per_conn", "no request yet"), ("used_per_conn",
                                                                 "after one request")):
            best = min(others, key=lambda p: m[p][k])
            ratio = m["portico"][k] / m[best][k] if m[best][k] > 0 else float("inf")
            parts.append(f"{label} {ratio:.2f}x of {best}'s ({m['portico'][k]:.2f} vs "
                         f"{m[best][k]:.2f} KiB)")
        L.append("Portico / best peer (lower is better): " + "; ".join(parts) + ".\n")
    L.append("## Checks\n")
    L.append("| proxy | round | connections | open took s | RSS MiB before / silent / after "
             "requests | failed requests | closed by proxy |")
    L.append("|---|---:|---:|---:|---|---:|---:|")
    for p in peers:
        for i, r in enumerate(results[p]):
            L.append(f"| {p} | {i+1} | {r['connections']:,} | {r['open_s']} | "
                     f"{r['base_kib']/1024:.1f} / {r['fresh_kib']/1024:.1f} / "
                     f"{r['used_kib']/1024:.1f} | {r['bad']} | {r['closed']} |")
    L.append("")
    return L, extra


def report_rate(scenario, results, peers, args):
    extra = [f"- Load: oha, open loop (`-q RATE --latency-correction`, latency counted from "
             f"each request's scheduled send time), up to {args.rate_connections} connections, "
             f"request timeout {args.rate_timeout} s, URLs uniform random over " +
             {"hits": "the 10,000 cached objects (after a warm-up pass)",
              "close": "the 10,000 cached objects (after a warm-up pass), a new connection per "
                       "request (`--rate-load close`: oha `--disable-keepalive`)",
              "miss": "the 10,000 no-store objects under /ns/ (every request a miss, "
                      "`--rate-load miss`)"}[args.rate_load] +
             f", {args.rate_step}s per step; the peak is a "
             f"closed-loop oha run ({args.connections} connections, {args.rate_peak}s) of the "
             f"same load just before the steps; load generator and origin on CPU {LOAD_CPU}, "
             f"proxy on CPU {PROXY_CPU}; {args.rounds} interleaved round(s)"]
    L = ["Per step, medians over rounds. `throughput` = responses/s of any status; `goodput` "
         "= 2xx responses/s, and as % of the closed-loop peak (2xx/s). `errors %` = failed "
         "requests / requests sent, split into 503 responses, other non-2xx statuses, "
         "timeouts (no response within the request timeout) and connection errors (refused, "
         "reset, closed without a response). Mean and p99 are over the responses received. "
         "`load CPU` is CPU 1's oha and origin together: near 1.00, the load side, not the "
         "proxy, was the limit.\n"]
    summary = []
    for p in peers:
        rs = results[p]
        peak = med(rs, "peak_rps")
        L.append(f"### {p}\n")
        L.append(f"Closed-loop peak: {peak:,.0f} req/s "
                 f"({fmt_spread([r['peak_rps'] for r in rs], lambda v: f'{v:,.0f}')}), "
                 f"p99 {med(rs, 'peak_p99_ms'):.2f} ms, proxy CPU "
                 f"{med(rs, 'peak_proxy_cpu'):.2f}, load CPU {med(rs, 'peak_load_cpu'):.2f}, "
                 f"other CPU over the whole run {med(rs, 'other_cpu'):.2f}.\n")
        L.append("| target % | target req/s | throughput | goodput | goodput % of peak | "
                 "mean ms | p99 ms | errors % | 503 % | other status % | timeouts % | "
                 "conn errors % | proxy CPU | load CPU | other CPU |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for si, pct in enumerate(args.rate_steps):
            st = [r["steps"][si] for r in rs if si < len(r["steps"])]
            if not st:
                continue
            q = {k: statistics.median(s[k] for s in st) for k in st[0] if
                 isinstance(st[0][k], (int, float))}
            L.append(f"| {pct}% | {q['target']:,.0f} | {q['throughput']:,.0f} | "
                     f"{q['goodput']:,.0f} | {q['goodput_pct']:.1f}% | {q['mean_ms']:.2f} | "
                     f"{q['p99_ms']:.2f} | {q['err_pct']:.2f} | {q['s503_pct']:.2f} | "
                     f"{q['other_status_pct']:.2f} | {q['timeout_pct']:.2f} | "
                     f"{q['conn_err_pct']:.2f} | {q['proxy_cpu']:.2f} | {q['load_cpu']:.2f} | "
                     f"{q['other_cpu']:.2f} |")
        L.append("")
        last = [r["steps"][-1] for r in rs if r["steps"]]
        if last:
            q = {k: statistics.median(s[k] for s in last) for k in
                 ("goodput_pct", "s503_pct", "err_pct", "proxy_cpu", "load_cpu")}
            clean = all(s["other_status"] + s["timeouts"] + s["conn_errors"] == 0 for s in last)
            q["peak_load_cpu"] = med(rs, "peak_load_cpu")
            summary.append((p, peak, q["goodput_pct"], clean, q, med(rs, "peak_proxy_cpu")))
    last_pct = args.rate_steps[-1] if args.rate_steps else 0
    L.append(f"## Overload (issue 6: at 150% of peak, goodput >= 95% of peak and every failure "
             f"a clean 503); last step here: {last_pct}%\n")
    L.append("A step only overloads the proxy if the proxy, not the load generator, was the "
             "limit: `bound by` says which CPU was near 1.00 (proxy CPU >= 0.9 at the peak and "
             "at the last step: proxy; else load CPU >= 0.9 at either: load generator). The "
             "verdict (`met`) is given only when the proxy was the limit.\n")
    L.append("| proxy | peak req/s | proxy CPU at peak | goodput at the last step, % of peak | "
             "503 % | failures only 503 | proxy CPU | load CPU | bound by | met |")
    L.append("|---|---:|---:|---:|---:|---|---:|---:|---|---|")
    for p, peak, gp, clean, q, pcpu in summary:
        if pcpu >= 0.9 and q["proxy_cpu"] >= 0.9:
            bound = "proxy"
        elif q["load_cpu"] >= 0.9 or q["peak_load_cpu"] >= 0.9:
            bound = "load generator"
        else:
            bound = "neither (other load?)"
        met = ("yes" if gp >= 95 and clean else "no") if bound == "proxy" else "n/a"
        L.append(f"| {p} | {peak:,.0f} | {pcpu:.2f} | {gp:.1f}% | {q['s503_pct']:.2f} | "
                 f"{'yes' if clean else 'no'} | {q['proxy_cpu']:.2f} | {q['load_cpu']:.2f} | "
                 f"{bound} | {met} |")
    L.append("")
    others = [s for s in summary if s[0] != "portico"]
    mine = [s for s in summary if s[0] == "portico"]
    if mine and others:
        best = max(others, key=lambda s: s[1])
        L.append(f"Portico / best peer: closed-loop peak {mine[0][1]/best[1]:.2f}x ({best[0]}); "
                 f"goodput at the last step {mine[0][2]:.1f}% of its peak vs {best[0]}'s "
                 f"{best[2]:.1f}%.\n")
    return L, extra


def report_rules(scenario, results, subjects, args):
    extra = [f"- Load: `wrk -t1 -c{args.connections} -d{args.duration}s --latency` for "
             f"throughput, then `wrk -t1 -c1 -d{max(1, args.duration // 2)}s` for the latency "
             f"of a single request; `GET /rNNNNN/page` (38,314 bytes, a cache hit) matching "
             f"the LAST of N `[[rule]]` entries (`{args.rule_kind}` matchers, distinct "
             f"prefixes /r00000/.., all others routed to a dead decoy upstream, so a wrong "
             f"match is a 502 and fails the run); Portico on CPU {PROXY_CPU}, wrk on CPU "
             f"{LOAD_CPU}; {args.rounds} interleaved round(s)"]
    L = ["Medians over rounds. `CPU µs/request` = Portico's CPU time / requests in the "
         f"throughput run; `+% vs {int(subjects[0]):,}` compares it with the first count "
         "(issue 7's target: 10,000 rules cost < 5% more than 10). `one connection` is wrk "
         "with a single connection: the time for one request with nothing queued, the "
         "Sun proxy's measure (its figures: regex assign-name rules, cache enabled, content "
         "server on the local network, the Sun proxy's hardware and network, so compare the "
         "growth, not the absolute numbers).\n",
         f"| rules | req/s | spread | CPU µs/request | +% vs {int(subjects[0]):,} | p50 ms | "
         "p99 ms | "
         "one connection p50 ms | one connection p99 ms | Sun proxy ms (assign-name) | "
         "started in s | runs |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = None
    for s in subjects:
        rs = results[s]
        n = int(s)
        cpu = med(rs, "cpu_us_per_req")
        if base is None:
            base = cpu
        seed = SEED_RULES_MS.get(n)
        L.append(f"| {n:,} | {med(rs, 'rps'):,.0f} | "
                 f"{fmt_spread([r['rps'] for r in rs], lambda v: f'{v:,.0f}')} | {cpu:.2f} | "
                 f"{(cpu / base - 1) * 100:+.1f}% | {med(rs, 'p50_us')/1000:.2f} | "
                 f"{med(rs, 'p99_us')/1000:.2f} | {med(rs, 'single_p50_us')/1000:.3f} | "
                 f"{med(rs, 'single_p99_us')/1000:.3f} | {seed if seed else '—'} | "
                 f"{med(rs, 'start_s'):.2f} | {len(rs)} |")
    L.append("")
    L.append("## Checks\n")
    L.append("| rules | round | requests | errors | origin requests during runs | other CPU |")
    L.append("|---:|---:|---:|---:|---:|---:|")
    for s in subjects:
        for i, r in enumerate(results[s]):
            L.append(f"| {int(s):,} | {i+1} | {r['requests']:,} | {r['errors']} | "
                     f"{r['origin_during']} | {r['other_cpu']:.2f} |")
    L.append("")
    return L, extra


def report_auth(scenario, results, subjects, args):
    extra = [f"- Load: `wrk -t1 -c{args.connections} -d{args.duration}s --latency` on "
             f"`GET /page` (38,314 bytes, a cache hit); `authenticated` adds "
             f"`-H 'Authorization: Basic ...'` for the one user of an htpasswd file written by "
             f"`htpasswd -nbB -C {AUTH_COST}` (bcrypt), with `[auth] required = true`; "
             f"`anonymous` is the same config without `[auth]`. Portico on CPU {PROXY_CPU}, "
             f"wrk on CPU {LOAD_CPU}; {args.rounds} interleaved round(s) (anonymous, "
             f"authenticated, anonymous, ...), fresh Portico per run"]
    L = ["Medians over rounds; spread is min–max. `CPU µs/request` = Portico's CPU time / "
         "requests; `req/s per core` = requests / Portico CPU seconds. Issue 14's target: "
         "authenticated hits whose user is in the user cache cost within 5% of anonymous "
         "hits per core.\n",
         "| clients | req/s | spread | CPU µs/request | req/s per core | spread | p50 ms | "
         "p99 ms | proxy CPU | other CPU | runs |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in subjects:
        rs = results[s]
        L.append(f"| {s} | {med(rs, 'rps'):,.0f} | "
                 f"{fmt_spread([r['rps'] for r in rs], lambda v: f'{v:,.0f}')} | "
                 f"{med(rs, 'cpu_us_per_req'):.2f} | {med(rs, 'rps_per_core'):,.0f} | "
                 f"{fmt_spread([r['rps_per_core'] for r in rs], lambda v: f'{v:,.0f}')} | "
                 f"{med(rs, 'p50_us')/1000:.2f} | {med(rs, 'p99_us')/1000:.2f} | "
                 f"{med(rs, 'proxy_cpu'):.2f} | {med(rs, 'other_cpu'):.2f} | {len(rs)} |")
    L.append("")
    if all(results.get(s) for s in AUTH_SUBJECTS):
        a, b = results["anonymous"], results["authenticated"]
        ratio = med(b, "rps_per_core") / med(a, "rps_per_core")
        cost = med(b, "cpu_us_per_req") / med(a, "cpu_us_per_req") - 1
        pairs = [y["rps_per_core"] / x["rps_per_core"] for x, y in zip(a, b)]
        L.append(f"Authenticated / anonymous, req/s per core: **{ratio:.3f}** "
                 f"({cost * 100:+.1f}% CPU per request; per round "
                 f"{', '.join(f'{p:.3f}' for p in pairs)}); target ≥ 0.95: "
                 f"{'met' if ratio >= 0.95 else 'NOT met'}.\n")
    L.append("## Checks\n")
    L.append("| clients | round | requests | errors | origin requests during run | "
             "user cache hits / misses during run | no / wrong credentials | other CPU |")
    L.append("|---|---:|---:|---:|---:|---|---|---:|")
    for s in subjects:
        for i, r in enumerate(results[s]):
            uc = (f"{r['auth_hits']:,} / {r['auth_misses']}" if "auth_hits" in r else "—")
            L.append(f"| {s} | {i+1} | {r['requests']:,} | {r['errors']} | "
                     f"{r['origin_during']} | {uc} | {r.get('refused', '—')} | "
                     f"{r['other_cpu']:.2f} |")
    L.append("")
    return L, extra


def report_auth_ldap(scenario, results, subjects, args):
    rs = results["portico"]
    slapd_v = subprocess.run(["/usr/sbin/slapd", "-VV"], capture_output=True, text=True)
    first_line = (slapd_v.stdout + slapd_v.stderr).strip().splitlines()
    extra = [f"- Directory: OpenLDAP slapd ({first_line[0] if first_line else '?'}), mdb, "
             f"{rs[0]['users']} users in one groupOfNames, on CPU {LOAD_CPU} with this script; "
             f"Portico on CPU {PROXY_CPU}, `[auth.ldap]` with a service account, "
             f"`group_filter = \"(member={{dn}})\"`, the default pool of 4 connections",
             "- Each user: one request with its Basic credentials on a new keep-alive "
             "connection (a user cache miss: Portico searches for the DN, binds as the user, "
             "binds back and searches the groups), then a second on the same connection (a "
             "user cache hit); `GET /page`, a cache hit, timed from the request's first byte "
             "to the response's last; one login at a time",
             "- `directory alone`: the same five operations (bind, search, bind, bind, search) "
             "timed by bench/ldap.py on one open connection, before Portico starts; this "
             f"client shares CPU {LOAD_CPU} with slapd, while Portico's requests to slapd cross "
             "between the CPUs (a wake-up on the other CPU per LDAP operation)",
             "- Machine load (1-minute load average) at the end of each round: " +
             ", ".join(f"{r['loadavg']:.1f}" for r in rs) + " (2 CPUs; above about 2, other "
             "work shared the CPUs and the tails show it)"]
    L = ["Milliseconds per login, over all users of all rounds; issue 14 asks for the "
         "first-login latency against the local slapd to be reported.\n",
         "| login | logins | p50 ms | p90 ms | p99 ms | max ms |", "|---|---:|---:|---:|---:|---:|"]
    for key, label in (("direct", "directory alone (5 LDAP operations)"),
                       ("first", "first login through Portico (user cache miss)"),
                       ("cached", "repeated login through Portico (user cache hit)")):
        p = {q: statistics.median(r[key][q] for r in rs) for q in ("p50", "p90", "p99", "max")}
        L.append(f"| {label} | {sum(r[key]['n'] for r in rs):,} | {p['p50']:.2f} | "
                 f"{p['p90']:.2f} | {p['p99']:.2f} | {p['max']:.2f} |")
    L.append("")
    f50 = statistics.median(r["first"]["p50"] for r in rs)
    d50 = statistics.median(r["direct"]["p50"] for r in rs)
    c50 = statistics.median(r["cached"]["p50"] for r in rs)
    L.append(f"A first login costs {f50 - c50:+.2f} ms at the median over a cached one; the "
             f"directory's own work is {d50:.2f} ms of it, Portico's ({f50 - c50 - d50:+.2f} ms) "
             f"the LDAP client (ldap3), the pool and the user cache insert. Portico CPU per "
             f"login, first and repeated together: "
             f"{statistics.median(r['cpu_ms_per_login'] for r in rs):.3f} ms.\n")
    L.append("## Checks\n")
    L.append("| round | users | user cache misses / hits | wrong password | first login p50 ms |")
    L.append("|---:|---:|---|---:|---:|")
    for i, r in enumerate(rs):
        L.append(f"| {i + 1} | {r['users']} | {r['misses']} / {r['hits']} | "
                 f"{r['wrong_password']} | {r['first']['p50']:.2f} |")
    L.append("")
    return L, extra


def report_soak(scenario, results, subjects, args):
    r = results["portico"][0]
    conf = r["config"]
    extra = [f"- Load: bench/soak.py, open loop at {r['rate']:g} requests/s (each started at "
             f"its scheduled time whatever the others are doing), one client process on CPU "
             f"{LOAD_CPU} with the soak origin (bench/soak.py origin, asyncio); Portico on CPU "
             f"{PROXY_CPU}, a forward and a reverse listener (GETs split between them)",
             f"- Portico config: memory tier {r['memory_limit'] / 2**20:.0f} MiB "
             f"(max_memory_object 64 KiB), disk tier {r['disk_limit'] / 2**20:.0f} MiB on the "
             f"work dir, origin connect/first-byte/idle timeouts "
             f"{conf['origin']['connect_timeout']}/{conf['origin']['first_byte_timeout']}/"
             f"{conf['origin']['idle_timeout']}, keep-alive {conf['keepalive']['timeout']} "
             f"({conf['keepalive']['max_requests']} requests per connection), access log off",
             f"- Pre-fill: {r['prefill_bytes'] / 2**20:.0f} MiB of new objects in "
             f"{r['prefill_s']} s before the load, so the disk tier starts full, then the "
             f"400 hit objects once through each listener"]
    src = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s", "--", "src",
                          "Cargo.toml", "Cargo.lock"], capture_output=True, text=True)
    if src.returncode == 0 and src.stdout.strip():
        extra.append(f"- Portico source: last commit touching src/, Cargo.toml, Cargo.lock: "
                     f"{src.stdout.strip()[:120]}")
    return soak.report_lines(r), extra


def chart(scenario, results, subjects, outdir, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if scenario == "hitratio":
        log("wrote " + hitratio_bench.chart(sys.modules[__name__], results, subjects, outdir, args))
        return
    if scenario == "soak":
        path = os.path.join(outdir, "soak.png")
        soak.chart(results["portico"][0], path, f"soak: {SCENARIOS['soak']}")
        log(f"wrote {path}")
        return
    color = ["#c0392b" if p == "portico" else "#7f8c8d" for p in subjects]

    def bars(ax, key, label, scale=1.0):
        meds = [med(results[p], key) * scale for p in subjects]
        lo = [m - min(r[key] for r in results[p]) * scale for m, p in zip(meds, subjects)]
        hi = [max(r[key] for r in results[p]) * scale - m for m, p in zip(meds, subjects)]
        ax.bar(subjects, meds, yerr=[lo, hi], capsize=4, color=color)
        ax.set_title(label, fontsize=9)

    if scenario in WRK_SCENARIOS or scenario == "auth" or scenario in tls_bench.THROUGHPUT:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        bars(axes[0], "rps", "requests/s (higher is better)")
        bars(axes[1], "rps_per_core", "requests/s per proxy core (higher is better)")
    elif scenario == "idle":
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        bars(axes[0], "fresh_per_conn", "KiB per idle connection, no request yet (lower is better)")
        bars(axes[1], "used_per_conn", "KiB per idle connection, after one request (lower is better)")
    elif scenario == "rate":
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        top = 0
        for p in subjects:
            rs = results[p]
            xs, gp, tp, p99 = [], [], [], []
            for si, pct in enumerate(args.rate_steps):
                st = [r["steps"][si] for r in rs if si < len(r["steps"])]
                if st:
                    xs.append(statistics.median(s["target"] for s in st))
                    gp.append(statistics.median(s["goodput"] for s in st))
                    tp.append(statistics.median(s["throughput"] for s in st))
                    p99.append(statistics.median(s["p99_ms"] for s in st))
            top = max([top] + xs)
            kw = {"color": "#c0392b", "linewidth": 2.5} if p == "portico" else {}
            line, = axes[0].plot(xs, gp, marker="o", label=f"{p} 2xx/s", **kw)
            if any(abs(a - b) > 0.5 for a, b in zip(gp, tp)):   # 503s etc. shown dashed
                axes[0].plot(xs, tp, "--", color=line.get_color(), label=f"{p} all responses/s")
            axes[1].plot(xs, p99, marker="o", label=p, color=line.get_color(),
                         linewidth=kw.get("linewidth", 1.5))
        axes[0].plot([0, top], [0, top], ":", color="#999", label="offered")
        axes[0].set_xlabel("target rate, requests/s (25-150% of each proxy's peak)")
        axes[0].set_ylabel("throughput, requests/s")
        axes[0].set_title("throughput vs target rate (higher is better)", fontsize=9)
        axes[1].set_xlabel("target rate, requests/s")
        axes[1].set_ylabel("p99 ms (log)")
        axes[1].set_yscale("log")
        axes[1].set_title("p99 response time vs target rate (lower is better)", fontsize=9)
        axes[0].legend(fontsize=8)
        axes[1].legend(fontsize=8)
    elif scenario == "rules":
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        ns = [int(s) for s in subjects]
        axes[0].plot(ns, [med(results[s], "rps") for s in subjects], marker="o", color="#c0392b",
                     label="Portico req/s")
        axes[0].set_xscale("log")
        axes[0].set_ylim(bottom=0)
        axes[0].set_xlabel("rules")
        axes[0].set_title("requests/s (higher is better)", fontsize=9)
        axes[1].plot(ns, [med(results[s], "single_p50_us") / 1000 for s in subjects],
                     marker="o", color="#c0392b", label="Portico, one request (p50)")
        sn = [n for n in ns if n in SEED_RULES_MS]
        axes[1].plot(sn, [SEED_RULES_MS[n] for n in sn], marker="s", color="#7f8c8d",
                     label="Sun proxy 4.0: assign-name regex rules")
        axes[1].set_xscale("log")
        axes[1].set_yscale("log")
        axes[1].set_xlabel("rules")
        axes[1].set_ylabel("ms (log)")
        axes[1].set_title("response time of one request (lower is better)", fontsize=9)
        axes[1].legend(fontsize=8)
    else:
        return
    fig.suptitle(f"{scenario}: {SCENARIOS[scenario]}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(outdir, f"{report_stem(scenario, args)}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    log(f"wrote {path}")


# ---------------------------------------------------------------- main

def run_one(scenario, subject, tmp, args, ctx, origin):
    if scenario in WRK_SCENARIOS:
        return run_wrk_scenario(scenario, subject, tmp, args, ctx, origin)
    if scenario == "idle":
        return run_idle(subject, tmp, args, ctx, origin)
    if scenario == "rate":
        return run_rate(subject, tmp, args, ctx, origin)
    if scenario == "rules":
        return run_rules(int(subject), tmp, args, ctx, origin)
    if scenario == "soak":
        return run_soak(tmp, args)
    if scenario == "auth":
        return run_auth(subject, tmp, args, ctx, origin)
    if scenario == "auth-ldap":
        return run_auth_ldap(tmp, args, ctx, origin)
    if scenario == "array":
        return array_bench.run(sys.modules[__name__], subject, tmp, args, ctx, origin)
    if scenario == "hitratio":
        return hitratio_bench.run(sys.modules[__name__], subject, tmp, args, ctx, origin)
    if scenario == "polygraph":
        return polygraph_bench.run(sys.modules[__name__], subject, tmp, args, ctx, origin)
    if scenario in tls_bench.SCENARIOS:
        return tls_bench.run(sys.modules[__name__], scenario, subject, tmp, args, ctx, origin)
    raise ValueError(scenario)


def default_tmp_dir():
    """tmpfs when there is room: creating 10,000 files (object set, nginx's and
    Portico's disk caches) on a shared virtual disk costs ~1 ms each and
    varies with the neighbours' I/O; hits are served from the page cache
    either way."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 2 << 30 and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    except OSError:
        pass
    return None


def precheck_portico(args):
    """Fail at once, not once per run, when this Portico rejects the config
    the harness would give it (--portico-extra, --rule-kind regex)."""
    d = tempfile.mkdtemp(prefix="portico-bench-check-")
    try:
        portico_check(args.portico_bin, write_portico_conf(d))
        if "rules" in args.scenarios:
            portico_check(args.portico_bin, write_portico_conf(d, 2, args.rule_kind),
                          args.rule_kind)
        if "auth" in args.scenarios:
            portico_check(args.portico_bin, write_portico_conf(d, auth=True))
    except RuntimeError as e:
        sys.exit(f"bench: {e}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def int_list(s):
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {s!r}")


def raise_nofile(need):
    """Open-files limit for this process and the proxies it starts (they
    inherit it): at least `need`, raising the hard limit too when root."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(need, 65536)
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            want = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def main():
    global NGINX_TCP_NOPUSH, PORTICO_EXTRA, PORTICO_EXTRA_PATH
    ap = argparse.ArgumentParser(
        prog="bench/run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Portico against nginx (at its latency and its throughput settings), "
                    "Varnish, Squid, HAProxy and Apache Traffic Server as caching reverse "
                    "proxies.",
        epilog="scenarios:\n" + "\n".join(f"  {k:6} {v}" for k, v in SCENARIOS.items()) +
               "\npeers:\n  " + ", ".join(PEERS) + " (configs and reasons: bench/peers/)\n\n"
               "examples:\n"
               "  bench/run --smoke                      # CI: every scenario, a few seconds, "
               "Portico only\n"
               "  bench/run --rounds 3 --chart           # full run (~40 min), tables and "
               "charts in bench/results/\n"
               "  bench/run hot --peers varnish --rounds 1 --duration 5   # one peer, < 1 minute\n"
               "  bench/run rate --peers portico --portico-extra bench/overload.toml "
               "--out /tmp/ovl\n"
               "  bench/run rules --rule-kind regex --portico-bin PATH   # once [[rule]] "
               "regex exists")
    ap.add_argument("scenarios", nargs="*", help="scenarios to run (default: all)")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated (default: all)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--duration", type=int, default=8,
                    help="seconds per wrk run (hot, hits, close, miss, rules; default 8)")
    ap.add_argument("--connections", type=int, default=64,
                    help="closed-loop connections (wrk, and oha's peak run; default 64)")
    ap.add_argument("--idle-connections", type=int, default=10000,
                    help="idle: connections held open (default 10000)")
    ap.add_argument("--rate-steps", type=int_list, default=RATE_STEPS,
                    help="rate: percent of the peak (default 25,50,75,100,120,150)")
    ap.add_argument("--rate-step", type=int, default=4, help="rate: seconds per step (default 4)")
    ap.add_argument("--rate-peak", type=int, default=3,
                    help="rate: seconds of the closed-loop peak run (default 3)")
    ap.add_argument("--rate-connections", type=int, default=1000,
                    help="rate: most connections oha opens (default 1000)")
    ap.add_argument("--rate-timeout", type=float, default=2.0,
                    help="rate: request timeout in seconds; slower counts as a timeout "
                         "(default 2)")
    ap.add_argument("--rate-load", choices=["hits", "close", "miss"], default="hits",
                    help="rate: URLs of the hits scenario (cached, after a warm-up), the same "
                         "with a new connection per request (close: the close scenario's tail "
                         "measured below the load generator's limit), or of the miss scenario "
                         "(no-store: every request to the origin); default hits")
    ap.add_argument("--rule-counts", type=int_list, default=RULE_COUNTS,
                    help="rules: rule counts (default 10,100,1000,10000)")
    ap.add_argument("--rule-kind", choices=["path", "regex"], default="path",
                    help="rules: `path` prefixes (default) or `regex` matchers (needs issue 7's "
                         "rules engine)")
    ap.add_argument("--soak-duration", type=int, default=3600,
                    help="soak: seconds of load (default 3600; --smoke: 30)")
    ap.add_argument("--soak-interval", type=float, default=10.0,
                    help="soak: seconds between samples (default 10; --smoke: 2)")
    ap.add_argument("--soak-warmup", type=float, default=None,
                    help="soak: seconds of load before the trend rule looks at samples "
                         "(default a tenth of the duration; --smoke: 10)")
    ap.add_argument("--soak-slack", type=int, default=8,
                    help="soak: absolute slack of the trend rule for fds and connections "
                         "(default 8; --smoke: 24, its quarters are 2-3 samples)")
    ap.add_argument("--soak-rate", type=float, default=200.0,
                    help="soak: requests started per second, open loop (default 200)")
    ap.add_argument("--soak-memory", type=parse_size, default=16 << 20,
                    help="soak: Portico's memory tier (default 16MiB)")
    ap.add_argument("--soak-disk", type=parse_size, default=64 << 20,
                    help="soak: Portico's disk tier (default 64MiB)")
    ap.add_argument("--soak-max-unexpected", type=float, default=1.0,
                    help="soak: percent of requests that may end unexpectedly (client "
                         "timeout, unexpected status) before the run fails (default 1.0); "
                         "a wrong body always fails")
    ap.add_argument("--polygraph-rate", type=int, default=None,
                    help=f"polygraph: offered requests/s (default {polygraph_bench.RATE}; "
                         f"--smoke: {polygraph_bench.RATE_SMOKE}); the outside run's figures "
                         f"were at 800-2,400")
    ap.add_argument("--polygraph-seconds", type=int, default=None,
                    help=f"polygraph: seconds of offered load (default "
                         f"{polygraph_bench.DURATION}; --smoke: {polygraph_bench.DURATION_SMOKE})")
    ap.add_argument("--hitratio-requests", type=int, default=None,
                    help=f"hitratio: requests in the stream (default "
                         f"{hitratio_bench.REQUESTS:,}; --smoke: {hitratio_bench.REQUESTS_SMOKE:,})")
    ap.add_argument("--hitratio-disk", metavar="PEER=MIB[,...]", default=None,
                    help=f"hitratio: configure PEER with MIB of disk cache instead of "
                         f"{hitratio_bench.DISK_MIB}, to compare at equal disk in use (e.g. "
                         f"portico=1577: Portico given what nginx, whose cache manager falls "
                         f"behind max_size, held on average); the report is written as "
                         f"hitratio-disk-<peer><mib>")
    ap.add_argument("--tls-key", choices=["rsa", "ec"], default="rsa",
                    help="tls-full, tls-resume, tls-hits, h2-hits: the certificate's key, RSA "
                         "2048 (default) or ECDSA P-256 (tls-roundtrips runs both)")
    ap.add_argument("--tls-max", choices=["1.2", "1.3"], default="1.3",
                    help="tls-full, tls-resume, tls-hits: the newest TLS version the client "
                         "offers (wrk through OPENSSL_CONF's MaxProtocol, the harness's checks "
                         "alike): 1.3 (default) or 1.2, whose resumption needs no key exchange")
    ap.add_argument("--portico-extra", metavar="FILE",
                    help="TOML merged into Portico's generated config (tables key by key, "
                         "arrays of tables appended), e.g. [server] max_requests / queue_size")
    ap.add_argument("--smoke", action="store_true",
                    help="every scenario for a few seconds, Portico only, 1 round; "
                         "exit 1 if a check fails")
    ap.add_argument("--redo", type=int, default=1,
                    help="redo a run up to N times when other processes used > 0.3 core "
                         "during it; the quietest attempt is kept (default 1)")
    ap.add_argument("--nginx-tcp-nopush", action="store_true",
                    help="the `nginx` peer (latency settings) with tcp_nopush on too (Debian's "
                         "stock setting; default off; `nginx-tput` always has it on), see "
                         "bench/peers/nginx.md")
    ap.add_argument("--no-install", action="store_true",
                    help="do not apt-get / cargo install anything")
    ap.add_argument("--portico-bin", help="use this binary instead of cargo build --release")
    ap.add_argument("--out", default=os.path.join(HERE, "results"),
                    help="where <scenario>.md/.json/.png go (default bench/results)")
    ap.add_argument("--chart", action="store_true", help="also write <scenario>.png (matplotlib)")
    ap.add_argument("--tmp-dir", help="where the work dir (object set, configs, the proxies' "
                    "disk caches) goes (default /dev/shm when it has 2 GiB free, else $TMPDIR "
                    "or /tmp)")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (configs, logs)")
    args = ap.parse_args()
    command = "bench/run " + " ".join(sys.argv[1:])
    for s in args.scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r} (have: {', '.join(SCENARIOS)})")
    args.scenarios = args.scenarios or [s for s in SCENARIOS
                                        if args.smoke or s not in NAMED_ONLY]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in args.peers:
        if p not in PEERS:
            ap.error(f"unknown peer {p!r} (have: {', '.join(PEERS)})")
    if args.smoke:
        args.peers, args.rounds, args.duration, args.redo = ["portico"], 1, 2, 0
        args.rate_step, args.rate_peak = 1, 2
        args.soak_duration, args.soak_interval, args.soak_warmup = 30, 2.0, 10.0
        args.soak_slack = 24
        # Under the listener's queue of handshakes (the listen backlog,
        # 4,096): the idle connections are silent, so TCP_DEFER_ACCEPT keeps
        # them in SYN-RECV, and 10,000 overflow into SYN cookies, some of
        # which fail their check and are reset (TcpExtSyncookiesFailed
        # equalled the connections "closed early" in every failing run, about
        # half of the smoke runs after `close` and `busy`, 2026-12-06).
        # bench/README.md, "Silent connections past the SYN backlog".
        if args.idle_connections == 10000:
            args.idle_connections = 2000
        args.out = os.path.join(tempfile.gettempdir(), "portico-bench-smoke")
    if args.rate_load == "miss":
        SCENARIOS["rate"] = SCENARIOS["rate"].replace(
            "hits over the 10,000 objects", "misses over the 10,000 no-store objects")
    if args.rate_load == "close":
        SCENARIOS["rate"] = SCENARIOS["rate"].replace(
            "hits over the 10,000 objects (also issue 6's overload benchmark)",
            "hits over the 10,000 objects, a new connection per request (the `close` "
            "scenario's tail below the load generator's limit)")
    if args.idle_connections != 10000:
        SCENARIOS["idle"] = SCENARIOS["idle"].replace(
            "10,000", f"{args.idle_connections:,}")
    for p in hitratio_bench.disk_overrides(args.hitratio_disk):
        if p not in PEERS:
            ap.error(f"--hitratio-disk: unknown peer {p!r} (have: {', '.join(PEERS)})")
    if any(n < 1 or n > 99999 for n in args.rule_counts):
        ap.error("--rule-counts: each between 1 and 99999")
    if args.portico_extra:
        import tomllib   # Python 3.11+
        PORTICO_EXTRA_PATH = args.portico_extra
        try:
            with open(args.portico_extra, "rb") as f:
                PORTICO_EXTRA = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            ap.error(f"--portico-extra {args.portico_extra}: {e}")
    if args.nginx_tcp_nopush:
        NGINX_TCP_NOPUSH = "on"
    if os.cpu_count() < 2:
        sys.exit("bench: needs at least 2 CPUs (proxy on CPU 0, load on CPU 1)")
    for only in ("rules", "soak", "auth", "array"):
        if only in args.scenarios and "portico" not in args.peers:
            log(f"{only}: Portico only, and Portico is not among --peers: skipped")
            args.scenarios.remove(only)

    if not args.no_install:
        ensure_installed(args.peers, (["htpasswd"] if "auth" in args.scenarios else []) +
                         (["slapd", "ldapadd"] if "auth-ldap" in args.scenarios else []) +
                         (["openssl"] if set(args.scenarios) & set(tls_bench.SCENARIOS)
                          else []) +
                         (["h2load"] if set(args.scenarios) & set(tls_bench.H2LOAD) else []))
    args.peers = drop_missing_peers(args.peers)
    oha = ensure_oha(not args.no_install) if "rate" in args.scenarios else find_oha()
    if "rate" in args.scenarios and not oha:
        msg = "rate: oha not found (cargo install oha --locked)"
        if args.smoke:
            sys.exit(f"bench: {msg}")
        log(f"{msg}: skipped")
        args.scenarios.remove("rate")
    bin_given = bool(args.portico_bin)
    if args.portico_bin:
        args.portico_bin = os.path.abspath(args.portico_bin)
        if not os.access(args.portico_bin, os.X_OK):
            sys.exit(f"bench: {args.portico_bin} is not an executable")
    elif "portico" in args.peers:
        args.portico_bin = build_portico()
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    nofile = raise_nofile(args.idle_connections + 1024)
    if "idle" in args.scenarios and nofile < args.idle_connections + 256:
        sys.exit(f"bench: open-files limit {nofile} too low for --idle-connections "
                 f"{args.idle_connections}")

    if "portico" in args.peers:
        precheck_portico(args)
    tmp = tempfile.mkdtemp(prefix="portico-bench-", dir=args.tmp_dir or default_tmp_dir())
    log(f"work dir {tmp} (object set, configs, caches)")
    os.chmod(tmp, 0o755)
    origin = None
    failures = []
    t_start = time.time()
    try:
        ctx = {"paths": [], "scripts": {}, "oha": oha}
        if any(s not in ("soak",) for s in args.scenarios):   # the soak has its own origin
            data = os.path.join(tmp, "data")
            log(f"generating object set in {data} (seed {SEED})")
            paths, sizes = generate_objects(data)
            subprocess.run(["chmod", "-R", "a+rX", data], check=True)
            log(f"{len(paths)} objects, mean {statistics.mean(sizes):.0f} B, "
                f"max {max(sizes)} B, total {sum(sizes) / 2**20:.1f} MiB")
            ctx = {"paths": paths, "scripts": write_wrk_scripts(tmp, paths), "oha": oha}
            # origin first (Squid's first forward may fail otherwise)
            origin = start_origin(tmp, data)
        vers = versions(args.portico_bin, bin_given)
        for scenario in args.scenarios:
            t_scen = time.time()
            subjects = ([str(n) for n in args.rule_counts] if scenario == "rules"
                        else ["portico"] if scenario == "soak"
                        else list(array_bench.SUBJECTS) if scenario == "array"
                        else list(AUTH_SUBJECTS) if scenario == "auth" else list(args.peers))
            for p, why in sat_out(scenario, subjects):
                log(f"{scenario}: {p} sits this scenario out: {why}")
                subjects.remove(p)
            who = (lambda s: "portico") if scenario in ("rules", "auth", "array") else (lambda s: s)
            results = {s: [] for s in subjects}
            for rnd in range(1 if scenario == "soak" else args.rounds):
                for subj in subjects:           # interleaved: P, n, v, s, P, n, v, s, ...
                    label = f"{scenario} {subj}{' rules' if scenario == 'rules' else ''} " \
                            f"round {rnd+1}"
                    r = None
                    for attempt in range(1 + max(0, args.redo)):
                        try:
                            a = run_one(scenario, subj, tmp, args, ctx, origin)
                        except Exception as e:
                            log(f"{label}: FAILED: {e}")
                            failures.append((scenario, who(subj), f"{subj}: {e}"))
                            r = None
                            break
                        a["attempts"] = attempt + 1
                        if r is None or a["other_cpu"] < r["other_cpu"]:
                            r = a
                        if a["other_cpu"] <= 0.3:
                            break
                        log(f"{label}: noisy (other CPU {a['other_cpu']:.2f} core)" +
                            (", redoing" if attempt < args.redo else ""))
                    if r is None:
                        continue
                    problems = r.pop("problems")
                    results[subj].append(r)
                    log(f"{label}: {r.pop('summary')}")
                    for pr in problems:
                        log(f"{label}: CHECK FAILED: {pr}")
                        failures.append((scenario, who(subj), f"{subj} round {rnd+1}: {pr}"))
            if any(results.values()):
                print(write_report(scenario, results, args, vers, args.out, command))
                print()
            log(f"{scenario}: {time.time() - t_scen:.0f} s")
    finally:
        if origin:
            origin.stop()
        if not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    log(f"total {time.time() - t_start:.0f} s")
    if args.smoke:
        bad = {s for s, _, _ in failures}
        ran = [s for s in args.scenarios]
        print(f"bench smoke: {len([s for s in ran if s not in bad])} passed, "
              f"{len([s for s in ran if s in bad])} failed")
    if failures:
        for s, p, e in failures:
            log(f"FAILURE {s} {p}: {e}")
        portico_failed = any(p == "portico" for _, p, _ in failures)
        sys.exit(1 if (portico_failed or args.smoke) else 0)
    log("all runs passed their checks")


if __name__ == "__main__":
    main()
