from s4fs import *  # noqa
