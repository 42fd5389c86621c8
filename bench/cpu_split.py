#!/usr/bin/env python3
"""Where a request's CPU goes, proxy by proxy: user and system time per
request and the machine's TCP segments per request, for one scenario of
bench/run (hits, close or miss), with bench/run's own object set, origin and
peer configurations (bench/peers/).

The throughput tables say how many requests a proxy core serves; this says
whether a gap is in user space (the proxy's own code) or in the kernel, and
whether the proxy makes the kernel send more segments than its peers (each
one costs the sender and wakes the receiver). It found that a miss left
Portico in two writes where HAProxy's left in one (bench/README.md, "Misses:
what the origin has sent, relayed in one write").

Usage: bench/cpu_split.py PORTICO_BIN SCENARIO ROUNDS PEER...
  e.g. bench/cpu_split.py target/release/portico close 2 portico nginx-tput haproxy

Each run: the peer started with a fresh cache (objects fetched twice first,
but for `miss`), wrk -t1 -c64 for 2 s to warm, then 5 s measured; CPU from
/proc (the peer's process tree), segments from /proc/net/snmp `OutSegs`
(the whole machine: client, proxy and origin, all on loopback). Proxy on
CPU 0, wrk and the origin on CPU 1, as in bench/run. Not a benchmark: no
checks, no medians; run bench/run for figures to quote.
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def out_segments():
    """TCP segments the machine has sent (/proc/net/snmp `OutSegs`)."""
    rows = [line.split() for line in open("/proc/net/snmp") if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def wrk(port, scenario, script, seconds):
    close = ["-H", "Connection: close"] if scenario == "close" else []
    return subprocess.run(["taskset", "-c", b.LOAD_CPU, "wrk", "-t1", "-c64", f"-d{seconds}s", *close,
                           "-s", script, f"http://127.0.0.1:{port}/"],
                          capture_output=True, text=True, check=True).stdout


def main():
    if len(sys.argv) < 5 or sys.argv[2] not in ("hits", "close", "miss"):
        sys.exit(__doc__)
    binary, scenario, rounds, peers = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    with b.objects_and_origin("portico-bench-split-") as (tmp, paths):
        script = b.write_wrk_scripts(tmp, paths)["miss" if scenario == "miss" else "hits"]
        for r in range(rounds):
            for peer in peers:
                with b.running_peer(peer, tmp, binary) as daemon:
                    port = b.PORTS[peer]
                    if scenario != "miss":
                        b.warm_hits(port, paths)
                        b.warm_hits(port, paths)
                    wrk(port, scenario, script, 2)
                    (u0, s0), g0 = b.tree_jiffies_split(daemon.pid), out_segments()
                    out = wrk(port, scenario, script, 5)
                    (u1, s1), g1 = b.tree_jiffies_split(daemon.pid), out_segments()
                    n = int(re.search(r"(\d+) requests in", out).group(1))
                    user, system = (u1 - u0) / CLK, (s1 - s0) / CLK
                    print(f"{scenario} round {r + 1} {peer:10} {n / (user + system):9,.0f} requests per core"
                          f"  user {user / n * 1e6:5.1f} us  system {system / n * 1e6:5.1f} us"
                          f"  segments {(g1 - g0) / n:.2f} per request", flush=True)


if __name__ == "__main__":
    main()
