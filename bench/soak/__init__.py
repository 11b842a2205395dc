"""Soak test: a real ge-serve under mixed valid and invalid traffic, with hot reloads.

    python -m bench run soak                   # 10 minutes, 32 HTTP + 32 gRPC clients
    python -m bench run soak --minutes 0.5 --out OUT      # OUT.md and OUT.json

It copies `simple` and `simple_string` from examples/models into a temporary
repository and starts `python -m ge_serve.server.cli` on free loopback ports in explicit
model-control mode (everything loaded at startup), so `POST /v2/repository/models/simple/load`
reloads `simple` in place: the server builds new versions and swaps them in while the old ones
keep serving. It stops the server by its PID at the end.

What runs (one asyncio loop, so the load generator costs little on a small machine):

- HTTP clients (httpx, one keep-alive connection each) and gRPC clients (grpc.aio, one
  channel and connection each: a local subchannel pool, since grpc otherwise shares one
  connection among a process's channels to a target). Each sends one request, waits a
  random think time (uniform in [0, 2 * --think-ms]) and sends the next. The HTTP clients
  share one TLS context: unused on plain HTTP, but building one per client (loading the CA
  bundle) is slow enough to hold the loop up while the clients start.
- Most requests are valid infers (`simple`: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 -
  INPUT1, int32 [batch, 16]; a few on `simple_string`, the same sums as decimal strings), in
  JSON and binary over HTTP and raw and typed contents over gRPC. Every answer is checked
  value for value. A valid request that fails for any reason (status, transport, timeout,
  wrong output) is a *failed valid request*.
- A fraction (`--invalid-fraction`) are drawn from a fixed catalogue of invalid requests
  (`http_invalid_cases`, `grpc_invalid_cases`). Over HTTP a 4xx answer, over gRPC
  INVALID_ARGUMENT or NOT_FOUND, is an *expected error*; a 5xx or INTERNAL / UNKNOWN is a
  *server error* and counts as a failure; anything else (a 200, UNAVAILABLE, a dropped
  connection) is an *unexpected status*, reported but not failed. Invalid and valid requests
  share each client's connection, so a server that mishandles a connection after a bad
  request shows up as failed valid requests.
- A reloader loads `simple` again every `--reload-every` seconds (30, or a quarter of the run
  when that is shorter); a reload that is not a 200 counts as a failure.
- A sampler reads the server's RSS (psutil, the process and any children) every
  `--rss-every` seconds. Start and end RSS are medians over a window (a twentieth of the
  run, 20 s at most, two samples at least): the start window opens after a warm-up of 20 s
  or a tenth of the run, whichever is shorter; the end window closes at the last sample.
  The medians keep one sample taken during a reload or a GC pause from deciding the verdict.

Latencies are measured in the client process around each valid request, so on a loaded
machine they include the load generator's own queueing. Besides p50 / p99 / max, the report
has the worst window's p99 and the longest time without any valid answer per protocol (the
JSON has every window, with how many clients got an answer in it, and each reload's time):
a stall that holds every client at once stands out there from a machine that is merely
slow. It also gives the CPU seconds the load generator and the server used.

The exit status is 1 when a valid request failed, an invalid one got a server error, a
reload failed or RSS grew more than `--max-rss-growth` per cent; 2 when the server did not
start; else 0.

Its parts: `calls` (the valid requests and the checks of their answers), `invalid` (the
catalogue of invalid requests), `outcomes` (what the clients record), `report` (the
summary, the verdict and the markdown), `traffic` (the server and the load) and `cli`.
"""

from .cli import main

__all__ = ["main"]
