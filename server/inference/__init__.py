"""The request path: the core (InferenceServer), tensor types and checks, the wire layout, Triton's
error texts, the response cache, BLS and request-level support.
"""
