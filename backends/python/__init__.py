"""The Python backend (`backend: "python"`): Triton Python-backend models, unchanged.

Each instance of a model is a worker process (`child.stub`) that imports the user's
`model.py` and our `triton_python_backend_utils`, as Triton's stub does, so a crash, hang
or exception in model code stays in that model. The server side (`host/`) is an executor
like any other: it hands the worker a batch as its requests and waits for their
responses. Both sides speak over the process link (ge_serve.link, thread driver): tensors
in shared memory, the typed messages of `messages`; BLS calls and decoupled responses
travel back over the same socket.
"""
