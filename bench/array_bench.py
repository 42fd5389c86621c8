"""The `array` scenario of bench/run: a 3-node Portico proxy array (CARP,
[array] in docs/CONFIG.md) against one node with the same total memory.

Two questions, as issue 19 asks them:

1. Hit ratio. The same Zipf-distributed request stream (alpha 0.8 over the
   bench's 10,000 objects, exp. sizes, mean 13 KiB) goes to one node with a
   memory tier of 3 x M, and round-robin to three nodes (127.0.0.11, .12,
   .13) with M each. CARP gives every URL one owner, so the array should
   hold one copy of each object and hit about as often as the single node;
   the origin's request count (nginx stub_status) says how often each
   missed, and the nodes' `not_owned` counters say whether any request was
   served outside its owner (a duplicate copy).
2. The extra hop. URLs owned by node A, cached there, requested with wrk
   through A itself (a hit) and through node B (B forwards to A, A hits):
   requests per second, latency, and the CPU both nodes spend per request.

Every node is pinned to the proxy CPU, wrk and the origin to the load CPU,
as for the other scenarios; everything is on loopback.
"""

import http.client
import json
import os
import random
import shutil
import subprocess
import threading
import time

ZIPF_ALPHA = 0.8
NODE_PORT = 28091
NODE_IPS = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]
MEMORY_PER_NODE_MIB = 16      # the single node gets 3x this
REQUESTS, REQUESTS_SMOKE = 30000, 1500
CLIENT_THREADS = 4
HOP_CONNS = 16
SUBJECTS = ["single", "array"]


def node_addr(i):
    return f"{NODE_IPS[i]}:{NODE_PORT}"


def node_conf(b, d, me, members, memory_mib):
    """A forward-proxy node: memory tier only (the hit ratio is the memory
    budget's), access log off, one worker thread like the other scenarios."""
    conf = {
        "server": {"workers": 1},
        "listener": [{"address": node_addr(me), "mode": "forward"}],
        "keepalive": {"max_requests": 0, "timeout": "120s"},
        "cache": {"memory": f"{memory_mib}MiB", "disk": "0", "dir": f"{d}/cache"},
        "log": {"access": "", "level": "warn"},
    }
    if members > 1:
        conf["array"] = {
            "self": node_addr(me),
            "probe_interval": "1s",
            "members": [{"address": node_addr(k), "name": f"node{k}"} for k in range(members)],
        }
    if b.PORTICO_EXTRA:
        b.merge_conf(conf, b.PORTICO_EXTRA)
    path = os.path.join(d, "portico.toml")
    with open(path, "w") as f:
        f.write(b.toml_dump(conf, "# bench/run array: one node (bench/array_bench.py)"))
    return path


def get(ip, path_or_url, conn=None):
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(ip, NODE_PORT, timeout=10)
    conn.request("GET", path_or_url)
    r = conn.getresponse()
    body = r.read()
    if own:
        conn.close()
    return r.status, body


def stats(ip):
    _, body = get(ip, "/.stats.json")
    return json.loads(body)["snapshot"]


def start_nodes(b, tmp, args, members, memory_mib):
    daemons = []
    try:
        for k in range(members):
            d = os.path.join(tmp, f"array-node{k}")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            conf = node_conf(b, d, k, members, memory_mib)
            b.portico_check(args.portico_bin, conf)
            daemons.append(b.Daemon(f"array-node{k}", [args.portico_bin, "run", "-c", conf],
                                    b.PROXY_CPU, d))
        origin = f"http://127.0.0.1:{b.PORTS['origin']}"
        for k, dm in enumerate(daemons):
            deadline = time.time() + 20
            while True:
                if not dm.alive():
                    raise RuntimeError(f"array node {k} exited: {dm.tail()}")
                try:
                    if get(NODE_IPS[k], f"{origin}/page")[0] == 200:
                        break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"array node {k} not ready: {dm.tail()}")
                time.sleep(0.2)
        # Every node must see every member up before the stream starts: a
        # node's first probe may have found a member that was still
        # starting, and it keeps that member down until its next probe.
        deadline = time.time() + 20
        while members > 1:
            views = [[m["up"] for m in (stats(NODE_IPS[k]).get("array") or {}).get("members", [])]
                     for k in range(members)]
            if all(len(v) == members and all(v) for v in views):
                break
            if time.time() > deadline:
                raise RuntimeError(f"array members still down after 20 s: {views}")
            time.sleep(0.2)
        return daemons
    except Exception:
        for dm in daemons:
            dm.stop()
        raise


def zipf_stream(paths, n, seed):
    """`n` paths drawn with probability proportional to 1 / rank^alpha,
    the ranks a seeded shuffle of the object set."""
    rng = random.Random(seed)
    ranked = list(paths)
    rng.shuffle(ranked)
    weights = [1.0 / (k + 1) ** ZIPF_ALPHA for k in range(len(ranked))]
    return rng.choices(ranked, weights=weights, k=n)


def replay(stream, members, origin):
    """The stream through the nodes, request i to node i mod members, on
    CLIENT_THREADS threads with one keep-alive connection per node each.
    Returns (bad responses, seconds)."""
    bad = []
    lock = threading.Lock()

    def worker(t):
        conns = [http.client.HTTPConnection(NODE_IPS[k], NODE_PORT, timeout=10)
                 for k in range(members)]
        for i in range(t, len(stream), CLIENT_THREADS):
            k = i % members
            try:
                st, _ = get(NODE_IPS[k], origin + stream[i], conns[k])
            except (OSError, http.client.HTTPException) as e:
                conns[k].close()
                conns[k] = http.client.HTTPConnection(NODE_IPS[k], NODE_PORT, timeout=10)
                st = str(e)
            if st != 200:
                with lock:
                    bad.append((stream[i], st))
        for c in conns:
            c.close()

    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(CLIENT_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return bad, time.time() - t0


def owned_by(portico_bin, conf, urls, member):
    """The URLs `portico array owner` gives to `member` under `conf`."""
    p = subprocess.run([portico_bin, "array", "owner", "-c", conf, "-"], input="\n".join(urls),
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"portico array owner: {p.stderr[-500:]}")
    # One line per URL: `URL: owner "NAME" ...`.
    owners = [line.split(": owner ", 1)[-1].split()[0].strip('";') for line in p.stdout.splitlines()]
    if len(owners) != len(urls):
        raise RuntimeError(f"portico array owner: {len(owners)} answers for {len(urls)} URLs")
    return [u for u, o in zip(urls, owners) if o == member]


def hop_cost(b, tmp, args, daemons, origin, paths):
    """wrk on URLs node 0 owns and holds: through node 0, then through node 1."""
    conf = os.path.join(tmp, "array-node0", "portico.toml")
    urls = [origin + p for p in paths[:2000]]
    mine = owned_by(args.portico_bin, conf, urls, "node0")[:400]
    for u in mine:                     # cached at the owner
        get(NODE_IPS[0], u)
    script = os.path.join(tmp, "array-hop.lua")
    listing = os.path.join(tmp, "array-hop-urls.txt")
    with open(listing, "w") as f:
        f.write("\n".join(mine) + "\n")
    with open(script, "w") as f:
        # Each line an absolute URL: wrk sends it as the request target.
        f.write(b.WRK_RANDOM % {"paths": listing, "seed": b.SEED} + b.WRK_DONE)
    out = {}
    for label, via in (("owner", 0), ("forwarded", 1)):
        j0 = [b.tree_jiffies(d.pid) for d in daemons]
        argv = ["taskset", "-c", b.LOAD_CPU, "wrk", "-t1", f"-c{HOP_CONNS}",
                f"-d{args.duration}s", "--latency", "--timeout", "5s", "-s", script,
                f"http://{node_addr(via)}/"]
        m0 = b.machine_busy_jiffies()
        t0 = time.time()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=args.duration + 60)
        wall = time.time() - t0
        line = [x for x in p.stdout.splitlines() if x.startswith("WRKJSON ")]
        if p.returncode != 0 or not line:
            raise RuntimeError(f"wrk failed ({p.returncode}): {p.stdout[-300:]} {p.stderr[-300:]}")
        r = json.loads(line[0][8:])
        cpu = [(b.tree_jiffies(d.pid) - j) / b.CLK_TCK for d, j in zip(daemons, j0)]
        busy = (b.machine_busy_jiffies() - m0) / b.CLK_TCK
        n = max(1, r["requests"])
        out[label] = {
            "rps": r["requests"] / (r["duration_us"] / 1e6),
            "p50_ms": r["p50_us"] / 1000, "p99_ms": r["p99_us"] / 1000,
            "errors": r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"],
            "cpu_us_per_req": sum(cpu) * 1e6 / n,
            "cpu_us_per_req_by_node": [c * 1e6 / n for c in cpu],
            "machine_busy": busy / wall,
        }
    return out, len(mine)


def run(b, subject, tmp, args, ctx, origin_daemon):
    """One round of one subject: `single` (one node, 3 x M) or `array`
    (three nodes, M each; also the hop cost)."""
    members = 1 if subject == "single" else 3
    memory = MEMORY_PER_NODE_MIB * (3 if members == 1 else 1)
    origin = f"http://127.0.0.1:{b.PORTS['origin']}"
    n = REQUESTS_SMOKE if args.smoke else REQUESTS
    stream = zipf_stream(ctx["paths"], n, b.SEED)
    daemons = start_nodes(b, tmp, args, members, memory)
    try:
        problems = []
        o0 = b.origin_requests()
        cpu = b.CpuMeter(daemons[0].pid, origin_daemon.pid)
        bad, secs = replay(stream, members, origin)
        c = cpu.stop()
        fetched = b.origin_requests() - o0 - 1
        if bad:
            problems.append(f"{len(bad)} requests failed, e.g. {bad[:3]}")
        snaps = [stats(NODE_IPS[k]) for k in range(members)]
        objects = [(s.get("cache") or {}).get("memory_entries", 0) for s in snaps]
        not_owned = sum((s.get("array") or {}).get("not_owned", 0) for s in snaps)
        if members > 1 and not_owned:
            said = []
            for dm in daemons:
                try:
                    with open(dm.logpath, errors="replace") as f:
                        said += [f"{dm.name}: {line.strip()}" for line in f if "array member" in line]
                except OSError:
                    pass
            problems.append(f"{not_owned} requests served outside their owner with every "
                            f"member up; the nodes said: {said[:6] or 'nothing'}")
        r = {"members": members, "memory_mib_per_node": memory, "requests": n,
             "origin_fetches": fetched, "hit_ratio": 1 - fetched / n,
             "distinct_urls": len(set(stream)), "objects_per_node": objects,
             "not_owned": not_owned, "seconds": secs, "other_cpu": c["other_cpu"],
             "problems": problems}
        if members > 1:
            hop, urls = hop_cost(b, tmp, args, daemons, origin, ctx["paths"])
            r["hop"], r["hop_urls"] = hop, urls
            if any(h["errors"] for h in hop.values()):
                problems.append(f"wrk errors on the hop runs: {hop}")
        for k, dm in enumerate(daemons):
            if not dm.alive():
                raise RuntimeError(f"array node {k} died: {dm.tail()}")
        r["summary"] = (f"{members} node(s) x {memory} MiB: hit ratio {r['hit_ratio']:.1%} "
                        f"({fetched:,} origin fetches for {n:,} requests), objects {objects}" +
                        (f"; hop: owner {r['hop']['owner']['rps']:.0f} req/s, forwarded "
                         f"{r['hop']['forwarded']['rps']:.0f} req/s" if members > 1 else ""))
        return r
    finally:
        for dm in daemons:
            dm.stop()


def report(b, scenario, results, subjects, args):
    import statistics
    single, array = results.get("single") or [], results.get("array") or []
    L = ["Requests go round-robin to the nodes (to the one node for `single`), each an "
         "absolute-form GET as a browser configured with any member sends it; the memory tier "
         "only (`cache.disk = 0`), so that both set-ups have the same total budget.\n",
         "| set-up | rounds | memory | hit ratio (median) | spread | origin fetches | objects held "
         "| served outside the owner |", "|---|---:|---|---:|---|---:|---|---:|"]
    for name, rs in (("one node", single), ("3-node array", array)):
        if not rs:
            continue
        hr = [r["hit_ratio"] for r in rs]
        L.append(f"| {name} | {len(rs)} | {rs[0]['members']} x {rs[0]['memory_mib_per_node']} MiB "
                 f"| {statistics.median(hr):.1%} | {min(hr):.1%}-{max(hr):.1%} | "
                 f"{statistics.median(r['origin_fetches'] for r in rs):,.0f} | "
                 f"{' + '.join(str(o) for o in rs[-1]['objects_per_node'])} | "
                 f"{sum(r['not_owned'] for r in rs)} |")
    L.append("")
    if single and array:
        d = statistics.median(r["hit_ratio"] for r in array) - \
            statistics.median(r["hit_ratio"] for r in single)
        L.append(f"The array's hit ratio is {d * 100:+.1f} points from the single node's, "
                 f"over {array[0]['distinct_urls']:,} distinct URLs in "
                 f"{array[0]['requests']:,} requests (Zipf alpha {ZIPF_ALPHA}).\n")
    if array:
        L += ["## The extra hop\n",
              f"wrk, {HOP_CONNS} connections, {args.duration} s each, over {array[0]['hop_urls']} "
              "URLs node 0 owns and holds: through node 0 itself (a hit there) and through "
              "node 1 (it forwards each request to node 0, which hits). CPU is both nodes' "
              "together, per request.\n",
              "| path | req/s (median) | p50 ms | p99 ms | CPU µs per request | of which node 0 "
              "| node 1 |", "|---|---:|---:|---:|---:|---:|---:|"]
        for label, name in (("owner", "client → owner"),
                            ("forwarded", "client → node 1 → owner")):
            hs = [r["hop"][label] for r in array]
            m = lambda k: statistics.median(h[k] for h in hs)
            L.append(f"| {name} | {m('rps'):,.0f} | {m('p50_ms'):.2f} | {m('p99_ms'):.2f} | "
                     f"{m('cpu_us_per_req'):.1f} | "
                     f"{statistics.median(h['cpu_us_per_req_by_node'][0] for h in hs):.1f} | "
                     f"{statistics.median(h['cpu_us_per_req_by_node'][1] for h in hs):.1f} |")
        own = statistics.median(r["hop"]["owner"]["cpu_us_per_req"] for r in array)
        fwd = statistics.median(r["hop"]["forwarded"]["cpu_us_per_req"] for r in array)
        L.append("")
        L.append(f"A request that lands on a non-owner costs {fwd / own:.2f}x the CPU of one "
                 f"that lands on its owner ({fwd - own:+.1f} µs): the receiving node parses, "
                 f"routes and relays it as a parent request. Browsers using the array's PAC "
                 f"file go to the owner directly and never pay it.\n")
    extra = [f"- Nodes: {', '.join(f'{ip}:{NODE_PORT}' for ip in NODE_IPS)} (forward "
             f"listeners, `[array]` with the three as members, probe every 1 s), all on CPU "
             f"{b.PROXY_CPU}; the client's {CLIENT_THREADS} threads and wrk on CPU {b.LOAD_CPU} "
             f"with the origin (nginx, the bench's object set, Cache-Control: max-age=120)"]
    return L, extra
