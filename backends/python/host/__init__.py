"""The Python backend's code that runs in the server process: the backend, each model
instance and its worker process as the server sees it, and what the worker asks of the
server (BLS, metrics, logging)."""
