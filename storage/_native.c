/*
 * The store's hot loops in C: encoding a batch of plain messages, appending encoded records
 * into a CommitLog segment, the dispatcher's partial decode, and index-file writes.
 *
 * Each function is an exact, byte-for-byte equivalent of a pure-Python path in storage/
 * (codec.encode_message, CommitLog._do_append, codec.read_dispatch, IndexFile.put_key); the
 * Python code stays the reference and the fallback. A function that meets anything outside
 * its fast path (IPv6 hosts, V2 records, custom properties, damage, the schedule topic...)
 * stops and lets the Python path handle that record, so every corner case keeps one
 * implementation. tests/storage/test_native.py checks each against its Python twin.
 *
 * Big-endian throughout, as Java's ByteBuffer. Buffers come through the buffer protocol
 * (mmap, bytearray, bytes); bounds are checked against the exported length, never trusted.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MESSAGE_MAGIC_CODE ((int32_t)0xDAA320A7)
#define BORNHOST_V6_FLAG 0x10
#define STOREHOSTADDRESS_V6_FLAG 0x20
#define TRANSACTION_MASK 0x0C
#define TRANSACTION_ROLLBACK_TYPE 0x0C
#define TRANSACTION_PREPARED_TYPE 0x04
#define FIXED_V4_LEN 91 /* a V1 record with IPv4 hosts, empty body, topic and properties */
#define BODY_POS_V4 88
#define MAX_PROPERTIES_BYTES 32767
#define INDEX_HEADER_SIZE 40
#define HASH_SLOT_SIZE 4
#define INDEX_ENTRY_SIZE 20
#define NAME_VALUE_SEPARATOR 1
#define PROPERTY_SEPARATOR 2

static PyObject *crc32_fn;   /* zlib.crc32 */
static PyObject *empty_str;  /* "" */
static PyObject *str_body, *str_queue_id, *str_tags, *str_keys, *str_properties, *str_flag, *str_born_host,
    *str_born_timestamp_ms, *str_wait_store_msg_ok;

/* ---- big-endian access --------------------------------------------------------------- */

static inline void put_i32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)(u >> 24);
    p[1] = (unsigned char)(u >> 16);
    p[2] = (unsigned char)(u >> 8);
    p[3] = (unsigned char)u;
}

static inline void put_i64(unsigned char *p, int64_t v) {
    uint64_t u = (uint64_t)v;
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)u;
        u >>= 8;
    }
}

static inline void put_i16(unsigned char *p, int16_t v) {
    uint16_t u = (uint16_t)v;
    p[0] = (unsigned char)(u >> 8);
    p[1] = (unsigned char)u;
}

static inline int32_t get_i32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

static inline int64_t get_i64(const unsigned char *p) {
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) u = (u << 8) | p[i];
    return (int64_t)u;
}

static inline int16_t get_i16(const unsigned char *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }

/* ---- Java String.hashCode over UTF-16 code units --------------------------------------- */

static inline uint32_t jhash_unit(uint32_t h, Py_UCS4 c) {
    if (c >= 0x10000) { /* a surrogate pair in Java's UTF-16 */
        c -= 0x10000;
        h = 31u * h + (uint32_t)(0xD800 + (c >> 10));
        return 31u * h + (uint32_t)(0xDC00 + (c & 0x3FF));
    }
    return 31u * h + (uint32_t)c;
}

/* h continued over s[start:stop] */
static uint32_t jhash_str(uint32_t h, PyObject *s, Py_ssize_t start, Py_ssize_t stop) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *d = (const Py_UCS1 *)data;
        for (Py_ssize_t i = start; i < stop; i++) h = 31u * h + d[i];
        return h;
    }
    for (Py_ssize_t i = start; i < stop; i++) h = jhash_unit(h, PyUnicode_READ(kind, data, i));
    return h;
}

static inline int is_ascii(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] & 0x80) return 0;
    return 1;
}

/* The Java hash of UTF-8 bytes decoded with errors="replace" (a tag's tagsCode). -1 on error. */
static int jhash_utf8(const unsigned char *p, Py_ssize_t n, uint32_t *out) {
    if (is_ascii(p, n)) {
        uint32_t h = 0;
        for (Py_ssize_t i = 0; i < n; i++) h = 31u * h + p[i];
        *out = h;
        return 0;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "replace");
    if (s == NULL) return -1;
    *out = jhash_str(0, s, 0, PyUnicode_GET_LENGTH(s));
    Py_DECREF(s);
    return 0;
}

/* ---- CRC-32 (zlib's, as RocketMQ's UtilAll.crc32 computes it) -----------------------------
 *
 * For the CRC on read: zlib 1.2's crc32 runs at about 2.5 GB/s here, which cost 25% of get
 * throughput with 1 KiB bodies. This folds 64 bytes a step with carry-less multiplication
 * (PCLMULQDQ; Intel's "Fast CRC Computation Using PCLMULQDQ", the constants of Go's
 * hash/crc32 ieeeCLMUL and Linux's crc32-pclmul for the reflected polynomial 0xEDB88320),
 * and takes the last < 16 bytes and short bodies through a byte table. Without the
 * instruction (or the compiler support), zlib.crc32 is called instead. test_native.py
 * checks it against zlib.crc32 on every length and alignment. */

static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* `c` is the running (inverted) state. */
static inline uint32_t crc_bytes(uint32_t c, const unsigned char *p, size_t n) {
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CRC_HAVE_CLMUL 1
static int crc_use_clmul = 0;

/* The running state after `n` bytes (n >= 64, a multiple of 16). */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_clmul(uint32_t c, const unsigned char *p, size_t n) {
    const __m128i r2r1 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i r4r3 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i r5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i rupoly = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_set_epi32(0, -1, 0, -1);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p);
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64;
#define CRC_FOLD(x, k, next) \
    x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    while (n >= 64) {
        CRC_FOLD(x1, r2r1, _mm_loadu_si128((const __m128i *)p));
        CRC_FOLD(x2, r2r1, _mm_loadu_si128((const __m128i *)(p + 16)));
        CRC_FOLD(x3, r2r1, _mm_loadu_si128((const __m128i *)(p + 32)));
        CRC_FOLD(x4, r2r1, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    CRC_FOLD(x1, r4r3, x2);
    CRC_FOLD(x1, r4r3, x3);
    CRC_FOLD(x1, r4r3, x4);
    while (n >= 16) {
        CRC_FOLD(x1, r4r3, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
#undef CRC_FOLD
    /* 128 -> 64 -> 32 bits, then Barrett reduction. */
    __m128i x0 = _mm_clmulepi64_si128(r4r3, x1, 0x01);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, r5, 0x00), x2);
    x2 = x1;
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_clmulepi64_si128(x1, rupoly, 0x10);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_clmulepi64_si128(x1, rupoly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

/* crc32(0, p, n) & 0x7FFFFFFF into *out, as codec.body_crc. -1 with an exception set (only on
 * the zlib.crc32 fallback). */
static int crc31_bytes(const unsigned char *p, Py_ssize_t n, int32_t *out);

static int crc31(PyObject *body, int32_t *out) {
    PyObject *r = PyObject_CallOneArg(crc32_fn, body);
    if (r == NULL) return -1;
    unsigned long v = PyLong_AsUnsignedLong(r);
    Py_DECREF(r);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    *out = (int32_t)(v & 0x7FFFFFFFul);
    return 0;
}

static int crc31_bytes(const unsigned char *p, Py_ssize_t n, int32_t *out) {
#ifdef CRC_HAVE_CLMUL
    if (crc_use_clmul || n < 64) {
        uint32_t c = 0xFFFFFFFFu;
        size_t len = (size_t)n;
        if (crc_use_clmul && len >= 64) {
            size_t run = len & ~(size_t)15;
            c = crc_clmul(c, p, run);
            p += run;
            len -= run;
        }
        c = crc_bytes(c, p, len);
        *out = (int32_t)(~c & 0x7FFFFFFFu);
        return 0;
    }
#endif
    /* zlib.crc32 over the bytes in place (a memoryview: no copy). */
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) return -1;
    int rc = crc31(view, out);
    Py_DECREF(view);
    return rc;
}

PyDoc_STRVAR(crc32_doc, "crc32(data) -> int\n\nzlib.crc32(data) (the kernel the read path's CRC check uses; for tests).");

static PyObject *crc32_py(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    size_t len = (size_t)view.len;
    uint32_t c = 0xFFFFFFFFu;
#ifdef CRC_HAVE_CLMUL
    if (crc_use_clmul && len >= 64) {
        size_t run = len & ~(size_t)15;
        c = crc_clmul(c, p, run);
        p += run;
        len -= run;
    }
#endif
    c = crc_bytes(c, p, len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(~c);
}

/* ---- encode_batch ------------------------------------------------------------------------ */

/* The UTF-8 of a tag or key: fills p and n; 0 if outside the fast path (not a str, or holds a
 * separator the Python path must reject), -1 on error. `no_space` also refuses ' '. */
static int plain_text(PyObject *o, const char **p, Py_ssize_t *n, int no_space) {
    if (!PyUnicode_CheckExact(o)) return 0;
    const char *s = PyUnicode_AsUTF8AndSize(o, n);
    if (s == NULL) {
        PyErr_Clear(); /* lone surrogates: the Python path reports them */
        return 0;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        char c = s[i];
        if (c == NAME_VALUE_SEPARATOR || c == PROPERTY_SEPARATOR || (no_space && c == ' ')) return 0;
    }
    *p = s;
    return 1;
}

/* 1 if o is falsy, 0 if truthy, -1 on error. */
static int is_falsy(PyObject *o) {
    if (o == Py_None) return 1;
    int truth = PyObject_IsTrue(o);
    return truth < 0 ? -1 : !truth;
}

/* A bounded attribute as a C integer: 1 ok, 0 outside the fast path, -1 error. */
static int small_int(PyObject *o, long long lo, long long hi, long long *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

#define MAX_KEYS_FAST 64

/* The message fields encode_one reads, in this order (PutSubmitter maps them to positions). */
enum { F_BODY, F_QUEUE_ID, F_TAGS, F_KEYS, F_PROPERTIES, F_FLAG, F_BORN_HOST, F_BORN_TS, F_WAIT, F_TOPIC, F_COUNT };

/* One message → one V1 record with IPv4 hosts and the properties the store builds itself
 * ("KEYS\1k1 k2\2TAGS\1t\2", as a Java producer's HashMap orders them). Returns a new bytes
 * object, Py_None (borrowed, not incremented: outside the fast path) or NULL on error.
 * `fields`: NULL, or the position of each F_* field in `m`, a tuple the caller checked is
 * exactly the NamedTuple those positions are of (its items are its attributes). */
static PyObject *str_topic;

static PyObject *encode_one(PyObject *m, const char *topic, Py_ssize_t topic_len, long long now_ms,
                            const unsigned char *born_ip, int32_t born_port, const unsigned char *store_ip,
                            int32_t store_port, long long max_size, PyObject *topic_str, long long topic_qid,
                            const Py_ssize_t *fields) {
    PyObject *body = NULL, *qid = NULL, *tags = NULL, *keys = NULL, *props = NULL, *flag = NULL, *born_host = NULL,
             *born_ts = NULL, *wait = NULL, *m_topic = NULL, *result = Py_None;
    long long queue_id, flag_v, born_ts_v = now_ms;
    const char *tags_p = NULL, *key_p[MAX_KEYS_FAST];
    Py_ssize_t tags_n = 0, key_n[MAX_KEYS_FAST], nkeys = 0;
    int r;

#define GET(var, name, field)                                                                        \
    var = fields != NULL ? Py_NewRef(PyTuple_GET_ITEM(m, fields[field])) : PyObject_GetAttr(m, name); \
    if (var == NULL) {                                                                               \
        result = NULL;                                                                               \
        goto done;                                                                                   \
    }
    GET(body, str_body, F_BODY)
    GET(qid, str_queue_id, F_QUEUE_ID)
    GET(tags, str_tags, F_TAGS)
    GET(keys, str_keys, F_KEYS)
    GET(props, str_properties, F_PROPERTIES)
    GET(flag, str_flag, F_FLAG)
    GET(born_host, str_born_host, F_BORN_HOST)
    GET(born_ts, str_born_timestamp_ms, F_BORN_TS)
    GET(wait, str_wait_store_msg_ok, F_WAIT)
    GET(m_topic, str_topic, F_TOPIC)
#undef GET
#define CHECK(expr)            \
    r = (expr);                \
    if (r < 0) {               \
        result = NULL;         \
        goto done;             \
    }                          \
    if (r == 0) goto done;

    if (!PyBytes_CheckExact(body)) goto done;
    /* A str subclass (an Enum member) is declined: the Python path refuses it (codec.check_str). */
    if (m_topic != topic_str && !PyUnicode_CheckExact(m_topic)) goto done;
    CHECK(m_topic == topic_str ? 1 : PyObject_RichCompareBool(m_topic, topic_str, Py_EQ))
    CHECK(small_int(qid, 0, INT32_MAX, &queue_id))
    if (queue_id != topic_qid) goto done; /* one topic and queue per call (a batch's rule) */
    CHECK(small_int(flag, INT32_MIN, INT32_MAX, &flag_v))
    if (born_ts != Py_None) {
        CHECK(small_int(born_ts, INT64_MIN, INT64_MAX, &born_ts_v))
    }
    if (wait != Py_True) goto done;
    CHECK(is_falsy(born_host))
    CHECK(is_falsy(props))
    if (tags != Py_None && tags != empty_str) {
        CHECK(plain_text(tags, &tags_p, &tags_n, 0))
        if (tags_n == 0) tags_p = NULL;
    }
    if (PyUnicode_CheckExact(keys)) {
        if (PyUnicode_GET_LENGTH(keys) > 0) {
            CHECK(plain_text(keys, &key_p[0], &key_n[0], 1))
            nkeys = 1;
        }
    } else if (PyTuple_CheckExact(keys) || PyList_CheckExact(keys)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
        if (n > MAX_KEYS_FAST) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            CHECK(plain_text(PySequence_Fast_GET_ITEM(keys, i), &key_p[i], &key_n[i], 1))
            if (key_n[i] == 0) goto done; /* an empty key: the Python path rejects it */
        }
        nkeys = n;
    } else if (keys != Py_None) {
        goto done;
    }
#undef CHECK

    Py_ssize_t keys_len = 0;
    for (Py_ssize_t i = 0; i < nkeys; i++) keys_len += key_n[i] + (i > 0);
    Py_ssize_t props_len = (nkeys ? 4 + 1 + keys_len + 1 : 0) + (tags_p ? 4 + 1 + tags_n + 1 : 0);
    if (props_len > MAX_PROPERTIES_BYTES) goto done;
    Py_ssize_t body_len = PyBytes_GET_SIZE(body);
    long long total = FIXED_V4_LEN + (long long)body_len + topic_len + props_len;
    if (total > max_size || total > INT32_MAX) goto done;
    int32_t crc = 0;
    if (body_len > 0 && crc31_bytes((const unsigned char *)PyBytes_AS_STRING(body), body_len, &crc) < 0) {
        result = NULL;
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(result);
    put_i32(o, (int32_t)total);
    put_i32(o + 4, MESSAGE_MAGIC_CODE);
    put_i32(o + 8, crc);
    put_i32(o + 12, (int32_t)queue_id);
    put_i32(o + 16, (int32_t)flag_v);
    put_i64(o + 20, 0); /* queue offset: the writer's */
    put_i64(o + 28, 0); /* physical offset: the writer's */
    put_i32(o + 36, 0); /* sys flag */
    put_i64(o + 40, born_ts_v);
    memcpy(o + 48, born_ip, 4);
    put_i32(o + 52, born_port);
    put_i64(o + 56, 0); /* store timestamp: the writer's */
    memcpy(o + 64, store_ip, 4);
    put_i32(o + 68, store_port);
    put_i32(o + 72, 0);
    put_i64(o + 76, 0);
    put_i32(o + 84, (int32_t)body_len);
    unsigned char *w = o + BODY_POS_V4;
    memcpy(w, PyBytes_AS_STRING(body), body_len);
    w += body_len;
    *w++ = (unsigned char)topic_len;
    memcpy(w, topic, topic_len);
    w += topic_len;
    put_i16(w, (int16_t)props_len);
    w += 2;
    if (nkeys) {
        memcpy(w, "KEYS\x01", 5);
        w += 5;
        for (Py_ssize_t i = 0; i < nkeys; i++) {
            if (i > 0) *w++ = ' ';
            memcpy(w, key_p[i], key_n[i]);
            w += key_n[i];
        }
        *w++ = PROPERTY_SEPARATOR;
    }
    if (tags_p) {
        memcpy(w, "TAGS\x01", 5);
        w += 5;
        memcpy(w, tags_p, tags_n);
        w += tags_n;
        *w++ = PROPERTY_SEPARATOR;
    }
done:
    Py_XDECREF(body);
    Py_XDECREF(qid);
    Py_XDECREF(tags);
    Py_XDECREF(keys);
    Py_XDECREF(props);
    Py_XDECREF(flag);
    Py_XDECREF(born_host);
    Py_XDECREF(born_ts);
    Py_XDECREF(wait);
    Py_XDECREF(m_topic);
    return result;
}

static int ip4_arg(PyObject *o, const unsigned char **out) {
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != 4) {
        PyErr_SetString(PyExc_ValueError, "an IPv4 address must be 4 bytes");
        return -1;
    }
    *out = (const unsigned char *)PyBytes_AS_STRING(o);
    return 0;
}

PyDoc_STRVAR(encode_batch_doc,
             "encode_batch(messages, topic_utf8, now_ms, born_ip4, born_port, store_ip4, store_port, "
             "max_message_size, topic, queue_id) -> tuple[bytes, ...] | None\n\n"
             "Each message as codec.encode_message would encode it after MessageStore._properties, "
             "or None when any message needs the general path (custom properties, IPv6, a born "
             "host, wait_store_msg_ok=False, another topic or queue than `topic`/`queue_id`, "
             "anything to be rejected).");

static PyObject *encode_batch(PyObject *self, PyObject *args) {
    PyObject *messages, *born_ip_o, *store_ip_o, *topic_str;
    const char *topic;
    Py_ssize_t topic_len;
    long long now_ms, max_size, topic_qid;
    int born_port, store_port;
    if (!PyArg_ParseTuple(args, "Oy#LOiOiLUL", &messages, &topic, &topic_len, &now_ms, &born_ip_o, &born_port,
                          &store_ip_o, &store_port, &max_size, &topic_str, &topic_qid))
        return NULL;
    const unsigned char *born_ip, *store_ip;
    if (ip4_arg(born_ip_o, &born_ip) < 0 || ip4_arg(store_ip_o, &store_ip) < 0) return NULL;
    if (topic_len <= 0 || topic_len > 127) Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(messages, "messages must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyTuple_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = encode_one(PySequence_Fast_GET_ITEM(seq, i), topic, topic_len, now_ms, born_ip, born_port,
                                   store_ip, store_port, max_size, topic_str, topic_qid, NULL);
        if (rec == NULL || rec == Py_None) {
            Py_DECREF(out);
            Py_DECREF(seq);
            if (rec == NULL) return NULL;
            Py_RETURN_NONE;
        }
        PyTuple_SET_ITEM(out, i, rec);
    }
    Py_DECREF(seq);
    return out;
}

/* ---- append_records ---------------------------------------------------------------------- */

PyDoc_STRVAR(append_records_doc,
             "append_records(buf, position, records, file_from_offset, queue_offset, advances, now_ms, "
             "ts_position, id_prefix) -> str\n\n"
             "CommitLog._do_append's copy-and-patch: the records go to buf[position:], each with its "
             "queue offset, physical offset and store timestamp, except the first record's first 8 "
             "bytes (TOTALSIZE, MAGIC), which the caller writes last. Returns the msgIds joined by ','.");

static PyObject *append_records(PyObject *self, PyObject *args) {
    PyObject *buf_o, *records, *id_prefix;
    Py_ssize_t position, ts_position;
    long long file_from, queue_offset, now_ms;
    int advances;
    if (!PyArg_ParseTuple(args, "OnOLLpLnU", &buf_o, &position, &records, &file_from, &queue_offset, &advances,
                          &now_ms, &ts_position, &id_prefix))
        return NULL;
    if (!PyTuple_Check(records) || PyTuple_GET_SIZE(records) == 0) {
        PyErr_SetString(PyExc_TypeError, "records must be a non-empty tuple of bytes");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(records), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_GET_ITEM(records, i);
        if (!PyBytes_Check(r) || PyBytes_GET_SIZE(r) < ts_position + 8 || PyBytes_GET_SIZE(r) < 36) {
            PyErr_SetString(PyExc_ValueError, "a record is not bytes or too short");
            return NULL;
        }
        if (get_i32((const unsigned char *)PyBytes_AS_STRING(r)) != PyBytes_GET_SIZE(r)) {
            PyErr_SetString(PyExc_ValueError, "record TOTALSIZE disagrees with its bytes");
            return NULL;
        }
        total += PyBytes_GET_SIZE(r);
    }
    const char *prefix = PyUnicode_AsUTF8(id_prefix);
    if (prefix == NULL) return NULL;
    size_t prefix_len = strlen(prefix);
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_WRITABLE) < 0) return NULL;
    if (position < 0 || position + total > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "records do not fit the buffer");
        return NULL;
    }
    unsigned char *base = (unsigned char *)view.buf;
    Py_ssize_t ids_len = n * (Py_ssize_t)(prefix_len + 16) + (n - 1);
    PyObject *ids = PyUnicode_New(ids_len, 127);
    if (ids == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *id = (char *)PyUnicode_DATA(ids);
    static const char hex[] = "0123456789ABCDEF";
    Py_ssize_t pos = position;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_GET_ITEM(records, i);
        Py_ssize_t size = PyBytes_GET_SIZE(r);
        const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(r);
        if (i == 0)
            memcpy(base + pos + 8, src + 8, size - 8);
        else
            memcpy(base + pos, src, size);
        long long offset = file_from + pos;
        put_i64(base + pos + 20, advances ? queue_offset++ : 0);
        put_i64(base + pos + 28, offset);
        put_i64(base + pos + ts_position, now_ms);
        if (i > 0) *id++ = ',';
        memcpy(id, prefix, prefix_len);
        id += prefix_len;
        for (int k = 15; k >= 0; k--) {
            id[k] = hex[offset & 0xF];
            offset >>= 4;
        }
        id += 16;
        pos += size;
    }
    PyBuffer_Release(&view);
    return ids;
}

/* ---- dispatch decoding helpers (dispatch_scan, below) -------------------------------------- */

static inline int span_is(const unsigned char *p, Py_ssize_t n, const char *lit, Py_ssize_t lit_n) {
    return n == lit_n && memcmp(p, lit, lit_n) == 0;
}

static PyObject *decode_span(const unsigned char *p, Py_ssize_t n) {
    return PyUnicode_DecodeUTF8((const char *)p, n, "replace");
}

/* A tuple-subclass instance (a NamedTuple) holding `n` new references from `items`. */
static PyObject *make_fields(PyTypeObject *cls, PyObject **items, Py_ssize_t n) {
    PyObject *t = cls->tp_alloc(cls, n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

/* ---- index_put_batch --------------------------------------------------------------------- */

/* One key's entry (IndexFile.put_key with room known to exist). */
static void index_put(unsigned char *buf, Py_ssize_t entries_pos, long long max_slots, long long *st, uint32_t h,
                      long long phy, long long ts) {
    /* st: index_count, hash_slot_count, begin_phy, begin_ts, end_phy, end_ts */
    int32_t key_hash;
    if (h == 0x80000000u)
        key_hash = 0; /* Math.abs(Integer.MIN_VALUE) stays negative; RocketMQ maps it to 0 */
    else
        key_hash = (int32_t)h < 0 ? -(int32_t)h : (int32_t)h;
    long long slot = key_hash % max_slots;
    unsigned char *slot_p = buf + INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE;
    long long index_count = st[0];
    int32_t slot_value = get_i32(slot_p);
    if (slot_value <= 0 || slot_value > index_count) slot_value = 0;
    long long begin_ts = st[3], diff_ms = ts - begin_ts, time_diff;
    if (begin_ts <= 0 || diff_ms < 0)
        time_diff = 0;
    else {
        time_diff = diff_ms / 1000;
        if (time_diff > INT32_MAX) time_diff = INT32_MAX;
    }
    unsigned char *e = buf + entries_pos + index_count * INDEX_ENTRY_SIZE;
    put_i32(e, key_hash);
    put_i64(e + 4, phy);
    put_i32(e + 12, (int32_t)time_diff);
    put_i32(e + 16, slot_value);
    put_i32(slot_p, (int32_t)index_count);
    st[1] += 1; /* 4.4.0 counts every put, not only newly used slots */
    st[0] = index_count + 1;
    st[4] = phy;
    st[5] = ts;
    if (index_count <= 1) { /* after the entry was written against the pre-set begin (§10.6) */
        st[2] = phy;
        st[3] = ts;
    }
}

static Py_ssize_t count_tokens(PyObject *keys) {
    int kind = PyUnicode_KIND(keys);
    const void *data = PyUnicode_DATA(keys);
    Py_ssize_t n = PyUnicode_GET_LENGTH(keys), count = 0;
    int in_token = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int space = PyUnicode_READ(kind, data, i) == ' ';
        if (!space && !in_token) count++;
        in_token = !space;
    }
    return count;
}

PyDoc_STRVAR(index_put_batch_doc,
             "index_put_batch(buf, max_hash_slot_num, max_index_num, state, requests, start, stop, "
             "indexed_below) -> int\n\n"
             "IndexService.build_index for requests[start:stop] into one file: UNIQ_KEY, then each "
             "KEYS token, as 'topic#key'. `state` is the list [index_count, hash_slot_count, "
             "begin_phy_offset, begin_timestamp, end_phy_offset, end_timestamp], updated in place; "
             "the caller writes the header. Returns the index of the first request not handled: "
             "stop, or one whose keys do not all fit this file (the caller rolls the file).");

static PyObject *index_put_batch(PyObject *self, PyObject *args) {
    PyObject *buf_o, *state, *requests;
    long long max_slots, max_index, indexed_below;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OLLO!O!nnL", &buf_o, &max_slots, &max_index, &PyList_Type, &state, &PyTuple_Type,
                          &requests, &start, &stop, &indexed_below))
        return NULL;
    if (max_slots <= 0 || max_index <= 1 || PyList_GET_SIZE(state) != 6) {
        PyErr_SetString(PyExc_ValueError, "bad index geometry or state");
        return NULL;
    }
    if (stop > PyTuple_GET_SIZE(requests)) stop = PyTuple_GET_SIZE(requests);
    long long st[6];
    for (int k = 0; k < 6; k++) {
        st[k] = PyLong_AsLongLong(PyList_GET_ITEM(state, k));
        if (st[k] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_ssize_t entries_pos = INDEX_HEADER_SIZE + (Py_ssize_t)max_slots * HASH_SLOT_SIZE;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_WRITABLE) < 0) return NULL;
    if (view.len < entries_pos + (Py_ssize_t)max_index * INDEX_ENTRY_SIZE || st[0] < 1 || st[0] > max_index) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the buffer does not hold an index file of this geometry");
        return NULL;
    }
    unsigned char *buf = (unsigned char *)view.buf;
    Py_ssize_t i = start;
    for (; i < stop; i++) {
        PyObject *r = PyTuple_GET_ITEM(requests, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 10) {
            PyErr_SetString(PyExc_TypeError, "a request is not DispatchFields");
            goto fail;
        }
        PyObject *topic = PyTuple_GET_ITEM(r, 0), *keys = PyTuple_GET_ITEM(r, 7), *uniq = PyTuple_GET_ITEM(r, 8);
        long long phy = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
        long long ts = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 5));
        long sys_flag = PyLong_AsLong(PyTuple_GET_ITEM(r, 9));
        if (PyErr_Occurred()) goto fail;
        if (!PyUnicode_Check(topic) || (keys != Py_None && !PyUnicode_Check(keys)) ||
            (uniq != Py_None && !PyUnicode_Check(uniq))) {
            PyErr_SetString(PyExc_TypeError, "topic, keys and uniq key must be str (or None)");
            goto fail;
        }
        /* a replay after a restart; and build_index's `offset < endPhyOffset` */
        if (phy < indexed_below) continue;
        if (st[0] >= max_index) break; /* full: the caller makes the next file first, as Python does */
        if (phy < st[4]) continue;
        /* the newest file ends at this message, which may be indexed in part: Python's
           build_index indexes it again, skipping the keys already there */
        if (phy == st[4]) break;
        if ((sys_flag & TRANSACTION_MASK) == TRANSACTION_ROLLBACK_TYPE) continue;
        Py_ssize_t needed = (uniq != Py_None) + (keys != Py_None ? count_tokens(keys) : 0);
        if (needed == 0) continue;
        if (st[0] + needed > max_index) break; /* the caller rolls to a new file */
        uint32_t topic_h = 31u * jhash_str(0, topic, 0, PyUnicode_GET_LENGTH(topic)) + '#';
        if (uniq != Py_None)
            index_put(buf, entries_pos, max_slots, st, jhash_str(topic_h, uniq, 0, PyUnicode_GET_LENGTH(uniq)), phy, ts);
        if (keys != Py_None) {
            int kind = PyUnicode_KIND(keys);
            const void *data = PyUnicode_DATA(keys);
            Py_ssize_t n = PyUnicode_GET_LENGTH(keys), a = 0;
            while (a < n) {
                while (a < n && PyUnicode_READ(kind, data, a) == ' ') a++;
                Py_ssize_t b = a;
                while (b < n && PyUnicode_READ(kind, data, b) != ' ') b++;
                if (b > a) index_put(buf, entries_pos, max_slots, st, jhash_str(topic_h, keys, a, b), phy, ts);
                a = b;
            }
        }
    }
    PyBuffer_Release(&view);
    for (int k = 0; k < 6; k++) {
        PyObject *v = PyLong_FromLongLong(st[k]);
        if (v == NULL) return NULL;
        PyList_SetItem(state, k, v);
    }
    return PyLong_FromSsize_t(i);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- cq_runs ------------------------------------------------------------------------------ */

/* A dispatch request (a DispatchFields tuple): 1 if its record gets a ConsumeQueue unit, 0 if
   not (a PREPARED or ROLLBACK transaction record), -1 with TypeError if it is not one. */
static int dispatch_gets_unit(PyObject *r) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 10) {
        PyErr_SetString(PyExc_TypeError, "a request is not DispatchFields");
        return -1;
    }
    long sys_flag = PyLong_AsLong(PyTuple_GET_ITEM(r, 9));
    if (sys_flag == -1 && PyErr_Occurred()) return -1;
    long tran = sys_flag & TRANSACTION_MASK;
    return tran != TRANSACTION_PREPARED_TYPE && tran != TRANSACTION_ROLLBACK_TYPE;
}

PyDoc_STRVAR(cq_runs_doc,
             "cq_runs(requests) -> list[(topic, queue_id, units, first_phy, last_phy, first_cq, count)]\n\n"
             "The ConsumeQueue units of DispatchFields in dispatch order, as runs of one queue with "
             "consecutive queue offsets and rising commitlog offsets, each packed as 20-byte units "
             "(offset, size, tags code). PREPARED and ROLLBACK messages have no unit.");

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} growbuf;

static int growbuf_add(growbuf *g, const unsigned char *unit) {
    if (g->len + 20 > g->cap) {
        Py_ssize_t cap = g->cap ? g->cap * 2 : 20 * 64;
        char *data = PyMem_Realloc(g->data, cap);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        g->data = data;
        g->cap = cap;
    }
    memcpy(g->data + g->len, unit, 20);
    g->len += 20;
    return 0;
}

static PyObject *cq_runs(PyObject *self, PyObject *requests) {
    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *out = PyList_New(0);
    growbuf g = {NULL, 0, 0};
    PyObject *topic = NULL;
    long long qid = 0, first_phy = 0, last_phy = 0, first_cq = 0, last_cq = 0, count = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i <= n; i++) {
        PyObject *r = NULL, *r_topic = NULL;
        long long r_qid = 0, phy = 0, size = 0, tags = 0, cq = 0;
        if (i < n) {
            r = PySequence_Fast_GET_ITEM(seq, i);
            int gets_unit = dispatch_gets_unit(r);
            if (gets_unit < 0) goto fail;
            if (!gets_unit) continue;
            r_topic = PyTuple_GET_ITEM(r, 0);
            r_qid = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
            phy = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
            size = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 3));
            tags = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 4));
            cq = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 6));
            if (PyErr_Occurred()) goto fail;
        }
        int same = 0;
        if (r != NULL && topic != NULL && r_qid == qid && cq == last_cq + 1 && phy > last_phy) {
            int eq = PyObject_RichCompareBool(r_topic, topic, Py_EQ);
            if (eq < 0) goto fail;
            same = eq;
        }
        if (!same && topic != NULL) { /* close the current run */
            PyObject *units = PyBytes_FromStringAndSize(g.data, g.len);
            if (units == NULL) goto fail;
            PyObject *run = Py_BuildValue("(OLNLLLL)", topic, qid, units, first_phy, last_phy, first_cq, count);
            if (run == NULL) goto fail;
            int appended = PyList_Append(out, run);
            Py_DECREF(run);
            if (appended < 0) goto fail;
            Py_CLEAR(topic);
            g.len = 0;
        }
        if (r == NULL) break;
        if (topic == NULL) {
            Py_INCREF(r_topic);
            topic = r_topic;
            qid = r_qid;
            first_phy = phy;
            first_cq = cq;
            count = 0;
        }
        unsigned char unit[20];
        put_i64(unit, phy);
        put_i32(unit + 8, (int32_t)size);
        put_i64(unit + 12, tags);
        if (growbuf_add(&g, unit) < 0) goto fail;
        last_phy = phy;
        last_cq = cq;
        count++;
    }
    PyMem_Free(g.data);
    Py_DECREF(seq);
    return out;
fail:
    PyMem_Free(g.data);
    Py_XDECREF(topic);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- msync without the GIL --------------------------------------------------------------- */

PyDoc_STRVAR(msync_doc,
             "msync(buf, offset, length) -> None\n\n"
             "msync(MS_SYNC) of buf[offset:offset+length] (offset page-aligned) with the GIL released. "
             "CPython's mmap.flush holds the GIL for the whole write-back, stalling every thread of "
             "the store for as long as the disk takes.");

static PyObject *msync_range(PyObject *self, PyObject *args) {
    PyObject *buf_o;
    Py_ssize_t offset, length;
    if (!PyArg_ParseTuple(args, "Onn", &buf_o, &offset, &length)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_SIMPLE) < 0) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    char *start = (char *)view.buf + offset;
    if (offset < 0 || length < 0 || offset + length > view.len || ((uintptr_t)start) % (uintptr_t)page != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "msync range outside the buffer or not page-aligned");
        return NULL;
    }
    int rc = 0, err = 0;
    if (length > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = msync(start, (size_t)length, MS_SYNC);
        err = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (rc != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* ---- java_hash --------------------------------------------------------------------------- */

PyDoc_STRVAR(java_hash_doc, "java_hash(s) -> int: String.hashCode, a signed 32-bit int.");

static PyObject *java_hash(PyObject *self, PyObject *s) {
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "java_hash takes a str");
        return NULL;
    }
    return PyLong_FromLong((int32_t)jhash_str(0, s, 0, PyUnicode_GET_LENGTH(s)));
}

/* ---- index_select / index_query: IndexFile.select_phy_offset, query_offset_in_files -------- */

/* The phyOffsets a walk found, kept in C until it ends (the Python list changes only on
 * success): 64 inline, then on the heap. */
typedef struct {
    long long *v;
    Py_ssize_t n, cap;
    long long small[64];
} offset_list;

static void offsets_init(offset_list *o) {
    o->v = o->small;
    o->n = 0;
    o->cap = 64;
}

static void offsets_free(offset_list *o) {
    if (o->v != o->small) PyMem_Free(o->v);
}

static int offsets_add(offset_list *o, long long x) {
    if (o->n == o->cap) {
        long long *v = PyMem_Malloc((size_t)o->cap * 2 * sizeof *v);
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(v, o->v, (size_t)o->n * sizeof *v);
        offsets_free(o);
        o->v = v;
        o->cap *= 2;
    }
    o->v[o->n++] = x;
    return 0;
}

/* Append `found`'s offsets to the list `result`: 0, or -1 with an exception set. */
static int offsets_extend(PyObject *result, const offset_list *found) {
    for (Py_ssize_t k = 0; k < found->n; k++) {
        PyObject *o = PyLong_FromLongLong(found->v[k]);
        if (o == NULL || PyList_Append(result, o) < 0) {
            Py_XDECREF(o);
            return -1;
        }
        Py_DECREF(o);
    }
    return 0;
}

/* keyHash of an index key: abs(String.hashCode), 0 for Integer.MIN_VALUE. */
static inline long long index_key_hash(uint32_t h) {
    int32_t s = (int32_t)h;
    return s == INT32_MIN ? 0 : (s < 0 ? -(long long)s : s);
}

/* select_phy_offset's walk of key_hash's chain in one mapped index file buf[0:len], appending
 * to `found` while base + found->n < max_num: 1 when walked, 0 where a slot or an entry lies
 * outside buf (the Python walk decides, and raises, there), -1 with an exception set. */
static int index_walk(const unsigned char *buf, Py_ssize_t len, long long key_hash, long long slots,
                      long long entries_pos, long long bound, long long begin_ts, long long index_count,
                      long long max_num, long long begin, long long end, Py_ssize_t base, offset_list *found) {
    long long slot = key_hash % slots;
    if (INDEX_HEADER_SIZE + (slot + 1) * HASH_SLOT_SIZE > len) return 0;
    long long n = get_i32(buf + INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE);
    if (n <= 0 || n > bound || index_count <= 1) return 1;
    for (long long step = 0; step < bound; step++) {
        if (base + found->n >= max_num) break;
        long long at = entries_pos + n * INDEX_ENTRY_SIZE;
        if (at < 0 || at + INDEX_ENTRY_SIZE > len) return 0;
        const unsigned char *e = buf + at;
        int32_t kh = get_i32(e), time_diff = get_i32(e + 12), prev = get_i32(e + 16);
        if (time_diff < 0) break;
        /* entry 1: its store time is the begin (the Python walk says why) */
        long long time_read = n == 1 ? begin_ts : begin_ts + (long long)time_diff * 1000;
        if (kh == key_hash && begin <= time_read && time_read <= end && offsets_add(found, get_i64(e + 4)) < 0)
            return -1;
        if (prev <= 0 || prev > bound || prev == n || time_read < begin) break;
        n = prev;
    }
    return 1;
}

PyDoc_STRVAR(index_select_doc,
             "index_select(buf, key, max_hash_slot_num, entries_pos, bound, begin_timestamp, index_count, max_num, "
             "begin, end, result) -> bool\n\n"
             "IndexFile.select_phy_offset over the index file mapped as buf: key's keyHash (abs(String.hashCode), "
             "0 for Integer.MIN_VALUE) and slot, then the slot's chain, newest first, appending to `result` the "
             "phyOffset of each entry with that hash stored within [begin, end] until it holds max_num. The "
             "same stops as the Python walk (bounded by `bound` steps). False, with `result` untouched, "
             "where an entry would lie outside buf: the Python walk decides (and raises) there.");

static PyObject *index_select(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "index_select takes 11 arguments");
        return NULL;
    }
    PyObject *key = args[1], *result = args[10];
    if (!PyUnicode_Check(key) || !PyList_Check(result)) {
        PyErr_SetString(PyExc_TypeError, "key must be a str and result a list");
        return NULL;
    }
    long long v[10];
    for (int k = 2; k < 10; k++) {
        v[k] = PyLong_AsLongLong(args[k]);
        if (v[k] == -1 && PyErr_Occurred()) return NULL;
    }
    long long slots = v[2];
    if (slots <= 0) {
        PyErr_SetString(PyExc_ValueError, "max_hash_slot_num must be positive");
        return NULL;
    }
    long long key_hash = index_key_hash(jhash_str(0, key, 0, PyUnicode_GET_LENGTH(key)));
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    offset_list found;
    offsets_init(&found);
    int walked = index_walk((const unsigned char *)view.buf, view.len, key_hash, slots, v[3], v[4], v[5], v[6], v[7],
                            v[8], v[9], PyList_GET_SIZE(result), &found);
    PyBuffer_Release(&view);
    if (walked > 0 && offsets_extend(result, &found) < 0) walked = -1;
    offsets_free(&found);
    if (walked < 0) return NULL;
    return PyBool_FromLong(walked);
}

PyDoc_STRVAR(index_query_doc,
             "index_query(bufs, topic, key, max_hash_slot_num, entries_pos, bound, max_num, begin, end) "
             "-> (offsets, last_update_timestamp, last_update_phy_offset) | None\n\n"
             "query_offset_in_files over the index files mapped as the buffers `bufs` (oldest first), each "
             "header read from its map as IndexFile.reload_header reads it: the key topic#key's chain in the "
             "newest file first, the offsets of entries with its hash stored within [begin, end], until "
             "max_num or a file that begins before `begin`; the last-update fields are the newest file's "
             "endTimestamp and endPhyOffset. None where a header, slot or entry lies outside its buffer: "
             "the Python walk decides (and raises) there.");

/* query_offset_in_files over the index files mapped as the buffers `bufs` (a tuple, oldest
 * first): 1 with `found`, *last_ts and *last_phy set, 0 where a header, slot or entry lies
 * outside its buffer (the Python walk decides there), -1 with an exception set. */
static int index_files_walk(PyObject *bufs, PyObject *topic, PyObject *key, long long slots, long long entries_pos,
                            long long bound, long long max_num, long long begin, long long end, offset_list *found,
                            long long *last_ts, long long *last_phy) {
    /* build_key(topic, key) == f"{topic}#{key}", hashed without building it */
    uint32_t h = jhash_str(0, topic, 0, PyUnicode_GET_LENGTH(topic));
    h = jhash_str(31u * h + '#', key, 0, PyUnicode_GET_LENGTH(key));
    long long key_hash = index_key_hash(h);
    *last_ts = *last_phy = 0;
    int walked = 1;
    Py_ssize_t files = PyTuple_GET_SIZE(bufs);
    for (Py_ssize_t i = files - 1; i >= 0 && walked > 0; i--) {
        Py_buffer view;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(bufs, i), &view, PyBUF_SIMPLE) < 0) return -1;
        const unsigned char *buf = (const unsigned char *)view.buf;
        if (view.len < INDEX_HEADER_SIZE) {
            PyBuffer_Release(&view);
            return 0;
        }
        long long fb = get_i64(buf), fe = get_i64(buf + 8), index_count = get_i32(buf + 36);
        if (index_count <= 0) index_count = 1; /* a fresh file: entry 0 is never used */
        if (i == files - 1) {
            *last_ts = fe;
            *last_phy = get_i64(buf + 24);
        }
        /* IndexFile.is_time_matched */
        if ((begin < fb && end > fe) || (fb <= begin && begin <= fe) || (fb <= end && end <= fe))
            walked = index_walk(buf, view.len, key_hash, slots, entries_pos, bound, fb, index_count, max_num, begin,
                                end, 0, found);
        PyBuffer_Release(&view);
        if (fb < begin || found->n >= max_num) break;
    }
    return walked;
}

static PyObject *index_query(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "index_query takes 9 arguments");
        return NULL;
    }
    PyObject *bufs = args[0], *topic = args[1], *key = args[2];
    if (!PyTuple_Check(bufs) || !PyUnicode_Check(topic) || !PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "bufs must be a tuple, topic and key str");
        return NULL;
    }
    long long v[9];
    for (int k = 3; k < 9; k++) {
        v[k] = PyLong_AsLongLong(args[k]);
        if (v[k] == -1 && PyErr_Occurred()) return NULL;
    }
    if (v[3] <= 0) {
        PyErr_SetString(PyExc_ValueError, "max_hash_slot_num must be positive");
        return NULL;
    }
    offset_list found;
    offsets_init(&found);
    long long last_ts, last_phy;
    int walked = index_files_walk(bufs, topic, key, v[3], v[4], v[5], v[6], v[7], v[8], &found, &last_ts, &last_phy);
    PyObject *answer = NULL;
    if (walked > 0) {
        PyObject *result = PyList_New(0);
        if (result != NULL && offsets_extend(result, &found) == 0)
            answer = Py_BuildValue("(NLL)", result, last_ts, last_phy);
        else
            Py_XDECREF(result);
    } else if (walked == 0) {
        answer = Py_NewRef(Py_None);
    }
    offsets_free(&found);
    return answer;
}

/* ---- Signal: a counting semaphore whose post and wait release the GIL ---------------------- */

typedef struct {
    PyObject_HEAD
    sem_t sem;
    int ready;
} SignalObject;

/* How many threads wait for the GIL right now after a Signal hand-off (woken by a post, or
 * taking the GIL back after posting without it): the store's actors hand off (inboxes,
 * answers) through Signal only, so this says whether a reader looping with the GIL is
 * holding up a put. */
static int woken_awaiting_gil = 0;

/* Longest a yield_gil waits for the woken threads to take the GIL before taking it back. */
#define YIELD_GIL_MAX_NS 2000000LL
/* For this long after a yield_gil found a woken thread waiting, each yield_gil also gives the
 * CPU away (sched_yield without the GIL), as time.sleep(0) did for every read: a producer's
 * put is a chain of hand-offs (writer, answer, dispatch), and between two of them no thread
 * is waiting, yet a reader taking the GIL straight back slowed the chain. */
#define YIELD_GIL_BUSY_NS 20000000LL

static long long monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long gil_wanted_at_ns = -YIELD_GIL_BUSY_NS; /* the last time a yield_gil found a waiter */

/* A forked child has none of its parent's threads: none of them waits for its GIL. */
static void yield_gil_after_fork(void) {
    woken_awaiting_gil = 0;
    gil_wanted_at_ns = -YIELD_GIL_BUSY_NS;
}

PyDoc_STRVAR(yield_gil_doc,
             "yield_gil() -> bool\n\n"
             "If a thread a Signal woke is waiting for the GIL, release the GIL until it has taken it "
             "(at most 2 ms) and return True. Releasing the GIL alone would not do: the releasing thread "
             "takes it back before the woken one runs, which then waits the whole switch interval (5 ms). "
             "Else, within 20 ms of a call that found one, give the CPU away once without the GIL "
             "(sched_yield) and return True; else return False at once (one atomic load, one clock read).");

static PyObject *yield_gil(PyObject *self, PyObject *noargs) {
    if (__atomic_load_n(&woken_awaiting_gil, __ATOMIC_RELAXED) == 0) {
        if (monotonic_ns() - __atomic_load_n(&gil_wanted_at_ns, __ATOMIC_RELAXED) >= YIELD_GIL_BUSY_NS)
            Py_RETURN_FALSE;
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
        Py_RETURN_TRUE;
    }
    Py_BEGIN_ALLOW_THREADS
    long long now = monotonic_ns(), deadline = now + YIELD_GIL_MAX_NS;
    __atomic_store_n(&gil_wanted_at_ns, now, __ATOMIC_RELAXED);
    while (__atomic_load_n(&woken_awaiting_gil, __ATOMIC_RELAXED) > 0 && monotonic_ns() < deadline) sched_yield();
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

static PyObject *woken_awaiting_gil_py(PyObject *self, PyObject *noargs) {
    return PyLong_FromLong(__atomic_load_n(&woken_awaiting_gil, __ATOMIC_RELAXED));
}

static int Signal_init(SignalObject *self, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, "")) return -1;
    if (self->ready) sem_destroy(&self->sem);
    if (sem_init(&self->sem, 0, 0) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->ready = 1;
    return 0;
}

static void Signal_dealloc(SignalObject *self) {
    if (self->ready) sem_destroy(&self->sem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Optional (append, item): `append(item)` first, in the same C call as the post. A message and
 * its token then go in with no point between where a signal handler's exception (a Ctrl-C the
 * host catches) could leave the message in an inbox without its token, which made the actor
 * take each later message one tell late (review 25, finding 5). */
static int append_before_post(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t first, const char *name) {
    if (nargs == first) return 0;
    if (nargs != first + 2) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd or %zd arguments (%zd given)", name, first, first + 2, nargs);
        return -1;
    }
    PyObject *result = PyObject_CallOneArg(args[first], args[first + 1]);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

static PyObject *Signal_post(SignalObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (append_before_post(args, nargs, 0, "post") < 0) return NULL;
    int rc;
    /* Without the GIL: a woken thread that preempts us on this CPU can run at once instead
     * of finding the GIL held and sleeping again (a convoy measured on this 2-CPU machine). */
    Py_BEGIN_ALLOW_THREADS
    rc = sem_post(&self->sem);
    __atomic_fetch_add(&woken_awaiting_gil, 1, __ATOMIC_RELAXED); /* and this thread wants it back */
    Py_END_ALLOW_THREADS
    __atomic_fetch_sub(&woken_awaiting_gil, 1, __ATOMIC_RELAXED);
    if (rc != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *Signal_post_holding_gil(SignalObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (append_before_post(args, nargs, 0, "post_holding_gil") < 0) return NULL;
    if (sem_post(&self->sem) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *Signal_post_many_holding_gil(SignalObject *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    for (long i = 0; i < n; i++)
        if (sem_post(&self->sem) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* CLOCK_MONOTONIC now + `timeout` seconds, for sem_clockwait. */
static void deadline_after(double timeout, struct timespec *deadline) {
    clock_gettime(CLOCK_MONOTONIC, deadline);
    double whole = (double)(long long)timeout;
    deadline->tv_sec += (time_t)whole;
    deadline->tv_nsec += (long)((timeout - whole) * 1e9);
    if (deadline->tv_nsec >= 1000000000L) {
        deadline->tv_sec += 1;
        deadline->tv_nsec -= 1000000000L;
    }
}

/* A count taken, unless a signal handler raises now (KeyboardInterrupt): then it is posted
 * back and the exception returned. Raised by the interpreter just after this call returned,
 * the exception would leave the caller holding a count it never recorded (an in-flight slot
 * lost for good: review 44 H3); run here, the handler finds nothing taken. */
static PyObject *taken_unless_interrupted(SignalObject *self, PyObject *taken) {
    if (PyErr_CheckSignals() < 0 || (taken != NULL && PyList_Append(taken, Py_True) < 0)) {
        sem_post(&self->sem);
        return NULL;
    }
    Py_RETURN_TRUE;
}

/* wait(timeout=-1, taken=None): with `taken` (a list), a count taken is also recorded there,
 * in this call: an exception raised into the thread just after it returned (a timeout
 * library's PyThreadState_SetAsyncExc, which no check here can see) finds the count in the
 * caller's list, to give back, rather than lost with the unstored return value (review 82 M2:
 * an in-flight slot leaked per killed waiter, down to every put refused). */
static PyObject *Signal_wait(SignalObject *self, PyObject *args) {
    double timeout = -1.0;
    PyObject *taken = NULL;
    if (!PyArg_ParseTuple(args, "|dO!", &timeout, &PyList_Type, &taken)) return NULL;
    if (sem_trywait(&self->sem) == 0) return taken_unless_interrupted(self, taken);
    struct timespec deadline;
    if (timeout >= 0) deadline_after(timeout, &deadline);
    for (;;) {
        int rc, err;
        Py_BEGIN_ALLOW_THREADS
        rc = timeout >= 0 ? sem_clockwait(&self->sem, CLOCK_MONOTONIC, &deadline) : sem_wait(&self->sem);
        err = errno;
        /* Woken: counted as waiting for the GIL until it has it (see yield_gil). */
        if (rc == 0) __atomic_fetch_add(&woken_awaiting_gil, 1, __ATOMIC_RELAXED);
        Py_END_ALLOW_THREADS
        if (rc == 0) {
            __atomic_fetch_sub(&woken_awaiting_gil, 1, __ATOMIC_RELAXED);
            return taken_unless_interrupted(self, taken);
        }
        if (err == ETIMEDOUT) Py_RETURN_FALSE;
        if (err != EINTR) {
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (PyErr_CheckSignals() < 0) return NULL;
    }
}

static PyObject *Signal_value(SignalObject *self, PyObject *noargs) {
    int value = 0;
    if (sem_getvalue(&self->sem, &value) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(value < 0 ? 0 : value);
}

static PyTypeObject SignalType;

PyDoc_STRVAR(Signal_post_then_wait_doc,
             "post_then_wait(other, timeout[, append, item]) -> bool: post() this signal, then take one from other, "
             "waiting at most timeout seconds (False if not taken: timed out or interrupted), in one "
             "stretch without the GIL: a caller that hands a request over and blocks on its answer never "
             "takes the GIL back in between (which, taken by the woken receiver meanwhile, was a sleep more). "
             "With append and item, append(item) first, in the same call (see post).");

static PyObject *Signal_post_then_wait(SignalObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 4) {
        PyErr_Format(PyExc_TypeError, "post_then_wait takes 2 or 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &SignalType)) {
        PyErr_SetString(PyExc_TypeError, "post_then_wait: other must be a Signal");
        return NULL;
    }
    SignalObject *other = (SignalObject *)args[0];
    double timeout = PyFloat_AsDouble(args[1]);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    if (append_before_post(args, nargs, 2, "post_then_wait") < 0) return NULL;
    struct timespec deadline;
    if (timeout >= 0) deadline_after(timeout, &deadline);
    int prc, rc, err = 0;
    Py_BEGIN_ALLOW_THREADS
    prc = sem_post(&self->sem);
    rc = timeout >= 0 ? sem_clockwait(&other->sem, CLOCK_MONOTONIC, &deadline) : sem_wait(&other->sem);
    err = errno;
    if (rc == 0) __atomic_fetch_add(&woken_awaiting_gil, 1, __ATOMIC_RELAXED);
    Py_END_ALLOW_THREADS
    if (rc == 0) __atomic_fetch_sub(&woken_awaiting_gil, 1, __ATOMIC_RELAXED);
    if (prc != 0) return PyErr_SetFromErrno(PyExc_OSError);
    if (rc == 0) Py_RETURN_TRUE;
    /* Not answered yet (timed out, or a signal came: the caller's own wait handles it). */
    if (err == ETIMEDOUT || err == EINTR) Py_RETURN_FALSE;
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

PyDoc_STRVAR(post_all_doc,
             "post_all(signals) -> None: post() each Signal of the list, in one stretch without the GIL. "
             "For an answerer with several answers at once (the writer's pass): a post that wakes a "
             "thread may get this one preempted by it, and while it held the GIL every thread it woke "
             "found the GIL held and slept again.");

static PyObject *post_all(PyObject *module, PyObject *arg) {
    if (!PyList_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "post_all takes a list of Signals");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    if (n == 0) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyObject_TypeCheck(PyList_GET_ITEM(arg, i), &SignalType)) {
            PyErr_SetString(PyExc_TypeError, "post_all takes a list of Signals");
            return NULL;
        }
    /* Each Signal held by this call while the GIL is released (not by the list: another
     * thread may change the list meanwhile, and a Signal it dropped would be freed in use). */
    SignalObject *stack_held[16];
    SignalObject **held = n <= 16 ? stack_held : PyMem_Malloc(sizeof(SignalObject *) * (size_t)n);
    if (held == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        held[i] = (SignalObject *)PyList_GET_ITEM(arg, i);
        Py_INCREF(held[i]);
    }
    int failed = 0, err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        if (sem_post(&held[i]->sem) != 0 && !failed) {
            failed = 1;
            err = errno;
        }
    __atomic_fetch_add(&woken_awaiting_gil, 1, __ATOMIC_RELAXED); /* and this thread wants it back */
    Py_END_ALLOW_THREADS
    __atomic_fetch_sub(&woken_awaiting_gil, 1, __ATOMIC_RELAXED);
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(held[i]);
    if (held != stack_held) PyMem_Free(held);
    if (failed) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Signal_methods[] = {
    {"post", (PyCFunction)(void (*)(void))Signal_post, METH_FASTCALL,
     "post([append, item]): add one to the count, waking one waiter; with append and item, append(item) first "
     "in the same call (a message and its token go in together, whatever signal comes)."},
    {"post_holding_gil", (PyCFunction)(void (*)(void))Signal_post_holding_gil, METH_FASTCALL,
     "post_holding_gil([append, item]): post() without releasing the GIL."},
    {"post_many_holding_gil", (PyCFunction)Signal_post_many_holding_gil, METH_O,
     "post_many_holding_gil(n): post_holding_gil() n times in one call (a pass's slots or tokens)."},
    {"wait", (PyCFunction)Signal_wait, METH_VARARGS,
     "wait(timeout=-1, taken=None) -> bool: take one from the count, blocking without the GIL; False on timeout. "
     "With `taken` (a list), True is appended to it in the same call when one is taken."},
    {"post_then_wait", (PyCFunction)(void (*)(void))Signal_post_then_wait, METH_FASTCALL, Signal_post_then_wait_doc},
    {"value", (PyCFunction)Signal_value, METH_NOARGS, "The count now (a snapshot, for tests and figures)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SignalType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqstore.storage._native.Signal",
    .tp_basicsize = sizeof(SignalObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A counting semaphore (POSIX sem_t) whose post and wait release the GIL.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Signal_init,
    .tp_dealloc = (destructor)Signal_dealloc,
    .tp_methods = Signal_methods,
};

/* ---- PutSubmitter: a single put's encode and hand-over to the writer in one call ------------
 *
 * put_async and the actor client's single puts (put_pipeline.PutPipeline._submit_one): the
 * message encoded as encode_batch would encode it, an in-flight slot taken, the writer's
 * messages.EncodedPut built and appended to the writer's inbox inside a pykka Envelope, and
 * the inbox's Signal posted without releasing the GIL (runtime.FastInbox.put_keeping_gil).
 * Everything else (a topic not yet validated, a message outside encode_one's fast path, no
 * free slot) returns before anything is handed out and the Python path does it, so each
 * refusal keeps one implementation. */

typedef struct {
    PyObject_HEAD
    PyObject *topics;            /* dict: validated topic -> its UTF-8 bytes (PutEncoder's) */
    PyObject *clock_ms;          /* the store's clock, called once per put as PutEncoder does */
    PyObject *slots;             /* Signal: one count per free in-flight slot */
    PyTypeObject *put_type;      /* messages.EncodedPut (a NamedTuple of 8 fields) */
    PyTypeObject *envelope_type; /* pykka's Envelope (slots message, reply_to) */
    PyTypeObject *message_type;  /* mqstore.Message: its instances' fields read by position */
    Py_ssize_t message_len;      /* how many fields it has */
    Py_ssize_t fields[F_COUNT];  /* where encode_one's fields are in it */
    unsigned char born_ip[4], store_ip[4];
    int born_port, store_port;
    long long max_size;
} PutSubmitterObject;

static PyObject *str_message, *str_reply_to;

/* message_type's `_fields` positions of encode_one's fields into self->fields. */
static int message_positions(PutSubmitterObject *self, PyObject *message_type) {
    PyObject **names[F_COUNT] = {&str_body,  &str_queue_id,    &str_tags,    &str_keys,
                                 &str_properties, &str_flag, &str_born_host, &str_born_timestamp_ms,
                                 &str_wait_store_msg_ok, &str_topic};
    if (!PyType_IsSubtype((PyTypeObject *)message_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "message_type must be a NamedTuple (mqstore.Message)");
        return -1;
    }
    PyObject *declared = PyObject_GetAttrString(message_type, "_fields");
    if (declared == NULL) return -1;
    if (!PyTuple_Check(declared)) {
        Py_DECREF(declared);
        PyErr_SetString(PyExc_TypeError, "message_type._fields must be a tuple");
        return -1;
    }
    self->message_len = PyTuple_GET_SIZE(declared);
    for (int f = 0; f < F_COUNT; f++) {
        self->fields[f] = -1;
        for (Py_ssize_t i = 0; i < self->message_len; i++) {
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(declared, i), *names[f], Py_EQ);
            if (same < 0) {
                Py_DECREF(declared);
                return -1;
            }
            if (same) {
                self->fields[f] = i;
                break;
            }
        }
        if (self->fields[f] < 0) {
            Py_DECREF(declared);
            PyErr_Format(PyExc_ValueError, "message_type has no field %R", *names[f]);
            return -1;
        }
    }
    Py_DECREF(declared);
    return 0;
}

static int PutSubmitter_init(PutSubmitterObject *self, PyObject *args, PyObject *kwds) {
    PyObject *topics, *clock_ms, *slots, *put_type, *envelope_type, *message_type, *born_ip_o, *store_ip_o;
    int born_port, store_port;
    long long max_size;
    static char *kwlist[] = {"topics", "clock_ms", "slots", "put_type", "envelope_type", "message_type", "born_ip4",
                             "born_port", "store_ip4", "store_port", "max_message_size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!O!O!O!OiOiL", kwlist, &PyDict_Type, &topics, &clock_ms,
                                     &SignalType, &slots, &PyType_Type, &put_type, &PyType_Type, &envelope_type,
                                     &PyType_Type, &message_type, &born_ip_o, &born_port, &store_ip_o, &store_port,
                                     &max_size))
        return -1;
    if (message_positions(self, message_type) < 0) return -1;
    if (!PyCallable_Check(clock_ms)) {
        PyErr_SetString(PyExc_TypeError, "clock_ms must be callable");
        return -1;
    }
    if (!PyType_IsSubtype((PyTypeObject *)put_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "put_type must be a tuple type (messages.EncodedPut)");
        return -1;
    }
    const unsigned char *born_ip, *store_ip;
    if (ip4_arg(born_ip_o, &born_ip) < 0 || ip4_arg(store_ip_o, &store_ip) < 0) return -1;
    memcpy(self->born_ip, born_ip, 4);
    memcpy(self->store_ip, store_ip, 4);
    self->born_port = born_port;
    self->store_port = store_port;
    self->max_size = max_size;
    Py_XSETREF(self->topics, Py_NewRef(topics));
    Py_XSETREF(self->clock_ms, Py_NewRef(clock_ms));
    Py_XSETREF(self->slots, Py_NewRef(slots));
    Py_XSETREF(self->put_type, (PyTypeObject *)Py_NewRef(put_type));
    Py_XSETREF(self->envelope_type, (PyTypeObject *)Py_NewRef(envelope_type));
    Py_XSETREF(self->message_type, (PyTypeObject *)Py_NewRef(message_type));
    return 0;
}

static int PutSubmitter_traverse(PutSubmitterObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->topics);
    Py_VISIT(self->clock_ms);
    Py_VISIT(self->slots);
    Py_VISIT(self->put_type);
    Py_VISIT(self->envelope_type);
    Py_VISIT(self->message_type);
    return 0;
}

static int PutSubmitter_clear(PutSubmitterObject *self) {
    Py_CLEAR(self->topics);
    Py_CLEAR(self->clock_ms);
    Py_CLEAR(self->slots);
    Py_CLEAR(self->put_type);
    Py_CLEAR(self->envelope_type);
    Py_CLEAR(self->message_type);
    return 0;
}

static void PutSubmitter_dealloc(PutSubmitterObject *self) {
    PyObject_GC_UnTrack(self);
    PutSubmitter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* EncodedPut(records, topic, queue_id, 0, False, True, reply, enqueued_ns): allocated and
 * filled as CPython's tuple_subtype_new does. Steals `records`. */
static PyObject *encoded_put(PyTypeObject *type, PyObject *records, PyObject *topic, PyObject *queue_id,
                             PyObject *reply) {
    PyObject *enqueued = PyLong_FromLongLong(monotonic_ns());
    if (enqueued == NULL) {
        Py_DECREF(records);
        return NULL;
    }
    PyObject *put = type->tp_alloc(type, 8);
    if (put == NULL) {
        Py_DECREF(records);
        Py_DECREF(enqueued);
        return NULL;
    }
    PyObject *items[8] = {records, Py_NewRef(topic), Py_NewRef(queue_id), PyLong_FromLong(0), Py_NewRef(Py_False),
                          Py_NewRef(Py_True), Py_NewRef(reply), enqueued};
    for (int i = 0; i < 8; i++) PyTuple_SET_ITEM(put, i, items[i]);
    return put;
}

/* pykka's Envelope(put) without its Python __init__: object.__new__ and its two slots. */
static PyObject *envelope(PyTypeObject *type, PyObject *message) {
    PyObject *env = type->tp_alloc(type, 0);
    if (env == NULL) return NULL;
    if (PyObject_SetAttr(env, str_message, message) < 0 || PyObject_SetAttr(env, str_reply_to, Py_None) < 0) {
        Py_DECREF(env);
        return NULL;
    }
    return env;
}

PyDoc_STRVAR(PutSubmitter_submit_doc,
             "submit(message, reply, inbox_append, inbox_signal) -> bool | None\n\n"
             "True: `message` is encoded, a slot taken and the writer told EncodedPut(..., reply, ...) "
             "(appended through `inbox_append`, `inbox_signal` posted holding the GIL). None: the encoder "
             "declines it (a topic not validated yet, anything outside encode_batch's fast path); False: "
             "no slot is free. Neither takes a slot nor tells anything: the Python path does it.");

static PyObject *PutSubmitter_submit(PutSubmitterObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "submit() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *m = args[0], *reply = args[1], *append = args[2], *inbox_signal = args[3];
    if (self->topics == NULL || self->message_type == NULL) { /* made by __new__, never __init__ */
        PyErr_SetString(PyExc_TypeError, "PutSubmitter was not initialised");
        return NULL;
    }
    if (!PyObject_TypeCheck(inbox_signal, &SignalType)) {
        PyErr_SetString(PyExc_TypeError, "inbox_signal must be a Signal");
        return NULL;
    }
    PyObject *topic = NULL, *qid = NULL, *topic_utf8 = NULL, *rec = NULL, *answer = NULL;
    long long queue_id;
    /* A Message (not a subclass, which may override a field's attribute) is read by position. */
    const Py_ssize_t *fields =
        Py_TYPE(m) == self->message_type && PyTuple_GET_SIZE(m) == self->message_len ? self->fields : NULL;
    topic = fields != NULL ? Py_NewRef(PyTuple_GET_ITEM(m, fields[F_TOPIC])) : PyObject_GetAttr(m, str_topic);
    if (topic == NULL) goto done;
    qid = fields != NULL ? Py_NewRef(PyTuple_GET_ITEM(m, fields[F_QUEUE_ID])) : PyObject_GetAttr(m, str_queue_id);
    if (qid == NULL) goto done;
    answer = Py_None;
    if (!PyUnicode_CheckExact(topic)) goto done;
    topic_utf8 = Py_XNewRef(PyDict_GetItemWithError(self->topics, topic)); /* held across the clock's call */
    if (topic_utf8 == NULL) {
        if (PyErr_Occurred()) answer = NULL;
        goto done; /* not validated yet: PutEncoder.encode validates and caches it */
    }
    if (!PyBytes_CheckExact(topic_utf8) || PyBytes_GET_SIZE(topic_utf8) <= 0 || PyBytes_GET_SIZE(topic_utf8) > 127)
        goto done;
    int r = small_int(qid, 0, INT32_MAX, &queue_id);
    if (r <= 0) {
        if (r < 0) answer = NULL;
        goto done;
    }
    PyObject *now = PyObject_CallNoArgs(self->clock_ms);
    if (now == NULL) {
        answer = NULL;
        goto done;
    }
    long long now_ms = PyLong_AsLongLong(now);
    Py_DECREF(now);
    if (now_ms == -1 && PyErr_Occurred()) {
        answer = NULL;
        goto done;
    }
    rec = encode_one(m, PyBytes_AS_STRING(topic_utf8), PyBytes_GET_SIZE(topic_utf8), now_ms, self->born_ip,
                     self->born_port, self->store_ip, self->store_port, self->max_size, topic, queue_id, fields);
    if (rec == NULL || rec == Py_None) {
        if (rec == NULL) answer = NULL;
        rec = NULL; /* Py_None is borrowed */
        goto done;
    }
    /* A slot after the encoding: a put the encoder declines never holds one, even briefly. */
    if (sem_trywait(&((SignalObject *)self->slots)->sem) != 0) {
        answer = Py_False;
        goto done;
    }
    PyObject *records = PyTuple_Pack(1, rec);
    PyObject *put = records != NULL ? encoded_put(self->put_type, records, topic, qid, reply) : NULL;
    PyObject *env = put != NULL ? envelope(self->envelope_type, put) : NULL;
    Py_XDECREF(put);
    PyObject *appended = env != NULL ? PyObject_CallOneArg(append, env) : NULL;
    Py_XDECREF(env);
    if (appended == NULL) { /* nothing handed out: the slot goes back */
        sem_post(&((SignalObject *)self->slots)->sem);
        answer = NULL;
        goto done;
    }
    Py_DECREF(appended);
    if (sem_post(&((SignalObject *)inbox_signal)->sem) != 0) { /* as Signal.post_holding_gil */
        PyErr_SetFromErrno(PyExc_OSError);
        answer = NULL;
        goto done;
    }
    answer = Py_True;
done:
    Py_XDECREF(topic);
    Py_XDECREF(qid);
    Py_XDECREF(topic_utf8);
    Py_XDECREF(rec);
    return Py_XNewRef(answer);
}

static PyMethodDef PutSubmitter_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))PutSubmitter_submit, METH_FASTCALL, PutSubmitter_submit_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PutSubmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mqstore.storage._native.PutSubmitter",
    .tp_basicsize = sizeof(PutSubmitterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "PutSubmitter(topics, clock_ms, slots, put_type, envelope_type, message_type, born_ip4, born_port, "
              "store_ip4, store_port, max_message_size): one store's single puts encoded and told to its writer in "
              "one call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PutSubmitter_init,
    .tp_dealloc = (destructor)PutSubmitter_dealloc,
    .tp_traverse = (traverseproc)PutSubmitter_traverse,
    .tp_clear = (inquiry)PutSubmitter_clear,
    .tp_methods = PutSubmitter_methods,
};

/* ==========================================================================================
 * ---- decode_message: the read path's record decoder --------------------------------------
 *
 * codec.read_record(buf, pos, limit, max_message_size=..., check_crc=...) for a record it would
 * return as MESSAGE (body read): the same MessageRecord, built straight from the buffer
 * without copying the record first. Everything else (blank, unwritten space, any damage or
 * disagreement between lengths) returns None, and the caller runs read_record, which stays
 * the reference and the only place those cases are decided. The checks below mirror
 * read_record and codec._decode_message in their order; where Python would read past the
 * record and only then find it CORRUPT (a fixed part or topic length beyond TOTALSIZE), this
 * declines before reading.
 * ========================================================================================== */

#define MESSAGE_MAGIC_CODE_V2 ((int32_t)0xDAA320AB)
#define MESSAGE_RECORD_FIELDS 18
#define DECODE_TOPIC_CACHE_BYTES 255

/* One decoded value per slot, reused while consecutive records repeat its bytes: a store's
 * records share their hosts and a queue's records their topic. Both values are immutable
 * (HostAddress is a frozen dataclass, and codec caches hosts the same way). */
typedef struct {
    PyObject *factory; /* the host factory that made `value` (hosts only) */
    unsigned char key[DECODE_TOPIC_CACHE_BYTES];
    Py_ssize_t key_len; /* -1: empty slot */
    int32_t port;
    PyObject *value;
} decode_slot;

static decode_slot decode_born_slot = {NULL, {0}, -1, 0, NULL};
static decode_slot decode_store_slot = {NULL, {0}, -1, 0, NULL};
static decode_slot decode_topic_slot = {NULL, {0}, -1, 0, NULL};

static inline int decode_slot_hit(const decode_slot *s, PyObject *factory, const unsigned char *key, Py_ssize_t n,
                                  int32_t port) {
    return s->value != NULL && s->factory == factory && s->key_len == n && s->port == port &&
           memcmp(s->key, key, (size_t)n) == 0;
}

static void decode_slot_fill(decode_slot *s, PyObject *factory, const unsigned char *key, Py_ssize_t n, int32_t port,
                             PyObject *value) {
    if (n > DECODE_TOPIC_CACHE_BYTES) return;
    Py_XINCREF(factory);
    Py_XSETREF(s->factory, factory);
    Py_INCREF(value);
    Py_XSETREF(s->value, value);
    memcpy(s->key, key, (size_t)n);
    s->key_len = n;
    s->port = port;
}

/* host_factory(address bytes, port), i.e. codec._host_from_bytes, for a 4- or 16-byte
 * address. A new reference, NULL on error. */
static PyObject *decode_host(decode_slot *slot, PyObject *factory, const unsigned char *addr, Py_ssize_t n,
                             int32_t port) {
    if (decode_slot_hit(slot, factory, addr, n, port)) {
        Py_INCREF(slot->value);
        return slot->value;
    }
    /* The factory runs Python code, during which another thread may write the buffer or
     * decode too: the slot is filled afterwards, from a copy of the key taken now. */
    unsigned char key[16];
    memcpy(key, addr, (size_t)n);
    PyObject *addr_o = PyBytes_FromStringAndSize((const char *)key, n);
    PyObject *port_o = PyLong_FromLong(port);
    PyObject *host = NULL;
    if (addr_o != NULL && port_o != NULL) host = PyObject_CallFunctionObjArgs(factory, addr_o, port_o, NULL);
    Py_XDECREF(addr_o);
    Py_XDECREF(port_o);
    if (host != NULL) decode_slot_fill(slot, factory, key, n, port, host);
    return host;
}

/* bytes.decode("utf-8", "replace"), as _decode_message decodes the topic. */
static PyObject *decode_topic(const unsigned char *p, Py_ssize_t n) {
    if (decode_slot_hit(&decode_topic_slot, NULL, p, n, 0)) {
        Py_INCREF(decode_topic_slot.value);
        return decode_topic_slot.value;
    }
    PyObject *topic = PyUnicode_DecodeUTF8((const char *)p, n, "replace");
    if (topic != NULL) decode_slot_fill(&decode_topic_slot, NULL, p, n, 0, topic);
    return topic;
}

/* codec.parse_properties over the decoded str itself (not its bytes), so every code point,
 * replacement characters included, splits exactly as str.split does: items on \2; an item
 * counts only if, once its trailing \1s are stripped, exactly one \1 remains. A later
 * duplicate name overwrites the value and keeps the first one's place, as a dict does. */
/* Property names and short values repeat from record to record (KEYS, TAGS and a queue's few
 * tags...): a small direct-mapped cache of those strings (1-byte kinds) saves building each
 * one again and hashing the names again for the dict (160 of a 400 ns decode went here). */
#define PROPS_CACHE_SLOTS 64
#define PROPS_CACHE_VALUE_MAX 16
static PyObject *props_cache[PROPS_CACHE_SLOTS];

/* s[a:b], from the cache where it can be (a name, or a value of at most 16 characters). */
static PyObject *props_part(PyObject *s, int kind, const void *data, Py_ssize_t a, Py_ssize_t b, int is_name) {
    Py_ssize_t n = b - a;
    if (kind != PyUnicode_1BYTE_KIND || n == 0 || n > 255 || (!is_name && n > PROPS_CACHE_VALUE_MAX))
        return PyUnicode_Substring(s, a, b);
    const Py_UCS1 *p = (const Py_UCS1 *)data + a;
    unsigned h = (unsigned)n * 31u + p[0] * 7u + p[n - 1] * 13u + p[n / 2] + (is_name ? 0u : 17u);
    PyObject **slot = &props_cache[h % PROPS_CACHE_SLOTS];
    PyObject *hit = *slot;
    if (hit != NULL && PyUnicode_GET_LENGTH(hit) == n && PyUnicode_KIND(hit) == PyUnicode_1BYTE_KIND &&
        memcmp(PyUnicode_1BYTE_DATA(hit), p, (size_t)n) == 0) {
        Py_INCREF(hit);
        return hit;
    }
    PyObject *made = PyUnicode_Substring(s, a, b);
    if (made != NULL) {
        Py_INCREF(made);
        Py_XSETREF(*slot, made);
    }
    return made;
}

static PyObject *decode_properties(PyObject *s) {
    PyObject *props = PyDict_New();
    if (props == NULL) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n == 0) return props;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t a = 0;
    for (;;) {
        Py_ssize_t b = a;
        while (b < n && PyUnicode_READ(kind, data, b) != PROPERTY_SEPARATOR) b++;
        Py_ssize_t e = b;
        while (e > a && PyUnicode_READ(kind, data, e - 1) == NAME_VALUE_SEPARATOR) e--;
        Py_ssize_t sep = -1, count = 0;
        for (Py_ssize_t k = a; k < e && count < 2; k++)
            if (PyUnicode_READ(kind, data, k) == NAME_VALUE_SEPARATOR) {
                count++;
                sep = k;
            }
        if (count == 1) {
            PyObject *name = props_part(s, kind, data, a, sep, 1);
            PyObject *value = name != NULL ? props_part(s, kind, data, sep + 1, e, 0) : NULL;
            int rc = value != NULL ? PyDict_SetItem(props, name, value) : -1;
            Py_XDECREF(name);
            Py_XDECREF(value);
            if (rc < 0) {
                Py_DECREF(props);
                return NULL;
            }
        }
        if (b >= n) break;
        a = b + 1;
    }
    return props;
}

PyDoc_STRVAR(decode_message_doc,
             "decode_message(buf, pos, limit, max_message_size, record_cls, host_factory[, check_crc]) -> record | None\n\n"
             "The MessageRecord codec.read_record(buf, pos, limit, max_message_size=..., check_crc=...) would return "
             "(limit None: the buffer's end), built from the buffer in place; bytes fields are copies. "
             "None for anything read_record does not report as MESSAGE: the caller runs it for those.");

/* The record at `pos` of buf[0:end] as decode_message decodes it: a new MessageRecord, a new
 * reference to None where read_record must decide, or NULL with an exception set. */
static PyObject *decode_at(const unsigned char *buf, Py_ssize_t end, Py_ssize_t pos, long long max_size,
                           PyTypeObject *cls, PyObject *host_factory, int check_crc) {
    PyObject *items[MESSAGE_RECORD_FIELDS] = {NULL};

    /* read_record: a header, a message magic code, a size within bounds and the buffer. */
    if (pos < 0 || pos + 8 > end) goto decline;
    const unsigned char *r = buf + pos;
    int32_t total = get_i32(r);
    int32_t magic = get_i32(r + 4);
    if (magic != MESSAGE_MAGIC_CODE && magic != MESSAGE_MAGIC_CODE_V2) goto decline;
    int v2 = magic == MESSAGE_MAGIC_CODE_V2;
    if (total < (v2 ? 92 : 91) || total > max_size || pos + total > end) goto decline;
    const Py_ssize_t rec_end = pos + total;

    /* _decode_message: the fixed part, whose length the host flags set. Where it overruns
     * the record, the body length check below could never pass in Python either. */
    int32_t sys_flag = get_i32(r + 36);
    Py_ssize_t born_len = (sys_flag & BORNHOST_V6_FLAG) ? 16 : 4;
    Py_ssize_t store_len = (sys_flag & STOREHOSTADDRESS_V6_FLAG) ? 16 : 4;
    Py_ssize_t p = pos + 48 + born_len + 12 + store_len + 20;
    if (p > rec_end) goto decline;
    const unsigned char *born = r + 48;
    const unsigned char *store = born + born_len + 12;
    int32_t body_len = get_i32(store + store_len + 16);
    if (body_len < 0 || p + body_len > rec_end) goto decline;
    const unsigned char *body = buf + p;
    p += body_len;
    Py_ssize_t topic_len;
    if (v2) {
        if (p + 2 > rec_end) goto decline;
        topic_len = get_i16(buf + p);
        p += 2;
    } else {
        if (p + 1 > rec_end) goto decline;
        topic_len = (int8_t)buf[p];
        p += 1;
    }
    if (topic_len <= 0 || p + topic_len + 2 > rec_end) goto decline;
    const unsigned char *topic = buf + p;
    p += topic_len;
    Py_ssize_t props_len = get_i16(buf + p);
    p += 2;
    if (props_len < 0 || p + props_len > rec_end) goto decline;
    const unsigned char *props = buf + p;
    /* calMsgLength with the hosts' sizes, as cal_msg_length(..., sys_flag, v2) */
    if ((Py_ssize_t)total != 74 + (born_len + 4) + (store_len + 4) + body_len + (v2 ? 2 : 1) + topic_len + props_len)
        goto decline;
    /* check_crc: read_record's integrity checks. A torn write that kept the body but not the
     * end of the properties passes the CRC; every writer ends properties with \2. */
    if (check_crc && props_len > 0 && props[props_len - 1] != PROPERTY_SEPARATOR) goto decline;
    if (check_crc && body_len > 0) {
        /* A mismatch declines: read_record(check_crc=True) reports it as CORRUPT, with its reason. */
        int32_t crc = 0;
        if (crc31_bytes(body, body_len, &crc) < 0) return NULL;
        if (crc != get_i32(r + 8)) goto decline;
    }

    /* A MESSAGE: the fields of MessageRecord, in its order; stop at the first failure (a
     * host factory must not be called with an exception set). */
#define DECODE_FIELD(k, value) \
    if ((items[k] = (value)) == NULL) goto fail;
    DECODE_FIELD(0, PyLong_FromLong(total))
    DECODE_FIELD(1, PyLong_FromLong(magic))
    DECODE_FIELD(2, PyLong_FromLong(get_i32(r + 8)))
    DECODE_FIELD(3, PyLong_FromLong(get_i32(r + 12)))
    DECODE_FIELD(4, PyLong_FromLong(get_i32(r + 16)))
    DECODE_FIELD(5, PyLong_FromLongLong(get_i64(r + 20)))
    DECODE_FIELD(6, PyLong_FromLongLong(get_i64(r + 28)))
    DECODE_FIELD(7, PyLong_FromLong(sys_flag))
    DECODE_FIELD(8, PyLong_FromLongLong(get_i64(r + 40)))
    DECODE_FIELD(9, decode_host(&decode_born_slot, host_factory, born, born_len, get_i32(born + born_len)))
    DECODE_FIELD(10, PyLong_FromLongLong(get_i64(born + born_len + 4)))
    DECODE_FIELD(11, decode_host(&decode_store_slot, host_factory, store, store_len, get_i32(store + store_len)))
    DECODE_FIELD(12, PyLong_FromLong(get_i32(store + store_len + 4)))
    DECODE_FIELD(13, PyLong_FromLongLong(get_i64(store + store_len + 8)))
    DECODE_FIELD(14, PyBytes_FromStringAndSize((const char *)body, body_len))
    DECODE_FIELD(15, decode_topic(topic, topic_len))
    if (props_len > 0) {
        DECODE_FIELD(16, PyUnicode_DecodeUTF8((const char *)props, props_len, "replace"))
    } else {
        Py_INCREF(empty_str);
        items[16] = empty_str;
    }
    DECODE_FIELD(17, decode_properties(items[16]))
#undef DECODE_FIELD
    return make_fields(cls, items, MESSAGE_RECORD_FIELDS);

decline:
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < MESSAGE_RECORD_FIELDS; k++) Py_XDECREF(items[k]);
    return NULL;
}

static int check_record_args(PyObject *cls_o, PyObject *host_factory) {
    if (!PyType_Check(cls_o) || !PyType_IsSubtype((PyTypeObject *)cls_o, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_cls must be a tuple subclass");
        return -1;
    }
    if (!PyCallable_Check(host_factory)) {
        PyErr_SetString(PyExc_TypeError, "host_factory must be callable");
        return -1;
    }
    return 0;
}

static PyObject *decode_message(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decode_message takes 6 or 7 arguments");
        return NULL;
    }
    int check_crc = 0;
    if (nargs == 7 && (check_crc = PyObject_IsTrue(args[6])) < 0) return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t limit = PY_SSIZE_T_MAX;
    if (args[2] != Py_None) {
        limit = PyLong_AsSsize_t(args[2]);
        if (limit == -1 && PyErr_Occurred()) return NULL;
    }
    long long max_size = PyLong_AsLongLong(args[3]);
    if (max_size == -1 && PyErr_Occurred()) return NULL;
    if (check_record_args(args[4], args[5]) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t end = limit < view.len ? limit : view.len;
    PyObject *record = decode_at((const unsigned char *)view.buf, end, pos, max_size, (PyTypeObject *)args[4],
                                 args[5], check_crc);
    PyBuffer_Release(&view);
    return record;
}

PyDoc_STRVAR(decode_keyed_doc,
             "decode_keyed(buf, pos, limit, max_message_size, record_cls, host_factory, check_crc, topic, key, out) "
             "-> record | None\n\n"
             "decode_message(buf, pos, limit, max_message_size, record_cls, host_factory, check_crc), and the "
             "record appended to `out` when it is one queryMessage asked for: its topic is `topic` and `key` is "
             "its UNIQ_KEY or one of the non-empty space-separated tokens of its KEYS (record.uniq_key == key or "
             "key in record.key_list). None where decode_message declines (nothing appended).");

/* Whether `key` equals one of the non-empty tokens of `keys` split on ' ' (java_split, then
 * the empty tokens dropped, as MessageRecord.key_list). */
static int key_in_tokens(PyObject *keys, PyObject *key) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(keys), klen = PyUnicode_GET_LENGTH(key), a = 0;
    if (klen == 0) return 0;
    while (a < n) {
        Py_ssize_t b = PyUnicode_FindChar(keys, ' ', a, n, 1);
        if (b == -2) return -1;
        if (b < 0) b = n;
        if (b - a == klen) {
            Py_ssize_t same = PyUnicode_Tailmatch(keys, key, a, b, -1);
            if (same != 0) return (int)same;
        }
        a = b + 1;
    }
    return 0;
}

static PyObject *str_prop_keys, *str_prop_uniq_key; /* "KEYS", "UNIQ_KEY" */

/* Whether the decoded `record` is one queryMessage asked for (record.topic == topic and
 * (record.uniq_key == key or key in record.key_list)): 1, 0, or -1 with an exception set. */
static int record_is_keyed(PyObject *record, PyObject *topic, PyObject *key) {
    PyObject *rtopic = PyTuple_GET_ITEM(record, 15), *props = PyTuple_GET_ITEM(record, 17);
    if (rtopic != topic) {
        int same = PyUnicode_Compare(rtopic, topic);
        if (same == -1 && PyErr_Occurred()) return -1;
        if (same != 0) return 0;
    }
    PyObject *uniq = PyDict_GetItemWithError(props, str_prop_uniq_key);
    if (uniq == NULL && PyErr_Occurred()) return -1;
    if (uniq != NULL && PyUnicode_Check(uniq)) {
        int same = PyUnicode_Compare(uniq, key);
        if (same == -1 && PyErr_Occurred()) return -1;
        if (same == 0) return 1;
    }
    PyObject *keys = PyDict_GetItemWithError(props, str_prop_keys);
    if (keys == NULL && PyErr_Occurred()) return -1;
    return keys != NULL && PyUnicode_Check(keys) ? key_in_tokens(keys, key) : 0;
}

/* Whether `record` has a key (its UNIQ_KEY or a KEYS token) whose index hash, as
 * record.topic#key, is `wanted` (reads.key_lost_reason's test): 1, 0, or -1 with an exception set. */
static int record_has_key_hash(PyObject *record, long long wanted) {
    PyObject *rtopic = PyTuple_GET_ITEM(record, 15), *props = PyTuple_GET_ITEM(record, 17);
    uint32_t prefix = jhash_unit(jhash_str(0, rtopic, 0, PyUnicode_GET_LENGTH(rtopic)), '#');
    PyObject *uniq = PyDict_GetItemWithError(props, str_prop_uniq_key);
    if (uniq == NULL && PyErr_Occurred()) return -1;
    if (uniq != NULL && PyUnicode_Check(uniq) &&
        index_key_hash(jhash_str(prefix, uniq, 0, PyUnicode_GET_LENGTH(uniq))) == wanted)
        return 1;
    PyObject *keys = PyDict_GetItemWithError(props, str_prop_keys);
    if (keys == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyUnicode_Check(keys)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(keys), a = 0;
    while (a < n) {
        Py_ssize_t b = PyUnicode_FindChar(keys, ' ', a, n, 1);
        if (b == -2) return -1;
        if (b < 0) b = n;
        if (b > a && index_key_hash(jhash_str(prefix, keys, a, b)) == wanted) return 1;
        a = b + 1;
    }
    return 0;
}

static PyObject *decode_keyed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "decode_keyed takes 10 arguments");
        return NULL;
    }
    PyObject *topic = args[7], *key = args[8], *out = args[9];
    if (!PyUnicode_Check(topic) || !PyUnicode_Check(key) || !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "topic and key must be str and out a list");
        return NULL;
    }
    PyObject *record = decode_message(self, args, 7);
    if (record == NULL || record == Py_None) return record;
    int wanted = record_is_keyed(record, topic, key);
    if (wanted < 0 || (wanted && PyList_Append(out, record) < 0)) {
        Py_DECREF(record);
        return NULL;
    }
    return record;
}

PyDoc_STRVAR(query_keyed_doc,
             "query_keyed(walk, topic, key, max_num, begin, end, select, max_message_size, record_cls, host_factory, "
             "check_crc, out) -> (first_store_timestamp | None, hits, last_update_timestamp, "
             "last_update_phy_offset) | None\n\n"
             "One round of reads.query_messages over a reader's own maps: the index walk of index_query (walk: "
             "IndexReader.walk_args, (bufs, max_hash_slot_num, entries_pos, bound, max_msgs_num_batch)), its "
             "offsets in ascending order, each record found through select(offset, 4) (CommitLogReader.select: "
             "None or (map, position)) and decoded as decode_keyed decodes it, appending to `out` the records "
             "queryMessage asked for. first_store_timestamp: the store time of the first offset's record if it "
             "was readable; hits: how many offsets the index gave. None where index_query or decode_message "
             "would decline, a record lacks the key and every key of its hash (damage: the reference names "
             "it), or a map is closed: the caller runs query_messages, the reference (`out` may hold records "
             "of the round by then).");

static int cmp_offsets(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static PyObject *query_keyed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "query_keyed takes 12 arguments");
        return NULL;
    }
    PyObject *walk = args[0], *topic = args[1], *key = args[2], *select = args[6], *out = args[11];
    if (!PyTuple_Check(walk) || PyTuple_GET_SIZE(walk) != 5 || !PyTuple_Check(PyTuple_GET_ITEM(walk, 0)) ||
        !PyUnicode_Check(topic) || !PyUnicode_Check(key) || !PyCallable_Check(select) || !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "walk must be a 5-tuple of (bufs, ...), topic and key str, select callable "
                                         "and out a list");
        return NULL;
    }
    long long w[5], v[8];
    for (int k = 1; k < 5; k++) {
        w[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(walk, k));
        if (w[k] == -1 && PyErr_Occurred()) return NULL;
    }
    for (int k = 3; k < 6; k++) {
        v[k] = PyLong_AsLongLong(args[k]);
        if (v[k] == -1 && PyErr_Occurred()) return NULL;
    }
    long long max_size = PyLong_AsLongLong(args[7]);
    if (max_size == -1 && PyErr_Occurred()) return NULL;
    int check_crc = PyObject_IsTrue(args[10]);
    if (check_crc < 0 || check_record_args(args[8], args[9]) < 0) return NULL;
    if (w[1] <= 0) {
        PyErr_SetString(PyExc_ValueError, "max_hash_slot_num must be positive");
        return NULL;
    }
    long long max_num = v[3] < w[4] ? v[3] : w[4]; /* IndexReader.query_offset's min(max_num, batch) */
    offset_list found;
    offsets_init(&found);
    long long last_ts, last_phy;
    int walked = index_files_walk(PyTuple_GET_ITEM(walk, 0), topic, key, w[1], w[2], w[3], max_num, v[4], v[5], &found,
                                  &last_ts, &last_phy);
    if (walked <= 0) {
        offsets_free(&found);
        if (walked < 0) return NULL;
        Py_RETURN_NONE;
    }
    qsort(found.v, (size_t)found.n, sizeof found.v[0], cmp_offsets);
    PyObject *first_ts = Py_NewRef(Py_None), *four = PyLong_FromLong(4);
    int ok = four != NULL, declined = 0;
    long long key_hash = index_key_hash(
        jhash_str(jhash_unit(jhash_str(0, topic, 0, PyUnicode_GET_LENGTH(topic)), '#'), key, 0, PyUnicode_GET_LENGTH(key)));
    for (Py_ssize_t k = 0; ok && k < found.n; k++) {
        PyObject *phy = PyLong_FromLongLong(found.v[k]);
        PyObject *call_args[2] = {phy, four};
        PyObject *place = phy != NULL ? PyObject_Vectorcall(select, call_args, 2, NULL) : NULL;
        Py_XDECREF(phy);
        if (place == NULL) {
            ok = 0;
            break;
        }
        if (place == Py_None) { /* record_at: nothing readable there */
            Py_DECREF(place);
            continue;
        }
        Py_ssize_t pos = -1;
        Py_buffer view;
        view.obj = NULL;
        if (!PyTuple_Check(place) || PyTuple_GET_SIZE(place) != 2 ||
            ((pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(place, 1))) == -1 && PyErr_Occurred()) ||
            PyObject_GetBuffer(PyTuple_GET_ITEM(place, 0), &view, PyBUF_SIMPLE) < 0) {
            /* a map closed under the read (or not a map): the reference decides */
            PyErr_Clear();
            Py_DECREF(place);
            declined = 1;
            break;
        }
        PyObject *record = decode_at((const unsigned char *)view.buf, view.len, pos, max_size, (PyTypeObject *)args[8],
                                     args[9], check_crc);
        PyBuffer_Release(&view);
        Py_DECREF(place);
        if (record == NULL) {
            ok = 0;
            break;
        }
        if (record == Py_None) { /* not a record decode_message serves: the reference decides */
            Py_DECREF(record);
            declined = 1;
            break;
        }
        int wanted = record_is_keyed(record, topic, key);
        /* Not the key's record: another key's of the same hash (a collision), or, with no key of
         * that hash, one whose topic or keys changed after it was indexed: the reference names it. */
        int other = wanted == 0 ? record_has_key_hash(record, key_hash) : 0;
        if (wanted == 0 && other == 0) {
            Py_DECREF(record);
            declined = 1;
            break;
        }
        if (k == 0) Py_SETREF(first_ts, Py_NewRef(PyTuple_GET_ITEM(record, 10)));
        if (wanted < 0 || other < 0 || (wanted && PyList_Append(out, record) < 0)) ok = 0;
        Py_DECREF(record);
    }
    Py_XDECREF(four);
    PyObject *answer = NULL;
    if (ok && declined)
        answer = Py_NewRef(Py_None);
    else if (ok)
        answer = Py_BuildValue("(OnLL)", first_ts, found.n, last_ts, last_phy);
    Py_DECREF(first_ts);
    offsets_free(&found);
    return answer;
}

/* ---- decode_units: getMessage's loop over a run of ConsumeQueue units ------------------------ */

#define CQ_UNIT_SIZE 20
#define FILLER_UNIT_SIZE 0x7FFFFFFF
#define DECODE_UNITS_NARGS 21

PyDoc_STRVAR(decode_units_doc,
             "decode_units(units, i, end, buf, seg_start, seg_limit, max_message_size, record_cls, host_factory, "
             "check_crc, topic, queue_id, first_queue_offset, count, total_bytes, max_count, max_total_bytes, head, "
             "in_memory_bytes, limits, out) -> (i, count, total_bytes)\n\n"
             "reads.collect's loop for a get without a tag filter, over units[i:end] (20 bytes each) whose "
             "records lie in the one commitlog segment mapped as buf (its first byte at commitlog offset "
             "seg_start, readable below buf position seg_limit): each record decode_message decodes is "
             "appended to `out`, while it is the (topic, queue_id) record at first_queue_offset + i/20. "
             "Stops before the first unit it leaves to the Python loop: a filler, a record elsewhere or "
             "cut by seg_limit, one decode_message declines or whose queue place differs, or one at which "
             "batch_full holds (max_total_bytes -1: none; limits: (in-memory bytes, in-memory count, "
             "on-disk bytes, on-disk count)). Between records, gives the GIL to threads a Signal woke "
             "(yield_gil).");

static PyObject *decode_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != DECODE_UNITS_NARGS) {
        PyErr_SetString(PyExc_TypeError, "decode_units takes 21 arguments");
        return NULL;
    }
    long long v[DECODE_UNITS_NARGS];
    /* the integer arguments, by position */
    static const int ints[] = {1, 2, 4, 5, 6, 11, 12, 13, 14, 15, 16, 17, 18};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        v[ints[k]] = PyLong_AsLongLong(args[ints[k]]);
        if (v[ints[k]] == -1 && PyErr_Occurred()) return NULL;
    }
    long long i = v[1], end = v[2], seg_start = v[4], seg_limit = v[5], max_size = v[6], queue_id = v[11],
              first_queue_offset = v[12], count = v[13], total_bytes = v[14], max_count = v[15],
              max_total = v[16], head = v[17], in_memory = v[18];
    int check_crc = PyObject_IsTrue(args[9]);
    if (check_crc < 0 || check_record_args(args[7], args[8]) < 0) return NULL;
    PyTypeObject *cls = (PyTypeObject *)args[7];
    PyObject *host_factory = args[8], *topic = args[10], *out = args[20];
    if (!PyUnicode_Check(topic) || !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "topic must be a str and out a list");
        return NULL;
    }
    long long lim[4];
    if (!PyTuple_Check(args[19]) || PyTuple_GET_SIZE(args[19]) != 4) {
        PyErr_SetString(PyExc_TypeError, "limits must be a 4-tuple");
        return NULL;
    }
    for (int k = 0; k < 4; k++) {
        lim[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[19], k));
        if (lim[k] == -1 && PyErr_Occurred()) return NULL;
    }
    Py_buffer units, map;
    if (PyObject_GetBuffer(args[0], &units, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &map, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&units);
        return NULL;
    }
    if (end > units.len) end = units.len;
    if (seg_limit > map.len) seg_limit = map.len;
    const unsigned char *u = (const unsigned char *)units.buf, *buf = (const unsigned char *)map.buf;
    int failed = 0;
    for (; i >= 0 && i + CQ_UNIT_SIZE <= end; i += CQ_UNIT_SIZE) {
        long long phy = get_i64(u + i);
        long long size = get_i32(u + i + 8);
        if (size <= 0 || size == FILLER_UNIT_SIZE) break; /* a filler, or nothing to read */
        long long pos = phy - seg_start;
        if (phy < seg_start || pos + size > seg_limit) break; /* CommitLogReader.select's bounds */
        if (total_bytes != 0 && count != 0) { /* batch_full */
            if (count >= max_count || (max_total >= 0 && total_bytes + size > max_total)) break;
            int in_disk = head - phy > in_memory;
            if (total_bytes + size > lim[in_disk ? 2 : 0] || count > lim[in_disk ? 3 : 1] - 1) break;
        }
        PyObject *record = decode_at(buf, pos + size, pos, max_size, cls, host_factory, check_crc);
        if (record == NULL) {
            failed = 1;
            break;
        }
        if (record == Py_None) {
            Py_DECREF(record);
            break;
        }
        PyObject *qoff = PyTuple_GET_ITEM(record, 5), *qid = PyTuple_GET_ITEM(record, 3),
                 *rtopic = PyTuple_GET_ITEM(record, 15);
        int same = PyLong_AsLongLong(qoff) == first_queue_offset + i / CQ_UNIT_SIZE &&
                   PyLong_AsLongLong(qid) == queue_id &&
                   (rtopic == topic || PyUnicode_Compare(rtopic, topic) == 0);
        if (!same || PyList_Append(out, record) < 0) {
            Py_DECREF(record);
            if (PyErr_Occurred()) failed = 1;
            break;
        }
        Py_DECREF(record);
        count++;
        total_bytes += size;
        if (__atomic_load_n(&woken_awaiting_gil, __ATOMIC_RELAXED) > 0) {
            /* The maps stay exported while the GIL is away: a close() from another thread
             * cannot unmap them under us (CommitLogReader.close tolerates the BufferError). */
            Py_DECREF(yield_gil(NULL, NULL));
        }
    }
    PyBuffer_Release(&map);
    PyBuffer_Release(&units);
    if (failed) return NULL;
    return Py_BuildValue("LLL", i, count, total_bytes);
}
/* ---- end of decode_message ----------------------------------------------------------------- */

PyDoc_STRVAR(check_record_crc_doc,
             "check_record_crc(buf, pos, limit) -> bool | None\n\n"
             "For a V1 record with IPv4 hosts whose lengths agree (as decode_message checks them): "
             "whether it passes read_record's check_crc checks (body CRC, properties ending in \\2), "
             "computed in place. None for anything else: the caller runs read_record(check_crc=True).");

static PyObject *check_record_crc(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "check_record_crc takes 3 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t limit = PY_SSIZE_T_MAX;
    if (args[2] != Py_None) {
        limit = PyLong_AsSsize_t(args[2]);
        if (limit == -1 && PyErr_Occurred()) return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = Py_None;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t end = limit < view.len ? limit : view.len;
    if (pos < 0 || pos + 91 > end) goto done;
    const unsigned char *r = buf + pos;
    int32_t total = get_i32(r);
    if (get_i32(r + 4) != MESSAGE_MAGIC_CODE || total < 91 || pos + total > end) goto done;
    if (get_i32(r + 36) & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) goto done;
    int32_t body_len = get_i32(r + 84);
    if (body_len < 0 || body_len > total - 91) goto done;
    Py_ssize_t topic_len = (int8_t)r[88 + body_len];
    if (topic_len <= 0 || 91 + body_len + topic_len > total) goto done;
    Py_ssize_t props_len = get_i16(r + 89 + body_len + topic_len);
    if (props_len < 0 || total != 91 + body_len + topic_len + props_len) goto done;
    result = Py_True;
    if (props_len > 0 && r[total - 1] != PROPERTY_SEPARATOR) {
        result = Py_False;
    } else if (body_len > 0) {
        int32_t crc = 0;
        if (crc31_bytes(r + 88, body_len, &crc) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (crc != get_i32(r + 8)) result = Py_False;
    }
done:
    PyBuffer_Release(&view);
    Py_INCREF(result);
    return result;
}

/* ==========================================================================================
 * ---- decode_arrow_run: whole Arrow column buffers for the Spark reader ---------------------
 *
 * pipeline/columnar.py's numpy fast path, for a byte range at once: walk the records from
 * `start` and fill the requested columns' Arrow buffers (values, offsets, validity) in one
 * pass, no Python object per row. It takes exactly the records the numpy path takes (V1,
 * IPv4 hosts, lengths that add up, valid UTF-8 topic and properties, properties that are
 * plain name\1value pairs with no repeated name) and, with check_crc, that pass
 * codec.body_crc_mismatch. At the first record it does not take it stops and returns where:
 * the caller hands that record (damage, blanks, V2, IPv6, the schedule topic when tags_code
 * is asked for...) to the reference path, so every odd case keeps one implementation.
 * ========================================================================================== */

#define AR_MAX_PAIRS 256
#define AR_SCHEDULE_TOPIC "SCHEDULE_TOPIC_XXXX"

enum {
    AR_COMMITLOG_OFFSET, AR_SIZE, AR_TOPIC, AR_QUEUE_ID, AR_QUEUE_OFFSET, AR_SYS_FLAG, AR_FLAG,
    AR_BORN_TS, AR_STORE_TS, AR_BORN_HOST, AR_STORE_HOST, AR_RECONSUME, AR_TAGS, AR_KEYS,
    AR_PROPERTIES, AR_BODY, AR_MSG_ID, AR_BODY_CRC, AR_PREPARED, AR_UNIQ_KEY, AR_TAGS_CODE, AR_NCOLS
};

static const char *const ar_names[AR_NCOLS] = {
    "commitlog_offset", "size", "topic", "queue_id", "queue_offset", "sys_flag", "flag",
    "born_timestamp", "store_timestamp", "born_host", "store_host", "reconsume_times", "tags", "keys",
    "properties", "body", "msg_id", "body_crc", "prepared_transaction_offset", "uniq_key", "tags_code",
};

/* A growable byte buffer (PyMem); copied into a bytes object at the end. */
typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
} ar_buf;

static int ar_reserve(ar_buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    unsigned char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int ar_put(ar_buf *b, const void *src, Py_ssize_t n) {
    if (ar_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static inline int ar_put_i32(ar_buf *b, int32_t v) { return ar_put(b, &v, 4); }

static inline int ar_put_i64(ar_buf *b, int64_t v) { return ar_put(b, &v, 8); }

static PyObject *ar_bytes(const ar_buf *b) { return PyBytes_FromStringAndSize((const char *)b->p, b->len); }

/* Strict UTF-8 (what pyarrow's full validation and Python's strict decoder accept): no
 * overlong forms, no surrogates, nothing above U+10FFFF. */
static int ar_utf8_ok(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t k;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            k = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (i + k >= n) return 0; /* truncated sequence */
        for (Py_ssize_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k + 1;
    }
    return 1;
}

/* Java's String.hashCode of valid UTF-8 bytes (decoded to UTF-16 code units). */
static uint32_t ar_jhash_utf8(const unsigned char *p, Py_ssize_t n) {
    uint32_t h = 0;
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            h = 31u * h + c;
            i++;
            continue;
        }
        Py_ssize_t k = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : 3;
        Py_UCS4 cp = c & (k == 1 ? 0x1F : k == 2 ? 0x0F : 0x07);
        for (Py_ssize_t j = 1; j <= k; j++) cp = (cp << 6) | (p[i + j] & 0x3F);
        h = jhash_unit(h, cp);
        i += k + 1;
    }
    return h;
}

typedef struct {
    const unsigned char *name, *value;
    Py_ssize_t name_n, value_n;
} ar_pair;

/* The properties as the numpy path splits them: items by \2 (empty ones dropped), each
 * exactly name\1value with a non-empty value, no name twice. The pair count, or -1 when the
 * record needs the reference parser (Java split semantics). */
static int ar_split_props(const unsigned char *p, Py_ssize_t n, ar_pair *out) {
    int count = 0;
    Py_ssize_t a = 0;
    while (a < n) {
        Py_ssize_t b = a;
        while (b < n && p[b] != PROPERTY_SEPARATOR) b++;
        if (b > a) {
            Py_ssize_t sep = -1;
            for (Py_ssize_t k = a; k < b; k++)
                if (p[k] == NAME_VALUE_SEPARATOR) {
                    if (sep != -1) return -1;
                    sep = k;
                }
            if (sep == -1 || sep == b - 1 || count == AR_MAX_PAIRS) return -1;
            ar_pair pr = {p + a, p + sep + 1, sep - a, b - sep - 1};
            for (int i = 0; i < count; i++)
                if (out[i].name_n == pr.name_n && memcmp(out[i].name, pr.name, (size_t)pr.name_n) == 0) return -1;
            out[count++] = pr;
        }
        a = b + 1;
    }
    return count;
}

static const ar_pair *ar_find(const ar_pair *pairs, int n, const char *name) {
    size_t len = strlen(name);
    for (int i = 0; i < n; i++)
        if ((size_t)pairs[i].name_n == len && memcmp(pairs[i].name, name, len) == 0) return &pairs[i];
    return NULL;
}

/* "a.b.c.d:port" of an IPv4 host's 8 bytes (port signed, as codec reads it). */
static int ar_put_host(ar_buf *b, const unsigned char *h, unsigned char *last, char *text, int *text_n) {
    if (*text_n < 0 || memcmp(last, h, 8) != 0) {
        memcpy(last, h, 8);
        *text_n = snprintf(text, 32, "%u.%u.%u.%u:%d", h[0], h[1], h[2], h[3], (int)get_i32(h + 4));
    }
    return ar_put(b, text, *text_n);
}

typedef struct {
    ar_buf values, offsets, data, validity, pair_offsets, key_offsets, key_data, val_offsets, val_data;
    Py_ssize_t nulls;
} ar_col;

static void ar_col_free(ar_col *c) {
    ar_buf *all[] = {&c->values, &c->offsets, &c->data, &c->validity, &c->pair_offsets,
                     &c->key_offsets, &c->key_data, &c->val_offsets, &c->val_data};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) PyMem_Free(all[i]->p);
}

/* A nullable string value (tags, keys, uniq_key): validity bit, offset, bytes. */
static int ar_put_opt(ar_col *c, Py_ssize_t row, const ar_pair *pr) {
    if (ar_reserve(&c->validity, 1) < 0) return -1;
    if (row % 8 == 0) c->validity.p[c->validity.len++] = 0;
    if (pr != NULL) {
        c->validity.p[row / 8] |= (unsigned char)(1u << (row % 8));
        if (ar_put(&c->data, pr->value, pr->value_n) < 0) return -1;
    } else {
        c->nulls++;
    }
    return ar_put_i32(&c->offsets, (int32_t)c->data.len);
}

PyDoc_STRVAR(decode_arrow_run_doc,
             "decode_arrow_run(buf, start, end, limit, max_message_size, max_rows, max_bytes, check_crc, columns,\n"
             "                 base_offset=-1)\n"
             "    -> (stop, rows, {column: buffers})\n\n"
             "Walk the records from start (before end; none past limit) and build the Arrow buffers of "
             "`columns` for those pipeline.columnar's fast path would decode (and, with check_crc, whose "
             "body CRC and properties terminator pass and, given the segment's base_offset, whose "
             "PHYSICALOFFSET is base_offset + position). Stops at max_rows records, once max_bytes of "
             "records are taken, or at the first record it does not take; `stop` is where the next "
             "step begins. Buffers per column: (values,) for numbers (timestamps in us), (offsets, data) "
             "for strings and binary, (validity or None, offsets, data) for tags/keys/uniq_key, "
             "(pair_offsets, key_offsets, key_data, value_offsets, value_data) for properties; "
             "\"_positions\" holds each record's int64 position. Native byte order, int32 offsets.");

static PyObject *decode_arrow_run(PyObject *self, PyObject *args) {
    PyObject *bufobj, *columns;
    Py_ssize_t start, end, limit, max_rows, max_bytes;
    long long max_size, base = -1;
    int check_crc;
    if (!PyArg_ParseTuple(args, "OnnnLnnpO|L", &bufobj, &start, &end, &limit, &max_size, &max_rows, &max_bytes,
                          &check_crc, &columns, &base))
        return NULL;
    if (start < 0 || end < start || max_rows <= 0 || max_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_arrow_run: need 0 <= start <= end, max_rows > 0, max_bytes > 0");
        return NULL;
    }
    int want[AR_NCOLS] = {0};
    PyObject *seq = PySequence_Fast(columns, "decode_arrow_run: columns must be a sequence of names");
    if (seq == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (name == NULL) {
            Py_DECREF(seq);
            return NULL;
        }
        int found = 0;
        for (int c = 0; c < AR_NCOLS; c++)
            if (strcmp(name, ar_names[c]) == 0) want[c] = found = 1;
        if (!found) {
            PyErr_Format(PyExc_ValueError, "decode_arrow_run: no native column %s", name);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    const int want_props = want[AR_TAGS] || want[AR_KEYS] || want[AR_PROPERTIES] || want[AR_UNIQ_KEY] ||
                           want[AR_TAGS_CODE];
    /* Arrow's offsets are int32: no column's bytes outgrow the records taken (a host is at most
     * 21 bytes, a msgId 32, a record at least 91), so a run stops before 2 GiB of records. */
    const int want_varlen = want[AR_TOPIC] || want[AR_BORN_HOST] || want[AR_STORE_HOST] || want_props ||
                            want[AR_BODY] || want[AR_MSG_ID];

    Py_buffer view;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (limit > view.len) limit = view.len;
    if (end > limit) end = limit;

    PyObject *result = NULL;
    ar_col cols[AR_NCOLS];
    memset(cols, 0, sizeof cols);
    ar_buf positions = {0};
    ar_pair *pairs = PyMem_Malloc(sizeof(ar_pair) * AR_MAX_PAIRS);
    if (pairs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int c = 0; c < AR_NCOLS; c++)
        if (want[c] && (c == AR_TOPIC || c == AR_BORN_HOST || c == AR_STORE_HOST || c == AR_TAGS || c == AR_KEYS ||
                        c == AR_BODY || c == AR_MSG_ID || c == AR_UNIQ_KEY))
            if (ar_put_i32(&cols[c].offsets, 0) < 0) goto done;
    if (want[AR_PROPERTIES] &&
        (ar_put_i32(&cols[AR_PROPERTIES].pair_offsets, 0) < 0 || ar_put_i32(&cols[AR_PROPERTIES].key_offsets, 0) < 0 ||
         ar_put_i32(&cols[AR_PROPERTIES].val_offsets, 0) < 0))
        goto done;

    unsigned char born_last[8], store_last[8];
    char born_text[32], store_text[32];
    int born_n = -1, store_n = -1;
    static const char hex[] = "0123456789ABCDEF";
    Py_ssize_t pos = start, rows = 0;
    while (pos < end && rows < max_rows && pos - start < max_bytes) {
        if (pos + FIXED_V4_LEN > limit) break;
        const unsigned char *r = buf + pos;
        int32_t total = get_i32(r);
        if (get_i32(r + 4) != MESSAGE_MAGIC_CODE || total < FIXED_V4_LEN || total > max_size || pos + total > limit)
            break;
        if (want_varlen && pos - start + total > INT32_MAX) break;
        int32_t sys_flag = get_i32(r + 36);
        if (sys_flag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) break;
        int32_t body_len = get_i32(r + 84);
        if (body_len < 0 || body_len > total - FIXED_V4_LEN) break;
        Py_ssize_t topic_len = (int8_t)r[BODY_POS_V4 + body_len];
        if (topic_len <= 0 || FIXED_V4_LEN + body_len + topic_len > total) break;
        const unsigned char *topic = r + BODY_POS_V4 + body_len + 1;
        Py_ssize_t props_len = get_i16(topic + topic_len);
        if (props_len < 0 || total != FIXED_V4_LEN + body_len + topic_len + props_len) break;
        const unsigned char *props = topic + topic_len + 2;
        if (check_crc) { /* codec.body_crc_mismatch's checks, as check_record_crc makes them */
            if (props_len > 0 && props[props_len - 1] != PROPERTY_SEPARATOR) break;
            if (body_len > 0) {
                int32_t crc = 0;
                if (crc31_bytes(r + BODY_POS_V4, body_len, &crc) < 0) goto done;
                if (crc != get_i32(r + 8)) break;
            }
            /* recovery's other rule: the record's own PHYSICALOFFSET says where it lies */
            if (base >= 0 && get_i64(r + 28) != base + pos) break;
        }
        if ((want[AR_TOPIC] || want[AR_TAGS_CODE]) && !ar_utf8_ok(topic, topic_len)) break;
        int npairs = 0;
        if (want_props) {
            if (!ar_utf8_ok(props, props_len)) break;
            npairs = ar_split_props(props, props_len, pairs);
            if (npairs < 0) break;
            if (want[AR_TAGS_CODE] && topic_len == (Py_ssize_t)strlen(AR_SCHEDULE_TOPIC) &&
                memcmp(topic, AR_SCHEDULE_TOPIC, (size_t)topic_len) == 0)
                break; /* a delayed message's tagsCode is its delivery time: the reference decides */
        }
        /* Taken: append this record's values. */
        if (ar_put_i64(&positions, pos) < 0) goto done;
        for (int c = 0; c < AR_NCOLS; c++) {
            if (!want[c]) continue;
            ar_col *col = &cols[c];
            int rc = 0;
            switch (c) {
            case AR_COMMITLOG_OFFSET: rc = ar_put_i64(&col->values, get_i64(r + 28)); break;
            case AR_SIZE: rc = ar_put_i32(&col->values, total); break;
            case AR_QUEUE_ID: rc = ar_put_i32(&col->values, get_i32(r + 12)); break;
            case AR_QUEUE_OFFSET: rc = ar_put_i64(&col->values, get_i64(r + 20)); break;
            case AR_SYS_FLAG: rc = ar_put_i32(&col->values, sys_flag); break;
            case AR_FLAG: rc = ar_put_i32(&col->values, get_i32(r + 16)); break;
            case AR_BORN_TS: rc = ar_put_i64(&col->values, get_i64(r + 40) * 1000); break;
            case AR_STORE_TS: rc = ar_put_i64(&col->values, get_i64(r + 56) * 1000); break;
            case AR_RECONSUME: rc = ar_put_i32(&col->values, get_i32(r + 72)); break;
            case AR_BODY_CRC: rc = ar_put_i32(&col->values, get_i32(r + 8)); break;
            case AR_PREPARED: rc = ar_put_i64(&col->values, get_i64(r + 76)); break;
            case AR_TAGS_CODE: {
                const ar_pair *t = ar_find(pairs, npairs, "TAGS");
                rc = ar_put_i64(&col->values, t ? (int64_t)(int32_t)ar_jhash_utf8(t->value, t->value_n) : 0);
                break;
            }
            case AR_TOPIC:
                rc = ar_put(&col->data, topic, topic_len) < 0 ? -1 : ar_put_i32(&col->offsets, (int32_t)col->data.len);
                break;
            case AR_BODY: /* the bytes are copied after the walk, into one exact-size buffer */
                rc = ar_put_i32(&col->offsets, (int32_t)(col->data.len += body_len));
                break;
            case AR_BORN_HOST:
                rc = ar_put_host(&col->data, r + 48, born_last, born_text, &born_n) < 0
                         ? -1 : ar_put_i32(&col->offsets, (int32_t)col->data.len);
                break;
            case AR_STORE_HOST:
                rc = ar_put_host(&col->data, r + 64, store_last, store_text, &store_n) < 0
                         ? -1 : ar_put_i32(&col->offsets, (int32_t)col->data.len);
                break;
            case AR_MSG_ID: {
                char id[32];
                for (int i = 0; i < 8; i++) {
                    id[2 * i] = hex[r[64 + i] >> 4], id[2 * i + 1] = hex[r[64 + i] & 15];
                    id[16 + 2 * i] = hex[r[28 + i] >> 4], id[16 + 2 * i + 1] = hex[r[28 + i] & 15];
                }
                rc = ar_put(&col->data, id, 32) < 0 ? -1 : ar_put_i32(&col->offsets, (int32_t)col->data.len);
                break;
            }
            case AR_TAGS: rc = ar_put_opt(col, rows, ar_find(pairs, npairs, "TAGS")); break;
            case AR_KEYS: rc = ar_put_opt(col, rows, ar_find(pairs, npairs, "KEYS")); break;
            case AR_UNIQ_KEY: rc = ar_put_opt(col, rows, ar_find(pairs, npairs, "UNIQ_KEY")); break;
            case AR_PROPERTIES:
                for (int i = 0; i < npairs && rc == 0; i++) {
                    rc = ar_put(&col->key_data, pairs[i].name, pairs[i].name_n) < 0 ||
                                 ar_put_i32(&col->key_offsets, (int32_t)col->key_data.len) < 0 ||
                                 ar_put(&col->val_data, pairs[i].value, pairs[i].value_n) < 0 ||
                                 ar_put_i32(&col->val_offsets, (int32_t)col->val_data.len) < 0
                             ? -1 : 0;
                }
                if (rc == 0) rc = ar_put_i32(&col->pair_offsets, (int32_t)((col->key_offsets.len / 4) - 1));
                break;
            }
            if (rc < 0) goto done;
        }
        rows++;
        pos += total;
    }

    PyObject *out = PyDict_New();
    if (out == NULL) goto done;
    PyObject *pos_bytes = ar_bytes(&positions);
    if (pos_bytes == NULL || PyDict_SetItemString(out, "_positions", pos_bytes) < 0) {
        Py_XDECREF(pos_bytes);
        Py_DECREF(out);
        goto done;
    }
    Py_DECREF(pos_bytes);
    for (int c = 0; c < AR_NCOLS; c++) {
        if (!want[c]) continue;
        ar_col *col = &cols[c];
        PyObject *t = NULL;
        switch (c) {
        case AR_TOPIC: case AR_BORN_HOST: case AR_STORE_HOST: case AR_MSG_ID:
            t = Py_BuildValue("(NN)", ar_bytes(&col->offsets), ar_bytes(&col->data));
            break;
        case AR_BODY: {
            PyObject *data = PyBytes_FromStringAndSize(NULL, col->data.len);
            if (data == NULL) break;
            char *w = PyBytes_AS_STRING(data);
            const int64_t *ps = (const int64_t *)positions.p;
            for (Py_ssize_t i = 0; i < rows; i++) {
                int32_t n = get_i32(buf + ps[i] + 84);
                memcpy(w, buf + ps[i] + BODY_POS_V4, (size_t)n);
                w += n;
            }
            t = Py_BuildValue("(NN)", ar_bytes(&col->offsets), data);
            break;
        }
        case AR_TAGS: case AR_KEYS: case AR_UNIQ_KEY:
            if (col->nulls == 0) {
                t = Py_BuildValue("(ONN)", Py_None, ar_bytes(&col->offsets), ar_bytes(&col->data));
            } else {
                t = Py_BuildValue("(NNN)", ar_bytes(&col->validity), ar_bytes(&col->offsets), ar_bytes(&col->data));
            }
            break;
        case AR_PROPERTIES:
            t = Py_BuildValue("(NNNNN)", ar_bytes(&col->pair_offsets), ar_bytes(&col->key_offsets),
                              ar_bytes(&col->key_data), ar_bytes(&col->val_offsets), ar_bytes(&col->val_data));
            break;
        default:
            t = Py_BuildValue("(N)", ar_bytes(&col->values));
        }
        if (t == NULL || PyDict_SetItemString(out, ar_names[c], t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            goto done;
        }
        Py_DECREF(t);
    }
    result = Py_BuildValue("(nnN)", pos, rows, out);

done:
    for (int c = 0; c < AR_NCOLS; c++) ar_col_free(&cols[c]);
    PyMem_Free(positions.p);
    PyMem_Free(pairs);
    PyBuffer_Release(&view);
    return result;
}

/* ---- end of decode_arrow_run --------------------------------------------------------------- */

/* Records of features mqstore does not implement (storage/foreign.py): 5.x sysflags
 * NEED_UNWRAP (0x40) and INNER_BATCH (0x80), and the INNER_MULTI_QUEUE_OFFSET property a broker
 * writes into a record it multi-dispatched (LMQ). The C walks stop before them;
 * codec.read_dispatch refuses them. */
#define FOREIGN_SYSFLAGS 0xC0
static const char MULTI_DISPATCH_NAME[] = "INNER_MULTI_QUEUE_OFFSET\x01";

/* 1 if an item of the properties starts with the INNER_MULTI_QUEUE_OFFSET name and its separator
 * (conservative: the Python decoder decides whether it parses as that property). */
static int has_multi_dispatch(const unsigned char *props, Py_ssize_t props_len) {
    const Py_ssize_t n = sizeof(MULTI_DISPATCH_NAME) - 1;
    Py_ssize_t a = 0;
    while (a < props_len) {
        if (props_len - a >= n && memcmp(props + a, MULTI_DISPATCH_NAME, n) == 0) return 1;
        const unsigned char *stop = memchr(props + a, PROPERTY_SEPARATOR, props_len - a);
        if (stop == NULL) return 0;
        a = stop - props + 1;
    }
    return 0;
}

/* ---- scan_records: the recovery scan's record walk ----------------------------------------- */

/* Why a run of records ended (storage/scan.py names them). */
enum {
    SCAN_LIMIT = 0,        /* fewer than 8 bytes before the limit */
    SCAN_BUDGET = 1,       /* max_bytes walked: call again from the end */
    SCAN_BLANK = 2,        /* the END_OF_FILE blank record */
    SCAN_ZEROES = 3,       /* a zero header: unwritten space */
    SCAN_BAD_CRC = 4,      /* a well-formed record whose body fails its CRC */
    SCAN_TORN_PROPS = 5,   /* properties that do not end with their separator */
    SCAN_WRONG_OFFSET = 6, /* a record whose physical-offset field says it lies elsewhere */
    SCAN_PAST_LIMIT = 7,   /* a record size that runs past the limit: a torn tail */
    SCAN_OTHER = 8,        /* anything else: the Python decoder says what it is */
};

PyDoc_STRVAR(scan_records_doc,
             "scan_records(buf, pos, limit, file_from_offset, max_message_size, check_crc, check_offset, max_bytes) "
             "-> (end, records, last_store_timestamp, stop)\n\n"
             "Walk consecutive records from pos that codec.read_dispatch's V1/IPv4 path and codec.read_record "
             "both accept as MESSAGE "
             "(with check_crc: body CRC and the properties' last separator; with check_offset: the "
             "physical-offset field equals file_from_offset + position), without the GIL. Returns where "
             "the run ends, how many records it holds, the last one's store timestamp (0 if none) and "
             "why it ended (see the SCAN_* codes); the record at `end` is left to the Python decoder.");

static PyObject *scan_records(PyObject *self, PyObject *args) {
    PyObject *buf_o;
    Py_ssize_t pos, limit, max_bytes;
    long long file_from, max_size;
    int check_crc, check_offset;
    if (!PyArg_ParseTuple(args, "OnnLLppn", &buf_o, &pos, &limit, &file_from, &max_size, &check_crc, &check_offset,
                          &max_bytes))
        return NULL;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must be >= 0");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (limit > view.len) limit = view.len;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t budget_end = max_bytes > 0 && pos <= PY_SSIZE_T_MAX - max_bytes ? pos + max_bytes : PY_SSIZE_T_MAX;
    Py_ssize_t records = 0;
    long long last_ts = 0;
    int stop = SCAN_LIMIT, failed = 0;
    /* Without the carry-less multiply the CRC is zlib's, a Python call: keep the GIL then. */
    int release = !check_crc;
#ifdef CRC_HAVE_CLMUL
    release = release || crc_use_clmul;
#endif
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    while (1) {
        if (pos + 8 > limit) {
            stop = SCAN_LIMIT;
            break;
        }
        if (pos >= budget_end) {
            stop = SCAN_BUDGET;
            break;
        }
        const unsigned char *r = buf + pos;
        int32_t total = get_i32(r), magic = get_i32(r + 4);
        if (magic != MESSAGE_MAGIC_CODE) {
            stop = magic == (int32_t)0xCBD43194 ? SCAN_BLANK : (total == 0 && magic == 0 ? SCAN_ZEROES : SCAN_OTHER);
            break;
        }
        if (total < FIXED_V4_LEN || total > max_size) {
            stop = SCAN_OTHER;
            break;
        }
        if (pos + total > limit) {
            stop = SCAN_PAST_LIMIT;
            break;
        }
        int32_t sys_flag = get_i32(r + 36), body_len = get_i32(r + 84);
        if ((sys_flag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) || body_len < 0 || body_len > total - FIXED_V4_LEN) {
            stop = SCAN_OTHER;
            break;
        }
        const unsigned char *t = r + BODY_POS_V4 + body_len;
        Py_ssize_t tlen = t[0];
        if (tlen == 0 || tlen > 127 || FIXED_V4_LEN + body_len + tlen > total) { /* read_record wants a topic */
            stop = SCAN_OTHER;
            break;
        }
        int16_t props_len = get_i16(t + 1 + tlen);
        if (props_len < 0 || total != FIXED_V4_LEN + body_len + tlen + props_len) {
            stop = SCAN_OTHER;
            break;
        }
        if (check_crc) {
            if (body_len > 0) {
                int32_t crc = 0;
                if (crc31_bytes(r + BODY_POS_V4, body_len, &crc) < 0) {
                    failed = 1;
                    break;
                }
                if (crc != get_i32(r + 8)) {
                    stop = SCAN_BAD_CRC;
                    break;
                }
            }
            if (props_len > 0 && r[total - 1] != PROPERTY_SEPARATOR) {
                stop = SCAN_TORN_PROPS;
                break;
            }
        }
        if (check_offset && get_i64(r + 28) != file_from + (long long)pos) {
            stop = SCAN_WRONG_OFFSET;
            break;
        }
        if ((sys_flag & FOREIGN_SYSFLAGS) || has_multi_dispatch(t + 3 + tlen, props_len)) {
            stop = SCAN_OTHER; /* a foreign feature's record: the Python decoder refuses it */
            break;
        }
        last_ts = get_i64(r + 56);
        records++;
        pos += total;
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    PyBuffer_Release(&view);
    if (failed) return NULL;
    return Py_BuildValue("(nnLi)", pos, records, last_ts, stop);
}

PyDoc_STRVAR(cq_valid_prefix_doc,
             "cq_valid_prefix(data, after=-1) -> (units, last_offset, after)\n\n"
             "How many 20-byte ConsumeQueue units at the start of data are valid (commitlog offset >= 0, "
             "size > 0, and past `after`, the last real unit's offset before them (0 after a filler), "
             "unless a filler unit) "
             "before the first that is not, the commitlog offset of the last of them (-1 if none), and "
             "the last real unit's offset after them: ConsumeQueue.recover's walk, without the GIL. "
             "len(data) must be a multiple of 20.");

static PyObject *cq_valid_prefix(PyObject *self, PyObject *args) {
    PyObject *data;
    long long after = -1;
    if (!PyArg_ParseTuple(args, "O|L", &data, &after)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len % 20 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "data must be a whole number of 20-byte units");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len / 20, units = 0;
    long long last = -1;
    Py_BEGIN_ALLOW_THREADS
    for (; units < n; units++) {
        const unsigned char *u = p + units * 20;
        long long offset = get_i64(u);
        int32_t size = get_i32(u + 8);
        if (offset < 0 || size <= 0) break;
        /* A queue's records lie in log order: a unit at or below the one before it is a torn
           one (review 122 F3: a power loss left (0, 282, 0), which served the log's first
           message at an acknowledged offset). A filler points nowhere. */
        if (!(offset == 0 && size == FILLER_UNIT_SIZE)) {
            if (offset <= after) break;
            after = offset;
        } else if (after < 0) {
            /* After a filler no real unit points at 0: the log's first record is its queue's
               first unit (review 123 F1: a torn (0, 272, 0) after only fillers passed). */
            after = 0;
        }
        last = offset;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(nLL)", units, last, after);
}

PyDoc_STRVAR(find_magic_doc,
             "find_magic(buf, start, stop, limit) -> int\n\n"
             "The first position pos in [start, stop) whose bytes pos+4..pos+8 hold a record's magic code "
             "(message V1 or V2, or the END_OF_FILE blank) with pos + 8 <= limit, or -1: the candidates "
             "commitlog.find_next_valid_record checks, found without the GIL (zeros are skipped a word "
             "at a time, so a zero-filled segment costs a memory read, not a search).");

static PyObject *find_magic(PyObject *self, PyObject *args) {
    PyObject *buf_o;
    Py_ssize_t start, stop, limit;
    if (!PyArg_ParseTuple(args, "Onnn", &buf_o, &start, &stop, &limit)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    if (limit > view.len) limit = view.len;
    if (start < 0) start = 0;
    /* A magic at pos + 4 must end by limit: pos <= limit - 8. */
    if (stop > limit - 7) stop = limit - 7;
    Py_ssize_t found = -1;
    Py_BEGIN_ALLOW_THREADS
    /* Scan the magic's first byte at m = pos + 4 (0xDA: messages, 0xCB: the blank). */
    Py_ssize_t m = start + 4, m_stop = stop + 4;
    while (m < m_stop) {
        if ((m & 7) == 0 && m + 8 <= m_stop) {
            uint64_t word;
            memcpy(&word, b + m, 8);
            if (word == 0) {
                m += 8;
                continue;
            }
        }
        unsigned char c = b[m];
        if (c == 0xDA && b[m + 1] == 0xA3 && b[m + 2] == 0x20 && (b[m + 3] == 0xA7 || b[m + 3] == 0xAB)) {
            found = m - 4;
            break;
        }
        if (c == 0xCB && b[m + 1] == 0xD4 && b[m + 2] == 0x31 && b[m + 3] == 0x94) {
            found = m - 4;
            break;
        }
        m++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
}

PyDoc_STRVAR(tally_records_doc,
             "tally_records(buf, pos, end, records) -> list[(topic: bytes, queue_id, max_queue_offset)]\n\n"
             "For a run scan_records accepted (`records` records from pos to end): per topic and queue, "
             "the largest queue offset of its records that are not PREPARED or ROLLBACK transaction "
             "records, in first-seen order. What crash recovery keeps of each record, without a "
             "Python call per record; the walk runs without the GIL.");

typedef struct {
    const unsigned char *topic; /* into the buffer, valid while the view is held */
    Py_ssize_t topic_len;
    int32_t queue_id;
    long long max_offset;
} tally_entry;

static PyObject *tally_records(PyObject *self, PyObject *args) {
    PyObject *buf_o;
    Py_ssize_t pos, end, records;
    if (!PyArg_ParseTuple(args, "Onnn", &buf_o, &pos, &end, &records)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (end > view.len) end = view.len;
    Py_ssize_t cap = 64, used = 0; /* open addressing, a power of two, at most half full */
    /* PyMem_Raw*: the table grows without the GIL. */
    tally_entry *table = PyMem_RawCalloc((size_t)cap, sizeof(tally_entry));
    Py_ssize_t *order = PyMem_RawMalloc((size_t)cap * sizeof(Py_ssize_t)); /* slot of the n-th key */
    int bad = 0, nomem = table == NULL || order == NULL;
    if (!nomem) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t n = 0; n < records; n++) {
            if (pos < 0 || pos + FIXED_V4_LEN > end) {
                bad = 1;
                break;
            }
            const unsigned char *r = buf + pos;
            int32_t total = get_i32(r), body_len = get_i32(r + 84);
            if (total < FIXED_V4_LEN || pos + total > end || body_len < 0 || body_len > total - FIXED_V4_LEN) {
                bad = 1;
                break;
            }
            int32_t tran = get_i32(r + 36) & TRANSACTION_MASK;
            if (tran != TRANSACTION_PREPARED_TYPE && tran != TRANSACTION_ROLLBACK_TYPE) {
                const unsigned char *t = r + BODY_POS_V4 + body_len;
                Py_ssize_t tlen = t[0];
                if (FIXED_V4_LEN + body_len + tlen > total) {
                    bad = 1;
                    break;
                }
                int32_t queue_id = get_i32(r + 12);
                long long queue_offset = get_i64(r + 20);
                uint32_t h = 2166136261u ^ (uint32_t)queue_id;
                for (Py_ssize_t k = 0; k < tlen; k++) h = (h ^ t[1 + k]) * 16777619u;
                Py_ssize_t slot = (Py_ssize_t)(h & (uint32_t)(cap - 1));
                while (table[slot].topic != NULL &&
                       !(table[slot].queue_id == queue_id && table[slot].topic_len == tlen &&
                         memcmp(table[slot].topic, t + 1, (size_t)tlen) == 0))
                    slot = (slot + 1) & (cap - 1);
                if (table[slot].topic == NULL) {
                    if (2 * (used + 1) > cap) { /* grow, and place this key again */
                        Py_ssize_t ncap = cap * 2;
                        tally_entry *nt = PyMem_RawCalloc((size_t)ncap, sizeof(tally_entry));
                        Py_ssize_t *no = PyMem_RawMalloc((size_t)ncap * sizeof(Py_ssize_t));
                        if (nt == NULL || no == NULL) {
                            PyMem_RawFree(nt);
                            PyMem_RawFree(no);
                            nomem = 1;
                            break;
                        }
                        for (Py_ssize_t i = 0; i < used; i++) {
                            tally_entry *e = &table[order[i]];
                            uint32_t eh = 2166136261u ^ (uint32_t)e->queue_id;
                            for (Py_ssize_t k = 0; k < e->topic_len; k++) eh = (eh ^ e->topic[k]) * 16777619u;
                            Py_ssize_t s2 = (Py_ssize_t)(eh & (uint32_t)(ncap - 1));
                            while (nt[s2].topic != NULL) s2 = (s2 + 1) & (ncap - 1);
                            nt[s2] = *e;
                            no[i] = s2;
                        }
                        PyMem_RawFree(table);
                        PyMem_RawFree(order);
                        table = nt;
                        order = no;
                        cap = ncap;
                        n--; /* this record again, against the new table */
                        continue;
                    }
                    table[slot].topic = t + 1;
                    table[slot].topic_len = tlen;
                    table[slot].queue_id = queue_id;
                    table[slot].max_offset = queue_offset;
                    order[used++] = slot;
                } else if (queue_offset > table[slot].max_offset) {
                    table[slot].max_offset = queue_offset;
                }
            }
            pos += total;
        }
        Py_END_ALLOW_THREADS
    }
    PyObject *out = NULL;
    if (nomem) {
        PyErr_NoMemory();
    } else if (bad) {
        PyErr_SetString(PyExc_ValueError, "tally_records: not a run scan_records accepted");
    } else {
        out = PyList_New(used);
        for (Py_ssize_t i = 0; out != NULL && i < used; i++) {
            tally_entry *e = &table[order[i]];
            PyObject *item = Py_BuildValue("(y#iL)", (const char *)e->topic, e->topic_len, e->queue_id, e->max_offset);
            if (item == NULL) Py_CLEAR(out);
            else PyList_SET_ITEM(out, i, item);
        }
    }
    PyMem_RawFree(table);
    PyMem_RawFree(order);
    PyBuffer_Release(&view);
    return out;
}

/* ---- re-dispatch: lean records and arrivals (issue 18) ------------------------------------ */

/* The spans of one record dispatch_scan decodes in C (a plain V1 record with IPv4 hosts outside
   the schedule topic; anything else is left to the Python decoder). */
typedef struct {
    int32_t total, sys_flag;
    const unsigned char *topic, *keys, *uniq, *tags;
    Py_ssize_t topic_len, keys_n, uniq_n, tags_n, props_len;
} dispatch_spans;

/* 1 and the spans of the record at r (avail bytes readable from it) if it is a plain V1
 * record with IPv4 hosts outside the schedule topic; 0 (d undefined) for anything else. */
static int parse_dispatch_spans(const unsigned char *r, Py_ssize_t avail, long long max_size, const char *schedule,
                                Py_ssize_t schedule_len, dispatch_spans *d) {
    if (avail < 8) return 0;
    int32_t total = get_i32(r);
    if (get_i32(r + 4) != MESSAGE_MAGIC_CODE || total < FIXED_V4_LEN || total > max_size || total > avail) return 0;
    int32_t sys_flag = get_i32(r + 36);
    int32_t body_len = get_i32(r + 84);
    if ((sys_flag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG | FOREIGN_SYSFLAGS)) || body_len < 0 ||
        body_len > total - FIXED_V4_LEN)
        return 0;
    const unsigned char *t = r + BODY_POS_V4 + body_len;
    Py_ssize_t tlen = t[0];
    if (tlen > 127 || FIXED_V4_LEN + body_len + tlen > total) return 0;
    int16_t props_len = get_i16(t + 1 + tlen);
    if (props_len < 0 || total != FIXED_V4_LEN + body_len + tlen + props_len) return 0;
    if (span_is(t + 1, tlen, schedule, schedule_len)) return 0; /* delay levels: the Python path */
    d->total = total;
    d->sys_flag = sys_flag;
    d->topic = t + 1;
    d->topic_len = tlen;
    d->props_len = props_len;
    d->keys = d->uniq = d->tags = NULL;
    d->keys_n = d->uniq_n = d->tags_n = 0;
    const unsigned char *props = t + 3 + tlen;
    /* string2messageProperties: items split on \2; an item splits on \1 into exactly two
     * parts after Java drops trailing empty strings (= stripping trailing \1s). */
    Py_ssize_t a = 0;
    while (a < props_len) {
        const unsigned char *stop = memchr(props + a, PROPERTY_SEPARATOR, props_len - a);
        Py_ssize_t b = stop != NULL ? stop - props : props_len;
        Py_ssize_t e = b;
        while (e > a && props[e - 1] == NAME_VALUE_SEPARATOR) e--;
        /* exactly one \1 in [a, e): memchr, not a byte loop (the properties are most of what
         * a small record's decode reads) */
        const unsigned char *sep = memchr(props + a, NAME_VALUE_SEPARATOR, e - a);
        if (sep != NULL && memchr(sep + 1, NAME_VALUE_SEPARATOR, props + e - (sep + 1)) == NULL) {
            const unsigned char *name = props + a, *value = sep + 1;
            Py_ssize_t name_n = sep - name, value_n = props + e - value;
            if (span_is(name, name_n, "KEYS", 4)) {
                d->keys = value;
                d->keys_n = value_n;
            } else if (span_is(name, name_n, "UNIQ_KEY", 8)) {
                d->uniq = value;
                d->uniq_n = value_n;
            } else if (span_is(name, name_n, "TAGS", 4)) {
                d->tags = value;
                d->tags_n = value_n;
            } else if (span_is(name, name_n, MULTI_DISPATCH_NAME, sizeof(MULTI_DISPATCH_NAME) - 2)) {
                return 0; /* multi-dispatch: the Python decoder refuses it */
            }
        }
        a = b + 1;
    }
    return 1;
}

/* An int for `v`: a new reference to *prev when it holds the same value (consecutive records
 * repeat sizes, tags codes, timestamps and flags), else a new int that replaces *prev. */
static PyObject *reuse_int(PyObject **prev, long long *prev_v, long long v) {
    if (*prev == NULL || *prev_v != v) {
        PyObject *made = PyLong_FromLongLong(v);
        if (made == NULL) return NULL;
        Py_XSETREF(*prev, made);
        *prev_v = v;
    }
    Py_INCREF(*prev);
    return *prev;
}

PyDoc_STRVAR(dispatch_scan_doc,
             "dispatch_scan(buf, pos, limit, max_records, max_message_size, fields_cls, schedule_topic) "
             "-> (list[DispatchFields], pos)\n\n"
             "codec.read_dispatch over consecutive records from pos, while each is a plain V1 record "
             "with IPv4 hosts outside the schedule topic; it stops before the first record it leaves to "
             "the Python decoder (blank, end of data, damage, IPv6, V2, delayed), at limit, or after "
             "max_records. Few objects: equal ints of consecutive records are one object, and "
             "the records are not tracked by the cycle collector (they hold only str, int and None), "
             "so a batch of them does not set off collections that walk them all.");

static PyObject *dispatch_scan(PyObject *self, PyObject *args) {
    PyObject *buf_o, *fields_cls_o;
    Py_ssize_t pos, limit, max_records;
    long long max_size;
    const char *schedule;
    Py_ssize_t schedule_len;
    if (!PyArg_ParseTuple(args, "OnnnLOy#", &buf_o, &pos, &limit, &max_records, &max_size, &fields_cls_o, &schedule,
                          &schedule_len))
        return NULL;
    if (!PyType_Check(fields_cls_o) || !PyType_IsSubtype((PyTypeObject *)fields_cls_o, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "fields_cls must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *fields_cls = (PyTypeObject *)fields_cls_o;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_o, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (limit > view.len) limit = view.len;
    const unsigned char *buf = (const unsigned char *)view.buf;
    PyObject *out = PyList_New(0);
    PyObject *topic = NULL; /* the last topic decoded, reused while records repeat it */
    const unsigned char *topic_bytes = NULL;
    Py_ssize_t topic_len = -1;
    /* the previous record's int fields, by DispatchFields position */
    enum { N_FIELDS = 11 };
    PyObject *prev[N_FIELDS] = {NULL};
    long long prev_v[N_FIELDS] = {0};
    if (out == NULL) goto fail;
    while (pos >= 0 && PyList_GET_SIZE(out) < max_records) {
        dispatch_spans d;
        const unsigned char *r = buf + pos;
        if (!parse_dispatch_spans(r, limit - pos, max_size, schedule, schedule_len, &d)) break;
        if (topic == NULL || d.topic_len != topic_len || memcmp(topic_bytes, d.topic, d.topic_len) != 0) {
            PyObject *decoded = decode_span(d.topic, d.topic_len);
            if (decoded == NULL) goto fail;
            Py_XSETREF(topic, decoded);
            topic_bytes = d.topic;
            topic_len = d.topic_len;
        }
        uint32_t code = 0;
        if (d.tags != NULL && jhash_utf8(d.tags, d.tags_n, &code) < 0) goto fail;
        PyObject *items[N_FIELDS];
        Py_INCREF(topic);
        items[0] = topic;
        items[1] = reuse_int(&prev[1], &prev_v[1], get_i32(r + 12));
        items[2] = PyLong_FromLongLong(get_i64(r + 28));
        items[3] = reuse_int(&prev[3], &prev_v[3], d.total);
        items[4] = reuse_int(&prev[4], &prev_v[4], (int32_t)code);
        items[5] = reuse_int(&prev[5], &prev_v[5], get_i64(r + 56));
        items[6] = PyLong_FromLongLong(get_i64(r + 20));
        if (d.props_len == 0) {
            Py_INCREF(empty_str); /* §8.4: no properties means keys "" */
            items[7] = empty_str;
        } else if (d.keys != NULL) {
            items[7] = decode_span(d.keys, d.keys_n);
        } else {
            Py_INCREF(Py_None);
            items[7] = Py_None;
        }
        if (d.uniq != NULL) {
            items[8] = decode_span(d.uniq, d.uniq_n);
        } else {
            Py_INCREF(Py_None);
            items[8] = Py_None;
        }
        items[9] = reuse_int(&prev[9], &prev_v[9], d.sys_flag);
        items[10] = reuse_int(&prev[10], &prev_v[10], get_i64(r + 76));
        int failed = 0;
        for (int k = 0; k < N_FIELDS; k++) failed |= items[k] == NULL;
        if (failed) {
            for (int k = 0; k < N_FIELDS; k++) Py_XDECREF(items[k]);
            goto fail;
        }
        PyObject *fields = make_fields(fields_cls, items, N_FIELDS);
        if (fields == NULL) goto fail;
        /* Only str, int and None inside: no cycle can run through it (CPython's own collector
         * untracks such tuples too, but only after walking them once per collection). */
        if (PyObject_GC_IsTracked(fields)) PyObject_GC_UnTrack(fields);
        int appended = PyList_Append(out, fields);
        Py_DECREF(fields);
        if (appended < 0) goto fail;
        pos += d.total;
    }
    for (int k = 0; k < N_FIELDS; k++) Py_XDECREF(prev[k]);
    Py_XDECREF(topic);
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", out, pos);
fail:
    for (int k = 0; k < N_FIELDS; k++) Py_XDECREF(prev[k]);
    Py_XDECREF(topic);
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* PyLong_AsLongLong without its detour: for an int past 30 bits (a timestamp, a commitlog
 * offset) CPython 3.11 converts through _PyLong_AsByteArray, a tenth of a dispatcher's time. */
static long long as_long_long(PyObject *v) {
    int overflow = 0;
    long long out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) PyErr_SetString(PyExc_OverflowError, "int too large to convert to a 64-bit integer");
    return out;
}

PyDoc_STRVAR(dispatch_arrivals_doc,
             "dispatch_arrivals(requests) -> list[(topic, queue_id, max_offset, store_timestamp)]\n\n"
             "For each queue of a dispatch batch (DispatchFields in commitlog order), in the order "
             "the queues first appear: the offset after its newest record and that record's store "
             "timestamp. PREPARED and ROLLBACK messages do not count (they get no unit).");

static PyObject *dispatch_arrivals(PyObject *self, PyObject *requests) {
    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *newest = PyDict_New(); /* (topic, queue_id) -> (max_offset, store_timestamp) */
    PyObject *out = NULL;
    PyObject *topic = NULL;          /* the run being gathered: consecutive records of one queue */
    long long qid = 0, max_offset = 0, ts = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (newest == NULL) goto fail;
    for (Py_ssize_t i = 0; i <= n; i++) {
        PyObject *r = NULL, *r_topic = NULL;
        long long r_qid = 0, r_cq = 0, r_ts = 0;
        if (i < n) {
            r = PySequence_Fast_GET_ITEM(seq, i);
            int gets_unit = dispatch_gets_unit(r);
            if (gets_unit < 0) goto fail;
            if (!gets_unit) continue;
            r_topic = PyTuple_GET_ITEM(r, 0);
            r_qid = as_long_long(PyTuple_GET_ITEM(r, 1));
            r_ts = as_long_long(PyTuple_GET_ITEM(r, 5));
            r_cq = as_long_long(PyTuple_GET_ITEM(r, 6));
            if (PyErr_Occurred()) goto fail;
        }
        int same = 0;
        if (r != NULL && topic != NULL && r_qid == qid) {
            same = r_topic == topic ? 1 : PyObject_RichCompareBool(r_topic, topic, Py_EQ);
            if (same < 0) goto fail;
        }
        if (!same && topic != NULL) { /* the run ends: its newest record is the queue's so far */
            PyObject *key = Py_BuildValue("(OL)", topic, qid);
            PyObject *value = key != NULL ? Py_BuildValue("(LL)", max_offset, ts) : NULL;
            int set = value != NULL ? PyDict_SetItem(newest, key, value) : -1;
            Py_XDECREF(key);
            Py_XDECREF(value);
            if (set < 0) goto fail;
            Py_CLEAR(topic);
        }
        if (r == NULL) break;
        if (topic == NULL) {
            Py_INCREF(r_topic);
            topic = r_topic;
            qid = r_qid;
        }
        max_offset = r_cq + 1;
        ts = r_ts;
    }
    out = PyList_New(0);
    if (out == NULL) goto fail;
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(newest, &at, &key, &value)) {
        PyObject *item = PyTuple_Pack(4, PyTuple_GET_ITEM(key, 0), PyTuple_GET_ITEM(key, 1), PyTuple_GET_ITEM(value, 0),
                                      PyTuple_GET_ITEM(value, 1));
        int appended = item != NULL ? PyList_Append(out, item) : -1;
        Py_XDECREF(item);
        if (appended < 0) goto fail;
    }
    Py_DECREF(newest);
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(topic);
    Py_XDECREF(out);
    Py_XDECREF(newest);
    Py_DECREF(seq);
    return NULL;
}

/* ---- module ------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"encode_batch", encode_batch, METH_VARARGS, encode_batch_doc},
    {"append_records", append_records, METH_VARARGS, append_records_doc},
    {"index_put_batch", index_put_batch, METH_VARARGS, index_put_batch_doc},
    {"java_hash", java_hash, METH_O, java_hash_doc},
    {"index_select", (PyCFunction)(void (*)(void))index_select, METH_FASTCALL, index_select_doc},
    {"index_query", (PyCFunction)(void (*)(void))index_query, METH_FASTCALL, index_query_doc},
    {"decode_keyed", (PyCFunction)(void (*)(void))decode_keyed, METH_FASTCALL, decode_keyed_doc},
    {"query_keyed", (PyCFunction)(void (*)(void))query_keyed, METH_FASTCALL, query_keyed_doc},
    {"msync", msync_range, METH_VARARGS, msync_doc},
    {"cq_runs", cq_runs, METH_O, cq_runs_doc},
    /* read path */
    {"decode_message", (PyCFunction)(void (*)(void))decode_message, METH_FASTCALL, decode_message_doc},
    {"check_record_crc", (PyCFunction)(void (*)(void))check_record_crc, METH_FASTCALL, check_record_crc_doc},
    {"decode_units", (PyCFunction)(void (*)(void))decode_units, METH_FASTCALL, decode_units_doc},
    {"crc32", crc32_py, METH_O, crc32_doc},
    {"yield_gil", yield_gil, METH_NOARGS, yield_gil_doc},
    {"post_all", post_all, METH_O, post_all_doc},
    {"woken_awaiting_gil", woken_awaiting_gil_py, METH_NOARGS,
     "woken_awaiting_gil() -> int: threads a Signal woke that wait for the GIL now (for tests)."},
    /* the Spark reader's column builder */
    {"decode_arrow_run", decode_arrow_run, METH_VARARGS, decode_arrow_run_doc},
    /* recovery */
    {"scan_records", scan_records, METH_VARARGS, scan_records_doc},
    {"cq_valid_prefix", cq_valid_prefix, METH_VARARGS, cq_valid_prefix_doc},
    {"find_magic", find_magic, METH_VARARGS, find_magic_doc},
    {"tally_records", tally_records, METH_VARARGS, tally_records_doc},
    /* re-dispatch (issue 18) */
    {"dispatch_scan", dispatch_scan, METH_VARARGS, dispatch_scan_doc},
    {"dispatch_arrivals", dispatch_arrivals, METH_O, dispatch_arrivals_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The store's hot loops in C (see storage/_native.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    crc_table_init();
    pthread_atfork(NULL, NULL, yield_gil_after_fork);
#ifdef CRC_HAVE_CLMUL
    __builtin_cpu_init();
    crc_use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    PyObject *zlib = PyImport_ImportModule("zlib");
    if (zlib == NULL) return NULL;
    crc32_fn = PyObject_GetAttrString(zlib, "crc32");
    Py_DECREF(zlib);
    if (crc32_fn == NULL) return NULL;
    empty_str = PyUnicode_InternFromString("");
#define INTERN(var, text)                            \
    var = PyUnicode_InternFromString(text);          \
    if (var == NULL) return NULL;
    INTERN(str_body, "body")
    INTERN(str_topic, "topic")
    INTERN(str_queue_id, "queue_id")
    INTERN(str_tags, "tags")
    INTERN(str_keys, "keys")
    INTERN(str_properties, "properties")
    INTERN(str_flag, "flag")
    INTERN(str_born_host, "born_host")
    INTERN(str_born_timestamp_ms, "born_timestamp_ms")
    INTERN(str_wait_store_msg_ok, "wait_store_msg_ok")
    INTERN(str_prop_keys, "KEYS")
    INTERN(str_prop_uniq_key, "UNIQ_KEY")
    INTERN(str_message, "message")
    INTERN(str_reply_to, "reply_to")
#undef INTERN
    if (empty_str == NULL) return NULL;
    if (PyType_Ready(&SignalType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&SignalType);
    if (PyModule_AddObject(m, "Signal", (PyObject *)&SignalType) < 0) {
        Py_DECREF(&SignalType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyType_Ready(&PutSubmitterType) < 0 || PyModule_AddObjectRef(m, "PutSubmitter", (PyObject *)&PutSubmitterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
