#!/usr/bin/env python3
"""Memory per idle keep-alive connection of a proxy that is already running,
e.g. a forward proxy you started by hand. The benchmark suite's `idle`
scenario (`bench/run idle`, run_idle in bench.py) does the same against
Portico, nginx, Varnish and Squid as reverse proxies, side by side.

usage: bench/idle.py PORT PID COUNT [URL]

Opens COUNT connections to 127.0.0.1:PORT. With URL, each connection first
sends one keep-alive request through the proxy (absolute-form, so the proxy
must be a forward proxy) and reads the response head; without URL the
connections send nothing. Then it reports the proxy's RSS growth divided by
COUNT. Loopback only; raise `ulimit -n` above COUNT first. Portico keeps
at most `keepalive.max_connections` idle connections (sized from the
open-files limit: 7,476 for a limit of 20,000) and closes the oldest beyond
it, so set it above COUNT for the URL variant.
"""
import socket
import sys
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise SystemExit(f"no VmRSS for pid {pid}")


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    port, pid, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    url = sys.argv[4] if len(sys.argv) > 4 else None
    base = rss_kib(pid)
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    if url:
        req = f"GET {url} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
        for c in conns:
            c.sendall(req)
        for c in conns:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = c.recv(65536)
                if not chunk:
                    raise SystemExit("connection closed before a response")
                data += chunk
    time.sleep(1.5)
    after = rss_kib(pid)
    mode = "after one request" if url else "before any request"
    print(f"{count} idle connections ({mode}): RSS {base} -> {after} KiB, "
          f"{(after - base) / count:.2f} KiB per connection")


if __name__ == "__main__":
    main()
