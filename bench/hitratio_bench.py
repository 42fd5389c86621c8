#!/usr/bin/env python3
"""The hitratio scenario (issue 16, "Byte hit ratio"): hit ratio and byte hit
ratio of each proxy at the same cache budgets, over one fixed request stream.

- Object population: URLS (1,000,000) URLs `/h/0000000`..`/h/0999999`. The
  size of each is a function of the URL alone (SHA-256 of seed and number):
  a fraction HEAVY_FRACTION (0.1%, about 1,000 URLs) are heavy objects,
  log-uniform between 1 MiB and 100 MiB (mean about 21.5 MiB); the rest
  exponential with mean 13 KiB (13,312 bytes).
- Stream: REQUESTS requests drawn with probability proportional to
  1 / rank^ZIPF_ALPHA (alpha 0.8) over the URLs, the ranks a seeded
  permutation of them (so heavy objects fall on random ranks), the same seed
  for every proxy and round.
- Origin: this file run as `python3 hitratio_bench.py origin ...`, a small
  asyncio HTTP/1.1 server (no files): the body of a URL is a slice of one
  seeded random block, its length the URL's size, `Cache-Control:
  max-age=86400`. It counts the requests it answers and the body bytes it
  writes; `/__count` returns both (not counted). The hit ratio and the byte
  hit ratio are computed from those counts, not from the proxies' claims:
  hit ratio = 1 - origin requests / client requests, byte hit ratio = 1 -
  origin body bytes / body bytes the client received.
- Budgets, the same for every proxy (bench/peers/*.md say how each maps):
  MEMORY_MIB (64 MiB) of memory cache in front of DISK_MIB (1 GiB) of disk
  cache under the work dir.
- Replay: the stream in ten equal parts; each part on CLIENT_CONNS
  keep-alive connections, and the origin's counts read between parts, so the
  chart shows both ratios per 10% of the stream. Every response must be a
  200 with the URL's whole body (its length checked).
"""

import asyncio
import bisect
import email.utils
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time

ZIPF_ALPHA = 0.8
URLS = 1_000_000
MEAN_SIZE = 13 * 1024
HEAVY_FRACTION = 0.001
HEAVY_MIN, HEAVY_MAX = 1 << 20, 100 << 20
HEAVY_MAX_SMOKE = 4 << 20          # --smoke: heavy objects 1-4 MiB
REQUESTS, REQUESTS_SMOKE = 1_000_000, 3_000   # 200,000 until 2026-11-27: too short to show issue 16's goal (bench/README.md)
MEMORY_MIB, DISK_MIB = 64, 1024
USAGE_EVERY = 5.0                   # seconds between samples of each proxy's work dir
CLIENT_CONNS = 8
PARTS = 10
ORIGIN_PORT = 28088
MAX_AGE = 86400
BLOCK = 1 << 20                     # bodies are slices of one 1 MiB random block
PEERS = ("portico", "nginx", "varnish", "squid", "ats")
# Peers that sit this scenario out, and why (merged into bench.py's SITS_OUT).
SITS_OUT = {
    "haproxy": "HAProxy's cache is in shared memory only (no disk tier), so it cannot have "
               "the same memory + disk budget as the others (bench/peers/haproxy.md)",
    "nginx-tput": "nginx's throughput settings (tcp_nopush, open_file_cache) do not change "
                  "what it caches: its hit ratios would be the `nginx` peer's",
}


# ---------------------------------------------------------------- the object population

def size_of(n, seed, heavy_max=HEAVY_MAX):
    """Body length of URL number `n`: a function of (seed, n) only, computed the
    same way by the origin and by the client."""
    h = hashlib.sha256(f"{seed}:{n}".encode()).digest()
    u1 = int.from_bytes(h[0:8], "big") / 2.0 ** 64
    u2 = int.from_bytes(h[8:16], "big") / 2.0 ** 64
    if u1 < HEAVY_FRACTION:
        return int(HEAVY_MIN * (heavy_max / HEAVY_MIN) ** u2)
    return max(1, int(-MEAN_SIZE * math.log(1.0 - u2)))


def path_of(n):
    return f"/h/{n:07d}"


def zipf_stream(n_requests, seed):
    """URL numbers drawn with probability proportional to 1 / rank^alpha, the
    ranks a seeded permutation of the URLs."""
    rng = random.Random(seed)
    ranked = list(range(URLS))
    rng.shuffle(ranked)
    cum = list(itertools.accumulate(1.0 / (k + 1) ** ZIPF_ALPHA for k in range(URLS)))
    total = cum[-1]
    return [ranked[min(URLS - 1, bisect.bisect_left(cum, rng.random() * total))]
            for _ in range(n_requests)]


_STREAMS = {}


def stream_for(n_requests, seed, heavy_max):
    """The stream and its sizes, computed once per run of the harness."""
    key = (n_requests, seed, heavy_max)
    if key not in _STREAMS:
        s = zipf_stream(n_requests, seed)
        sizes = {}
        for u in s:
            if u not in sizes:
                sizes[u] = size_of(u, seed, heavy_max)
        _STREAMS[key] = (s, sizes)
    return _STREAMS[key]


def stream_facts(stream, sizes):
    """What the stream is made of (for the report): requests, bytes, distinct
    URLs and their bytes, heavy requests, and the best any cache could do
    without a budget (every repeat a hit)."""
    total = sum(sizes[u] for u in stream)
    heavy = [u for u in stream if sizes[u] >= HEAVY_MIN]
    distinct_bytes = sum(sizes.values())
    return {"requests": len(stream), "bytes": total, "distinct_urls": len(sizes),
            "distinct_bytes": distinct_bytes, "heavy_requests": len(heavy),
            "heavy_bytes": sum(sizes[u] for u in heavy),
            "heavy_distinct": len(set(heavy)),
            "infinite_hit_ratio": 1 - len(sizes) / len(stream),
            "infinite_byte_hit_ratio": 1 - distinct_bytes / total}


# ---------------------------------------------------------------- the origin

def origin_main(argv):
    """`hitratio_bench.py origin PORT SEED HEAVY_MAX`: serve every /h/N."""
    port, seed, heavy_max = int(argv[0]), int(argv[1]), int(argv[2])
    serve_origin(port, seed, lambda n: size_of(n, seed, heavy_max) if 0 <= n < URLS else None)


def serve_origin(port, seed, size, delay=None):
    """The counting origin of the hitratio and polygraph scenarios: answers
    every `/h/N` with `size(n)` bytes (404 where it is None), a slice of one
    seeded random block, fresh for MAX_AGE, after `delay(n)` seconds when
    given; `/__count` returns the requests and body bytes answered so far
    (itself not counted). Serves until killed."""
    block = random.Random(seed).randbytes(BLOCK)
    block2 = memoryview(block + block)
    count = {"requests": 0, "bytes": 0}

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
                if len(line) < 2:
                    return
                method, target = line[0], line[1]
                if "://" in target:           # absolute form (a forward proxy)
                    target = "/" + target.split("://", 1)[1].partition("/")[2]
                if target == "/__count":
                    body = json.dumps(count).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Cache-Control: no-store\r\nContent-Length: %d\r\n\r\n"
                                 % len(body) + body)
                    await writer.drain()
                    continue
                n = int(target[3:]) if target.startswith("/h/") and target[3:].isdigit() else -1
                length = size(n) if n >= 0 else None
                if length is None:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                count["requests"] += 1
                if delay is not None:
                    await asyncio.sleep(delay(n))
                # Date: RFC 9110 6.6.1 (an origin with a clock sends it); Squid
                # stores nothing without it.
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Date: %s\r\nCache-Control: max-age=%d\r\n"
                             b"Content-Length: %d\r\n\r\n"
                             % (email.utils.formatdate(usegmt=True).encode(), MAX_AGE, length))
                if method == "HEAD":
                    await writer.drain()
                    continue
                off, left = (n * 7919) % BLOCK, length
                while left:
                    k = min(left, BLOCK)
                    writer.write(block2[off:off + k])
                    await writer.drain()
                    count["bytes"] += k
                    left -= k
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def main():
        # backlog: the polygraph scenario's slow origin has thousands of
        # connections opening at once.
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096,
                                            limit=1 << 16)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def origin_count():
    s = socket.create_connection(("127.0.0.1", ORIGIN_PORT), timeout=10)
    try:
        s.sendall(b"GET /__count HTTP/1.1\r\nHost: origin\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return json.loads(data.split(b"\r\n\r\n", 1)[1])
    finally:
        s.close()


def start_origin(b, tmp, heavy_max):
    return start_origin_daemon(b, tmp, "hitratio-origin", __file__, [str(heavy_max)])


def start_origin_daemon(b, tmp, name, script, args):
    """Starts `script origin ORIGIN_PORT SEED *args` (a `serve_origin`) on the
    load CPU and waits until it answers `/__count`."""
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    if not b.port_free(ORIGIN_PORT):
        raise RuntimeError(f"{name} port {ORIGIN_PORT} is in use")
    dm = b.Daemon(name, [sys.executable, os.path.abspath(script), "origin", str(ORIGIN_PORT),
                         str(b.SEED), *args], b.LOAD_CPU, d)
    deadline = time.time() + 20
    while True:
        try:
            origin_count()
            return dm
        except (OSError, ValueError):
            if not dm.alive() or time.time() > deadline:
                dm.stop()
                raise RuntimeError(f"{name} not ready: {dm.tail()}")
            time.sleep(0.2)


# ---------------------------------------------------------------- the client

async def get(reader, writer, path, port):
    """One GET on a keep-alive connection, its body read whole: (status, body
    bytes received, header fields by lower-case name)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        fields[k.strip().lower()] = v.strip()
    got = 0
    if "chunked" in fields.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")     # no trailers expected
                break
            left = size
            while left:
                k = min(left, 1 << 20)
                await reader.readexactly(k)
                got += k
                left -= k
            await reader.readexactly(2)
    else:
        left = int(fields.get("content-length", "0"))
        while left:
            k = min(left, 1 << 20)
            await reader.readexactly(k)
            got += k
            left -= k
    return status, got, fields


async def fetch(reader, writer, path, port):
    """One GET on a keep-alive connection: (status, body bytes received)."""
    status, got, fields = await get(reader, writer, path, port)
    if fields.get("connection", "").lower() == "close":
        raise ConnectionResetError("closed by the proxy")   # reconnect for the next one
    return status, got


async def replay_part(port, stream, sizes, lo, hi, conns):
    """Requests lo..hi-1 of the stream on `conns` keep-alive connections.
    Returns (bytes received, bad responses)."""
    nxt = [lo]
    received = [0]
    bad = []

    async def worker():
        reader = writer = None
        while nxt[0] < hi:
            i = nxt[0]
            nxt[0] += 1
            u = stream[i]
            for attempt in range(2):
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                                       limit=1 << 20)
                    st, got = await asyncio.wait_for(fetch(reader, writer, path_of(u), port),
                                                     timeout=120)
                    break
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                        ValueError, IndexError) as e:
                    if writer is not None:
                        writer.close()
                    reader = writer = None
                    st, got = repr(e)[:80], 0
            received[0] += got
            if st != 200 or got != sizes[u]:
                bad.append((path_of(u), st, got, sizes[u]))
        if writer is not None:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(conns)))
    return received[0], bad


# ---------------------------------------------------------------- the proxies

def disk_overrides(text):
    """`--hitratio-disk`'s value, `PEER=MIB[,PEER=MIB...]`, as a dict; a
    clear error for anything else."""
    out = {}
    for part in filter(None, (text or "").split(",")):
        peer, sep, mib = part.partition("=")
        if not sep or not mib.isdigit() or int(mib) < 1:
            raise SystemExit(f"--hitratio-disk: {part!r} is not PEER=MIB (e.g. portico=1577)")
        out[peer.strip()] = int(mib)
    return out


def disk_mib(args, peer):
    """The disk budget `peer` is configured with: the scenario's DISK_MIB
    unless `--hitratio-disk` gives it another. Equal configured budgets are
    not equal disk in use when a proxy overruns its own (nginx's cache
    manager falls seconds behind this stream: bench/peers/nginx.md), so the
    override compares at equal disk in use: Portico configured with what
    the other really held on average. (The other way round does not work
    for nginx: a lower max_size did not lower what it held.)"""
    return disk_overrides(args.hitratio_disk).get(peer, DISK_MIB)


def stem(scenario, args):
    """The report's file name: `hitratio-disk-portico1577` for a run with
    `--hitratio-disk portico=1577`, so that it sits beside the equal-budget one."""
    o = disk_overrides(args.hitratio_disk)
    return scenario + "".join(f"-disk-{p}{m}" for p, m in sorted(o.items()))


def budget_conf(b, peer, d, portico_cache=None, disk=DISK_MIB):
    """Write `peer`'s config with the scenario's budgets (`disk` MiB of disk
    cache), its origin the scenario's origin (`portico_cache`: more [cache]
    keys for Portico, for the scenarios that reuse these configs). Returns
    (argv, env)."""
    mine = str(ORIGIN_PORT)
    theirs = str(b.PORTS["origin"])
    if peer == "portico":
        conf = b.portico_conf(d)
        conf["upstream"] = [{"name": "origin", "servers": [f"127.0.0.1:{ORIGIN_PORT}"]}]
        # max_object_size (1 GiB) and max_memory_object (1 MiB) at their defaults.
        conf["cache"].update({"memory": f"{MEMORY_MIB}MiB", "disk": f"{disk}MiB"})
        # open_files at its default (a quarter of the usable descriptors): the
        # 20,000 portico_conf gives the hits scenarios took every descriptor
        # once the disk tier held that many objects, and until Portico learnt
        # to close held files when descriptors ran out (2026-11-27), opens
        # failed and hits became misses (39.8% instead of 42.3% on the
        # 1,000,000-request stream with balanced).
        conf["cache"].pop("open_files", None)
        conf["cache"].update(portico_cache or {})
        if b.PORTICO_EXTRA:
            b.merge_conf(conf, b.PORTICO_EXTRA)
        path = os.path.join(d, "portico.toml")
        with open(path, "w") as f:
            f.write(b.toml_dump(conf, "# Portico, hitratio scenario (bench/hitratio_bench.py)"))
        return path, None
    if peer == "nginx":
        text = b.nginx_conf(d).replace(theirs, mine)
        old = "keys_zone=bench:64m max_size=2g inactive=10m"
        if old not in text:
            raise RuntimeError("nginx_conf changed: update hitratio_bench.budget_conf")
        # max_size: the disk budget. nginx has no memory cache of its own (the page
        # cache holds its files); keys_zone is its index of keys (8,000 per MiB).
        # manager_files/manager_sleep: the cache manager's default pace (100
        # files per pass, a pass every 250 ms at most: ~400 files/s) falls
        # behind this stream's ~4,000 stores/s on a quiet machine, and nginx
        # then held 2.86 GiB against its 1 GiB max_size (2026-11-24 22:16).
        text = text.replace(
            old, f"keys_zone=bench:64m max_size={disk}m inactive=1h manager_files=10000 manager_sleep=10ms")
        path = os.path.join(d, "nginx.conf")
        with open(path, "w") as f:
            f.write(text)
        return path, None
    if peer == "squid":
        text = b.squid_conf(d, disk=True).replace(theirs, mine)
        old_mem = f"cache_mem {b.DISK_HITS_MEMORY_MIB} MB\n"
        old_dir = f"cache_dir aufs {d}/cache 1024 16 256\n"
        if old_mem not in text or old_dir not in text:
            raise RuntimeError("squid_conf changed: update hitratio_bench.budget_conf")
        # maximum_object_size (default 4 MB) must come before cache_dir to apply to it.
        text = text.replace(old_mem, f"cache_mem {MEMORY_MIB} MB\n").replace(
            old_dir, f"maximum_object_size 128 MB\ncache_dir aufs {d}/cache {disk} 16 256\n")
        path = os.path.join(d, "squid.conf")
        with open(path, "w") as f:
            f.write(text)
        return path, None
    if peer == "ats":
        runroot = b.ats_files(d, disk=True)
        etc = os.path.join(d, "etc")
        rec = os.path.join(etc, "records.config")
        with open(rec) as f:
            text = f.read()
        old = f"ram_cache.size INT {b.DISK_HITS_MEMORY_MIB << 20}"
        if old not in text:
            raise RuntimeError("ats_files changed: update hitratio_bench.budget_conf")
        text = text.replace(old, f"ram_cache.size INT {MEMORY_MIB << 20}").replace(theirs, mine)
        with open(rec, "w") as f:
            f.write(text)
        for name in ("remap.config",):
            p = os.path.join(etc, name)
            with open(p) as f:
                t = f.read()
            with open(p, "w") as f:
                f.write(t.replace(theirs, mine))
        with open(os.path.join(etc, "storage.config"), "w") as f:
            f.write(f"{d}/cache {disk}M\n")
        return runroot, {"TS_RUNROOT": runroot}
    if peer == "varnish":
        return None, None
    raise ValueError(peer)


def start_proxy(b, peer, tmp, args, portico_cache=None):
    d = os.path.join(tmp, f"hitratio-{peer}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    os.chmod(d, 0o777)
    disk = disk_mib(args, peer)
    conf, env = budget_conf(b, peer, d, portico_cache, disk)
    if peer == "portico":
        b.portico_check(args.portico_bin, conf)
        argv = [args.portico_bin, "run", "-c", conf]
    elif peer == "nginx":
        argv = ["nginx", "-e", f"{d}/error.log", "-p", d, "-c", conf]
    elif peer == "squid":
        z = subprocess.run(["squid", "-N", "-z", "-f", conf], capture_output=True, text=True,
                           timeout=60)
        if z.returncode != 0:
            raise RuntimeError(f"squid -z failed: {(z.stdout + z.stderr)[-800:]}")
        argv = ["squid", "-N", "-f", conf]
    elif peer == "ats":
        argv = ["traffic_server"]
    elif peer == "varnish":
        # One storage, the disk budget: Varnish has no memory tier in front of a
        # file store (bench/peers/varnish.md). nuke_limit: objects it may evict to
        # make room for one new object (default 50; a 100 MiB object needs more).
        argv = ["varnishd", "-F", "-n", f"{d}/varnish", "-a", f"127.0.0.1:{b.PORTS['varnish']}",
                "-b", f"127.0.0.1:{ORIGIN_PORT}", "-s", f"file,{d}/storage.bin,{disk}M",
                "-T", "none", "-p", "thread_pools=1", "-p", "thread_pool_min=200",
                "-p", "thread_pool_max=1000", "-p", "timeout_idle=120",
                "-p", "nuke_limit=100000"]
    else:
        raise ValueError(peer)
    port = b.PORTS[peer]
    if not b.port_free(port):
        raise RuntimeError(f"port {port} is in use")
    dm = b.Daemon(peer, argv, b.PROXY_CPU, d, env)
    try:
        deadline = time.time() + 30
        while True:
            if not dm.alive():
                raise RuntimeError(f"{peer} exited: {dm.tail()}")
            try:
                status, _, _ = b.http_get(port, path_of(URLS - 1))
                if status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"{peer} not ready after 30 s: {dm.tail()}")
            time.sleep(0.2)
        b.pin_threads(dm.pid)
    except Exception:
        dm.stop()
        raise
    return dm, d


class DiskUsage:
    """Samples allocated_bytes(d) every USAGE_EVERY seconds on a thread of its own
    until stop(), which returns the mean and the peak of the samples."""

    def __init__(self, d):
        import threading
        self.d, self.samples, self.done = d, [], threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.done.wait(USAGE_EVERY):
            self.samples.append(allocated_bytes(self.d))

    def stop(self):
        self.done.set()
        self.thread.join()
        s = self.samples or [allocated_bytes(self.d)]
        return {"mean": sum(s) / len(s), "peak": max(s), "samples": len(s)}


def allocated_bytes(d):
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


# ---------------------------------------------------------------- one run

def run(b, peer, tmp, args, ctx, origin_daemon):
    """One round of one proxy over the whole stream."""
    n = REQUESTS_SMOKE if args.smoke else (args.hitratio_requests or REQUESTS)
    heavy_max = HEAVY_MAX_SMOKE if args.smoke else HEAVY_MAX
    stream, sizes = stream_for(n, b.SEED, heavy_max)
    origin = start_origin(b, tmp, heavy_max)
    dm = d = None
    try:
        dm, d = start_proxy(b, peer, tmp, args)
        port = b.PORTS[peer]
        cpu = b.CpuMeter(dm.pid, origin.pid)
        c0 = origin_count()
        parts, bad, received = [], [], 0
        # The cache directory's size every few seconds: a proxy that evicts
        # late holds more than its budget for a while (nginx's cache manager,
        # once under max_size, sleeps up to 10 s before checking again), and
        # neither the end nor a tenth's end shows how much on average.
        usage = DiskUsage(d)
        t0 = time.time()
        for k in range(PARTS):
            lo, hi = n * k // PARTS, n * (k + 1) // PARTS
            got, bad_k = asyncio.run(replay_part(port, stream, sizes, lo, hi, CLIENT_CONNS))
            c1 = origin_count()
            parts.append({"requests": hi - lo, "bytes": got,
                          "origin_requests": c1["requests"] - c0["requests"],
                          "origin_bytes": c1["bytes"] - c0["bytes"],
                          "seconds": time.time() - t0})
            received += got
            bad += bad_k
            c0 = c1
            if not dm.alive():
                raise RuntimeError(f"{peer} died: {dm.tail()}")
        secs = time.time() - t0
        used = usage.stop()
        c = cpu.stop()
        for p in parts:
            p["hit_ratio"] = 1 - p["origin_requests"] / p["requests"]
            p["byte_hit_ratio"] = 1 - p["origin_bytes"] / p["bytes"] if p["bytes"] else 0.0
        oreq = sum(p["origin_requests"] for p in parts)
        obytes = sum(p["origin_bytes"] for p in parts)
        rss = b.tree_rss_kib(dm.pid) / 1024
        disk = allocated_bytes(d)
        problems = []
        if bad:
            problems.append(f"{len(bad)} of {n} responses not a 200 with the whole body, "
                            f"e.g. {bad[:3]}")
        hr = 1 - oreq / n
        bhr = 1 - obytes / received if received else 0.0
        if peer == "portico" and hr <= 0:
            problems.append(f"hit ratio {hr:.3f}: nothing was served from the cache")
        r = {"requests": n, "bytes": received, "origin_requests": oreq, "origin_bytes": obytes,
             "hit_ratio": hr, "byte_hit_ratio": bhr, "parts": parts, "errors": len(bad),
             "seconds": secs, "rps": n / secs, "proxy_cpu": c["proxy_cpu"],
             # The harness redoes a run when other processes used > 0.3 core; a hit
             # ratio does not depend on CPU time, so it is kept under another name.
             "other_cpu": 0.0, "machine_other_cpu": c["other_cpu"], "rss_mib": rss, "cache_dir_bytes": disk,
             "cache_dir_peak_bytes": max(used["peak"], disk),
             "cache_dir_mean_bytes": used["mean"], "cache_dir_samples": used["samples"],
             "problems": problems,
             "summary": f"hit ratio {hr:.1%}, byte hit ratio {bhr:.1%} ({oreq:,} origin "
                        f"requests, {obytes / 2**20:,.0f} MiB, for {n:,} requests, "
                        f"{received / 2**20:,.0f} MiB) in {secs:.0f} s"}
        if peer == "portico":
            try:
                r["portico_stats"] = json.loads(b.http_get(port, "/.stats.json")[2]).get(
                    "snapshot", {}).get("cache")
            except (OSError, ValueError):
                pass
        return r
    finally:
        if dm is not None:
            dm.stop()
        origin.stop()
        if d:
            shutil.rmtree(d, ignore_errors=True)   # 1 GiB of tmpfs per proxy


# ---------------------------------------------------------------- report and chart

def report(b, scenario, results, subjects, args):
    import statistics
    n = REQUESTS_SMOKE if args.smoke else (args.hitratio_requests or REQUESTS)
    heavy_max = HEAVY_MAX_SMOKE if args.smoke else HEAVY_MAX
    stream, sizes = stream_for(n, b.SEED, heavy_max)
    f = stream_facts(stream, sizes)
    changed = disk_overrides(args.hitratio_disk)
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    spread = lambda rs, k: (f"{min(r[k] for r in rs):.1%}–{max(r[k] for r in rs):.1%}"
                            if len(rs) > 1 else "—")
    L = [f"One stream of {f['requests']:,} GETs (seed {b.SEED}), Zipf alpha {ZIPF_ALPHA} over "
         f"{URLS:,} URLs: sizes exponential with mean {MEAN_SIZE:,} bytes, except "
         f"{HEAVY_FRACTION:.1%} of the URLs, log-uniform from {HEAVY_MIN >> 20} to "
         f"{heavy_max >> 20} MiB. The stream touches {f['distinct_urls']:,} distinct URLs "
         f"({f['distinct_bytes'] / 2**30:.2f} GiB) and {f['bytes'] / 2**30:.2f} GiB in all; "
         f"{f['heavy_requests']:,} requests ({f['heavy_distinct']} distinct URLs) are for heavy "
         f"objects, {f['heavy_bytes'] / f['bytes']:.0%} of the bytes. A cache without a budget "
         f"(every repeat a hit) would reach a hit ratio of {f['infinite_hit_ratio']:.1%} and a "
         f"byte hit ratio of {f['infinite_byte_hit_ratio']:.1%}.\n",
         f"Budgets: {MEMORY_MIB} MiB of memory cache in front of {DISK_MIB} MiB of disk cache "
         f"(work dir on tmpfs) for every proxy: Portico `cache.memory = \"{MEMORY_MIB}MiB\"`, "
         f"`cache.disk = \"{DISK_MIB}MiB\"`; nginx `proxy_cache_path max_size={DISK_MIB}m` "
         f"(no memory cache of its own); Varnish `-s file,{DISK_MIB}M` (one store: no memory "
         f"tier); Squid `cache_mem {MEMORY_MIB} MB` + `cache_dir aufs {DISK_MIB}`; ATS "
         f"`ram_cache.size` {MEMORY_MIB} MiB + a {DISK_MIB} MiB cache file. Hits counted from "
         f"the origin's own counts (1 − origin requests / requests; bytes: 1 − origin body "
         f"bytes / body bytes received), not from the proxies.\n",
         *([f"**Budgets changed for this run** (`--hitratio-disk`): "
            + ", ".join(f"{p} configured with {m} MiB of disk instead of {DISK_MIB}"
                        for p, m in sorted(changed.items()))
            + ". Equal configured budgets are not equal disk in use when a proxy holds more "
            "than it was given; this run compares at equal disk in use instead: read the "
            "ratios beside the `disk GiB in use` columns.\n"] if changed else []),
         "| proxy | rounds | hit ratio (median) | spread | byte hit ratio (median) | spread "
         "| origin requests | origin GiB | errors | run s | disk GiB in use: mean "
         "| peak | at end |",
         "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in subjects:
        rs = results[p]
        L.append(f"| {p} | {len(rs)} | {med(rs, 'hit_ratio'):.1%} | {spread(rs, 'hit_ratio')} | "
                 f"{med(rs, 'byte_hit_ratio'):.1%} | {spread(rs, 'byte_hit_ratio')} | "
                 f"{med(rs, 'origin_requests'):,.0f} | {med(rs, 'origin_bytes') / 2**30:.2f} | "
                 f"{sum(r['errors'] for r in rs)} | {med(rs, 'seconds'):.0f} | "
                 f"{med(rs, 'cache_dir_mean_bytes') / 2**30:.2f} | "
                 f"{med(rs, 'cache_dir_peak_bytes') / 2**30:.2f} | "
                 f"{med(rs, 'cache_dir_bytes') / 2**30:.2f} |")
    L += ["", f"Disk in use: the blocks allocated under each proxy's work directory (its "
          f"cache files, and the cache file ATS and Varnish allocate whole), sampled every "
          f"{USAGE_EVERY:.0f} s over the run. A proxy whose mean is well above "
          f"{DISK_MIB / 1024:.0f} GiB held more than the budget it was given, and its ratios "
          f"are those of a larger cache.", ""]
    others = [p for p in subjects if p != "portico"]
    if "portico" in subjects and others:
        pm = {k: med(results["portico"], k) for k in ("hit_ratio", "byte_hit_ratio")}
        for k, name in (("hit_ratio", "hit ratio"), ("byte_hit_ratio", "byte hit ratio")):
            best = max(others, key=lambda p: med(results[p], k))
            d = (pm[k] - med(results[best], k)) * 100
            L.append(f"- {name}: Portico {pm[k]:.1%}, best peer {best} "
                     f"{med(results[best], k):.1%}: {d:+.1f} points (issue 16's goal: +5); "
                     f"disk in use on average: Portico "
                     f"{med(results['portico'], 'cache_dir_mean_bytes') / 2**30:.2f} GiB, {best} "
                     f"{med(results[best], 'cache_dir_mean_bytes') / 2**30:.2f} GiB")
        L.append("")
    L += ["## Per 10% of the stream\n",
          "Each cell: hit ratio / byte hit ratio within that tenth of the stream (median over "
          "rounds); the first tenths include the cold start.\n",
          "| proxy | " + " | ".join(f"{10 * (k + 1)}%" for k in range(PARTS)) + " |",
          "|---|" + "---:|" * PARTS]
    for p in subjects:
        rs = results[p]
        cells = [f"{statistics.median(r['parts'][k]['hit_ratio'] for r in rs):.0%} / "
                 f"{statistics.median(r['parts'][k]['byte_hit_ratio'] for r in rs):.0%}"
                 for k in range(PARTS)]
        L.append(f"| {p} | " + " | ".join(cells) + " |")
    L.append("")
    extra = [f"- Load: this script's asyncio client, {CLIENT_CONNS} keep-alive connections, "
             f"the stream in {PARTS} parts (the origin's counts read between parts); the origin "
             f"(bench/hitratio_bench.py, asyncio, port {ORIGIN_PORT}) and the client on CPU "
             f"{b.LOAD_CPU}, the proxy on CPU {b.PROXY_CPU}; {args.rounds} round(s), fresh "
             f"cache per run"]
    return L, extra


def chart(b, results, subjects, outdir, args):
    """Both ratios per tenth of the stream, one line per proxy; the legend
    gives each proxy's ratio over the whole stream and the disk it held on
    average (a proxy over its budget is a larger cache). Written beside the
    report, under the same name ([`stem`])."""
    import statistics
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [10 * (k + 1) for k in range(PARTS)]
    # Portico in the bench's red; the peers in colours far from it.
    palette = iter(["#2980b9", "#27ae60", "#8e44ad", "#f39c12", "#7f8c8d", "#16a085"])
    for p in subjects:
        rs = results[p]
        style = ({"color": "#c0392b", "linewidth": 2.2} if p == "portico"
                 else {"color": next(palette), "linewidth": 1.2})
        for ax, key in ((axes[0], "hit_ratio"), (axes[1], "byte_hit_ratio")):
            ys = [statistics.median(r["parts"][k][key] for r in rs) * 100 for k in range(PARTS)]
            held = [r["cache_dir_mean_bytes"] for r in rs if "cache_dir_mean_bytes" in r]
            disk = f", {statistics.median(held) / 2**30:.2f} GiB held" if held else ""
            ax.plot(xs, ys, marker="o",
                    label=f"{p} ({statistics.median(r[key] for r in rs):.1%}{disk})", **style)
    for ax, name in ((axes[0], "hit ratio"), (axes[1], "byte hit ratio")):
        ax.set_xlabel("% of the stream")
        ax.set_ylabel(f"{name} in that tenth, % (higher is better)")
        ax.set_title(f"{name} per 10% of the stream (legend: whole stream, mean disk held)",
                     fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    budgets = f"every proxy {MEMORY_MIB} MiB memory + {DISK_MIB} MiB disk" + "".join(
        f", {p} {m} MiB disk" for p, m in sorted(disk_overrides(args.hitratio_disk).items()))
    fig.suptitle(f"hitratio: one Zipf stream (alpha {ZIPF_ALPHA}) over {URLS:,} URLs, {budgets}",
                 fontsize=9)
    fig.tight_layout()
    path = os.path.join(outdir, f"{stem('hitratio', args)}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "origin":
        origin_main(sys.argv[2:])
    else:
        sys.exit("usage: hitratio_bench.py origin PORT SEED HEAVY_MAX (run by bench/run hitratio)")
