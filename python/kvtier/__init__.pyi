from ._kvtier import *  # noqa: F401,F403
from ._kvtier import __version__ as __version__
