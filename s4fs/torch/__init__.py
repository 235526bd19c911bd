"""s4fs.torch — torch files stored without being written out as one byte stream.

``layout`` (the zip records torch writes: the writer here and the stream parser read and
patch the same fields), ``save`` (``s4fs.save`` / ``s4fs.async_save``) and ``load``
(``s4fs.load``, onto the GPU). Imports of the real ``torch`` in this package are
absolute: this package never shadows it.
"""

from s4fs.errors import S4Error


class Unsupported(S4Error):
    """This object or call cannot take the direct path; the caller streams instead."""
