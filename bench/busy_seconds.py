#!/usr/bin/env python3
"""The `busy` scenario's run cut into seconds: where its tail comes from.

bench/run's `busy` (1,000 keep-alive connections asking for hits) gives one
p99 over its whole run. This starts each proxy as bench/run does (its object
set, origin and bench/peers/ configuration, the proxy on CPU 0, wrk and the
origin on CPU 1), fetches every object once as bench/run does, then runs wrk
several times in a row on the same proxy process and prints each run's
requests a second, p50 and p99: the first second after the warm-up apart
from the seconds after it (bench/README.md, "Busy connections: the tail is
the first second after the warm-up").

Usage: bench/busy_seconds.py PORTICO_BIN PEER... [--runs 1,1,1,5] [--connections N]
  e.g. bench/busy_seconds.py target/release/portico portico nginx nginx-tput
  --connections 64: the `hits` scenario the same way (default 1,000: `busy`)
Not a benchmark: no checks, no medians; bench/run gives figures to quote.
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402


def main():
    args = sys.argv[1:]
    runs, connections = [1, 1, 1, 5], b.BUSY_CONNECTIONS
    if "--runs" in args:
        i = args.index("--runs")
        runs = [int(x) for x in args[i + 1].split(",")]
        del args[i:i + 2]
    if "--connections" in args:
        i = args.index("--connections")
        connections = int(args[i + 1])
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    binary, peers = args[0], args[1:]
    with b.objects_and_origin("portico-bench-seconds-") as (tmp, paths):
        script = b.write_wrk_scripts(tmp, paths)["busy"]
        for peer in peers:
            with b.running_peer(peer, tmp, binary):
                port = b.PORTS[peer]
                b.warm_hits(port, paths)
                print(peer, flush=True)
                for seconds in runs:
                    out = subprocess.run(
                        ["taskset", "-c", b.LOAD_CPU, "wrk", "-t1", f"-c{connections}",
                         f"-d{seconds}s", "--latency", "-s", script, f"http://127.0.0.1:{port}/"],
                        capture_output=True, text=True, timeout=seconds + 60).stdout

                    def find(pattern):
                        m = re.search(pattern, out)
                        return m.group(1) if m else "?"
                    rps, p50, p99 = (find(r"Requests/sec:\s+(\S+)"), find(r"50%\s+(\S+)"),
                                     find(r"99%\s+(\S+)"))
                    print(f"  {seconds} s: {rps} requests/s, p50 {p50}, p99 {p99}", flush=True)


if __name__ == "__main__":
    main()
