"""The generative text backend (`backend: "llm"`): a decoder-only model served by
ge-serve's own generation engine. See docs/generation.md.

The backend loads what one model version needs (its settings, tokenizer, KV block pool
and step graph); the scheduler (scheduler/generation.py) owns the iteration loop that
drives them. Nothing here knows asyncio, the scheduler or the server.
"""
