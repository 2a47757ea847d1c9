"""`masa serve --config device.yaml`: the device daemon's command.

Registering the parser imports nothing heavy (`masa --help` stays lean); the
handler imports the service (ONNX Runtime, aiohttp) when it runs. A bad
config is refused with every problem and its path (exit 2); after SIGTERM or
SIGINT the daemon stops cleanly and exits 0.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from masa.common.errors import RunFailed
from masa.common.units import format_bytes

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve", help="run the device daemon (HTTP API, journal, metrics)",
        description="Take jobs over HTTP, schedule their networks under the memory budget, "
                    "journal every accepted job (a restart resumes the unfinished ones) and "
                    "serve Prometheus metrics (docs/serve.md). Load plugin code that the "
                    "config's graphs name with `masa --plugin FILE.py serve ...`.")
    serve.add_argument("--config", required=True, type=Path, help="the device config YAML")
    serve.add_argument("--check", action="store_true",
                       help="validate the config and the store, print the settings, exit")
    serve.set_defaults(handler=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    from masa.serve.config import load_config

    config = load_config(args.config)
    if args.check:
        print(f"{config.source}: ok: {len(config.graphs)} graph(s) "
              f"({', '.join(config.graphs)}), {len(config.manifests)} network(s), "
              f"listen {config.url}, journal {config.journal}")
        return 0
    from masa.serve.api import serve
    from masa.serve.service import Service

    service = Service(config)
    log.info("memory budget %s (%s), %d worker(s), policy %s, context %s",
             format_bytes(service.budget_bytes), service.budget_how, config.workers,
             config.policy, config.context)
    resumed = service.start()
    if resumed:
        log.info("%d job(s) from the journal resumed", resumed)
    try:
        return serve(service)
    except OSError as error:
        raise RunFailed(str(error)) from None
