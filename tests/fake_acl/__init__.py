"""A strict fake of pyACL and of CANN's `atc`, for testing the real ACL shim without an NPU."""

from .core import FakeAcl, build_module

__all__ = ["FakeAcl", "build_module"]
