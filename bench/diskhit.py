#!/usr/bin/env python3
"""Disk-tier hits, measured by hand (bench/README.md, "Disk-tier hits").

The object set of bench/run (10,000 objects, exp 13 KiB, nginx origin on
127.0.0.1:38080 pinned to CPU 1), Portico as a reverse proxy on
127.0.0.1:38081 pinned to CPU 0 with a 16 MiB memory tier and a 1 GiB disk
tier, both under /dev/shm/dh; every object fetched twice (stored, then read
once from disk), then:

  diskhit.py PORTICO_BIN wrk ROUNDS SECONDS   wrk -t1 -c64 random hits (CPU 1):
                                              req/s, Portico CPU, req per core, TCP
                                              segments per request (whole machine:
                                              client, Portico and origin)
  diskhit.py PORTICO_BIN callgrind N          Portico restarted under callgrind
                                              (instrumentation off), every object
                                              read again, then N sequential random
                                              hits instrumented: instructions/request
  diskhit.py PORTICO_BIN h2callgrind N        as callgrind, the N hits over cleartext HTTP/2
                                              (h2load, prior knowledge: the listener gets
                                              h2c = true), 1 connection of 100 streams
  diskhit.py PORTICO_BIN strace N             strace -c -f over N sequential hits:
                                              system calls per request
  diskhit.py PORTICO_BIN serve SECONDS        set up and wait (manual probing)

DH_PREFILL: how many times every object is fetched before the mode starts
(default 2; bench/run's hit scenarios fetch each once, so their first hits
are each object's second request). DH_KEEPALIVE adds lines to Portico's
[keepalive] (e.g. 'max_connections = 20000').
DH_CACHE adds lines to Portico's [cache] (e.g. 'open_files = 10000'),
DH_SERVER to its [server] (e.g. bench/overload.toml's limits), DH_LISTENER
to its [[listener]] (h2callgrind adds h2c = true). DH_CLOSE=1 makes the
wrk, callgrind and strace modes send each request on a connection of its own
with `Connection: close` (the close scenario).
DH_MEMORY sets the memory tier (default 16MiB; 512MiB holds every object,
so the hits are memory-tier hits). DH_PREFIX=/ns asks for the same objects under the origin's /ns/, which it
serves with Cache-Control: no-store: every request is then a miss (the
miss path measured the same ways).
DH_STORE=1 (callgrind mode) restarts Portico on an empty cache and makes
the N instrumented requests N different objects, each a miss that is
stored (after 300 others as a warm-up): the store path measured. In wrk
mode it gives every request a query string of its own: each a miss that
is stored (memory tier and disk tier, until the GC makes room).
Ports 38080/38081 keep it clear of bench/run's.
"""
import os, sys, time, json, random, subprocess, signal, http.client, shutil, re
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench
W = "/dev/shm/dh"
ORIGIN, PORT = 38080, 38081
CLK = os.sysconf("SC_CLK_TCK")

def setup_data():
    data = f"{W}/data"
    if not os.path.exists(f"{data}/o/09999"):
        shutil.rmtree(data, ignore_errors=True); os.makedirs(data)
        bench.generate_objects(data)
    paths = [os.environ.get("DH_PREFIX", "") + f"/o/{i:05d}" for i in range(10000)]
    open(f"{W}/paths.txt", "w").write("\n".join(paths) + "\n")
    return data, paths

def start_origin(data):
    d = f"{W}/origin"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    conf = bench.origin_conf(d, data).replace("28080", str(ORIGIN))
    open(f"{d}/nginx.conf", "w").write(conf)
    p = subprocess.Popen(["taskset", "-c", "1", "nginx", "-e", f"{d}/err.log", "-p", d, "-c", f"{d}/nginx.conf"], start_new_session=True)
    wait(ORIGIN, "/o/00000"); return p

def wait(port, path, t=60):
    end = time.time() + t
    while time.time() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", path); r = c.getresponse(); r.read(); c.close(); return
        except Exception: time.sleep(0.2)
    raise SystemExit(f"port {port} not ready")

def portico_conf(extra=""):
    return f"""[server]
workers = 1
{os.environ.get("DH_SERVER", "")}
[[listener]]
address = "127.0.0.1:{PORT}"
mode = "reverse"
{os.environ.get("DH_LISTENER", "")}
[keepalive]
max_requests = 0
timeout = "120s"
{os.environ.get("DH_KEEPALIVE", "")}
[[upstream]]
name = "origin"
servers = ["127.0.0.1:{ORIGIN}"]
[[rule]]
upstream = "origin"
[cache]
memory = "{os.environ.get("DH_MEMORY", "16MiB")}"
disk = "1GiB"
dir = "{W}/cache"
{os.environ.get("DH_CACHE", "")}
[log]
access = ""
level = "warn"
{extra}"""

def start_portico(binary, wrap=()):
    open(f"{W}/portico.toml", "w").write(portico_conf(os.environ.get("DH_EXTRA", "")))
    p = subprocess.Popen(["taskset", "-c", "0", *wrap, binary, "run", "-c", f"{W}/portico.toml"], start_new_session=True, stderr=open(f"{W}/portico.err", "a"))
    wait(PORT, "/o/00000", 300); return p

def client_run(paths, n, seed=1):
    """n random GETs on one keep-alive connection, or with DH_CLOSE=1 each
    on a connection of its own with `Connection: close` (the close scenario)."""
    rng = random.Random(seed)
    close = os.environ.get("DH_CLOSE") == "1"
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    for i in range(n):
        if close:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
            c.request("GET", rng.choice(paths), headers={"Connection": "close"})
        else:
            c.request("GET", rng.choice(paths))
        r = c.getresponse(); r.read()
        if r.status != 200: raise SystemExit(f"status {r.status}")
        if close: c.close()
    c.close()

def h2_run(paths, n, seed=1):
    """n random hits over cleartext HTTP/2 (h2load: one connection, 100
    streams at once), every one a 200."""
    rng = random.Random(seed)
    with open(f"{W}/h2-uris.txt", "w") as f:
        f.write("\n".join(f"http://127.0.0.1:{PORT}{rng.choice(paths)}" for _ in range(n)) + "\n")
    out = subprocess.run(["taskset", "-c", "1", "h2load", "-n", str(n), "-c1", "-m100", "-i", f"{W}/h2-uris.txt"],
                         capture_output=True, text=True, timeout=600).stdout
    codes = next((ln for ln in out.splitlines() if ln.startswith("status codes:")), "")
    if not codes.startswith(f"status codes: {n} 2xx"):
        raise SystemExit(f"h2load: {out[-600:]}")

def prefill(paths):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    for p in paths:
        c.request("GET", p); r = c.getresponse(); r.read()
    c.close()

def stats():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30); c.request("GET", "/.stats.json"); r = c.getresponse(); j = json.loads(r.read()); c.close(); return j

def out_segments():
    """TCP segments sent by the whole machine so far (/proc/net/snmp
    OutSegs): the client's, Portico's and the origin's, all on loopback."""
    rows = [l.split() for l in open("/proc/net/snmp") if l.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])

def jiffies(pid):
    """User and system CPU of all of pid's threads, in jiffies."""
    user = system = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        s = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
        user += int(s[11])
        system += int(s[12])
    return user, system

def stop(p):
    try: os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError: pass
    try: p.wait(30)
    except Exception: os.killpg(p.pid, signal.SIGKILL); p.wait()

def disk_counters():
    j = stats()
    def find(o):
        if isinstance(o, dict):
            if "checksum_failures" in o and "reads" in o: return o
            for v in o.values():
                r = find(v)
                if r: return r
    d = find(j) or {}
    return {k: v for k, v in d.items() if isinstance(v, (int, float))}

def main():
    binary, mode = sys.argv[1], sys.argv[2]
    if mode == "h2callgrind":
        os.environ["DH_LISTENER"] = os.environ.get("DH_LISTENER", "") + "\nh2c = true"
    os.makedirs(W, exist_ok=True)
    data, paths = setup_data()
    shutil.rmtree(f"{W}/cache", ignore_errors=True)
    lua = f"{W}/hits.lua"
    open(lua, "w").write(bench.WRK_RANDOM % {"paths": f"{W}/paths.txt", "seed": bench.SEED})
    origin = start_origin(data)
    procs = [origin]
    try:
        pt = start_portico(binary); procs.append(pt)
        for _ in range(int(os.environ.get("DH_PREFILL", "2"))):
            prefill(paths)
        if mode == "wrk":
            rounds, dur = int(sys.argv[3]), int(sys.argv[4])
            subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c64", "-d3s", "-s", lua, f"http://127.0.0.1:{PORT}/"], capture_output=True)
            d0 = disk_counters()
            res = []
            for i in range(rounds):
                (u0, s0), t0, g0 = jiffies(pt.pid), time.time(), out_segments()
                close = ["-H", "Connection: close"] if os.environ.get("DH_CLOSE") else []
                script = lua
                if os.environ.get("DH_STORE") == "1":
                    # Every request a new URL (a query string of its own): a miss that is stored.
                    script = f"{W}/stores.lua"
                    pick = 'paths[math.random(#paths)])'
                    assert pick in bench.WRK_RANDOM, "bench.WRK_RANDOM no longer picks a path this way"
                    open(script, "w").write(bench.WRK_RANDOM.replace(
                        pick, f'paths[math.random(#paths)] .. "?s={i}-" .. tostring(math.random(1e9)))'
                    ) % {"paths": f"{W}/paths.txt", "seed": bench.SEED + i})
                out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c64", f"-d{dur}s", "--latency", *close, "-s", script, f"http://127.0.0.1:{PORT}/"], capture_output=True, text=True).stdout
                (u1, s1), t1, g1 = jiffies(pt.pid), time.time(), out_segments()
                reqs = int(re.search(r"(\d+) requests in", out).group(1))
                non2xx = re.search(r"Non-2xx.*?(\d+)", out)
                p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)
                user, system = (u1 - u0) / CLK, (s1 - s0) / CLK
                cpu = (user + system) / (t1 - t0)
                rps = reqs / (t1 - t0)
                res.append((rps, cpu, rps / cpu))
                print(f"round {i}: {rps:,.0f} req/s, proxy CPU {cpu:.2f}, {rps/cpu:,.0f} req/core "
                      f"(per request {user / reqs * 1e6:.1f} us user, {system / reqs * 1e6:.1f} us system), "
                      f"p99 {p99}, non2xx {non2xx.group(1) if non2xx else 0}, "
                      f"TCP segments per request {(g1 - g0) / reqs:.2f}", flush=True)
            d1 = disk_counters()
            print("disk counters delta:", {k: d1[k] - d0.get(k, 0) for k in d1 if d1[k] != d0.get(k, 0)})
            res.sort(key=lambda r: r[2]); print(f"median requests per core: {res[len(res)//2][2]:,.0f}")
        elif mode == "serve":
            print("ready", pt.pid, flush=True)
            time.sleep(int(sys.argv[3]))
        elif mode in ("callgrind", "h2callgrind", "strace"):
            n = int(sys.argv[3])
            client_run(paths, 500, seed=7)
            d0 = disk_counters()
            if mode in ("callgrind", "h2callgrind"):
                stop(pt); procs.remove(pt)
                store = os.environ.get("DH_STORE") == "1"
                if store:
                    if n > len(paths) - 301: raise SystemExit(f"DH_STORE: at most {len(paths) - 301} requests")
                    shutil.rmtree(f"{W}/cache", ignore_errors=True)
                wrap = ("valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={W}/cg.out")
                pt = start_portico(binary, wrap); procs.append(pt)
                if store:
                    prefill(paths[-300:])
                else:
                    prefill(paths)
                    client_run(paths, 500, seed=7)
                d0 = disk_counters()
                subprocess.run(["callgrind_control", "-i", "on", str(pt.pid)], check=True, capture_output=True)
                if mode == "h2callgrind":
                    h2_run(paths, n, seed=9)
                elif store:
                    prefill(paths[1:n + 1])
                else:
                    client_run(paths, n, seed=9)
                subprocess.run(["callgrind_control", "-d", str(pt.pid)], check=True, capture_output=True)
                subprocess.run(["callgrind_control", "-i", "off", str(pt.pid)], check=True, capture_output=True)
                time.sleep(1)
                dumps = sorted(f for f in os.listdir(W) if f.startswith("cg.out"))
                ir = 0
                for f in dumps:
                    for line in open(f"{W}/{f}"):
                        if line.startswith("summary:") or line.startswith("totals:"):
                            ir = max(ir, int(line.split()[1]))
                print(f"dumps {dumps}; Ir {ir:,}; instructions per request: {ir / n:,.0f}")
                for f in dumps: os.rename(f"{W}/{f}", f"{W}/last-{f}")
            if mode == "strace":
                st = subprocess.Popen(["strace", "-c", "-f", "-o", f"{W}/strace.txt", "-p", str(pt.pid)])
                time.sleep(1.5)
                client_run(paths, n, seed=9)
                st.send_signal(signal.SIGINT); st.wait()
                txt = open(f"{W}/strace.txt").read(); print(txt)
                total = int([l for l in txt.splitlines() if l.rstrip().endswith("total")][0].split()[3])
                print(f"syscalls per request: {total / n:.1f}")
            d1 = disk_counters()
            print("disk counters delta:", {k: d1[k] - d0.get(k, 0) for k in d1 if d1[k] != d0.get(k, 0)})
    finally:
        for p in reversed(procs): stop(p)

if __name__ == "__main__":
    # A SIGTERM (`pkill -f diskhit.py`, `timeout`) unwinds through main's
    # `finally`, so the origin and Portico (each in a session of its own)
    # stop with it instead of holding ports 38080/38081, where the next run
    # would otherwise measure the old process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
