# SPDX-License-Identifier: Apache-2.0
"""`ltp exporter`: serve the loaded LTP programs' counters and round
statistics to Prometheus (dataplane/xdp/metrics.py reads the maps at each
scrape; this module binds, serves and stops). See docs/operations.md.

  ltp exporter [--port 9435] [--listen ADDR] [--netns NS] [-v] [-j]
"""
from __future__ import annotations

import ipaddress
import signal
import sys
import threading

from .common import (LtpError, UsageError, add_json, add_verbose, emit, need_root,
                     setup_logging)
from .flags import add_netns
from .opviews import add_parser, guard, listed_ns

DEFAULT_PORT = 9435

EPILOG = f"""examples:
  sudo ltp exporter                         http://127.0.0.1:{DEFAULT_PORT}/metrics
  sudo ltp exporter --port 9500 --netns ltp-default-ps
  sudo ltp exporter --listen 0.0.0.0        every interface (mind who can reach it)
  curl -s localhost:{DEFAULT_PORT}/metrics | grep ltp_flow_packets_total

Binds 127.0.0.1 unless --listen says otherwise: the counters name hosts,
jobs and workers. Each scrape reads what `ltp status` lists, at that moment
(no polling in between): every XDP counter and drop class
(ltp_xdp_packets_total{{class}}), per flow the `ltp flows -j` counters
(ltp_flow_<key>_total{{worker,slot}}), rounds closed by reason (early =
Early Close), delivered ratios and a round-time histogram
(ltp_flow_round_seconds). --port 0 takes a free port and prints it.
Runs until Ctrl-C or SIGTERM; -j prints the address as JSON.
"""


def register(sub) -> None:
    p = add_parser(sub, "exporter", "serve LTP counters and round statistics to Prometheus",
                   EPILOG)
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"HTTP port (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--listen", default="127.0.0.1", metavar="ADDR",
                   help="address to bind (default 127.0.0.1: this machine only; "
                   "0.0.0.0 or :: for every interface)")
    add_netns(p, "filter")
    add_verbose(p)
    add_json(p)
    p.set_defaults(func=guard(cmd_exporter))


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        raise UsageError(f"--listen: {text!r} is not an IP address (e.g. 127.0.0.1, "
                         "0.0.0.0, ::1)") from None


def cmd_exporter(args) -> None:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port: must be in 0..65535, got {args.port}")
    addr = _address(args.listen)
    ns = listed_ns(args.netns)
    need_root("ltp exporter")
    setup_logging(args.verbose, "exporter")
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise LtpError("prometheus_client is not importable: scripts/setup.sh installs it "
                       "(pip install prometheus_client in the venv)") from None
    from ..dataplane.xdp.metrics import LtpCollector
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LtpCollector(ns))
    try:
        httpd, thread = start_http_server(args.port, addr, registry=reg)
    except OSError as e:
        raise LtpError(f"cannot serve on {addr} port {args.port}: {e.strerror or e}"
                       + ("; another exporter? --port picks another" if
                          e.errno == 98 else "")) from None
    port = httpd.server_port
    host = f"[{addr}]" if ":" in addr else addr
    url = f"http://{host}:{port}/metrics"
    emit(args, {"listening": url, "address": addr, "port": port},
         f"serving {url} (Ctrl-C stops)")
    sys.stdout.flush()
    _serve_until_signal(httpd, thread)


def _serve_until_signal(httpd, thread: threading.Thread) -> None:
    """Wait for SIGINT or SIGTERM, then stop serving and close the socket
    (a scrape in progress finishes first)."""
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            if not thread.is_alive():
                raise LtpError("the HTTP server stopped unexpectedly")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
