/* The loader's per-utterance hot path in C: walking a shard's tar headers and reading a batch's
 * feature rows.  Both did the same few steps per utterance in Python, ~15 us of the loader's
 * ~40 us per utterance (see docs/loader.md, Performance).  Also two helpers Python cannot do
 * well: asking the kernel to read a whole shard ahead without holding the GIL, and taking the
 * loader's buffered per-utterance objects off the cyclic GC's books.
 *
 * This module only takes the plain case.  walk() returns None for anything it does not handle
 * (a bad checksum, truncation, pax records other than mtime, GNU long names, base-256 sizes,
 * names that are not UTF-8), and wdsprep/reader.py then walks the shard in Python, which reports
 * damage precisely and falls back to tarfile for the exotic.  So this file never has to word an
 * error about a shard, and the Python walk stays the reference the tests compare it with.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define BLOCK 512
#define MAX_PEEK (1 << 16)

/* pread until n bytes are read or the file ends: the bytes read, or -1 with errno set.
 * No Python API, so callers may run it without the GIL. */
static Py_ssize_t pread_full(int fd, void *dst, Py_ssize_t n, long long offset)
{
    Py_ssize_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, (char *)dst + done, (size_t)(n - done), (off_t)(offset + done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (got == 0)
            break;
        done += got;
    }
    return done;
}

typedef struct {
    int fd;                   /* >= 0: the shard is a file, read with pread */
    const unsigned char *mem; /* else: the whole shard in memory */
    long long size;
    unsigned char *window;    /* the fd case: the last bytes read ... */
    long long win_pos;        /* ... from this offset ... */
    Py_ssize_t win_len;       /* ... this many (fewer than asked at the end of the file) */
    Py_ssize_t win_cap;       /* room: two headers with their peeks */
} Source;

/* Bytes [pos, pos + want) of the shard, or NULL with an OSError set; *got is less than want
 * only at the end of the file.  A small member (a transcript) and the header after it usually
 * lie in the window already read with the previous header: one pread per sample, not two. */
static const unsigned char *fetch(Source *src, long long pos, Py_ssize_t want, Py_ssize_t *got)
{
    if (pos + want > src->size)
        want = (Py_ssize_t)(src->size - pos);
    if (src->fd < 0) {
        *got = want;
        return src->mem + pos;
    }
    if (pos >= src->win_pos && pos + want <= src->win_pos + src->win_len) {
        *got = want;
        return src->window + (pos - src->win_pos);
    }
    Py_ssize_t ask = src->win_cap;
    if (pos + ask > src->size)
        ask = (Py_ssize_t)(src->size - pos);
    Py_ssize_t done;
    Py_BEGIN_ALLOW_THREADS /* a cold shard: wait for the disk without blocking other threads */
    done = pread_full(src->fd, src->window, ask, pos); /* short: the file shrank */
    Py_END_ALLOW_THREADS
    if (done < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    src->win_pos = pos;
    src->win_len = done;
    *got = done < want ? done : want;
    return src->window;
}

/* An octal header field: digits with optional leading spaces and trailing spaces/NULs (what
 * Python's int(field.rstrip(b" \0"), 8) accepts from tar writers).  -1 when anything else. */
static long long octal(const unsigned char *p, int len)
{
    int i = 0;
    long long v = 0;
    while (i < len && p[i] == ' ')
        i++;
    while (i < len && p[i] >= '0' && p[i] <= '7') {
        if (v > (1LL << 54))
            return -1;
        v = v * 8 + (p[i] - '0');
        i++;
    }
    for (int j = i; j < len; j++)
        if (p[j] != ' ' && p[j] != '\0')
            return -1;
    return v; /* no digits at all: 0, as Python gives for an empty field */
}

static int checksum_ok(const unsigned char *h)
{
    long long stored = octal(h + 148, 8);
    long long sum = 8 * ' ';
    for (int i = 0; i < 148; i++)
        sum += h[i];
    for (int i = 156; i < BLOCK; i++)
        sum += h[i];
    return stored == sum;
}

/* A pax record of mtime only ("%d mtime=%s\n"), which Python's tarfile writes for every member
 * with a float mtime (webdataset's TarWriter does). */
static int mtime_only(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && p[i] >= '0' && p[i] <= '9')
        i++;
    if (i == 0 || n - i < 8 || memcmp(p + i, " mtime=", 7) != 0)
        return 0;
    i += 7;
    Py_ssize_t digits = i;
    while (i < n && ((p[i] >= '0' && p[i] <= '9') || p[i] == '.'))
        i++;
    return i > digits && i == n - 1 && p[i] == '\n';
}

static Py_ssize_t cstrlen(const unsigned char *p, Py_ssize_t max)
{
    const unsigned char *z = memchr(p, 0, (size_t)max);
    return z ? z - p : max;
}

/* The member name of a ustar/v7 header, or NULL (no exception set) when it is not UTF-8. */
static PyObject *member_name(const unsigned char *h)
{
    char buf[256 + 100];
    Py_ssize_t nlen = cstrlen(h, 100), plen = 0;
    if (memcmp(h + 257, "ustar", 5) == 0)
        plen = cstrlen(h + 345, 155);
    Py_ssize_t len = 0;
    if (plen) {
        memcpy(buf, h + 345, (size_t)plen);
        buf[plen] = '/';
        len = plen + 1;
    }
    memcpy(buf + len, h, (size_t)nlen);
    len += nlen;
    PyObject *name = PyUnicode_DecodeUTF8(buf, len, NULL);
    if (name == NULL)
        PyErr_Clear();
    return name;
}

/* The walk itself: a list of (name, data offset, size, first min(size, peek) bytes), or Py_None
 * when the shard is not plain, or NULL with an exception (an I/O error). */
static PyObject *walk_source(Source *src, Py_ssize_t peek)
{
    PyObject *members = PyList_New(0);
    if (members == NULL)
        return NULL;
    long long pos = 0;
    for (;;) {
        if (pos + BLOCK > src->size)
            goto not_plain; /* truncated */
        Py_ssize_t got;
        const unsigned char *chunk = fetch(src, pos, BLOCK + peek, &got);
        if (chunk == NULL)
            goto error;
        if (got < BLOCK)
            goto not_plain;
        if (chunk[0] == 0) {
            int zero = 1;
            for (int i = 0; i < BLOCK && zero; i++)
                zero = chunk[i] == 0;
            if (zero)
                return members; /* the end-of-archive block */
        }
        if (!checksum_ok(chunk))
            goto not_plain;
        if (chunk[124] & 0x80)
            goto not_plain; /* base-256 size (>= 8 GiB) */
        long long size = octal(chunk + 124, 12);
        if (size < 0)
            goto not_plain;
        long long data = pos + BLOCK;
        if (data + size > src->size)
            goto not_plain; /* truncated */
        Py_ssize_t have = got - BLOCK; /* member bytes that came with the header */
        unsigned char flag = chunk[156];
        if (flag == 'x') {
            if (size > have || !mtime_only(chunk + BLOCK, (Py_ssize_t)size))
                goto not_plain; /* path/size overrides and the rest: the Python walk */
        } else if (flag == '0' || flag == '\0' || flag == '7') {
            PyObject *name = member_name(chunk);
            if (name == NULL)
                goto not_plain;
            Py_ssize_t hlen = size < have ? (Py_ssize_t)size : have;
            PyObject *m = Py_BuildValue("(NLLy#)", name, data, size, (const char *)chunk + BLOCK, hlen);
            if (m == NULL)
                goto error;
            int rc = PyList_Append(members, m);
            Py_DECREF(m);
            if (rc < 0)
                goto error;
        } else if (flag < '1' || flag > '6') {
            goto not_plain; /* 'L', 'K', 'g', vendor types */
        }
        pos = data + (size + BLOCK - 1) / BLOCK * BLOCK;
    }
not_plain:
    Py_DECREF(members);
    Py_RETURN_NONE;
error:
    Py_DECREF(members);
    return NULL;
}

PyDoc_STRVAR(walk_doc,
"walk(src, peek, size=-1) -> list[(name, offset, size, head)] | None\n\n"
"The regular-file members of a plain tar; src is a file descriptor (whose first size bytes\n"
"are the tar) or a bytes-like object.\n"
"head is the first min(size, peek) bytes of the member.  None when the tar is not plain\n"
"(damaged, truncated, or using headers left to the Python walk).");

static PyObject *walk(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t peek;
    long long size = -1;
    if (!PyArg_ParseTuple(args, "On|L:walk", &obj, &peek, &size))
        return NULL;
    if (peek < 0 || peek > MAX_PEEK) {
        PyErr_Format(PyExc_ValueError, "peek must be in [0, %d]", MAX_PEEK);
        return NULL;
    }
    Source src = {-1, NULL, 0, NULL, 0, 0, 0};
    PyObject *result;
    if (PyLong_Check(obj)) {
        src.fd = PyLong_AsLong(obj);
        if (src.fd < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "negative file descriptor");
            return NULL;
        }
        if (size < 0) {
            PyErr_SetString(PyExc_ValueError, "walk of a file descriptor needs its size");
            return NULL;
        }
        src.size = size;
        src.win_cap = 2 * (BLOCK + peek);
        src.window = PyMem_Malloc((size_t)src.win_cap);
        if (src.window == NULL)
            return PyErr_NoMemory();
        result = walk_source(&src, peek);
        PyMem_Free(src.window);
    } else {
        Py_buffer view;
        if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        src.mem = view.buf;
        src.size = view.len;
        result = walk_source(&src, peek);
        PyBuffer_Release(&view);
    }
    return result;
}

PyDoc_STRVAR(read_rows_doc,
"read_rows(out, row_bytes, rows) -> int\n\n"
"For each (fd, offset, nbytes) of rows, read nbytes at offset into out[i * row_bytes:] and\n"
"zero the rest of that row.  out is a writable C-contiguous buffer of len(rows) * row_bytes\n"
"bytes.  Returns -1, or the index of the first row whose file ended early (nothing after\n"
"it is read).");

typedef struct {
    int fd;
    long long offset;
    Py_ssize_t nbytes;
} Row;

static PyObject *read_rows(PyObject *self, PyObject *args)
{
    Py_buffer out;
    Py_ssize_t row_bytes;
    PyObject *rows;
    if (!PyArg_ParseTuple(args, "w*nO!:read_rows", &out, &row_bytes, &PyList_Type, &rows))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    Py_ssize_t short_row = -1;
    Row *todo = NULL;
    if (row_bytes < 0 || n * row_bytes > out.len) {
        PyErr_Format(PyExc_ValueError, "out has %zd bytes, %zd rows of %zd need more", out.len, n, row_bytes);
        goto fail;
    }
    todo = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(Row));
    if (todo == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Row *r = &todo[i];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(rows, i), "iLn:read_rows", &r->fd, &r->offset, &r->nbytes))
            goto fail;
        if (r->nbytes < 0 || r->nbytes > row_bytes) {
            PyErr_Format(PyExc_ValueError, "row %zd: %zd bytes do not fit a row of %zd", i, r->nbytes, row_bytes);
            goto fail;
        }
    }
    /* The reads may wait for the disk: other threads (the shard readahead) run meanwhile. */
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        char *dst = (char *)out.buf + i * row_bytes;
        Py_ssize_t done = pread_full(todo[i].fd, dst, todo[i].nbytes, todo[i].offset);
        if (done < 0)
            err = errno;
        if (done < todo[i].nbytes) {
            short_row = i;
            break;
        }
        memset(dst + todo[i].nbytes, 0, (size_t)(row_bytes - todo[i].nbytes));
    }
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    PyMem_Free(todo);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(short_row);
fail:
    PyMem_Free(todo);
    PyBuffer_Release(&out);
    return NULL;
}

PyDoc_STRVAR(readahead_doc,
"readahead(fd, size, chunk) -> bool\n\n"
"Ask the kernel to read bytes [0, size) of fd into the page cache (POSIX_FADV_WILLNEED,\n"
"chunk bytes per call), without the GIL, unless 16 probes spread over the file find every\n"
"page cached already.  Returns whether reads were asked for.");

static PyObject *readahead_file(PyObject *self, PyObject *args)
{
    int fd;
    long long size, chunk;
    if (!PyArg_ParseTuple(args, "iLL:readahead", &fd, &size, &chunk))
        return NULL;
    if (chunk <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk must be positive");
        return NULL;
    }
    int asked = 0;
#ifdef POSIX_FADV_WILLNEED
    Py_BEGIN_ALLOW_THREADS
    int cached = 0;
#ifdef RWF_NOWAIT
    /* A warm shard costs 16 one-byte reads instead of a walk over all its pages. */
    char byte;
    struct iovec iov = {&byte, 1};
    cached = size > 0;
    for (int k = 0; k < 16 && cached; k++)
        cached = preadv2(fd, &iov, 1, (off_t)(size * k / 16), RWF_NOWAIT) == 1;
#endif
    if (!cached) {
        /* Linux reads at most the readahead window per call (128 KiB by default): hence chunks. */
        for (long long off = 0; off < size; off += chunk)
            posix_fadvise(fd, (off_t)off, (off_t)chunk, POSIX_FADV_WILLNEED);
        asked = 1;
    }
    Py_END_ALLOW_THREADS
#endif
    return PyBool_FromLong(asked);
}

PyDoc_STRVAR(untrack_doc,
"untrack(obj) -> obj\n\n"
"Stop the cyclic garbage collector from tracking obj, which must never be part of a reference\n"
"cycle; returns obj.");

static PyObject *untrack(PyObject *self, PyObject *obj)
{
    if (PyObject_IS_GC(obj))
        PyObject_GC_UnTrack(obj);
    Py_INCREF(obj);
    return obj;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, walk_doc},
    {"read_rows", read_rows, METH_VARARGS, read_rows_doc},
    {"readahead", readahead_file, METH_VARARGS, readahead_doc},
    {"untrack", untrack, METH_O, untrack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wdsprep._native",
    "The loader's hot path in C: tar header walk, batch row reads, shard readahead (see wdsprep.reader).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
