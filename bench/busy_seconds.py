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

Usage: bench/busy_seconds.py PORTICO_BIN PEER... [--runs 1,1,1,5] [--connections N] [--offcpu]
  e.g. bench/busy_seconds.py target/release/portico portico nginx nginx-tput
  --connections 64: the `hits` scenario the same way (default 1,000: `busy`)
  --offcpu: records the scheduler's switches (`perf record -e
    sched:sched_switch -a -g`, as root) during each peer's first run and
    prints how long the proxy's threads were off a CPU, and the waits of a
    millisecond or more by kernel stack: what a thread slept on while its
    connections waited (bench/README.md, "The first second: the descriptor
    table grown while serving")
Not a benchmark: no checks, no medians; bench/run gives figures to quote.
"""

import os
import re
import subprocess
import sys
import time

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
    offcpu = "--offcpu" in args
    if offcpu:
        args.remove("--offcpu")
    if len(args) < 2:
        sys.exit(__doc__)
    binary, peers = args[0], args[1:]
    with b.objects_and_origin("portico-bench-seconds-") as (tmp, paths):
        script = b.write_wrk_scripts(tmp, paths)["busy"]
        for peer in peers:
            with b.running_peer(peer, tmp, binary) as daemon:
                port = b.PORTS[peer]
                b.warm_hits(port, paths)
                print(peer, flush=True)
                for run, seconds in enumerate(runs):
                    record = None
                    if offcpu and run == 0:
                        data = os.path.join(tmp, f"offcpu-{peer}.data")
                        record = subprocess.Popen(
                            ["perf", "record", "-q", "-e", "sched:sched_switch", "-a", "-g",
                             "-o", data, "--", "sleep", str(seconds + 0.2)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        time.sleep(0.1)
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
                    if record:
                        record.wait()
                        print_offcpu(data, daemon.pid)


def print_offcpu(data, pgid):
    """Off-CPU time of the threads of process group `pgid` in a `perf record
    -e sched:sched_switch -a -g` file: a thread is off from the switch that
    takes it off its CPU to the one that puts it back."""
    pids = set(subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True,
                              text=True).stdout.split()) | {str(pgid)}
    text = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,time,trace,ip,sym"],
                          capture_output=True, text=True).stdout
    left, total, waits = {}, 0.0, {}
    for event in text.split("\n\n"):
        lines = event.strip().splitlines()
        m = lines and re.match(r"\s*(\d+)/(\d+)\s+([\d.]+):.*prev_state=(\S+) ==> "
                               r"next_comm=.* next_pid=(\d+)", lines[0])
        if not m:
            continue
        pid, tid, t, state, next_tid = m.group(1), m.group(2), float(m.group(3)), m.group(4), m.group(5)
        if next_tid in left:
            off, why = t - left[next_tid][0], left.pop(next_tid)[1]
            total += off
            if off >= 0.001:
                n, sum_ = waits.get(why, (0, 0.0))
                waits[why] = (n + 1, sum_ + off)
        if pid in pids:
            frames = [f.split(None, 1)[-1] for f in lines[1:]]
            frames = [f for f in frames if not f.startswith(("__schedule", "schedule", "[unknown]"))]
            left[tid] = (t, f"{state} " + " < ".join(frames[:5]))
    print(f"  off a CPU: {total * 1000:.1f} ms over the proxy's threads; waits of 1 ms or more:")
    for why, (n, sum_) in sorted(waits.items(), key=lambda w: -w[1][1])[:8]:
        print(f"    {sum_ * 1000:7.1f} ms in {n:3d}: {why[:150]}")


if __name__ == "__main__":
    main()
