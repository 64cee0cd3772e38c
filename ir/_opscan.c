/* hcc.ir._opscan — every field of a plan's ops read into flat arrays in one pass.

   scan(ops, classes, code, ndeps, peer, tag, tree, sbuf, soff, scnt, dbuf, doff, dcnt, extra)
       -> bytes: every op's deps, concatenated, as int64

   ``ops`` is a list, ``classes`` the tuple (Send, Recv, RecvReduce, Copy, Reduce, Scale).
   Per op g: code[g] = the index of type(op) in ``classes`` (-1 for anything else, which the
   caller leaves to its Python path: subclasses, foreign objects); ndeps[g]; peer, tag, tree
   of the message ops (the first three classes; -1 otherwise); the source range (Send, Copy,
   Reduce) and the destination range (all but Send) as buffer code (0 in, 1 out, 2 tmp, 3 any
   other name, -1 none), offset and count; extra[g] = a Scale's divisor, 1 for a Copy with
   roundtrip set, else 0. Each op object is touched once, while it is in cache: reading the
   same fields with one Python pass per field missed the cache on every object (2 us per op
   on the 1024-rank samples). A field of the wrong type raises (TypeError, OverflowError,
   AttributeError); the callers then take their Python path, which reports it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

static PyObject *s_deps, *s_peer, *s_tag, *s_tree, *s_src, *s_dst, *s_count, *s_offset, *s_buf, *s_divisor,
    *s_roundtrip;

static int64_t get_int(PyObject *o, PyObject *name, int *err) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) {
        *err = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *err = 1;
    return (int64_t)x;
}

/* a ChunkRef's (buffer code, offset, count) */
static void get_ref(PyObject *op, PyObject *name, int8_t *buf, int64_t *off, int64_t *cnt, int *err) {
    PyObject *ref = PyObject_GetAttr(op, name);
    if (!ref) {
        *err = 1;
        return;
    }
    PyObject *b = PyObject_GetAttr(ref, s_buf);
    if (!b) {
        *err = 1;
    } else {
        *buf = 3;
        if (PyUnicode_Check(b)) {
            if (PyUnicode_CompareWithASCIIString(b, "in") == 0) *buf = 0;
            else if (PyUnicode_CompareWithASCIIString(b, "out") == 0) *buf = 1;
            else if (PyUnicode_CompareWithASCIIString(b, "tmp") == 0) *buf = 2;
        }
        Py_DECREF(b);
        *off = get_int(ref, s_offset, err);
        *cnt = get_int(ref, s_count, err);
    }
    Py_DECREF(ref);
}

#define NOUT 12

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *ops, *classes;
    Py_buffer b[NOUT];
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "O!O!w*w*w*w*w*w*w*w*w*w*w*w*", &PyList_Type, &ops, &PyTuple_Type, &classes, &b[0],
                          &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11]))
        return NULL;
    int8_t *code = b[0].buf;
    int64_t *ndeps = b[1].buf, *peer = b[2].buf, *tag = b[3].buf, *tree = b[4].buf;
    int8_t *sbuf = b[5].buf;
    int64_t *soff = b[6].buf, *scnt = b[7].buf;
    int8_t *dbuf = b[8].buf;
    int64_t *doff = b[9].buf, *dcnt = b[10].buf, *extra = b[11].buf;
    Py_ssize_t total = PyList_GET_SIZE(ops), ncls = PyTuple_GET_SIZE(classes);
    Py_ssize_t dcap = total + 16, dn = 0;
    int64_t *flat = malloc((size_t)dcap * sizeof(int64_t));
    PyObject *result = NULL;
    int err = 0;
    for (int i = 0; i < NOUT; i++) {
        Py_ssize_t item = (i == 0 || i == 5 || i == 8) ? 1 : 8;
        if (b[i].len < total * item) {
            PyErr_SetString(PyExc_ValueError, "an output array is shorter than the ops");
            goto out;
        }
    }
    if (!flat) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t g = 0; g < total && !err; g++) {
        PyObject *op = PyList_GET_ITEM(ops, g);
        int k = -1;
        for (Py_ssize_t c = 0; c < ncls; c++)
            if ((PyObject *)Py_TYPE(op) == PyTuple_GET_ITEM(classes, c)) {
                k = (int)c;
                break;
            }
        code[g] = (int8_t)k;
        ndeps[g] = 0;
        peer[g] = tag[g] = tree[g] = -1;
        sbuf[g] = dbuf[g] = -1;
        soff[g] = scnt[g] = doff[g] = dcnt[g] = 0;
        extra[g] = 0;
        if (k < 0) continue;
        PyObject *deps = PyObject_GetAttr(op, s_deps);
        if (!deps) {
            err = 1;
            break;
        }
        PyObject *fast = PySequence_Fast(deps, "deps must be a sequence");
        Py_DECREF(deps);
        if (!fast) {
            err = 1;
            break;
        }
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(fast);
        if (dn + nd > dcap) {
            Py_ssize_t nc = (dn + nd) * 2;
            int64_t *nf = realloc(flat, (size_t)nc * sizeof(int64_t));
            if (!nf) {
                Py_DECREF(fast);
                PyErr_NoMemory();
                err = 1;
                break;
            }
            flat = nf;
            dcap = nc;
        }
        for (Py_ssize_t i = 0; i < nd; i++) {
            PyObject *d = PySequence_Fast_GET_ITEM(fast, i);
            if (!PyLong_Check(d)) { /* the Python checker names the op */
                PyErr_SetString(PyExc_TypeError, "a dependency that is not an int");
                err = 1;
                break;
            }
            long long x = PyLong_AsLongLong(d);
            if (x == -1 && PyErr_Occurred()) {
                err = 1;
                break;
            }
            flat[dn++] = (int64_t)x;
        }
        Py_DECREF(fast);
        ndeps[g] = nd;
        if (err) break;
        if (k < 3) {
            peer[g] = get_int(op, s_peer, &err);
            tag[g] = get_int(op, s_tag, &err);
            tree[g] = get_int(op, s_tree, &err);
        }
        if (k == 0 || k == 3 || k == 4) get_ref(op, s_src, &sbuf[g], &soff[g], &scnt[g], &err);
        if (k != 0) get_ref(op, s_dst, &dbuf[g], &doff[g], &dcnt[g], &err);
        if (k == 5) extra[g] = get_int(op, s_divisor, &err);
        if (k == 3) {
            PyObject *rt = PyObject_GetAttr(op, s_roundtrip);
            if (!rt) {
                PyErr_Clear(); /* an op without the field: not a round trip */
            } else {
                int truth = PyObject_IsTrue(rt);
                Py_DECREF(rt);
                if (truth < 0) err = 1;
                extra[g] = truth > 0;
            }
        }
    }
    if (!err) result = PyBytes_FromStringAndSize((const char *)flat, (Py_ssize_t)(dn * sizeof(int64_t)));
out:
    free(flat);
    for (int i = 0; i < NOUT; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "every field of a plan's ops as flat arrays (ir/opscan.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.ir._opscan",
                                       "a plan's op fields as flat arrays (ir/opscan.py)", -1, methods};

PyMODINIT_FUNC PyInit__opscan(void) {
    s_deps = PyUnicode_InternFromString("deps");
    s_peer = PyUnicode_InternFromString("peer");
    s_tag = PyUnicode_InternFromString("tag");
    s_tree = PyUnicode_InternFromString("tree");
    s_src = PyUnicode_InternFromString("src");
    s_dst = PyUnicode_InternFromString("dst");
    s_count = PyUnicode_InternFromString("count");
    s_offset = PyUnicode_InternFromString("offset");
    s_buf = PyUnicode_InternFromString("buf");
    s_divisor = PyUnicode_InternFromString("divisor");
    s_roundtrip = PyUnicode_InternFromString("roundtrip");
    return PyModule_Create(&moduledef);
}
