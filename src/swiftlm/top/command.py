"""``swiftlm top [--url URL] [--api-key KEY] [--once]``: the live view, refreshed every second."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live

from swiftlm.top.scrape import TopError, fetch, metrics_url
from swiftlm.top.view import frame
from swiftlm.top.window import Window


def add_top_parser(sub: Any) -> None:
    p = sub.add_parser("top", help="a live terminal view of a running server (reads its /metrics)")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default: http://127.0.0.1:8000)")
    p.add_argument("--api-key", help="bearer token, for a proxy that guards /metrics (default: $SWIFTLM_API_KEY)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh period (default: 1)")
    p.add_argument("--once", action="store_true", help="print one frame (two scrapes --interval apart) and exit")
    p.set_defaults(func=run_top)


def run_top(args: argparse.Namespace, console: Console | None = None) -> int:
    """Exit status 0, or 1 with one ``error: ...`` line when the server cannot be watched."""
    if args.interval <= 0:
        print(f"error: --interval must be > 0 seconds, got {args.interval}", file=sys.stderr)
        return 2
    console = console or Console()
    api_key = args.api_key or os.environ.get("SWIFTLM_API_KEY") or None
    url = metrics_url(args.url)
    window = Window()
    with httpx.Client() as client:
        try:
            figures = window.add(fetch(url, api_key, client=client))
        except TopError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if args.once:
            time.sleep(args.interval)
            try:
                figures = window.add(fetch(url, api_key, client=client))
            except TopError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            console.print(frame(url, figures))
            return 0
        try:
            with Live(frame(url, figures), console=console, auto_refresh=False, screen=False) as live:
                while True:
                    time.sleep(args.interval)
                    try:
                        figures, problem = window.add(fetch(url, api_key, client=client)), None
                    except TopError as exc:
                        problem = str(exc)
                    live.update(frame(url, figures, problem), refresh=True)
        except KeyboardInterrupt:
            return 0
