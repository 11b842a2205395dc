"""The OpenAI-compatible API (`/v1/...`), served on the HTTP port beside KServe v2.

A thin adapter over the core, as the v2 routes are: each endpoint checks its JSON body
(schemas.py), finds the model it names among those /v1 can serve (catalog.py), turns the
request into the core's tensors and runs it through `InferenceServer.infer_responses`
(generation.py) or `infer` (embeddings.py), and encodes what comes back as OpenAI's
objects (chat.py, completions.py). Errors are OpenAI's error object (errors.py).

The routes are plain starlette routes added after the v2 ones, so the v2 inference path
(the shortcut in front of the route table, server/http/infer.py) never looks at them.
"""
