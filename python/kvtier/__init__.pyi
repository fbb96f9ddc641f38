from ._kvtier import *
