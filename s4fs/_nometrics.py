"""No-op stand-in for s4fs.metrics when it is unavailable."""


def observe_save(path, logical, stored, seconds): pass
def observe_load(path, nbytes, seconds): pass
def uploads_started(n=1): pass
def uploads_finished(n=1): pass
def observe_error(kind): pass
