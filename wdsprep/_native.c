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
#include <stdint.h>
#include <stdlib.h>
#include <fcntl.h>
#include <pthread.h>
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

/* One regular member as the walk meets it.  head points into the walk's window: valid only until
 * the next member is read. */
typedef struct {
    char name[155 + 1 + 100]; /* ustar prefix, '/', name; not NUL-terminated */
    Py_ssize_t name_len;
    long long data, size;
    const unsigned char *head;
    Py_ssize_t have; /* bytes at head: the member's first min(size, peek) */
} Member;

enum { END = 0, MEMBER = 1, NOT_PLAIN = -1, FAILED = -2 };

/* The next regular member from *pos on, skipping directories, links and mtime-only pax records,
 * with *pos moved past it.  MEMBER; END at the end-of-archive block; NOT_PLAIN for anything left
 * to the Python walk (damage, truncation, other headers); FAILED with an OSError set. */
static int next_member(Source *src, long long *pos, Py_ssize_t peek, Member *m)
{
    for (;;) {
        long long at = *pos;
        if (at + BLOCK > src->size)
            return NOT_PLAIN; /* truncated */
        Py_ssize_t got;
        const unsigned char *chunk = fetch(src, at, BLOCK + peek, &got);
        if (chunk == NULL)
            return FAILED;
        if (got < BLOCK)
            return NOT_PLAIN;
        if (chunk[0] == 0) {
            int zero = 1;
            for (int i = 0; i < BLOCK && zero; i++)
                zero = chunk[i] == 0;
            if (zero)
                return END;
        }
        if (!checksum_ok(chunk))
            return NOT_PLAIN;
        if (chunk[124] & 0x80)
            return NOT_PLAIN; /* base-256 size (>= 8 GiB) */
        long long size = octal(chunk + 124, 12);
        if (size < 0)
            return NOT_PLAIN;
        long long data = at + BLOCK;
        if (data + size > src->size)
            return NOT_PLAIN; /* truncated */
        Py_ssize_t have = got - BLOCK; /* member bytes that came with the header */
        *pos = data + (size + BLOCK - 1) / BLOCK * BLOCK;
        unsigned char flag = chunk[156];
        if (flag == 'x') {
            if (size > have || !mtime_only(chunk + BLOCK, (Py_ssize_t)size))
                return NOT_PLAIN; /* path/size overrides and the rest: the Python walk */
        } else if (flag == '0' || flag == '\0' || flag == '7') {
            Py_ssize_t nlen = cstrlen(chunk, 100), plen = 0;
            if (memcmp(chunk + 257, "ustar", 5) == 0)
                plen = cstrlen(chunk + 345, 155);
            m->name_len = 0;
            if (plen) {
                memcpy(m->name, chunk + 345, (size_t)plen);
                m->name[plen] = '/';
                m->name_len = plen + 1;
            }
            memcpy(m->name + m->name_len, chunk, (size_t)nlen);
            m->name_len += nlen;
            m->data = data;
            m->size = size;
            m->head = chunk + BLOCK;
            m->have = size < have ? (Py_ssize_t)size : have;
            return MEMBER;
        } else if (flag < '1' || flag > '6') {
            return NOT_PLAIN; /* 'L', 'K', 'g', vendor types */
        }
    }
}

/* The walk itself: a list of (name, data offset, size, first min(size, peek) bytes), or Py_None
 * when the shard is not plain (or a name is not UTF-8), or NULL with an exception (an I/O error). */
static PyObject *walk_source(Source *src, Py_ssize_t peek)
{
    PyObject *members = PyList_New(0);
    if (members == NULL)
        return NULL;
    long long pos = 0;
    Member m;
    int r;
    while ((r = next_member(src, &pos, peek, &m)) == MEMBER) {
        PyObject *name = PyUnicode_DecodeUTF8(m.name, m.name_len, NULL);
        if (name == NULL) {
            PyErr_Clear();
            r = NOT_PLAIN;
            break;
        }
        PyObject *t = Py_BuildValue("(NLLy#)", name, m.data, m.size, (const char *)m.head, m.have);
        if (t == NULL || PyList_Append(members, t) < 0) {
            Py_XDECREF(t);
            r = FAILED;
            break;
        }
        Py_DECREF(t);
    }
    if (r == END)
        return members;
    Py_DECREF(members);
    if (r == FAILED)
        return NULL;
    Py_RETURN_NONE;
}

/* A Source for walk() and samples(): a file descriptor (whose first size bytes are the tar) or a
 * bytes-like object.  0, or -1 with an exception set; release with source_close. */
static int source_open(Source *src, PyObject *obj, Py_ssize_t peek, long long size, Py_buffer *view)
{
    memset(src, 0, sizeof(*src));
    src->fd = -1;
    view->obj = NULL;
    if (peek < 0 || peek > MAX_PEEK) {
        PyErr_Format(PyExc_ValueError, "peek must be in [0, %d]", MAX_PEEK);
        return -1;
    }
    if (PyLong_Check(obj)) {
        src->fd = PyLong_AsLong(obj);
        if (src->fd < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "negative file descriptor");
            return -1;
        }
        if (size < 0) {
            PyErr_SetString(PyExc_ValueError, "a file descriptor needs its size");
            return -1;
        }
        src->size = size;
        src->win_cap = 2 * (BLOCK + peek);
        src->window = PyMem_Malloc((size_t)src->win_cap);
        if (src->window == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    src->mem = view->buf;
    src->size = view->len;
    return 0;
}

static void source_close(Source *src, Py_buffer *view)
{
    PyMem_Free(src->window);
    if (view->obj != NULL)
        PyBuffer_Release(view);
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
    Source src;
    Py_buffer view;
    if (source_open(&src, obj, peek, size, &view) < 0)
        return NULL;
    PyObject *result = walk_source(&src, peek);
    source_close(&src, &view);
    return result;
}

/* ---- samples(): the walk, grouped into samples, with the .npy header and transcript decoded. */

#define MAX_LAYOUTS 4
#define MAX_EXT 32
#define MAX_FIELDS 16

/* What a sample's members gave for one layout (features extension, transcript extension). */
typedef struct {
    int has_feats, feats_ok;
    long long offset, frames, dims;
    int itemsize;
    int has_text;
    PyObject *text; /* NULL when the transcript is not UTF-8 */
} Found;

/* Parse a decimal number of at most 18 digits at *p; -1 when there is none. */
static long long decimal(const char **p, const char *stop)
{
    long long v = 0;
    const char *q = *p;
    while (q < stop && *q >= '0' && *q <= '9' && q - *p < 18)
        v = v * 10 + (*q++ - '0');
    if (q == *p || (q < stop && *q >= '0' && *q <= '9'))
        return -1;
    *p = q;
    return v;
}

static int literal(const char **p, const char *stop, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(stop - *p) < n || memcmp(*p, lit, n) != 0)
        return 0;
    *p += n;
    return 1;
}

/* The .npy header exactly as numpy writes a C-order little-endian float32/float16 2-D array
 * (version 1.0); anything else (float64, Fortran order, other versions or spellings) is left to
 * the Python reader, which also words the errors.  Fills f or returns 0. */
static int npy_header(const Member *m, Found *f)
{
    const unsigned char *h = m->head;
    if (m->have < 10 || memcmp(h, "\x93NUMPY\x01", 7) != 0)
        return 0;
    Py_ssize_t end = 10 + (h[8] | (h[9] << 8));
    if (end > m->have)
        return 0;
    const char *p = (const char *)h + 10, *stop = (const char *)h + end;
    if (!literal(&p, stop, "{'descr': '<f"))
        return 0;
    if (p < stop && (*p == '4' || *p == '2'))
        f->itemsize = *p++ == '4' ? 4 : 2;
    else
        return 0;
    if (!literal(&p, stop, "', 'fortran_order': False, 'shape': ("))
        return 0;
    f->frames = decimal(&p, stop);
    if (f->frames < 0 || !literal(&p, stop, ", "))
        return 0;
    f->dims = decimal(&p, stop);
    if (f->dims < 0 || !literal(&p, stop, "), }"))
        return 0;
    if (f->frames == 0 || f->dims == 0)
        return 0; /* an empty matrix: the Python reader refuses it */
    if (f->dims > 0 && f->frames > ((1LL << 62) / f->itemsize) / f->dims)
        return 0;
    if (end + f->frames * f->dims * f->itemsize > m->size)
        return 0; /* truncated data: the Python reader says so */
    f->offset = m->data + end;
    return 1;
}

/* The member's bytes as UTF-8 text; NULL with no exception when they are not UTF-8, NULL with
 * an OSError on a failed read. */
static PyObject *member_text(Source *src, const Member *m)
{
    if (m->size <= m->have)
        return PyUnicode_DecodeUTF8((const char *)m->head, m->have, NULL);
    if (src->fd < 0)
        return PyUnicode_DecodeUTF8((const char *)src->mem + m->data, (Py_ssize_t)m->size, NULL);
    char *buf = PyMem_Malloc((size_t)m->size);
    if (buf == NULL)
        return PyErr_NoMemory();
    Py_ssize_t done;
    Py_BEGIN_ALLOW_THREADS
    done = pread_full(src->fd, buf, (Py_ssize_t)m->size, m->data);
    Py_END_ALLOW_THREADS
    PyObject *text = NULL;
    if (done < 0)
        PyErr_SetFromErrno(PyExc_OSError);
    else if (done == m->size)
        text = PyUnicode_DecodeUTF8(buf, done, NULL);
    PyMem_Free(buf);
    return text;
}

static void found_clear(Found *found, int n)
{
    for (int l = 0; l < n; l++)
        Py_CLEAR(found[l].text);
    memset(found, 0, sizeof(Found) * (size_t)n);
}

static int name_is_ascii(const Member *m)
{
    for (Py_ssize_t i = 0; i < m->name_len; i++)
        if ((unsigned char)m->name[i] >= 0x80)
            return 0;
    return 1;
}

/* A shard's samples as columns, as samples() returns them: numbers for numpy, strings in lists. */
typedef struct {
    PyObject *keys, *texts;
    long long *layout; /* offset, frames, dims, itemsize per sample */
    Py_ssize_t n, cap;
    int nfields;
    PyObject *values[MAX_FIELDS]; /* per field asked for: a list of each sample's value (str, or None) */
} Columns;

static void columns_clear(Columns *c)
{
    Py_CLEAR(c->keys);
    Py_CLEAR(c->texts);
    for (int j = 0; j < c->nfields; j++)
        Py_CLEAR(c->values[j]);
    PyMem_Free(c->layout);
    c->layout = NULL;
}

/* A sample's field members as found: the value of each field asked for (NULL: no such member). */
typedef struct {
    PyObject *value[MAX_FIELDS];
    int bad; /* a field member that is not UTF-8: the Python reader says so */
} FieldsFound;

static void fields_clear(FieldsFound *f, int n)
{
    for (int j = 0; j < n; j++)
        Py_CLEAR(f->value[j]);
    f->bad = 0;
}

/* The first layout a sample has both members of, appended to the columns: MEMBER; NOT_PLAIN
 * when it has no pair or that pair did not decode; FAILED with an exception. */
static int emit(Columns *out, const char *key, Py_ssize_t key_len, Found *found, int n, FieldsFound *ff)
{
    for (int l = 0; l < n; l++) {
        Found *f = &found[l];
        if (!f->has_feats || !f->has_text)
            continue;
        if (!f->feats_ok || f->text == NULL || ff->bad)
            return NOT_PLAIN;
        if (out->n == out->cap) {
            Py_ssize_t cap = out->cap ? 2 * out->cap : 1024;
            long long *grown = PyMem_Realloc(out->layout, (size_t)cap * 4 * sizeof(long long));
            if (grown == NULL) {
                PyErr_NoMemory();
                return FAILED;
            }
            out->layout = grown;
            out->cap = cap;
        }
        PyObject *k = PyUnicode_DecodeASCII(key, key_len, NULL);
        if (k == NULL || PyList_Append(out->keys, k) < 0 || PyList_Append(out->texts, f->text) < 0) {
            Py_XDECREF(k);
            return FAILED;
        }
        Py_DECREF(k);
        for (int j = 0; j < out->nfields; j++)
            if (PyList_Append(out->values[j], ff->value[j] != NULL ? ff->value[j] : Py_None) < 0)
                return FAILED;
        long long *row = out->layout + 4 * out->n++;
        row[0] = f->offset;
        row[1] = f->frames;
        row[2] = f->dims;
        row[3] = f->itemsize;
        return MEMBER;
    }
    return NOT_PLAIN;
}

static PyObject *samples_source(Source *src, Py_ssize_t peek, char exts[][2][MAX_EXT], int nlayouts,
                                char fexts[][MAX_EXT], int nfields)
{
    Columns cols = {PyList_New(0), PyList_New(0), NULL, 0, 0, nfields, {NULL}};
    Columns *out = &cols;
    int made = cols.keys != NULL && cols.texts != NULL;
    for (int j = 0; j < nfields && made; j++)
        made = (cols.values[j] = PyList_New(0)) != NULL;
    if (!made) {
        columns_clear(&cols);
        return NULL;
    }
    FieldsFound ff;
    memset(&ff, 0, sizeof(ff));
    Found found[MAX_LAYOUTS];
    memset(found, 0, sizeof(found));
    char key[sizeof(((Member *)0)->name)];
    Py_ssize_t key_len = -1; /* -1: no sample started */
    long long pos = 0;
    Member m;
    int r;
    while ((r = next_member(src, &pos, peek, &m)) == MEMBER) {
        if (!name_is_ascii(&m)) {
            r = NOT_PLAIN; /* the Python walk decides what such names mean */
            break;
        }
        /* The member-name rule of format/keys.py split_member: the key is the name without the
         * longest layout suffix it ends with (so dotted ids stay whole), else it ends at the first
         * dot of the base name, as webdataset splits. */
        Py_ssize_t base = m.name_len;
        while (base > 0 && m.name[base - 1] != '/')
            base--;
        Py_ssize_t klen = -1;
        for (int l = 0; l < nlayouts; l++)
            for (int r = 0; r < 2; r++) {
                Py_ssize_t el = (Py_ssize_t)strlen(exts[l][r]);
                Py_ssize_t k = m.name_len - el - 1;
                if (k > base && (klen < 0 || k < klen) && m.name[k] == '.' &&
                    memcmp(m.name + k + 1, exts[l][r], (size_t)el) == 0)
                    klen = k;
            }
        if (klen < 0) {
            const char *dot = memchr(m.name + base, '.', (size_t)(m.name_len - base));
            klen = dot ? dot - m.name : m.name_len;
        }
        const char *ext = klen < m.name_len ? m.name + klen + 1 : m.name + m.name_len;
        Py_ssize_t elen = m.name + m.name_len - ext;
        if (klen != key_len || memcmp(key, m.name, (size_t)klen) != 0) {
            if (key_len >= 0 && (r = emit(out, key, key_len, found, nlayouts, &ff)) != MEMBER)
                break;
            found_clear(found, nlayouts);
            fields_clear(&ff, nfields);
            memcpy(key, m.name, (size_t)klen);
            key_len = klen;
        }
        for (int j = 0; j < nfields; j++) {
            if ((Py_ssize_t)strlen(fexts[j]) != elen || memcmp(fexts[j], ext, (size_t)elen) != 0)
                continue;
            Py_CLEAR(ff.value[j]); /* a later member of the same name wins, as in a dict */
            ff.value[j] = member_text(src, &m);
            if (ff.value[j] == NULL && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    r = FAILED;
                    break;
                }
                PyErr_Clear();
                ff.bad = 1;
            }
        }
        if (r == FAILED)
            break;
        for (int l = 0; l < nlayouts; l++) {
            Found *f = &found[l];
            if ((Py_ssize_t)strlen(exts[l][0]) == elen && memcmp(exts[l][0], ext, (size_t)elen) == 0) {
                f->has_feats = 1; /* a later member of the same name wins, as in a dict */
                f->feats_ok = npy_header(&m, f);
            }
            if ((Py_ssize_t)strlen(exts[l][1]) == elen && memcmp(exts[l][1], ext, (size_t)elen) == 0) {
                f->has_text = 1;
                Py_CLEAR(f->text);
                f->text = member_text(src, &m);
                if (f->text == NULL && PyErr_Occurred()) {
                    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        r = FAILED;
                        break;
                    }
                    PyErr_Clear();
                }
            }
        }
        if (r == FAILED)
            break;
    }
    if (r == END && key_len >= 0)
    {
        int last = emit(out, key, key_len, found, nlayouts, &ff);
        r = last == MEMBER ? END : last;
    }
    found_clear(found, nlayouts);
    fields_clear(&ff, nfields);
    PyObject *result = NULL;
    if (r == END) {
        PyObject *layout = PyBytes_FromStringAndSize((const char *)cols.layout,
                                                     (Py_ssize_t)(cols.n * 4 * (Py_ssize_t)sizeof(long long)));
        PyObject *values = layout == NULL || nfields == 0 ? NULL : PyList_New(nfields);
        for (int j = 0; values != NULL && j < nfields; j++)
            PyList_SET_ITEM(values, j, Py_NewRef(cols.values[j]));
        if (layout != NULL && nfields == 0)
            result = Py_BuildValue("(OON)", cols.keys, cols.texts, layout);
        else if (layout != NULL && values != NULL)
            result = Py_BuildValue("(OONN)", cols.keys, cols.texts, layout, values);
        else
            Py_XDECREF(layout);
    } else if (!(r == FAILED && PyErr_Occurred())) {
        result = Py_NewRef(Py_None);
    }
    columns_clear(&cols);
    return result;
}

PyDoc_STRVAR(samples_doc,
"samples(src, peek, size, layouts, fields=None) -> (keys, texts, layout[, values]) | None\n\n"
"The samples of a plain tar (src and size as for walk) as columns: their keys and transcripts\n"
"(lists of str) and, as bytes holding native int64 [n, 4], the offset of each one's\n"
"float32/float16 feature data (C order), its frames, dims and item size.  layouts is a list of\n"
"(features extension, transcript extension) pairs, tried in order.  fields, a list of member\n"
"extensions (bytes): values is then one list per field of each sample's member text, or None\n"
"where the sample has no such member (a field member that is not UTF-8 gives None overall).\n"
"None when anything needs the Python reader: whatever walk() declines, names that are not\n"
"ASCII, a sample without a pair, an .npy header other than numpy's own for such an array,\n"
"truncated feature data, a transcript that is not UTF-8.");

static PyObject *samples(PyObject *self, PyObject *args)
{
    PyObject *obj, *layouts, *fields = Py_None;
    Py_ssize_t peek;
    long long size;
    if (!PyArg_ParseTuple(args, "OnLO!|O:samples", &obj, &peek, &size, &PyList_Type, &layouts, &fields))
        return NULL;
    char fexts[MAX_FIELDS][MAX_EXT];
    Py_ssize_t nf = 0;
    if (fields != Py_None) {
        if (!PyList_Check(fields) || PyList_GET_SIZE(fields) > MAX_FIELDS) {
            PyErr_Format(PyExc_ValueError, "fields must be a list of at most %d extensions", MAX_FIELDS);
            return NULL;
        }
        nf = PyList_GET_SIZE(fields);
        for (Py_ssize_t j = 0; j < nf; j++) {
            const char *fe;
            Py_ssize_t fl;
            if (!PyArg_Parse(PyList_GET_ITEM(fields, j), "y#:samples", &fe, &fl))
                return NULL;
            if (fl < 1 || fl >= MAX_EXT || fl != (Py_ssize_t)strlen(fe)) {
                PyErr_SetString(PyExc_ValueError, "field extensions must be short and without NUL bytes");
                return NULL;
            }
            memcpy(fexts[j], fe, (size_t)fl + 1);
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(layouts);
    if (n < 1 || n > MAX_LAYOUTS) {
        PyErr_Format(PyExc_ValueError, "between 1 and %d layouts", MAX_LAYOUTS);
        return NULL;
    }
    char exts[MAX_LAYOUTS][2][MAX_EXT];
    for (Py_ssize_t l = 0; l < n; l++) {
        const char *fe, *te;
        Py_ssize_t fl, tl;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(layouts, l), "y#y#:samples", &fe, &fl, &te, &tl))
            return NULL;
        if (fl >= MAX_EXT || tl >= MAX_EXT || fl != (Py_ssize_t)strlen(fe) || tl != (Py_ssize_t)strlen(te)) {
            PyErr_SetString(PyExc_ValueError, "extensions must be short and without NUL bytes");
            return NULL;
        }
        memcpy(exts[l][0], fe, (size_t)fl + 1);
        memcpy(exts[l][1], te, (size_t)tl + 1);
    }
    Source src;
    Py_buffer view;
    if (source_open(&src, obj, peek, size, &view) < 0)
        return NULL;
    PyObject *result = samples_source(&src, peek, exts, (int)n, fexts, (int)nf);
    source_close(&src, &view);
    return result;
}

PyDoc_STRVAR(read_rows_doc,
"read_rows(out, row_bytes, rows, half=False, bad=None) -> int\n\n"
"For each row (fd, offset, nbytes) of rows, a C-contiguous int64 [n, 3] buffer, read nbytes at\n"
"offset into out[i * row_bytes:] and zero the rest of that row.  out is a writable C-contiguous\n"
"buffer of n * row_bytes\n"
"bytes.  With half, the bytes are float16 and go to out as float32 (2 * nbytes of the row).\n"
"With bad, a writable buffer of n bytes, bad[i] is set to 1 when row i holds a NaN or an\n"
"infinity (checked right after its read, while the row is in the CPU cache), else 0.\n"
"Returns -1, or the index of the first row whose file ended early (nothing after it is read).");

/* Whether any of n float32 (or, with half, float16) values is a NaN or an infinity: its
 * exponent bits are all ones.  Vectorized below: AVX2 where the CPU has it, else SSE2 (every
 * x86-64), else this. */
static int nonfinite_scalar(const void *data, Py_ssize_t n, int half)
{
    unsigned bad = 0;
    if (half) {
        const uint16_t *h = data;
        for (Py_ssize_t i = 0; i < n; i++)
            bad |= (h[i] & 0x7c00u) == 0x7c00u;
    } else {
        const uint32_t *w = data;
        for (Py_ssize_t i = 0; i < n; i++)
            bad |= (w[i] & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

#if defined(__SSE2__)
#include <emmintrin.h>
static int nonfinite_sse2(const void *data, Py_ssize_t n, int half)
{
    const char *p = data;
    Py_ssize_t per = half ? 8 : 4, i = 0;
    const __m128i expo = half ? _mm_set1_epi16(0x7c00) : _mm_set1_epi32(0x7f800000);
    __m128i acc = _mm_setzero_si128();
    for (; i + per <= n; i += per) {
        __m128i x = _mm_and_si128(_mm_loadu_si128((const __m128i *)(p + i * (half ? 2 : 4))), expo);
        acc = _mm_or_si128(acc, half ? _mm_cmpeq_epi16(x, expo) : _mm_cmpeq_epi32(x, expo));
    }
    return _mm_movemask_epi8(acc) != 0 || nonfinite_scalar(p + i * (half ? 2 : 4), n - i, half);
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
static int have_avx2; /* set once at import */

/* AVX2, two 32-byte loads a step: the check costs ~0.9 us on a 96 KB row beside ~1.7 us with
 * SSE2 (a memcpy of it: 1.8 us), so it stays a few percent of the read. */
__attribute__((target("avx2"))) static int nonfinite_avx2(const void *data, Py_ssize_t n, int half)
{
    const char *p = data;
    Py_ssize_t per = half ? 32 : 16, i = 0, size = half ? 2 : 4;
    const __m256i expo = half ? _mm256_set1_epi16(0x7c00) : _mm256_set1_epi32(0x7f800000);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    for (; i + per <= n; i += per) {
        const __m256i *q = (const __m256i *)(p + i * size);
        __m256i x0 = _mm256_and_si256(_mm256_loadu_si256(q), expo);
        __m256i x1 = _mm256_and_si256(_mm256_loadu_si256(q + 1), expo);
        a0 = _mm256_or_si256(a0, half ? _mm256_cmpeq_epi16(x0, expo) : _mm256_cmpeq_epi32(x0, expo));
        a1 = _mm256_or_si256(a1, half ? _mm256_cmpeq_epi16(x1, expo) : _mm256_cmpeq_epi32(x1, expo));
    }
    return _mm256_movemask_epi8(_mm256_or_si256(a0, a1)) != 0 || nonfinite_scalar(p + i * size, n - i, half);
}
#endif

static int nonfinite(const void *data, Py_ssize_t n, int half)
{
#ifdef HAVE_AVX2_PATH
    if (have_avx2)
        return nonfinite_avx2(data, n, half);
#endif
#if defined(__SSE2__)
    return nonfinite_sse2(data, n, half);
#else
    return nonfinite_scalar(data, n, half);
#endif
}

/* float16 -> float32, exact for every value (subnormals, infinities, NaN payloads). */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        float f = (float)mant * (1.0f / 16777216.0f); /* zero or subnormal: mant * 2^-24 */
        memcpy(&bits, &f, sizeof(bits));
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof(out));
    return out;
}

static void halves_to_floats_scalar(const uint16_t *src, float *dst, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = half_to_float(src[i]);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
/* The F16C instruction converts 8 values at once (~20x the scalar loop); most x86 CPUs since
 * 2012 have it, and the caller checks at run time. */
__attribute__((target("avx,f16c"))) static void halves_to_floats_f16c(const uint16_t *src, float *dst, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    halves_to_floats_scalar(src + i, dst + i, n - i);
}

static void halves_to_floats(const uint16_t *src, float *dst, Py_ssize_t n)
{
    static int f16c = -1;
    if (f16c < 0)
        f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    if (f16c)
        halves_to_floats_f16c(src, dst, n);
    else
        halves_to_floats_scalar(src, dst, n);
}
#else
#define halves_to_floats halves_to_floats_scalar
#endif

typedef struct {
    int fd;
    long long offset;
    Py_ssize_t nbytes;
} Row;

/* One batch's row reads: what read_rows does at once and a RowReader in its thread. */
typedef struct Job {
    struct Job *next;
    Py_buffer out;
    Py_ssize_t row_bytes, n;
    Row *rows;
    int half;             /* rows are float16, out is float32 */
    Py_buffer bad;        /* optional: one byte per row, set when the row holds a NaN or an infinity */
    Py_ssize_t short_row; /* results: -1 or the first row whose file ended early */
    int err;              /* errno of a failed read, or 0 */
    /* Rows are claimed one at a time, in order, by whoever reads them (a RowReader's thread and
     * the thread waiting for the job); in a RowReader these change under its lock. */
    Py_ssize_t claimed;   /* rows handed out so far (all of them after a failed row) */
    Py_ssize_t running;   /* rows handed out and not finished */
    int done;             /* every row claimed and finished: the results are final */
} Job;

static void job_free(Job *job)
{
    PyMem_RawFree(job->rows);
    PyBuffer_Release(&job->out);
    if (job->bad.obj != NULL)
        PyBuffer_Release(&job->bad);
}

/* Parse read_rows' arguments into job (needs the GIL); 0, or -1 with an exception set and
 * nothing left to free. */
static int job_parse(Job *job, PyObject *args, const char *format)
{
    Py_buffer rows;
    PyObject *bad = Py_None;
    memset(job, 0, sizeof(*job));
    job->short_row = -1;
    if (!PyArg_ParseTuple(args, format, &job->out, &job->row_bytes, &rows, &job->half, &bad))
        return -1;
    if (bad != Py_None && PyObject_GetBuffer(bad, &job->bad, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&job->out);
        return -1;
    }
    Py_ssize_t n = job->n = rows.len / (Py_ssize_t)(3 * sizeof(long long));
    if (rows.len != n * (Py_ssize_t)(3 * sizeof(long long))) {
        PyErr_Format(PyExc_ValueError, "rows has %zd bytes: not int64 [n, 3]", rows.len);
        goto fail;
    }
    if (job->bad.obj != NULL && job->bad.len < n) {
        PyErr_Format(PyExc_ValueError, "bad has %zd bytes for %zd rows", job->bad.len, n);
        goto fail;
    }
    if (job->row_bytes < 0 || n * job->row_bytes > job->out.len) {
        PyErr_Format(PyExc_ValueError, "out has %zd bytes, %zd rows of %zd need more", job->out.len, n,
                     job->row_bytes);
        goto fail;
    }
    job->rows = PyMem_RawMalloc((size_t)(n > 0 ? n : 1) * sizeof(Row));
    if (job->rows == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v[3];
        memcpy(v, (const char *)rows.buf + i * (Py_ssize_t)sizeof(v), sizeof(v)); /* any alignment */
        Row *r = &job->rows[i];
        r->fd = (int)v[0];
        r->offset = v[1];
        r->nbytes = (Py_ssize_t)v[2];
        if (v[0] < 0 || v[0] > INT32_MAX || v[1] < 0) {
            PyErr_Format(PyExc_ValueError, "row %zd: bad descriptor %lld or offset %lld", i, v[0], v[1]);
            goto fail;
        }
        if (r->nbytes < 0 || (job->half ? 2 * r->nbytes : r->nbytes) > job->row_bytes) {
            PyErr_Format(PyExc_ValueError, "row %zd: %zd bytes do not fit a row of %zd", i, r->nbytes,
                         job->row_bytes);
            goto fail;
        }
    }
    PyBuffer_Release(&rows);
    return 0;
fail:
    PyBuffer_Release(&rows);
    job_free(job);
    return -1;
}

/* Room for one float16 row before it is converted: kept by its owner between jobs, so the
 * bytes stay in the CPU cache and the memory is not faulted in again. */
typedef struct {
    char *buf;
    Py_ssize_t cap;
} Scratch;

/* Read row i of job into its place in out: 0, -1 when the file ended early, or an errno.  No
 * Python API and no lock, so it runs without the GIL, in any thread. */
static int row_run(const Job *job, Py_ssize_t i, Scratch *scratch)
{
    const Row *row = &job->rows[i];
    char *dst = (char *)job->out.buf + i * job->row_bytes;
    Py_ssize_t filled = job->half ? 2 * row->nbytes : row->nbytes;
    char *to = dst;
    if (job->half) {
        if (scratch->cap < row->nbytes) {
            char *grown = realloc(scratch->buf, (size_t)row->nbytes);
            if (grown == NULL)
                return ENOMEM;
            scratch->buf = grown;
            scratch->cap = row->nbytes;
        }
        to = scratch->buf;
    }
    Py_ssize_t done = pread_full(row->fd, to, row->nbytes, row->offset);
    if (done < 0)
        return errno ? errno : EIO;
    if (done < row->nbytes)
        return -1;
    if (job->bad.obj != NULL) /* the bytes just read, still in the cache (float16: half of them) */
        ((char *)job->bad.buf)[i] = (char)nonfinite(to, row->nbytes / (job->half ? 2 : 4), job->half);
    if (job->half)
        halves_to_floats((const uint16_t *)to, (float *)dst, row->nbytes / 2);
    memset(dst + filled, 0, (size_t)(job->row_bytes - filled));
    return 0;
}

/* Hand out the job's next row (which exists). */
static Py_ssize_t row_claim(Job *job)
{
    job->running++;
    return job->claimed++;
}

/* Record row i's result.  Rows are claimed in order, so the lowest failed row is the first:
 * every row before it was read.  No row is handed out after a failure. */
static void row_finish(Job *job, Py_ssize_t i, int result)
{
    if (result != 0) {
        if (job->short_row < 0 || i < job->short_row) {
            job->short_row = i;
            job->err = result > 0 ? result : 0;
        }
        job->claimed = job->n;
    }
    job->running--;
    job->done = job->claimed >= job->n && job->running == 0;
}

/* All of a job's rows, in the calling thread. */
static void job_run(Job *job, Scratch *scratch)
{
    while (job->claimed < job->n) {
        Py_ssize_t i = row_claim(job);
        row_finish(job, i, row_run(job, i, scratch));
    }
    job->done = 1;
}

/* A finished job's result (needs the GIL); frees the job's parts. */
static PyObject *job_result(Job *job)
{
    Py_ssize_t short_row = job->short_row;
    int err = job->err;
    job_free(job);
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(short_row);
}

static PyObject *read_rows(PyObject *self, PyObject *args)
{
    Job job;
    Scratch scratch = {NULL, 0};
    if (job_parse(&job, args, "w*ny*|pO:read_rows") < 0)
        return NULL;
    /* The reads may wait for the disk: other threads (the shard readahead) run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    job_run(&job, &scratch);
    free(scratch.buf);
    Py_END_ALLOW_THREADS
    return job_result(&job);
}

/* RowReader: read_rows in a thread of its own that never takes the GIL.  A Python thread pool
 * measured the same in the loader, but it needs the GIL to pick up each job and to report it
 * done, and a main thread busy in Python hands the GIL over only every switch interval (5 ms):
 * how soon a read starts would depend on what the main thread runs.  This one's never does.
 *
 * A thread that waits for a job reads the job's unclaimed rows itself instead of idling: when
 * the loader is faster than the reads, the reads then have both cores. */
typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was queued, or stop was set */
    pthread_cond_t done; /* a job finished */
    pthread_t thread;
    int started, stop;
    pid_t pid;           /* the process the thread runs in */
    Job *head, *tail;    /* jobs submitted and not yet waited for, oldest first */
    Job *todo;           /* the first of them with rows not claimed yet */
    Scratch scratch;     /* the thread's */
    Scratch helper;      /* the waiting thread's */
} RowReader;

/* Move todo past jobs with every row claimed (under r->mu). */
static void skip_claimed(RowReader *r)
{
    while (r->todo != NULL && r->todo->claimed >= r->todo->n)
        r->todo = r->todo->next;
}

/* Read one row of todo, the lock released meanwhile (called with r->mu held). */
static void read_one_row(RowReader *r, Scratch *scratch)
{
    Job *job = r->todo;
    Py_ssize_t i = row_claim(job);
    skip_claimed(r);
    pthread_mutex_unlock(&r->mu);
    int result = row_run(job, i, scratch);
    pthread_mutex_lock(&r->mu);
    row_finish(job, i, result); /* the job cannot be freed before: it is not done */
    skip_claimed(r);
    if (job->done)
        pthread_cond_broadcast(&r->done);
}

static void *row_reader_main(void *arg)
{
    RowReader *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->todo != NULL)
            read_one_row(r, &r->scratch);
        else if (r->stop)
            break;
        else
            pthread_cond_wait(&r->work, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static PyObject *row_reader_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":RowReader", kwlist))
        return NULL;
    RowReader *r = (RowReader *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work, NULL);
    pthread_cond_init(&r->done, NULL);
    r->pid = getpid();
    return (PyObject *)r;
}

PyDoc_STRVAR(row_reader_submit_doc,
"submit(out, row_bytes, rows, half=False, bad=None)\n\n"
"Queue read_rows(out, row_bytes, rows, half, bad) for the reader's thread and return at once.  out\n"
"and bad must not be touched until wait() returned this job's result.");

static PyObject *row_reader_submit(RowReader *r, PyObject *args)
{
    if (r->pid != getpid()) {
        PyErr_SetString(PyExc_RuntimeError, "a RowReader cannot be used in a forked child: its thread is in the parent");
        return NULL;
    }
    if (r->stop) {
        PyErr_SetString(PyExc_ValueError, "submit() on a closed RowReader");
        return NULL;
    }
    Job *job = PyMem_RawMalloc(sizeof(Job));
    if (job == NULL)
        return PyErr_NoMemory();
    if (job_parse(job, args, "w*ny*|pO:submit") < 0) {
        PyMem_RawFree(job);
        return NULL;
    }
    if (!r->started) {
        int err = pthread_create(&r->thread, NULL, row_reader_main, r);
        if (err != 0) {
            job_free(job);
            PyMem_RawFree(job);
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        r->started = 1;
    }
    pthread_mutex_lock(&r->mu);
    if (r->tail != NULL)
        r->tail->next = job;
    else
        r->head = job;
    r->tail = job;
    job->done = job->n == 0;
    if (r->todo == NULL && !job->done)
        r->todo = job;
    pthread_cond_signal(&r->work);
    pthread_mutex_unlock(&r->mu);
    Py_RETURN_NONE;
}

/* Wait (without the GIL) until the oldest job is done, reading its unclaimed rows meanwhile,
 * and unlink it. */
static Job *row_reader_pop(RowReader *r)
{
    Job *job = r->head;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->mu);
    while (!job->done) {
        if (r->todo == job) /* jobs before it are done, so todo is the oldest job with unclaimed rows */
            read_one_row(r, &r->helper);
        else
            pthread_cond_wait(&r->done, &r->mu);
    }
    r->head = job->next;
    if (r->head == NULL)
        r->tail = NULL;
    pthread_mutex_unlock(&r->mu);
    Py_END_ALLOW_THREADS
    return job;
}

PyDoc_STRVAR(row_reader_wait_doc,
"wait() -> int\n\n"
"Wait for the oldest job not waited for yet, reading its rows no thread has begun, and return\n"
"what read_rows would have.");

static PyObject *row_reader_wait(RowReader *r, PyObject *unused)
{
    if (r->head == NULL) {
        PyErr_SetString(PyExc_ValueError, "wait() without a job submitted");
        return NULL;
    }
    Job *job = row_reader_pop(r);
    PyObject *result = job_result(job);
    PyMem_RawFree(job);
    return result;
}

/* Finish every job (their buffers stay valid until then) and end the thread. */
static void row_reader_stop(RowReader *r)
{
    if (r->started && r->pid == getpid()) {
        while (r->head != NULL) {
            Job *job = row_reader_pop(r);
            job_free(job);
            PyMem_RawFree(job);
        }
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_signal(&r->work);
        pthread_mutex_unlock(&r->mu);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(r->thread, NULL);
        Py_END_ALLOW_THREADS
        r->started = 0;
    }
    r->stop = 1;
}

PyDoc_STRVAR(row_reader_close_doc,
"close()\n\n"
"Wait for the jobs still queued (their results are dropped) and end the thread.");

static PyObject *row_reader_close(RowReader *r, PyObject *unused)
{
    row_reader_stop(r);
    Py_RETURN_NONE;
}

static void row_reader_dealloc(RowReader *r)
{
    row_reader_stop(r);
    free(r->scratch.buf);
    free(r->helper.buf);
    pthread_cond_destroy(&r->done);
    pthread_cond_destroy(&r->work);
    pthread_mutex_destroy(&r->mu);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef row_reader_methods[] = {
    {"submit", (PyCFunction)row_reader_submit, METH_VARARGS, row_reader_submit_doc},
    {"wait", (PyCFunction)row_reader_wait, METH_NOARGS, row_reader_wait_doc},
    {"close", (PyCFunction)row_reader_close, METH_NOARGS, row_reader_close_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(row_reader_doc,
"RowReader()\n\n"
"A thread of its own, started with the first job, that runs read_rows jobs in submission order\n"
"without ever taking the GIL.  Jobs are waited for in the same order, by one Python thread,\n"
"which meanwhile reads the rows of the job it waits for that the reader's thread has not begun.");

static PyTypeObject RowReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wdsprep._native.RowReader",
    .tp_basicsize = sizeof(RowReader),
    .tp_dealloc = (destructor)row_reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = row_reader_doc,
    .tp_methods = row_reader_methods,
    .tp_new = row_reader_new,
};

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
    {"samples", samples, METH_VARARGS, samples_doc},
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
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    if (PyType_Ready(&RowReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RowReaderType);
    if (PyModule_AddObject(m, "RowReader", (PyObject *)&RowReaderType) < 0) {
        Py_DECREF(&RowReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
