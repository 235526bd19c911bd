/* Byte-plane split and merge for the CPU codec, in C, without the GIL.
 *
 * Exact twins of the NumPy reference in codec/_planes.py (tests compare the two on
 * every layout and adversarial input). Every function takes a source buffer and a
 * writable destination buffer of the right size and returns None:
 *
 *   split_sm(src, dst, unit)        FLOAT_SM: unit 2 (bf16) or 4 (fp32, complex64)
 *   merge_sm(planes, dst, unit)
 *   split_bytes(src, dst, unit)     BYTES: plane k holds byte k of every element
 *   merge_bytes(planes, dst, unit)
 *   split_sign_bytes(src, dst, unit)  SIGN_BYTES: packed signs, then bytes unit-1..0
 *   merge_sign_bytes(planes, dst, unit)
 *   zero_runs(src, dst, min_run) -> count   the long runs of zero bytes (zstd's parse)
 *
 * ``src``/``dst`` hold n whole elements (n * unit bytes; the caller handles a tail).
 * Split writes its planes back to back into ``dst`` in the order the layout defines;
 * merge takes a sequence of plane buffers in that order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_UNIT 16

static int get_bufs(PyObject *src, PyObject *dst, Py_buffer *s, Py_buffer *d) {
    if (PyObject_GetBuffer(src, s, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(dst, d, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(s);
        return -1;
    }
    return 0;
}

static int check_unit(Py_ssize_t unit, Py_ssize_t len) {
    if (unit < 1 || unit > MAX_UNIT || len % unit) {
        PyErr_Format(PyExc_ValueError, "bad unit %zd for %zd bytes", unit, len);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- FLOAT_SM */

static void split_sm_2(const uint8_t *s, uint8_t *d, Py_ssize_t n) {
    uint8_t *exp = d, *sm = d + n;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t w = (uint16_t)s[2 * i] | ((uint16_t)s[2 * i + 1] << 8);
        exp[i] = (uint8_t)(w >> 7);
        sm[i] = (uint8_t)((w & 0x7F) | ((w >> 8) & 0x80));
    }
}

static void split_sm_4(const uint8_t *s, uint8_t *d, Py_ssize_t n) {
    uint8_t *exp = d, *sm = d + n, *p1 = d + 2 * n, *p0 = d + 3 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *w = s + 4 * i;
        uint8_t hi = w[3], nxt = w[2];
        exp[i] = (uint8_t)((hi << 1) | (nxt >> 7));
        sm[i] = (uint8_t)((nxt & 0x7F) | (hi & 0x80));
        p1[i] = w[1];
        p0[i] = w[0];
    }
}

static PyObject *py_split_sm(PyObject *self, PyObject *args) {
    PyObject *src, *dst;
    Py_ssize_t unit;
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "OOn", &src, &dst, &unit))
        return NULL;
    if (get_bufs(src, dst, &s, &d) < 0)
        return NULL;
    if ((unit != 2 && unit != 4) || check_unit(unit, s.len) < 0 || d.len != s.len) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "split_sm: unit must be 2 or 4, dst as src");
        PyBuffer_Release(&s);
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_ssize_t n = s.len / unit;
    Py_BEGIN_ALLOW_THREADS
    if (unit == 2)
        split_sm_2(s.buf, d.buf, n);
    else
        split_sm_4(s.buf, d.buf, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

/* Planes arrive as a sequence of buffers; each must hold at least ``need`` bytes. */
static int get_planes(PyObject *seq, Py_buffer *bufs, Py_ssize_t count, const Py_ssize_t *need) {
    PyObject *fast = PySequence_Fast(seq, "planes must be a sequence");
    if (!fast)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) < count) {
        PyErr_Format(PyExc_ValueError, "need %zd planes", count);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, k), &bufs[k], PyBUF_SIMPLE) < 0 ||
            bufs[k].len < need[k]) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "plane %zd is shorter than %zd bytes", k, need[k]);
            else
                k--;
            for (Py_ssize_t j = 0; j <= k; j++)
                PyBuffer_Release(&bufs[j]);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static void release_planes(Py_buffer *bufs, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++)
        PyBuffer_Release(&bufs[k]);
}

static PyObject *py_merge_sm(PyObject *self, PyObject *args) {
    PyObject *seq, *dst;
    Py_ssize_t unit;
    Py_buffer d, p[MAX_UNIT];
    Py_ssize_t need[MAX_UNIT];
    if (!PyArg_ParseTuple(args, "OOn", &seq, &dst, &unit))
        return NULL;
    if (unit != 2 && unit != 4) {
        PyErr_SetString(PyExc_ValueError, "merge_sm: unit must be 2 or 4");
        return NULL;
    }
    if (PyObject_GetBuffer(dst, &d, PyBUF_WRITABLE) < 0)
        return NULL;
    if (check_unit(unit, d.len) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_ssize_t n = d.len / unit;
    for (Py_ssize_t k = 0; k < unit; k++)
        need[k] = n;
    if (get_planes(seq, p, unit, need) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    uint8_t *o = d.buf;
    const uint8_t *exp = p[0].buf, *sm = p[1].buf;
    Py_BEGIN_ALLOW_THREADS
    if (unit == 2) {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t w = (uint16_t)((uint16_t)exp[i] << 7) | ((uint16_t)(sm[i] & 0x80) << 8) |
                         (uint16_t)(sm[i] & 0x7F);
            o[2 * i] = (uint8_t)w;
            o[2 * i + 1] = (uint8_t)(w >> 8);
        }
    } else {
        const uint8_t *p1 = p[2].buf, *p0 = p[3].buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint8_t *w = o + 4 * i;
            w[3] = (uint8_t)((exp[i] >> 1) | (sm[i] & 0x80));
            w[2] = (uint8_t)((exp[i] << 7) | (sm[i] & 0x7F));
            w[1] = p1[i];
            w[0] = p0[i];
        }
    }
    Py_END_ALLOW_THREADS
    release_planes(p, unit);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- BYTES */

/* The byte planes of 2-, 4- and 8-byte elements (bf16/fp16 and fp32 words, pairs' residuals):
 * a loop the compiler unrolls and vectorizes, where the general one moves a byte at a time
 * (fp32: 1.5 GB/s). Byte k of an element is byte k of its memory, whatever the machine's
 * byte order, as in the general loop. */
static void split_fixed2(const uint8_t *in, uint8_t *out, Py_ssize_t n) {
    uint8_t *o0 = out, *o1 = out + n;
    for (Py_ssize_t i = 0; i < n; i++) {
        o0[i] = in[2 * i];
        o1[i] = in[2 * i + 1];
    }
}

static void split_fixed4(const uint8_t *in, uint8_t *out, Py_ssize_t n) {
    uint8_t *o0 = out, *o1 = out + n, *o2 = out + 2 * n, *o3 = out + 3 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        o0[i] = in[4 * i];
        o1[i] = in[4 * i + 1];
        o2[i] = in[4 * i + 2];
        o3[i] = in[4 * i + 3];
    }
}

static void merge_fixed2(const uint8_t **src, uint8_t *out, Py_ssize_t n) {
    const uint8_t *s0 = src[0], *s1 = src[1];
    for (Py_ssize_t i = 0; i < n; i++) {
        out[2 * i] = s0[i];
        out[2 * i + 1] = s1[i];
    }
}

static void merge_fixed4(const uint8_t **src, uint8_t *out, Py_ssize_t n) {
    const uint8_t *s0 = src[0], *s1 = src[1], *s2 = src[2], *s3 = src[3];
    for (Py_ssize_t i = 0; i < n; i++) {
        out[4 * i] = s0[i];
        out[4 * i + 1] = s1[i];
        out[4 * i + 2] = s2[i];
        out[4 * i + 3] = s3[i];
    }
}

static void split_fixed8(const uint8_t *in, uint8_t *out, Py_ssize_t n) {
    uint8_t *o0 = out, *o1 = out + n, *o2 = out + 2 * n, *o3 = out + 3 * n,
            *o4 = out + 4 * n, *o5 = out + 5 * n, *o6 = out + 6 * n, *o7 = out + 7 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *e = in + 8 * i;
        o0[i] = e[0]; o1[i] = e[1]; o2[i] = e[2]; o3[i] = e[3];
        o4[i] = e[4]; o5[i] = e[5]; o6[i] = e[6]; o7[i] = e[7];
    }
}

static void merge_fixed8(const uint8_t **src, uint8_t *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        for (int k = 0; k < 8; k++)
            out[8 * i + k] = src[k][i];
}

static PyObject *py_split_bytes(PyObject *self, PyObject *args) {
    PyObject *src, *dst;
    Py_ssize_t unit;
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "OOn", &src, &dst, &unit))
        return NULL;
    if (get_bufs(src, dst, &s, &d) < 0)
        return NULL;
    if (check_unit(unit, s.len) < 0 || d.len != s.len) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "split_bytes: dst must be as long as src");
        PyBuffer_Release(&s);
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_ssize_t n = s.len / unit;
    const uint8_t *in = s.buf;
    uint8_t *out = d.buf;
    Py_BEGIN_ALLOW_THREADS
    if (unit == 2)
        split_fixed2(in, out, n);
    else if (unit == 4)
        split_fixed4(in, out, n);
    else if (unit == 8)
        split_fixed8(in, out, n);
    else
        for (Py_ssize_t i = 0; i < n; i++)
            for (Py_ssize_t k = 0; k < unit; k++)
                out[k * n + i] = in[i * unit + k];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

static PyObject *py_merge_bytes(PyObject *self, PyObject *args) {
    PyObject *seq, *dst;
    Py_ssize_t unit;
    Py_buffer d, p[MAX_UNIT];
    Py_ssize_t need[MAX_UNIT];
    if (!PyArg_ParseTuple(args, "OOn", &seq, &dst, &unit))
        return NULL;
    if (PyObject_GetBuffer(dst, &d, PyBUF_WRITABLE) < 0)
        return NULL;
    if (check_unit(unit, d.len) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_ssize_t n = d.len / unit;
    for (Py_ssize_t k = 0; k < unit; k++)
        need[k] = n;
    if (get_planes(seq, p, unit, need) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    uint8_t *out = d.buf;
    const uint8_t *src[MAX_UNIT];
    for (Py_ssize_t k = 0; k < unit; k++)
        src[k] = p[k].buf;
    Py_BEGIN_ALLOW_THREADS
    if (unit == 2)
        merge_fixed2(src, out, n);
    else if (unit == 4)
        merge_fixed4(src, out, n);
    else if (unit == 8)
        merge_fixed8(src, out, n);
    else
        for (Py_ssize_t i = 0; i < n; i++)
            for (Py_ssize_t k = 0; k < unit; k++)
                out[i * unit + k] = src[k][i];
    Py_END_ALLOW_THREADS
    release_planes(p, unit);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- SIGN_BYTES */

/* sign_bits[b][j]: 0x80 where bit j of the packed sign byte b is set (little bit order) */
static uint8_t sign_bits[256][8];

static void init_sign_bits(void) {
    for (int b = 0; b < 256; b++)
        for (int j = 0; j < 8; j++)
            sign_bits[b][j] = (uint8_t)(((b >> j) & 1) << 7);
}

static PyObject *py_split_sign_bytes(PyObject *self, PyObject *args) {
    PyObject *src, *dst;
    Py_ssize_t unit;
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "OOn", &src, &dst, &unit))
        return NULL;
    if (get_bufs(src, dst, &s, &d) < 0)
        return NULL;
    Py_ssize_t n = unit > 0 ? s.len / unit : 0;
    if (check_unit(unit, s.len) < 0 || d.len != (n + 7) / 8 + s.len) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "split_sign_bytes: dst has the wrong size");
        PyBuffer_Release(&s);
        PyBuffer_Release(&d);
        return NULL;
    }
    const uint8_t *in = s.buf;
    uint8_t *sign = d.buf, *planes = (uint8_t *)d.buf + (n + 7) / 8;
    Py_BEGIN_ALLOW_THREADS
    memset(sign, 0, (size_t)((n + 7) / 8));
    Py_ssize_t i = 0;
    if (unit == 2) {              /* fp16: eight words per sign byte, in one pass */
        uint8_t *mag = planes, *low = planes + n;
        for (; i + 8 <= n; i += 8) {
            const uint8_t *w = in + 2 * i;
            unsigned bits = 0;
            for (int j = 0; j < 8; j++) {
                uint8_t hi = w[2 * j + 1];
                bits |= (unsigned)(hi >> 7) << j;
                mag[i + j] = hi & 0x7F;
                low[i + j] = w[2 * j];
            }
            sign[i >> 3] = (uint8_t)bits;
        }
    }
    for (; i < n; i++) {
        const uint8_t *w = in + i * unit;
        uint8_t hi = w[unit - 1];
        sign[i >> 3] |= (uint8_t)((hi >> 7) << (i & 7));
        planes[i] = hi & 0x7F;                               /* plane of byte unit-1 */
        for (Py_ssize_t k = unit - 2, j = 1; k >= 0; k--, j++)
            planes[j * n + i] = w[k];
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

static PyObject *py_merge_sign_bytes(PyObject *self, PyObject *args) {
    PyObject *seq, *dst;
    Py_ssize_t unit;
    Py_buffer d, p[MAX_UNIT + 1];
    Py_ssize_t need[MAX_UNIT + 1];
    if (!PyArg_ParseTuple(args, "OOn", &seq, &dst, &unit))
        return NULL;
    if (PyObject_GetBuffer(dst, &d, PyBUF_WRITABLE) < 0)
        return NULL;
    if (check_unit(unit, d.len) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_ssize_t n = d.len / unit;
    need[0] = (n + 7) / 8;
    for (Py_ssize_t k = 1; k <= unit; k++)
        need[k] = n;
    if (get_planes(seq, p, unit + 1, need) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    uint8_t *out = d.buf;
    const uint8_t *sign = p[0].buf;
    const uint8_t *src[MAX_UNIT + 1];
    for (Py_ssize_t k = 1; k <= unit; k++)
        src[k] = p[k].buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
    if (unit == 2) {              /* fp16: eight words per sign byte, a loop the compiler
                                     vectorizes (the sign bits come from a table) */
        const uint8_t *hi = src[1], *lo = src[2];
        for (; i + 8 <= n; i += 8) {
            const uint8_t *e = sign_bits[sign[i >> 3]];
            uint8_t *w = out + 2 * i;
            for (int j = 0; j < 8; j++) {
                w[2 * j] = lo[i + j];
                w[2 * j + 1] = (uint8_t)(hi[i + j] | e[j]);
            }
        }
    }
    for (; i < n; i++) {
        uint8_t *w = out + i * unit;
        w[unit - 1] = (uint8_t)((((sign[i >> 3] >> (i & 7)) & 1) << 7) | src[1][i]);
        for (Py_ssize_t k = unit - 2, j = 2; k >= 0; k--, j++)
            w[k] = src[j][i];
    }
    Py_END_ALLOW_THREADS
    release_planes(p, unit + 1);
    PyBuffer_Release(&d);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------- zero runs */

static inline uint64_t word_at(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The runs of at least min_run zero bytes in a[0:n] into out as (start, end) pairs;
 * returns how many. A run of 15 or more zeros holds a whole aligned 8-byte word, so for
 * such runs only the zero words are looked at byte by byte: a plane with few long runs
 * costs one pass over its words, whatever its short runs. */
static Py_ssize_t find_zero_runs(const uint8_t *a, Py_ssize_t n, Py_ssize_t min_run,
                                 int64_t *out) {
    Py_ssize_t count = 0;
    if (min_run >= 15) {
        Py_ssize_t words = n / 8, w = 0;
        while (w < words) {
            if (word_at(a + 8 * w)) {
                w++;
                continue;
            }
            Py_ssize_t start = 8 * w, end = 8 * w + 8;
            while (start > 0 && !a[start - 1])
                start--;
            while (end + 8 <= n && !word_at(a + end))
                end += 8;
            while (end < n && !a[end])
                end++;
            if (end - start >= min_run) {
                out[2 * count] = start;
                out[2 * count + 1] = end;
                count++;
            }
            w = end / 8 + 1;      /* the word holding a[end] is not all zeros */
        }
        return count;
    }
    Py_ssize_t i = 0;
    while (i < n) {
        while (i < n && a[i])
            i++;
        Py_ssize_t start = i;
        while (i < n && !a[i])
            i++;
        if (i > start && i - start >= min_run) {
            out[2 * count] = start;
            out[2 * count + 1] = i;
            count++;
        }
    }
    return count;
}

/* zero_runs(src, dst, min_run) -> count: the runs of zero bytes in src at least
 * min_run long, as (start, end) int64 pairs written into dst, which must have room for
 * every run there can be (len(src) // (min_run + 1) + 1 pairs). */
static PyObject *py_zero_runs(PyObject *self, PyObject *args) {
    PyObject *src, *dst;
    Py_ssize_t min_run;
    Py_buffer s, d;
    if (!PyArg_ParseTuple(args, "OOn", &src, &dst, &min_run))
        return NULL;
    if (min_run < 1) {
        PyErr_Format(PyExc_ValueError, "min_run must be at least 1, not %zd", min_run);
        return NULL;
    }
    if (get_bufs(src, dst, &s, &d) < 0)
        return NULL;
    Py_ssize_t n = s.len, cap = d.len / (Py_ssize_t)(2 * sizeof(int64_t));
    if (cap < n / (min_run + 1) + 1) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&d);
        PyErr_Format(PyExc_ValueError, "room for %zd runs, %zd bytes may hold %zd", cap,
                     n, n / (min_run + 1) + 1);
        return NULL;
    }
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS
    count = find_zero_runs(s.buf, n, min_run, d.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"split_sm", py_split_sm, METH_VARARGS, "FLOAT_SM split into dst"},
    {"merge_sm", py_merge_sm, METH_VARARGS, "FLOAT_SM merge into dst"},
    {"split_bytes", py_split_bytes, METH_VARARGS, "BYTES split into dst"},
    {"merge_bytes", py_merge_bytes, METH_VARARGS, "BYTES merge into dst"},
    {"split_sign_bytes", py_split_sign_bytes, METH_VARARGS, "SIGN_BYTES split into dst"},
    {"merge_sign_bytes", py_merge_sign_bytes, METH_VARARGS, "SIGN_BYTES merge into dst"},
    {"zero_runs", py_zero_runs, METH_VARARGS, "runs of zero bytes: (start, end) pairs"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shuffle",
    "Byte-plane split and merge for the CPU codec (GIL released).", -1, methods,
};

PyMODINIT_FUNC PyInit__shuffle(void) {
    init_sign_bits();
    return PyModule_Create(&module);
}
