"""`masa serve`: the device daemon, and `masa submit`, its client.

Modules, lowest first: `config` (the device config, every problem at once),
`inputs` (request bodies into arrays, per-network image preprocessing),
`journal` (the SQLite journal every accepted job is written to before its
202, request bodies in files beside it), `metrics` (Prometheus), `service`
(the live driver, jobs, results, crash-resume), `openapi` and `api` (the
aiohttp application), `cli` (the `serve` command) and `client` (the `submit`
command). docs/serve.md is the user's page.
"""
