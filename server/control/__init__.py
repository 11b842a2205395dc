"""The control APIs: repository load and unload, log settings, shared-memory regions, endpoint
restrictions, and how a stopping server drains its front ends.
"""
