#!/usr/bin/env python3
"""The `soak` scenario of the benchmark suite (bench/README.md, "soak").

One Portico (memory and disk tiers, short origin timeouts) under a mixed
open-loop load for a long time (default 1 hour), sampled every few seconds:
RSS, open file descriptors, connections in service and disk-cache use must
not trend upward after the warm-up, and every body a client receives whole
must be the one the origin sent for that URL.

This file holds the parts that do not need bench.py:

- the origin (`python3 bench/soak.py origin --port P --echo-port E`, run by
  bench.py as its own process): an asyncio HTTP/1.1 server whose bodies are
  derived from the URL (a slice of one seeded random block, at an offset and
  length from the SHA-256 of the URL), with cacheable objects, objects that
  change version every VERSION_PERIOD seconds (ETag / Last-Modified, max-age
  1 s: revalidations and 304s), slow answers, answers cut by a TCP reset,
  answers that stall, and a TCP echo port for CONNECT tunnels;
- the load (`run_load`): fixed arrival rate (open loop: a request is started
  at its scheduled time whatever the others are doing), each request a kind
  drawn from a seeded mix, over a small pool of keep-alive connections or a
  fresh one; every complete body is compared byte for byte;
- the sampler, the trend rule, the report lines and the chart.
"""
import argparse
import asyncio
import collections
import hashlib
import json
import logging
import math
import os
import random
import socket
import statistics
import struct
import sys
import time
from email.utils import formatdate

# Writes to a peer that already reset the connection are expected here (aborted
# clients, resets): asyncio warns once per such write after a few; not news.
logging.getLogger("asyncio").setLevel(logging.ERROR)

SEED = 20261124
BLOCK_SIZE = 2 << 20           # bodies are slices of this seeded random block
BLOCK = random.Random(SEED).randbytes(BLOCK_SIZE)
MEAN_SIZE = 12 * 1024          # small objects: exponential sizes, this mean
LARGE_MIN, LARGE_MAX = 80 * 1024, 400 * 1024   # 10% of objects: on the disk tier only
BIG_MIN, BIG_MAX = 256 * 1024, 512 * 1024      # the aborted-miss objects
VERSION_PERIOD = 30            # /v/ objects change version this often (seconds)
N_HOT = 400                    # hit kind: objects /c/0../c/399
N_REVAL = 60                   # revalidation kind: /v/0../v/59
N_FAULT = 16                   # reset and stall kinds: URLs per variant (reused: a cut
                               # body that was stored would be served whole later)
MTIME = 1767225600             # Last-Modified of the fixed objects (2026-01-01)
ORIGIN_STALL_MAX = 60          # a stalled origin answer waits at most this long for the
                               # proxy to give up (then the origin closes it itself)

# Request kinds of the load: (kind, weight). Each kind has variants (below).
MIX = [("hit", 40), ("miss", 14), ("reval", 14), ("connect", 8), ("abort", 8),
       ("reset", 6), ("stall", 6), ("slow", 4)]
KIND_VARIANTS = {
    "hit": ["hit"],
    "miss": ["miss"],
    "reval": ["reval", "reval-cond"],
    "connect": ["connect", "connect-abort"],
    "abort": ["abort-hit", "abort-miss", "abort-wait", "abort-head"],
    "reset": ["reset-head", "reset-body", "reset-chunked"],
    "stall": ["stall-head", "stall-body"],
    "slow": ["slow"],
}
VARIANT_TEXT = {
    "hit": "GET /c/N: one of 400 objects (max-age 3600; 10% 80-400 KiB, disk tier only)",
    "miss": "GET /m/UNIQUE: never asked before (max-age 600): stored, evicting older ones",
    "reval": "GET /v/N: max-age 1, new version every 30 s: Portico revalidates (304 or 200)",
    "reval-cond": "as reval, with the client's If-None-Match: 304 or 200 with the new version",
    "connect": "CONNECT to the echo port, 1-32 KiB sent, the same bytes read back",
    "connect-abort": "CONNECT, bytes sent, client closes without reading (RST half the time)",
    "abort-hit": "GET a large cached object, close after the head (RST half the time)",
    "abort-miss": "GET a new 256-512 KiB object, close after the head",
    "abort-wait": "GET /slow/N (origin waits 0.3-0.8 s), close after 0.1 s",
    "abort-head": "half a request head, then close",
    "reset-head": "origin resets the connection before answering: 502",
    "reset-body": "origin sends the head (Content-Length) and half the body, then resets",
    "reset-chunked": "as reset-body, chunked",
    "stall-head": "origin never answers: first_byte_timeout (2 s), 504",
    "stall-body": "origin sends the head and half the body, then nothing: idle_timeout (2 s)",
    "slow": "GET /slow/N: origin waits 0.3-0.8 s, then answers whole (no-store)",
}
# What a variant may end in besides `ok` without it being a problem.
EXPECTED = {
    "reset-head": {"502"},
    "reset-body": {"502", "truncated"},
    "reset-chunked": {"502", "truncated"},
    "stall-head": {"504"},
    "stall-body": {"504", "truncated"},
}


# ---------------------------------------------------------------- content

def _h(key):
    return hashlib.sha256(key.encode()).digest()


def size_of(key):
    """Body length for a URL path (deterministic)."""
    h = _h(key)
    u = (int.from_bytes(h[:8], "big") + 0.5) / 2 ** 64
    if key.startswith("/b/"):
        return BIG_MIN + int(u * (BIG_MAX - BIG_MIN))
    if h[8] < 26:   # ~10%
        return LARGE_MIN + int(u * (LARGE_MAX - LARGE_MIN))
    return max(1, min(int(-math.log(1 - u) * MEAN_SIZE), 256 * 1024))


def body_of(key):
    """The body the origin sends for `key` (path, or path#version): a slice
    of BLOCK, as a memoryview (no copy)."""
    size = size_of(key.split("#")[0])
    off = int.from_bytes(_h(key)[9:17], "big") % (BLOCK_SIZE - size)
    return memoryview(BLOCK)[off:off + size]


def version_of(i, now):
    """Current version of /v/i and the time it started (each object has its
    own phase, so versions do not all change at once)."""
    phase = (i * 7919) % VERSION_PERIOD
    v = int((now + phase) // VERSION_PERIOD)
    return v, v * VERSION_PERIOD - phase


# ---------------------------------------------------------------- origin

class Origin:
    def __init__(self):
        self.counts = collections.Counter()

    async def handle(self, reader, writer):
        self.counts["connections"] += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                        ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    return
                method, target, _ = parts
                hdrs = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        hdrs[k.strip().lower()] = v.strip()
                n = int(hdrs.get("content-length", "0") or 0)
                if n:
                    await reader.readexactly(n)
                if target.startswith("http://"):
                    target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
                keep = await self.respond(method, target, hdrs, reader, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            if not writer.is_closing():
                writer.close()

    async def send(self, writer, status, headers, body=b"", chunked=False):
        h = [f"HTTP/1.1 {status}"] + [f"{k}: {v}" for k, v in headers]
        if chunked:
            h.append("Transfer-Encoding: chunked")
        elif status != "304 Not Modified":
            h.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(h) + "\r\n\r\n").encode())
        if chunked:
            step = max(1, len(body) // 3 + 1)
            for i in range(0, len(body), step):
                part = body[i:i + step]
                writer.write(f"{len(part):x}\r\n".encode())
                writer.write(part)
                writer.write(b"\r\n")
            writer.write(b"0\r\n\r\n")
        elif body:
            writer.write(body)
        await writer.drain()

    @staticmethod
    def reset(writer):
        sock = writer.get_extra_info("socket")
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        writer.transport.abort()

    async def stall(self, reader):
        """Wait until the proxy closes (it must: its timeouts), at most ORIGIN_STALL_MAX."""
        try:
            await asyncio.wait_for(reader.read(), ORIGIN_STALL_MAX)
        except (asyncio.TimeoutError, ConnectionError):
            self.counts["stall not closed by proxy"] += 1

    async def respond(self, method, target, hdrs, reader, writer):
        path = target.split("?")[0]
        seg = path.split("/")
        kind = seg[1] if len(seg) > 1 else ""
        self.counts[f"GET /{kind}/"] += 1
        if path == "/__stats":
            await self.send(writer, "200 OK", [("Content-Type", "application/json"),
                                               ("Cache-Control", "no-store")],
                            json.dumps(self.counts).encode())
            return True
        lm = formatdate(MTIME, usegmt=True)
        if kind in ("c", "m", "b") and len(seg) == 3:
            etag = '"' + _h(path)[:8].hex() + '"'
            hh = [("Cache-Control", "max-age=3600" if kind == "c" else "max-age=600"),
                  ("ETag", etag), ("Last-Modified", lm),
                  ("Content-Type", "application/octet-stream")]
            if hdrs.get("if-none-match") == etag:
                self.counts["304 sent"] += 1
                await self.send(writer, "304 Not Modified", hh)
                return True
            # a quarter of the objects come chunked (no Content-Length)
            await self.send(writer, "200 OK", hh, body_of(path), chunked=_h(path)[20] < 64)
            return True
        if kind == "v" and len(seg) == 3 and seg[2].isdigit():
            v, start = version_of(int(seg[2]), time.time())
            etag = f'"v{seg[2]}-{v}"'
            hh = [("Cache-Control", "max-age=1"), ("ETag", etag),
                  ("Last-Modified", formatdate(start, usegmt=True)),
                  ("Content-Type", "application/octet-stream")]
            inm = hdrs.get("if-none-match")
            if inm is not None and etag in [x.strip() for x in inm.split(",")]:
                self.counts["304 sent"] += 1
                await self.send(writer, "304 Not Modified", hh)
                return True
            self.counts["/v/ 200 sent"] += 1
            await self.send(writer, "200 OK", hh, body_of(f"{path}#{v}"))
            return True
        if kind == "slow" and len(seg) == 3:
            await asyncio.sleep(0.3 + 0.5 * _h(path)[0] / 255)
            await self.send(writer, "200 OK", [("Cache-Control", "no-store")], body_of(path))
            return True
        if kind in ("reset", "stall") and len(seg) == 4:
            how = seg[2]
            body = body_of(path)
            hh = [("Cache-Control", "max-age=600"), ("ETag", '"' + _h(path)[:8].hex() + '"'),
                  ("Last-Modified", lm)]
            self.counts[f"{kind} {how}"] += 1
            if how == "head":
                if kind == "reset":
                    self.reset(writer)
                else:
                    await self.stall(reader)
                return False
            half = len(body) // 2
            if how == "chunked":
                writer.write(("HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hh) +
                              "Transfer-Encoding: chunked\r\n\r\n").encode())
                writer.write(f"{half:x}\r\n".encode() + body[:half] + b"\r\n")
            else:
                writer.write(("HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hh) +
                              f"Content-Length: {len(body)}\r\n\r\n").encode())
                writer.write(body[:half])
            await writer.drain()
            if kind == "reset":
                await asyncio.sleep(0.02)
                self.reset(writer)
            else:
                await self.stall(reader)
            return False
        await self.send(writer, "404 Not Found", [("Cache-Control", "no-store")], b"not here\n")
        return True

    async def echo(self, reader, writer):
        self.counts["echo connections"] += 1
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


async def origin_main(port, echo_port):
    o = Origin()
    s1 = await asyncio.start_server(o.handle, "127.0.0.1", port, backlog=4096,
                                    reuse_address=True)
    s2 = await asyncio.start_server(o.echo, "127.0.0.1", echo_port, backlog=4096,
                                    reuse_address=True)
    async with s1, s2:
        await asyncio.gather(s1.serve_forever(), s2.serve_forever())


# ---------------------------------------------------------------- client

class Incomplete(Exception):
    """The connection ended (or a read timed out) before the message did."""

    def __init__(self, what, status=None, got_bytes=0):
        super().__init__(what)
        self.status = status
        self.got_bytes = got_bytes


async def read_head(reader):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        raise Incomplete("closed before a response head", got_bytes=len(e.partial))
    except asyncio.LimitOverrunError:
        raise Incomplete("response head too large")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ")[1])
    except (IndexError, ValueError):
        raise Incomplete(f"bad status line {lines[0][:60]!r}")
    hdrs = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    return status, hdrs


async def read_body(reader, status, hdrs, method="GET"):
    """The body, per HTTP/1.1 framing; (body, framing). Raises Incomplete
    with the status when the connection ends inside it."""
    if method == "HEAD" or status in (204, 304) or status < 200:
        return b"", "none"
    if "chunked" in hdrs.get("transfer-encoding", "").lower():
        parts = []
        try:
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    return b"".join(parts), "chunked"
                parts.append(await reader.readexactly(size))
                if await reader.readexactly(2) != b"\r\n":
                    raise Incomplete("bad chunk framing", status)
        except (asyncio.IncompleteReadError, ConnectionError):
            raise Incomplete("closed inside a chunked body", status,
                             sum(len(p) for p in parts))
        except ValueError:
            raise Incomplete("bad chunk size", status)
    if "content-length" in hdrs:
        n = int(hdrs["content-length"])
        try:
            return await reader.readexactly(n), "length"
        except asyncio.IncompleteReadError as e:
            raise Incomplete("closed inside a Content-Length body", status, len(e.partial))
        except ConnectionError:
            raise Incomplete("reset inside a Content-Length body", status)
    try:
        return await reader.read(), "close"
    except ConnectionError:
        raise Incomplete("reset inside a close-delimited body", status)


def _rst(writer):
    Origin.reset(writer)


class Load:
    """Open-loop mixed load against one Portico. Counts by variant and
    outcome; `wrong` lists every body that was not the origin's."""

    def __init__(self, fwd_port, rev_port, origin_port, echo_port, rate, seed=SEED,
                 request_timeout=20.0, max_in_flight=2000):
        self.fwd, self.rev = fwd_port, rev_port
        self.origin_host = f"127.0.0.1:{origin_port}"
        self.echo_port = echo_port
        self.rate = rate
        self.rng = random.Random(seed)
        self.run_id = f"{os.getpid():x}{int(time.time()) % 100000:x}"
        self.timeout = request_timeout
        self.max_in_flight = max_in_flight
        self.counts = collections.defaultdict(collections.Counter)   # variant -> outcome -> n
        self.xcache = collections.defaultdict(collections.Counter)   # variant -> X-Cache -> n
        self.wrong = []
        self.pools = {fwd_port: collections.deque(), rev_port: collections.deque()}
        self.pool_max = 32
        self.in_flight = 0
        self.started = 0
        self.completed = 0
        self.lag = []          # start lag (s) per second: the worst in each
        self.miss_n = 0
        self.seen_etag = {}
        self.tasks = set()
        kinds, weights = zip(*MIX)
        self.kinds, self.cum = kinds, list(itertools_accumulate(weights))

    # -- connections

    async def connect(self, port):
        return await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)

    async def take(self, port):
        """A pooled keep-alive connection (idle < 5 s: well within Portico's
        15 s keep-alive timeout), else a new one; (reader, writer, reused)."""
        pool = self.pools[port]
        now = time.monotonic()
        while pool:
            r, w, t = pool.pop()
            if now - t < 5 and not w.is_closing() and not r.at_eof():
                return r, w, True
            w.close()
        r, w = await self.connect(port)
        return r, w, False

    def give(self, port, r, w, hdrs):
        if "close" in hdrs.get("connection", "").lower() or len(self.pools[port]) >= self.pool_max:
            w.close()
            return
        self.pools[port].append((r, w, time.monotonic()))

    def close_pools(self):
        for pool in self.pools.values():
            while pool:
                pool.pop()[1].close()

    # -- requests

    def request_bytes(self, port, path, extra=()):
        target = path if port == self.rev else f"http://{self.origin_host}{path}"
        h = [f"GET {target} HTTP/1.1", f"Host: {self.origin_host}"] + list(extra)
        return ("\r\n".join(h) + "\r\n\r\n").encode()

    async def exchange(self, path, extra=(), port=None):
        """One GET over a pooled or new connection; retried once on a new
        connection when a reused one was closed before any response byte (a
        keep-alive race, not a failure). Returns (status, hdrs, body, framing)."""
        port = port or (self.fwd if self.rng.random() < 0.5 else self.rev)
        for attempt in (0, 1):
            r, w, reused = await self.take(port)
            try:
                w.write(self.request_bytes(port, path, extra))
                await w.drain()
                status, hdrs = await read_head(r)
            except (Incomplete, ConnectionError) as e:
                w.close()
                if reused and attempt == 0 and getattr(e, "got_bytes", 0) == 0:
                    continue
                raise
            try:
                body, framing = await read_body(r, status, hdrs)
            except BaseException:
                w.close()
                raise
            if framing == "close":
                w.close()
            else:
                self.give(port, r, w, hdrs)
            return status, hdrs, body, framing
        raise Incomplete("unreachable")

    def check(self, variant, path, key, body, hdrs):
        """Compare a complete body with the origin's; record a wrong one."""
        want = body_of(key)
        if body == want:
            return "ok"
        first = next((i for i in range(min(len(body), len(want))) if body[i] != want[i]),
                     min(len(body), len(want)))
        self.wrong.append({"variant": variant, "path": path, "key": key, "got": len(body),
                           "want": len(want), "first_difference": first,
                           "x_cache": hdrs.get("x-cache"), "etag": hdrs.get("etag"),
                           "time": time.time()})
        return "WRONG BODY"

    async def do_get(self, variant, path, key=None, extra=()):
        status, hdrs, body, framing = await self.exchange(path, extra)
        self.xcache[variant][hdrs.get("x-cache", "-")] += 1
        if status == 200:
            if framing == "close" and variant in EXPECTED:
                return "close-delimited body"
            return self.check(variant, path, key or path, body, hdrs)
        return str(status)

    async def run_variant(self, variant):
        rng = self.rng
        if variant == "hit":
            return await self.do_get(variant, f"/c/{rng.randrange(N_HOT)}")
        if variant == "miss":
            self.miss_n += 1
            return await self.do_get(variant, f"/m/{self.run_id}-{self.miss_n}")
        if variant in ("reval", "reval-cond"):
            i = rng.randrange(N_REVAL)
            path = f"/v/{i}"
            extra = ()
            sent = self.seen_etag.get(path)
            if variant == "reval-cond" and sent:
                extra = (f"If-None-Match: {sent}",)
            v_before, _ = version_of(i, time.time())
            status, hdrs, body, _ = await self.exchange(path, extra)
            self.xcache[variant][hdrs.get("x-cache", "-")] += 1
            etag = hdrs.get("etag", "")
            if status == 304:
                return "ok" if extra and etag in ("", sent) else f"304 (etag {etag})"
            if status != 200:
                return str(status)
            try:
                v = int(etag.strip('"').split("-")[1])
            except (IndexError, ValueError):
                return f"200 without a version ETag ({etag[:30]})"
            res = self.check(variant, path, f"{path}#{v}", body, hdrs)
            self.seen_etag[path] = etag
            if res == "ok" and v < v_before - 1:
                return "stale version (> 1 period old)"
            return res
        if variant == "slow":
            return await self.do_get(variant, f"/slow/{rng.randrange(1 << 30)}")
        if variant in ("reset-head", "reset-body", "reset-chunked", "stall-head", "stall-body"):
            kind, how = variant.split("-")
            path = f"/{kind}/{how}/{rng.randrange(N_FAULT)}"
            try:
                return await self.do_get(variant, path)
            except Incomplete as e:
                if e.status == 200:
                    return "truncated"
                raise
        if variant in ("connect", "connect-abort"):
            return await self.tunnel(variant == "connect-abort")
        return await self.abort(variant)

    async def tunnel(self, abort):
        r, w = await self.connect(self.fwd)
        try:
            t = f"127.0.0.1:{self.echo_port}"
            w.write(f"CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n".encode())
            await w.drain()
            status, _ = await read_head(r)
            if status != 200:
                return str(status)
            n = self.rng.randrange(1024, 32 * 1024)
            off = self.rng.randrange(BLOCK_SIZE - n)
            data = memoryview(BLOCK)[off:off + n]
            cut = self.rng.randrange(1, n)
            w.write(data[:cut])
            await w.drain()
            w.write(data[cut:])
            await w.drain()
            if abort:
                if self.rng.random() < 0.5:
                    _rst(w)
                return "ok"
            got = await r.readexactly(n)
            if got != data:
                self.wrong.append({"variant": "connect", "path": t, "got": len(got), "want": n,
                                   "time": time.time()})
                return "WRONG BODY"
            return "ok"
        except asyncio.IncompleteReadError:
            return "tunnel closed early"
        finally:
            if not w.is_closing():
                w.close()

    async def abort(self, variant):
        port = self.fwd if self.rng.random() < 0.5 else self.rev
        r, w = await self.connect(port)
        try:
            if variant == "abort-head":
                req = self.request_bytes(port, f"/c/{self.rng.randrange(N_HOT)}")
                w.write(req[:len(req) // 2])
                await w.drain()
                await asyncio.sleep(0.05)
                return "ok"
            if variant == "abort-wait":
                w.write(self.request_bytes(port, f"/slow/{self.rng.randrange(1 << 30)}"))
                await w.drain()
                await asyncio.sleep(0.1)
                return "ok"
            if variant == "abort-hit":
                path = f"/c/{self.rng.randrange(N_HOT // 10) * 10}"   # some of them large
            else:
                self.miss_n += 1
                path = f"/b/{self.run_id}-{self.miss_n}"
            w.write(self.request_bytes(port, path))
            await w.drain()
            status, hdrs = await read_head(r)
            self.xcache[variant][hdrs.get("x-cache", "-")] += 1
            if status != 200:
                return str(status)
            await r.read(4096)
            return "ok"
        finally:
            if self.rng.random() < 0.5:
                _rst(w)
            elif not w.is_closing():
                w.close()

    def pick(self):
        x = self.rng.random() * self.cum[-1]
        for kind, c in zip(self.kinds, self.cum):
            if x < c:
                return self.rng.choice(KIND_VARIANTS[kind])
        return "hit"

    async def one(self, variant):
        self.in_flight += 1
        try:
            out = await asyncio.wait_for(self.run_variant(variant), self.timeout)
        except asyncio.TimeoutError:
            out = f"client timeout ({self.timeout:.0f} s)"
        except Incomplete as e:
            out = str(e) + (f" (status {e.status})" if e.status else "")
        except ConnectionRefusedError:
            out = "connection refused"
        except (ConnectionError, OSError) as e:
            out = f"connection error: {type(e).__name__}"
        except Exception as e:   # a malformed response (bad Content-Length, ...): counted
            out = f"client error: {type(e).__name__}: {str(e)[:60]}"
        finally:
            self.in_flight -= 1
        self.completed += 1
        self.counts[variant][out] += 1

    async def run(self, duration, stop):
        """Start requests at `rate` per second for `duration` s (or until
        `stop` is set), then wait for those in flight (bounded)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        k = 0
        worst, sec = 0.0, 0
        while not stop.is_set():
            due = t0 + k / self.rate
            if due - t0 >= duration:
                break
            now = loop.time()
            if due > now:
                await asyncio.sleep(due - now)
                now = loop.time()
            lag = now - due
            if int(due - t0) != sec:
                self.lag.append(worst)
                worst, sec = 0.0, int(due - t0)
            worst = max(worst, lag)
            k += 1
            variant = self.pick()
            if self.in_flight >= self.max_in_flight:
                self.counts[variant]["not sent: client in-flight cap"] += 1
                continue
            self.started += 1
            t = asyncio.ensure_future(self.one(variant))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=self.timeout + 5)
        for t in list(self.tasks):
            t.cancel()
        self.close_pools()


def itertools_accumulate(xs):
    total = 0
    for x in xs:
        total += x
        yield total


# ---------------------------------------------------------------- sampler

def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return 0


def dir_usage(d):
    """(bytes allocated, apparent bytes, files) under d."""
    alloc = size = files = 0
    for root, _, names in os.walk(d):
        for n in names:
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            alloc += st.st_blocks * 512
            size += st.st_size
            files += 1
    return alloc, size, files


async def fetch_stats(port, path="/.stats.json"):
    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        w.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Connection: close\r\n\r\n".encode())
        await w.drain()
        status, hdrs = await asyncio.wait_for(read_head(r), 10)
        body, _ = await asyncio.wait_for(read_body(r, status, hdrs), 10)
        if status != 200:
            raise RuntimeError(f"{path}: status {status}")
        return json.loads(body)
    finally:
        w.close()


async def sample_once(pid, stats_port, cache_dir, load, t):
    s = {"t": round(t, 2)}
    s["rss_kib"] = proc_rss_kib(pid)
    s["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    try:
        j = await fetch_stats(stats_port)
        d = j.get("derived", {})
        snap = j.get("snapshot", {})
        s["active"] = d.get("active", 0)
        s["idle"] = d.get("idle_connections") or 0
        s["disk_stats"] = d.get("cache_disk_bytes", 0)
        s["memory_cache"] = d.get("cache_memory_bytes", 0)
        s["requests"] = d.get("requests", 0)
        s["threads"] = snap.get("server", {}).get("threads", 0)
        disk = (snap.get("cache") or {}).get("disk") or {}
        s["disk_objects"] = disk.get("objects", 0)
        # Cache files held open between hits (`cache.open_files`): they
        # grow with the objects hit until the limit, by design, so the fd
        # trend is judged without them, and the limit is checked instead.
        s["held_files"] = disk.get("open_files", 0)
        s["held_limit"] = disk.get("open_files_limit", 0)
        s["fds_total"] = s["fds"]
        s["fds"] = max(0, s["fds"] - s["held_files"])
    except (OSError, RuntimeError, ValueError, asyncio.TimeoutError, Incomplete) as e:
        s["stats_error"] = str(e)[:200]
    s["conns"] = s.get("active", 0) + s.get("idle", 0)
    alloc, size, files = await asyncio.to_thread(dir_usage, cache_dir)
    s["disk_du"], s["disk_apparent"], s["disk_files"] = alloc, size, files
    s["client_in_flight"] = load.in_flight
    s["client_completed"] = load.completed
    return s


# ---------------------------------------------------------------- trend rule

# metric -> (label, relative tolerance, absolute slack or None for `slack`, unit divisor, unit)
TREND = {
    "rss_kib": ("RSS", 0.05, 0, 1024, "MiB"),
    "fds": ("open fds (held cache files apart)", 0.05, None, 1, ""),
    "conns": ("connections (in service + idle)", 0.05, None, 1, ""),
}


def judge(samples, warmup, disk_limit, slack_count=8):
    """The rule (bench/README.md): samples after the warm-up are split into
    quarters; for each TREND metric the last quarter's median must be at
    most the second quarter's median * (1 + tolerance) + slack (for fds and
    connections `slack_count`: they move with the requests in flight at the
    moment of a sample). Disk use
    (the stats' bytes and the files' apparent size) must stay under the
    disk-tier budget in every sample. Returns (rows, problems)."""
    post = [s for s in samples if s["t"] >= warmup]
    rows, problems = [], []
    n = len(post)
    if n < 8:
        problems.append(f"only {n} samples after the warm-up: need at least 8 to judge a trend")
        return rows, problems
    q = n // 4
    q2, q4 = post[q:2 * q], post[n - q:]
    for key, (label, tol, slack, div, unit) in TREND.items():
        slack = slack_count if slack is None else slack
        m2 = statistics.median(s.get(key, 0) for s in q2)
        m4 = statistics.median(s.get(key, 0) for s in q4)
        limit = m2 * (1 + tol) + slack
        ok = m4 <= limit
        per_hour = ((m4 - m2) / ((q4[len(q4) // 2]["t"] - q2[len(q2) // 2]["t"]) / 3600)
                    if q4[len(q4) // 2]["t"] > q2[len(q2) // 2]["t"] else 0.0)
        rows.append({"metric": key, "label": label, "start": samples[0].get(key, 0) / div,
                     "after_warmup": post[0].get(key, 0) / div, "q2": m2 / div, "q4": m4 / div,
                     "end": samples[-1].get(key, 0) / div, "max": max(s.get(key, 0) for s in post) / div,
                     "limit": limit / div, "ok": ok, "unit": unit,
                     "rule": f"≤ Q2 × {1 + tol:.2f}" + (f" + {slack}" if slack else ""),
                     "per_hour": per_hour / div})
        if not ok:
            problems.append(f"{label} trends upward: last-quarter median {m4 / div:,.1f}{unit} > "
                            f"second-quarter median {m2 / div:,.1f}{unit} × {1 + tol:.2f}"
                            + (f" + {slack}" if slack else "") +
                            f" (≈ {per_hour / div:+,.1f}{unit} per hour)")
    for key, label in (("disk_stats", "disk tier (Portico's count)"),
                       ("disk_apparent", "disk tier (files' apparent size)")):
        mx = max(s.get(key, 0) for s in samples)
        ok = mx <= disk_limit
        rows.append({"metric": key, "label": label, "start": samples[0].get(key, 0) / 2 ** 20,
                     "after_warmup": post[0].get(key, 0) / 2 ** 20,
                     "q2": statistics.median(s.get(key, 0) for s in q2) / 2 ** 20,
                     "q4": statistics.median(s.get(key, 0) for s in q4) / 2 ** 20,
                     "end": samples[-1].get(key, 0) / 2 ** 20, "max": mx / 2 ** 20,
                     "limit": disk_limit / 2 ** 20, "ok": ok, "unit": "MiB",
                     "rule": "max ≤ cache.disk", "per_hour": 0.0})
        if not ok:
            problems.append(f"{label} reached {mx / 2**20:.1f} MiB, over cache.disk "
                            f"{disk_limit / 2**20:.0f} MiB")
    # The held cache files left out of the fd trend are bounded instead:
    # never more than `cache.open_files` in any sample.
    held = max(s.get("held_files", 0) for s in samples)
    held_limit = max(s.get("held_limit", 0) for s in samples)
    if held_limit:
        ok = held <= held_limit
        rows.append({"metric": "held_files", "label": "cache files held open",
                     "start": samples[0].get("held_files", 0),
                     "after_warmup": post[0].get("held_files", 0),
                     "q2": statistics.median(s.get("held_files", 0) for s in q2),
                     "q4": statistics.median(s.get("held_files", 0) for s in q4),
                     "end": samples[-1].get("held_files", 0), "max": held,
                     "limit": held_limit, "ok": ok, "unit": "",
                     "rule": "max ≤ cache.open_files", "per_hour": 0.0})
        if not ok:
            problems.append(f"cache files held open reached {held}, over cache.open_files "
                            f"{held_limit}")
    return rows, problems


def outcome_problems(counts, wrong, max_unexpected_pct):
    """Wrong bodies always fail; unexpected outcomes fail above
    max_unexpected_pct of all requests."""
    problems = []
    total = sum(sum(c.values()) for c in counts.values())
    unexpected = sum(n for v, c in counts.items() for o, n in c.items()
                     if o != "ok" and o != "WRONG BODY" and o not in EXPECTED.get(v, ()))
    if wrong:
        problems.append(f"{len(wrong)} wrong bodies (first: {json.dumps(wrong[0])})")
    if total == 0:
        problems.append("no requests completed")
    elif 100.0 * unexpected / total > max_unexpected_pct:
        problems.append(f"{unexpected} unexpected outcomes of {total} requests "
                        f"({100.0 * unexpected / total:.2f}% > {max_unexpected_pct}%)")
    return problems, total, unexpected


# ---------------------------------------------------------------- report

def variant_rows(counts, xcache):
    rows = []
    order = [v for vs in KIND_VARIANTS.values() for v in vs]
    for v in order:
        c = counts.get(v, {})
        if not c:
            continue
        total = sum(c.values())
        exp = {o: n for o, n in c.items() if o in EXPECTED.get(v, ())}
        unexp = {o: n for o, n in c.items() if o not in EXPECTED.get(v, ()) and o not in
                 ("ok", "WRONG BODY")}
        xc = xcache.get(v, {})
        rows.append({"variant": v, "total": total, "ok": c.get("ok", 0),
                     "expected": exp, "unexpected": unexp, "wrong": c.get("WRONG BODY", 0),
                     "xcache": dict(xc)})
    return rows


def fmt_counts(d):
    return ", ".join(f"{k} {n:,}" for k, n in sorted(d.items(), key=lambda kv: -kv[1])) or "—"


def report_lines(r):
    L = []
    L.append(f"**Verdict: {'PASS' if not r['problems_all'] else 'FAIL'}**"
             + ("" if not r["problems_all"] else ": " + "; ".join(r["problems_all"])) + "\n")
    L.append(f"Ran {r['elapsed_s'] / 60:.1f} min ({r['duration_s']} s of load requested), "
             f"{r['started']:,} requests started at {r['rate']:g}/s (open loop), "
             f"{r['completed']:,} finished; samples every {r['interval_s']:g} s "
             f"({len(r['samples'])}), warm-up {r['warmup_s']:g} s. Start lag of the load "
             f"generator (how late a request started against its schedule): p99 "
             f"{r['lag_p99_ms']:.1f} ms, max {r['lag_max_ms']:.1f} ms.\n")
    L.append("## Resources\n")
    L.append("Rule: the samples after the warm-up are split into quarters; the last "
             "quarter's median (Q4) must not exceed the second quarter's (Q2) by more than "
             f"5% (plus {r.get('slack', 8)} for fds and connections); disk use must stay "
             "under `cache.disk` "
             "in every sample. `per hour` is (Q4 − Q2) over the time between their "
             "middles.\n")
    L.append("| metric | start | after warm-up | Q2 median | Q4 median | end | max | limit | "
             "per hour | rule | ok |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for t in r["trend"]:
        u = t["unit"]
        f = (lambda v: f"{v:,.1f}") if u else (lambda v: f"{v:,.0f}")
        ph = f"{t['per_hour']:+,.1f}" if t["metric"] in TREND else "—"
        L.append(f"| {t['label']} {('(' + u + ')') if u else ''} | {f(t['start'])} | "
                 f"{f(t['after_warmup'])} | {f(t['q2'])} | {f(t['q4'])} | {f(t['end'])} | "
                 f"{f(t['max'])} | {f(t['limit'])} | "
                 f"{ph} | "
                 f"{t['rule']} | {'yes' if t['ok'] else '**NO**'} |")
    L.append("")
    L.append("## Requests\n")
    L.append("Every body received whole (by its Content-Length or chunked framing) is "
             "compared byte for byte with the origin's body for that URL (for `/v/`, for "
             "the version its ETag names); a mismatch is a wrong body and fails the run. "
             "`expected` are the failures the variant provokes; `unexpected` are counted "
             f"and fail the run above {r['max_unexpected_pct']}% of all requests.\n")
    L.append("| variant | what | requests | ok | expected | unexpected | wrong bodies | "
             "X-Cache |")
    L.append("|---|---|---:|---:|---|---|---:|---|")
    for v in r["variants"]:
        L.append(f"| {v['variant']} | {VARIANT_TEXT.get(v['variant'], '')} | {v['total']:,} | "
                 f"{v['ok']:,} | {fmt_counts(v['expected'])} | {fmt_counts(v['unexpected'])} | "
                 f"{v['wrong']} | {fmt_counts(v['xcache'])} |")
    tot = r["totals"]
    L.append(f"| **all** | | {tot['total']:,} | {tot['ok']:,} | {tot['expected']:,} | "
             f"{tot['unexpected']:,} | {tot['wrong']} | |")
    L.append("")
    if r["wrong"]:
        L.append("Wrong bodies (first 10):\n")
        for w in r["wrong"][:10]:
            L.append(f"- `{json.dumps(w)}`")
        L.append("")
    L.append(f"Origin counters: {fmt_counts(r.get('origin_counts', {}))}.\n")
    L.append(f"CPU over the run (cores): Portico {r['cpu']['proxy_cpu']:.2f}, load generator "
             f"{r['cpu'].get('client_cpu', 0):.2f}, soak origin {r['cpu']['origin_cpu']:.2f}, "
             f"everything else "
             f"on the machine {r['cpu']['other_cpu']:.2f}. Portico's warnings and errors in "
             f"its log: {r['log_lines']}.\n")
    return L


def chart(r, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = r["samples"]
    t = [x["t"] / 60 for x in s]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    warm = r["warmup_s"] / 60
    post = [x for x in s if x["t"] >= r["warmup_s"]]
    n = len(post)
    q = n // 4 if n >= 8 else 0

    def panel(a, keys, div, ylabel, name, limit=None, loc="lower left"):
        for key, label, color in keys:
            a.plot(t, [x.get(key, 0) / div for x in s], label=label, color=color, linewidth=1.2)
        if q:
            for lo, hi in ((q, 2 * q), (n - q, n)):
                seg = post[lo:hi]
                m = statistics.median(x.get(keys[0][0], 0) for x in seg) / div
                a.hlines(m, seg[0]["t"] / 60, seg[-1]["t"] / 60, colors="#2c3e50",
                         linestyles="--", linewidth=2)
        if limit is not None:
            a.axhline(limit, color="#7f8c8d", linestyle=":", label="cache.disk")
        a.axvspan(0, warm, color="#ecf0f1", label="warm-up")
        a.set_ylabel(ylabel)
        a.set_ylim(bottom=0)
        a.set_title(name, fontsize=9)
        a.legend(fontsize=7, loc=loc, framealpha=0.9)

    panel(ax[0][0], [("rss_kib", "VmRSS", "#c0392b")], 1024, "MiB", "Portico RSS")
    panel(ax[0][1], [("fds", "/proc/PID/fd", "#2980b9")], 1, "descriptors",
          "open file descriptors")
    panel(ax[1][0], [("conns", "in service + idle", "#8e44ad"),
                     ("active", "requests in service", "#16a085"),
                     ("idle", "idle keep-alive", "#f39c12")], 1, "connections",
          "connections (Portico's /.stats.json)", loc="upper right")
    panel(ax[1][1], [("disk_stats", "disk tier (Portico)", "#27ae60"),
                     ("disk_apparent", "files (apparent size)", "#95a5a6")], 2 ** 20, "MiB",
          "disk cache use", limit=r["disk_limit"] / 2 ** 20)
    for a in ax[1]:
        a.set_xlabel("minutes")
    fig.suptitle(f"soak: Portico under a mixed open-loop load of {r['rate']:g} requests/s for "
                 f"{r['elapsed_s'] / 60:.0f} min; shaded: warm-up, dashed: Q2 and Q4 medians "
                 f"({'PASS' if not r['problems_all'] else 'FAIL'})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------- the run

async def soak_async(pid, alive, fwd, rev, origin_port, echo_port, cache_dir, opts):
    """Pre-fill, then load and sampler together. `alive()` says whether
    Portico still runs. Returns the raw result."""
    load = Load(fwd, rev, origin_port, echo_port, opts["rate"],
                request_timeout=opts.get("request_timeout", 20.0))
    stop = asyncio.Event()
    samples, notes = [], []
    loop = asyncio.get_running_loop()

    # Pre-fill: fill the disk tier past its low watermark with new objects
    # (closed loop, 16 at a time) so the warm-up starts near the steady state.
    t = loop.time()
    filled, target = 0, opts["prefill_bytes"]
    fill = Load(fwd, rev, origin_port, echo_port, 1.0)
    fill.run_id = load.run_id + "f"

    async def filler(w):
        nonlocal filled
        while filled < target and loop.time() - t < opts["prefill_max_s"]:
            fill.miss_n += 1
            out = await fill.do_get("miss", f"/m/{fill.run_id}-{w}-{fill.miss_n}")
            if out == "ok":
                filled += size_of(f"/m/{fill.run_id}-{w}-{fill.miss_n}")
    async def warm(port, paths):
        for p in paths:
            await fill.exchange(p, port=port)

    if target > 0:
        try:
            await asyncio.gather(*(filler(w) for w in range(16)))
            # then the hit set once through each listener (after the fill, so that
            # it is the most recently used on disk), as a long-running cache has it
            hot = [f"/c/{i}" for i in range(N_HOT)]
            await asyncio.gather(*(warm(port, hot[w::8]) for port in (fwd, rev)
                                   for w in range(8)))
        except (Incomplete, OSError) as e:
            notes.append(f"pre-fill stopped: {e}")
        fill.close_pools()
        if fill.wrong:
            load.wrong.extend(fill.wrong)
    prefill_s = loop.time() - t

    t0 = loop.time()

    async def sampler():
        nxt = 0.0
        while True:
            el = loop.time() - t0
            if el >= opts["duration"]:
                return   # the load stops starting requests: what follows is not steady state
            if not alive():
                notes.append(f"Portico exited at t = {el:.0f} s")
                stop.set()
                return
            if el >= nxt:
                try:
                    samples.append(await sample_once(pid, fwd, cache_dir, load, el))
                except OSError as e:
                    notes.append(f"sample at {el:.0f} s failed: {e}")
                nxt += opts["interval"]
                if opts.get("progress") and len(samples) % max(1, int(60 / opts["interval"])) == 0:
                    opts["progress"](samples[-1], load)
            if stop.is_set():
                return
            await asyncio.sleep(min(0.5, max(0.0, nxt - (loop.time() - t0))))

    st = asyncio.ensure_future(sampler())
    await load.run(opts["duration"], stop)
    elapsed = loop.time() - t0
    # a last sample once the load is over (not part of the trend: the load stopped)
    stop.set()
    await st
    return load, samples, notes, prefill_s, filled, elapsed


def main():
    ap = argparse.ArgumentParser(description="soak origin (used by bench/bench.py)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("origin")
    o.add_argument("--port", type=int, required=True)
    o.add_argument("--echo-port", type=int, required=True)
    a = ap.parse_args()
    if a.cmd == "origin":
        try:
            asyncio.run(origin_main(a.port, a.echo_port))
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    sys.exit(main())
