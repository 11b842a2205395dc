"""Front-end worker processes: protocol work on every core, one scheduler per model.

With `--grpc-workers N` (or `--http-workers N`), N processes accept that protocol's
connections and do its decoding and encoding; each hands the decoded requests to the
server process over the process link (ge_serve.link: a Unix socket, typed messages,
tensors in shared memory), where `InferenceServer.infer` runs them as it runs its own.

- `pool`: the server's side: starts, serves and restarts the workers (pool.py);
- `passon`: the server's side of HTTP requests a worker passes on whole;
- `remote`: the worker's side: its way into the server's core (`RemoteCore`);
- `messages` and `codec`: what travels, and requests and responses to and from it.
"""
