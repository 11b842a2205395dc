"""Front-end worker processes: protocol work on every core, one scheduler per model.

With `--grpc-workers N` (or `--http-workers N`), N processes accept that protocol's
connections and do its decoding and encoding; each hands the decoded requests to the
server process over the process link (ge_serve.link: a Unix socket, typed messages,
tensors in shared memory), where `InferenceServer.infer` runs them as it runs its own.
Only inference crosses the link: a worker passes everything else on, as it came, to the
server's own front end of its protocol on a Unix socket only the server's user reaches
(server/http/passon.py, and the gRPC worker's forwarding handlers), so every other
answer is the server's own.

- `pool`: the server's side: starts, serves and restarts the workers (pool.py);
- `remote`: the worker's side: its way into the server's core (`RemoteCore`);
- `messages` and `codec`: what travels, and requests and responses to and from it;
- `loopback`: the Unix sockets the server's own front ends answer the workers on.
"""
