"""The Python backend's code that runs in a model's worker process: the stub that runs
`model.py`, its side of the link (`runtime`), and `triton_python_backend_utils`
(`pb_*`, with `modules/` the folder put first on the worker's import path)."""
