"""The name Triton Python models import: the worker puts this folder first on sys.path.

Everything is ge_serve.backends.python.child.pb_utils, under the name models know.
"""

from ge_serve.backends.python.child.pb_utils import *  # noqa: F403
from ge_serve.backends.python.child.pb_utils import __all__ as __all__
