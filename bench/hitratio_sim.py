#!/usr/bin/env python3
"""A trace simulation of the hitratio scenario's stream (bench/hitratio_bench.py):
Portico's two cache tiers modelled closely enough to compare replacement and
admission policies in seconds, before building one. Not a benchmark: the
scenario itself (`bench/run hitratio`) is what the results quote.

The model:
- the disk tier holds every stored object, each charged its file's size
  (body plus FILE_OVERHEAD) rounded up to 4 KiB blocks; when the bytes
  charged pass the high watermark (99%), one GC pass ranks every object and
  evicts the lowest until the low watermark (97%), as src/cache/disk/gc.rs
  does, with `Index::rank`'s priorities (Greedy-Dual: clock + uses x term);
- the memory tier (64 MiB, objects up to 1 MiB) is a size-aware S3-FIFO like
  quick_cache's: a small queue (10% of the weight) for new objects, a main
  queue for the ones used again, a ghost list of keys evicted from the
  small queue; every object fetched goes in, a disk hit only while the tier
  has room;
- a request is a hit if either tier holds the URL; otherwise the origin is
  asked and the object stored in both.

Usage: bench/hitratio_sim.py [--requests N] [--oracle] [--policy P[:m=X][:w=N][:layout=L] ...]
Policies: see POLICIES below. One policy over 1,000,000 requests takes one
to three minutes.

Checked against the scenario (2026-11-27, 1,000,000 requests): `balanced`
simulated 41.5% / 36.6% and measured 42.3% / 37.3%; `frequency` simulated
43.8% / 41.2% and measured 44.2% / 41.3%.
"""

import argparse
import hashlib
import re
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hitratio_bench as hb  # noqa: E402

BLOCK = 4096
FILE_OVERHEAD = 700        # envelope, metadata and trailer of a cache file (measured: ~0.6-0.8 KiB)
MEM_OVERHEAD = 1500        # MemObject::weight beyond the body for a typical response
PER_OBJECT = 0.15          # Index's BALANCED_PER_OBJECT


class Sketch:
    """A count-min sketch of 8-bit counters with conservative update and
    periodic halving (TinyLFU's frequency estimate), as
    src/cache/disk/popularity.rs: `width` counters per row, 4 rows, halved
    after `window` increments. `layout`: "blocked" (src/cache/disk/
    popularity.rs since 2026-12-06: a key's four counters in one block of
    64, the low 64 bits of the hash choosing the block and six bits of the
    high 64 each counter in it), "rows" (before: each row apart, each
    counter from its own 32 bits) or "quarters" (blocked, each row's
    counter among its own 16 of the block)."""

    def __init__(self, width, window, layout="blocked"):
        self.width = width
        self.layout = layout
        self.slots = {}     # key -> its four counters (hashing once per key)
        self.c = bytearray(4 * width)
        self.window = window
        self.added = 0

    def _idx(self, key):
        s = self.slots.get(key)
        if s is None:
            h = int.from_bytes(hashlib.blake2b(key.to_bytes(8, "little"), digest_size=16).digest(), "little")
            block = (h & ((1 << 64) - 1)) % (self.width // 16) * 64
            if self.layout == "rows":
                s = [i * self.width + (h >> (32 * i)) % self.width for i in range(4)]
            elif self.layout == "quarters":
                s = [block + 16 * i + ((h >> (64 + 4 * i)) & 15) for i in range(4)]
            else:
                s = [block + ((h >> (64 + 6 * i)) & 63) for i in range(4)]
            self.slots[key] = s
        return s

    def add(self, key):
        idx = self._idx(key)
        c = self.c
        least = min(c[i] for i in idx)
        if least < 255:
            for i in idx:
                if c[i] == least:
                    c[i] = least + 1
        self.added += 1
        if self.added >= self.window:
            self.added //= 2
            self.c = bytearray(v >> 1 for v in c)

    def get(self, key):
        return min(self.c[i] for i in self._idx(key))


class Memory:
    """quick_cache-like S3-FIFO by weight."""

    def __init__(self, budget):
        self.budget = budget
        self.small_budget = budget // 10
        self.small = collections.OrderedDict()   # key -> weight
        self.main = collections.OrderedDict()
        self.freq = {}
        self.ghost = collections.OrderedDict()
        self.small_w = self.main_w = 0

    def weight(self):
        return self.small_w + self.main_w

    def has(self, k):
        return k in self.small or k in self.main

    def get(self, k):
        if self.has(k):
            self.freq[k] = min(3, self.freq.get(k, 0) + 1)
            return True
        return False

    def insert(self, k, w):
        if self.has(k):
            return
        if k in self.ghost:
            del self.ghost[k]
            self.main[k] = w
            self.main_w += w
        else:
            self.small[k] = w
            self.small_w += w
        self.freq[k] = 0
        while self.weight() > self.budget:
            self._evict()

    def _evict(self):
        if self.small_w > self.small_budget or not self.main:
            k, w = self.small.popitem(last=False)
            self.small_w -= w
            if self.freq.pop(k, 0) > 0:
                self.main[k] = w
                self.main_w += w
                self.freq[k] = 0
            else:
                self.ghost[k] = True
                if len(self.ghost) > 4 * max(1, len(self.main) + len(self.small)):
                    self.ghost.popitem(last=False)
        else:
            k, w = self.main.popitem(last=False)
            self.main_w -= w
            f = self.freq.get(k, 0)
            if f > 0:
                self.freq[k] = f - 1
                self.main[k] = w
                self.main_w += w
            else:
                self.freq.pop(k, None)


class Disk:
    """The disk tier. `policy` is a name from POLICIES, optionally followed
    by `:m=X` (the per-object term, default per policy) and, for
    `frequency`, `:w=N` (2^N counters per sketch row instead of the sizing
    of src/cache/disk/popularity.rs) and `:layout=L` (the sketch's layout:
    see `Sketch`)."""

    def __init__(self, budget, policy, sketch):
        self.budget = budget
        self.high, self.low = budget * 99 // 100, budget * 97 // 100
        self.name = policy.split(":")[0]
        if self.name not in POLICIES:
            raise SystemExit(f"unknown policy {self.name}: one of {', '.join(POLICIES)}")
        self.sketch = sketch
        self.entries = {}   # key -> [clock, charged, hits, last]
        self.bytes = 0
        self.clock = 0.0
        self.counts = collections.Counter() if self.name == "lfu-exact" else None
        m = re.search(r"m=([0-9.]+)", policy)
        self.per_object = float(m.group(1)) if m else POLICIES[self.name]

    def uses(self, k, e):
        if self.name == "frequency":
            return max(1, self.sketch.get(k))
        if self.name == "lfu-exact":
            return self.counts[k]
        return 1 + e[2]

    def score(self, k, e):
        blocks = e[1] // BLOCK
        clock = e[0] if self.name == "balanced" else 0.0
        return clock + self.uses(k, e) * (1.0 / blocks + self.per_object)

    def asked(self, k):
        if self.sketch is not None:
            self.sketch.add(k)
        if self.counts is not None:
            self.counts[k] += 1

    def touch(self, k, t):
        e = self.entries.get(k)
        if e is None:
            return False
        e[0] = self.clock
        e[2] += 1
        e[3] = t
        return True

    def insert(self, k, size, t):
        charged = -(-(size + FILE_OVERHEAD) // BLOCK) * BLOCK
        if charged > self.budget:
            return
        old = self.entries.pop(k, None)
        if old:
            self.bytes -= old[1]
        self.entries[k] = [self.clock, charged, 0, t]
        self.bytes += charged
        if self.bytes > self.high:
            self.gc()

    def gc(self):
        ranked = sorted(((self.score(k, e), e[3], -e[1], k) for k, e in self.entries.items()))
        for score, _, _, k in ranked:
            if self.bytes <= self.low:
                break
            e = self.entries.pop(k)
            self.bytes -= e[1]
            if self.name == "balanced":
                self.clock = max(self.clock, score)


def simulate(stream, sizes, policy, memory_mib=64, disk_mib=1024):
    sketch = None
    if policy.startswith("frequency"):
        # As src/cache/disk/popularity.rs sizes it: an object per 16 KiB of
        # budget expected, four counters per row for each, halved after ten
        # requests per expected object.
        expected = max(1024, (disk_mib << 20) // (16 << 10))
        w = re.search(r"w=([0-9]+)", policy)
        width = 1 << int(w.group(1)) if w else min(1 << 22, 1 << (4 * expected - 1).bit_length())
        layout = re.search(r"layout=([a-z]+)", policy)
        sketch = Sketch(width=width, window=10 * expected, layout=layout.group(1) if layout else "blocked")
    disk = Disk(disk_mib << 20, policy, sketch)
    mem = Memory(memory_mib << 20) if memory_mib else None
    hits = bytes_hit = total_bytes = 0
    tenths, tenth = [], len(stream) // 10
    for t, u in enumerate(stream):
        if t and t % tenth == 0:
            tenths.append((hits, bytes_hit, total_bytes))
        size = sizes[u]
        total_bytes += size
        disk.asked(u)
        if mem is not None and mem.get(u):
            hits += 1
            bytes_hit += size
            continue
        if disk.touch(u, t):
            hits += 1
            bytes_hit += size
            if mem is not None and size <= (1 << 20) and mem.weight() + size + MEM_OVERHEAD <= mem.budget * 7 // 8:
                mem.insert(u, size + MEM_OVERHEAD)
            continue
        # A miss: fetched and stored in both tiers.
        if mem is not None and size <= (1 << 20):
            mem.insert(u, size + MEM_OVERHEAD)
        disk.insert(u, size, t)
    tenths.append((hits, bytes_hit, total_bytes))
    per_tenth, last = [], (0, 0, 0)
    for h, bh, tb in tenths:
        per_tenth.append(f"{(h - last[0]) / tenth:.0%}/{(bh - last[1]) / max(1, tb - last[2]):.0%}")
        last = (h, bh, tb)
    return hits / len(stream), bytes_hit / total_bytes, " ".join(per_tenth)


# Policy name -> its default per-object term.
POLICIES = {
    "balanced": PER_OBJECT,   # cache.replacement = "balanced": clock + (1 + hits) x (1/blocks + m)
    "frequency": 0.5,         # cache.replacement = "frequency": sketch lookups x (1/blocks + m)
    "lfu-exact": 0.5,         # frequency with exact counts that never age: what the sketch approximates
}


def oracle(stream, sizes, memory_mib, disk_mib):
    """Bounds no online policy reaches: the tiers' bytes (disk to its low
    watermark, plus memory) filled once with the objects chosen knowing the
    whole stream, every request after an object's first a hit. By request
    count (the byte hit ratio's best static choice: a byte stored earns its
    object's count) and by count per byte (the hit ratio's)."""
    counts = collections.Counter(stream)
    total_bytes = sum(sizes[u] for u in stream)
    budget = (disk_mib << 20) * 97 // 100 + (memory_mib << 20)
    out = []
    for label, key in (("by count", lambda kv: -kv[1]), ("by count per byte", lambda kv: -kv[1] / max(1, sizes[kv[0]]))):
        used = hits = hit_bytes = 0
        for u, c in sorted(counts.items(), key=key):
            w = -(-(sizes[u] + FILE_OVERHEAD) // BLOCK) * BLOCK
            if used + w > budget:
                continue
            used += w
            hits += c - 1
            hit_bytes += (c - 1) * sizes[u]
        out.append((label, hits / len(stream), hit_bytes / total_bytes))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=hb.REQUESTS)
    ap.add_argument("--seed", type=int, default=20260314)
    ap.add_argument("--memory-mib", type=int, default=hb.MEMORY_MIB)
    ap.add_argument("--disk-mib", type=int, default=hb.DISK_MIB)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--oracle", action="store_true",
                    help="also the static offline bounds (objects chosen knowing the whole stream)")
    a = ap.parse_args()
    t0 = time.time()
    stream, sizes = hb.stream_for(a.requests, a.seed, hb.HEAVY_MAX)
    facts = hb.stream_facts(stream, sizes)
    print(f"{a.requests:,} requests, {facts['distinct_urls']:,} URLs; without a budget "
          f"{facts['infinite_hit_ratio']:.1%} / {facts['infinite_byte_hit_ratio']:.1%} "
          f"({time.time() - t0:.0f} s to generate)", flush=True)
    if a.oracle:
        for label, hr, bhr in oracle(stream, sizes, a.memory_mib, a.disk_mib):
            print(f"{'oracle ' + label:32} {hr:6.1%} / {bhr:6.1%}", flush=True)
    for p in a.policy or ["balanced", "frequency"]:
        t0 = time.time()
        hr, bhr, tenths = simulate(stream, sizes, p, a.memory_mib, a.disk_mib)
        print(f"{p:32} {hr:6.1%} / {bhr:6.1%}   ({time.time() - t0:.0f} s)   per tenth: {tenths}", flush=True)


if __name__ == "__main__":
    main()
