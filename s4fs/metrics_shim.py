"""``s4fs.metrics`` when the service layer is installed, else no-ops."""

try:
    from s4fs.metrics import (observe_error, observe_load, observe_save,  # noqa: F401
                              uploads_finished, uploads_started)
except ImportError:
    from s4fs._nometrics import (observe_error, observe_load, observe_save,  # noqa: F401
                                 uploads_finished, uploads_started)
