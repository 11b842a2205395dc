"""The Python backend (`backend: "python"`): Triton Python-backend models, unchanged.

Each instance of a model is a worker process (`stub`) that imports the user's `model.py`
and our `triton_python_backend_utils`, as Triton's stub does, so a crash, hang or
exception in model code stays in that model. The server side is an executor like any
other (`executor`): it hands the worker a batch as its requests and waits for their
responses. Tensors cross in shared memory (`shm`), control messages over a Unix socket
(`channel`); BLS calls and decoupled responses travel back over the same socket.
"""
