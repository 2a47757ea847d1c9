"""The OpenAPI 3 document of the daemon's HTTP API, served at `GET /openapi.json`.

Owns the API's description for clients and tools; masa.serve.api implements
it and tests/test_serve.py checks that every route here exists there.
"""

from __future__ import annotations

from typing import Any

from masa import __version__


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"}}}}


def _json(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{schema}"}}}}


_JOB_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
_TEXT = {"description": "ok", "content": {"text/plain": {"schema": {"type": "string"}}}}


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "masa serve", "version": __version__,
                 "description": "Memory-aware multi-DNN inference on a small device: submit "
                                "an image or tensors to a job graph, get each network's "
                                "results. Where a token is configured, send "
                                "`Authorization: Bearer TOKEN` (not needed for /healthz "
                                "and /readyz)."},
        "paths": {
            "/v1/jobs": {"post": {
                "summary": "Submit a job; answered once it is journaled",
                "parameters": [{"name": "graph", "in": "query", "required": True,
                                "schema": {"type": "string"}},
                               {"name": "wait", "in": "query",
                                "schema": {"type": "number", "maximum": 60},
                                "description": "seconds to wait for the job to end: 200 "
                                               "with the job when it ends in time, else "
                                               "202"}],
                "requestBody": {"required": True, "content": {
                    "image/jpeg": {}, "image/png": {}, "application/x-npy": {},
                    "application/x-npz": {},
                    "application/json": {"schema": {"$ref": "#/components/schemas/Inputs"}}}},
                "responses": {
                    "200": _json("with wait: the job, ended", "Job"),
                    "202": _json("accepted and journaled", "Accepted"),
                    "400": _error("undecodable input or unknown graph"),
                    "401": _error("missing or wrong token"),
                    "413": _error("body or decoded input over the size limit"),
                    "429": _error("queue full; see Retry-After"),
                    "503": _error("shutting down")}}},
            "/v1/jobs/{id}": {
                "get": {"summary": "A job's state, per-network status, timings, small outputs",
                        "parameters": [_JOB_ID, {"name": "wait", "in": "query",
                                                 "schema": {"type": "number", "maximum": 60},
                                                 "description": "long-poll: seconds to wait "
                                                                "for the job to end"},
                                       {"name": "while", "in": "query",
                                        "schema": {"type": "string"},
                                        "description": "with wait: wait only while the "
                                                       "job is in this state (queued: "
                                                       "until it starts running)"}],
                        "responses": {"200": _json("the job", "Job"),
                                      "404": _error("no such job")}},
                "delete": {"summary": "Cancel a job (running stages are stopped, memory "
                                      "returned)",
                           "parameters": [_JOB_ID],
                           "responses": {"202": _json("cancelling", "Accepted"),
                                         "404": _error("no such job"),
                                         "409": _error("the job had already ended")}}},
            "/v1/jobs/{id}/outputs.npz": {"get": {
                "summary": "Every output tensor of the job's finished networks, as "
                           "NETWORK/OUTPUT in one .npz",
                "parameters": [_JOB_ID],
                "responses": {"200": {"description": "the tensors", "content": {
                    "application/x-npz": {}}},
                    "404": _error("no such job, or no outputs"),
                    "409": _error("the job has not ended")}}},
            "/v1/graphs": {"get": {"summary": "The job graphs this device offers",
                                   "responses": {"200": {"description": "graphs"}}}},
            "/v1/networks": {"get": {"summary": "The prepared networks with stage counts "
                                                "and memory figures",
                                     "responses": {"200": {"description": "networks"}}}},
            "/v1/status": {"get": {"summary": "Budget, ledger, queue and scheduler state size",
                                   "parameters": [{"name": "wait", "in": "query",
                                                   "schema": {"type": "number", "maximum": 60},
                                                   "description": "seconds to wait until no "
                                                                  "accepted job is unfinished"}],
                                   "responses": {"200": {"description": "status"}}}},
            "/healthz": {"get": {"summary": "Live", "responses": {"200": _TEXT}}},
            "/readyz": {"get": {"summary": "Store readable, budget sane, journal writable",
                                "responses": {"200": {"description": "ready"},
                                              "503": {"description": "not ready"}}}},
            "/metrics": {"get": {"summary": "Prometheus text format", "responses": {
                "200": _TEXT}}},
            "/openapi.json": {"get": {"summary": "This document",
                                      "responses": {"200": {"description": "OpenAPI 3"}}}},
        },
        "components": {"schemas": _schemas()},
    }


def _schemas() -> dict[str, Any]:
    return {
            "Error": {"type": "object", "properties": {"error": {"type": "string"}}},
            "Accepted": {"type": "object", "properties": {
                "id": {"type": "integer"}, "state": {"type": "string"},
                "url": {"type": "string"}}},
            "Inputs": {"type": "object", "properties": {"inputs": {
                "type": "object", "additionalProperties": {
                    "description": "a nested list, or {data, dtype, shape}"}}}},
            "Job": {"type": "object", "properties": {
                "id": {"type": "integer"}, "graph": {"type": "string"},
                "state": {"type": "string",
                          "enum": ["queued", "running", "done", "failed", "cancelled"]},
                "attempts": {"type": "integer"},
                "accepted_at": {"type": "number"}, "started_at": {"type": "number"},
                "ended_at": {"type": "number"}, "response_ms": {"type": "number"},
                "networks": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {
                        "status": {"type": "string", "enum": [
                            "pending", "running", "done", "failed", "skipped", "aborted",
                            "cancelled"]},
                        "reason": {"type": "string"}, "error": {"type": "string"},
                        "load_ms": {"type": "number"}, "exec_ms": {"type": "number"},
                        "outputs": {"type": "object"}}}}}},
    }
