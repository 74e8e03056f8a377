/* SIGBUS guard for the store's file maps (storage/mapguard.py is its Python face).

A file cut short under its map (another process truncates a segment, a restore tool rewrites
it in place) turns the next access to the lost pages into SIGBUS, and SIGBUS kills the host
process: an embedded store must not do that (the JVM turns the same fault into an
InternalError in the thread that touched the page, and a broker goes on). Here the handler
maps one anonymous zero page over the faulting page of a registered map and returns: the
access is retried and reads zeros (a record that fails its checks, a unit that is empty), a
store lands in memory and never in the file. Each map counts its faults, so its owner learns
of them before it answers a put (the writer refuses: nothing lost is acknowledged) and says
so loudly. A fault anywhere else goes to the handler that was there before (Python's
faulthandler under pytest) or to the default action, exactly as without this module.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* vm.max_map_count defaults to 65530: a process cannot hold more maps than that. */
#define SLOT_BITS 16
#define GUARD_SLOTS ((size_t)1 << SLOT_BITS)

/* What guard() hands out is a token, (generation << SLOT_BITS) | slot: a slot taken again by
   another map has a new generation, so the token of a map that went before (released twice,
   or once by its owner after guard() reclaimed it) names no slot and can neither free nor read
   the new map's. */
typedef struct {
    _Atomic uintptr_t start; /* 0: free */
    _Atomic uintptr_t end;
    _Atomic unsigned long faults;
    unsigned long long generation; /* not read by the handler; changed only under the GIL */
} GuardSlot;

static GuardSlot slots[GUARD_SLOTS];
static _Atomic size_t slots_used; /* the handler scans [0, slots_used) */
static _Atomic unsigned long total_faults;
static size_t free_hint; /* changed only under the GIL */
static uintptr_t page_size;
static struct sigaction previous_action;

/* The thread is inside a handler we chained to: a SIGBUS it raises (to die, as faulthandler
   does after its dump) takes the default action. And the last address whose fault we chained:
   a chained handler that returned without curing it (a disabled faulthandler) is not called
   again for it, so the access dies instead of faulting forever. initial-exec: no lazy TLS
   allocation inside a signal handler. */
static __thread int in_chain __attribute__((tls_model("initial-exec")));
static __thread uintptr_t last_chained __attribute__((tls_model("initial-exec")));

static int previous_is_a_handler(void)
{
    if (previous_action.sa_flags & SA_SIGINFO) {
        return previous_action.sa_sigaction != NULL;
    }
    return previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN;
}

static void call_previous(int signum, siginfo_t *info, void *context)
{
    in_chain = 1;
    if (previous_action.sa_flags & SA_SIGINFO) {
        previous_action.sa_sigaction(signum, info, context);
    } else {
        previous_action.sa_handler(signum);
    }
    in_chain = 0;
}

/* The default action: a fault runs its access again and dies of it; a sent signal is sent
   again. */
static void die_by_default(int signum, int sent)
{
    struct sigaction fallback;
    memset(&fallback, 0, sizeof(fallback));
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    sigaction(signum, &fallback, NULL);
    if (sent) {
        raise(signum);
    }
}

static void on_sigbus(int signum, siginfo_t *info, void *context)
{
    /* si_code > 0: the kernel raised it for an access at si_addr (not kill() or raise()). */
    int sent = info == NULL || info->si_code <= 0;
    if (!sent) {
        uintptr_t address = (uintptr_t)info->si_addr;
        size_t used = atomic_load_explicit(&slots_used, memory_order_acquire);
        for (size_t i = 0; i < used; i++) {
            uintptr_t start = atomic_load_explicit(&slots[i].start, memory_order_acquire);
            uintptr_t end = atomic_load_explicit(&slots[i].end, memory_order_acquire);
            if (start == 0 || address < start || address >= end) {
                continue;
            }
            /* Past a cut every page of the file is gone: zeros from this page to the map's end
               in one call, one region for the map however scattered the reads (a page at a
               time, scattered faults split the map until vm.max_map_count). A page at a time
               where that fails. */
            uintptr_t page = address & ~(page_size - 1);
            uintptr_t map_end = (end + page_size - 1) & ~(page_size - 1);
            void *zeros = mmap((void *)page, map_end - page, PROT_READ | PROT_WRITE,
                               MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (zeros == MAP_FAILED) {
                zeros = mmap((void *)page, page_size, PROT_READ | PROT_WRITE,
                             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            }
            if (zeros == MAP_FAILED) {
                break; /* no memory for the page: the fault stays fatal */
            }
            atomic_fetch_add_explicit(&slots[i].faults, 1, memory_order_release);
            atomic_fetch_add_explicit(&total_faults, 1, memory_order_release);
            return; /* the access runs again, on zeros */
        }
        if (!in_chain && previous_is_a_handler() && address != last_chained) {
            last_chained = address;
            call_previous(signum, info, context);
            return;
        }
        die_by_default(signum, 0);
        return;
    }
    /* Sent: to the handler that was there before, ignored if it was ignored. */
    if (!in_chain && previous_is_a_handler()) {
        call_previous(signum, info, context);
        return;
    }
    if (!in_chain && !(previous_action.sa_flags & SA_SIGINFO) && previous_action.sa_handler == SIG_IGN) {
        return;
    }
    /* Raised by this process at itself with nothing of its own before us: a handler the host set
       in front of us after we were installed (faulthandler.enable() after the store opened) that
       caught a fault, put us back and raised it again to die. Returning lets the access run
       again and fault to us: on a store map it reads zeros, anywhere else it dies as it would
       have. (A SIGBUS a process sends itself on purpose, with no handler, is the cost.) */
    if (!in_chain && info != NULL && info->si_pid == getpid() && (info->si_code == SI_TKILL || info->si_code == SI_USER)) {
        return;
    }
    die_by_default(signum, 1);
}

/* One installer at a time (guard() under the GIL, the watch thread without it): each reads
   what is there and makes it previous_action only if it is not ours. */
static atomic_flag installing = ATOMIC_FLAG_INIT;

/* Ours on SIGBUS, chaining to what is there now if it is not ours already. Called at every
   guard() and by the watch thread: a host that set its own handler after us
   (faulthandler.enable(), signal.signal) gets ours back in front of it. */
static int ensure_installed(void)
{
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0) {
        return -1;
    }
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) {
        return 0;
    }
    while (atomic_flag_test_and_set_explicit(&installing, memory_order_acquire)) {
        sched_yield();
    }
    int result = 0;
    if (sigaction(SIGBUS, NULL, &current) != 0) {
        result = -1;
    } else if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus)) {
        struct sigaction mine;
        memset(&mine, 0, sizeof(mine));
        mine.sa_sigaction = on_sigbus;
        sigemptyset(&mine.sa_mask);
        mine.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        previous_action = current;
        result = sigaction(SIGBUS, &mine, NULL);
    }
    atomic_flag_clear_explicit(&installing, memory_order_release);
    return result;
}

/* The guard goes back in front every WATCH_MS from a thread of its own, which never takes the
   GIL (review 119 F1): a host that set a Python SIGBUS handler after the open, whose C part
   only flags the signal and returns, made an access to a cut store page fault again at once,
   forever, in a thread that held the GIL, so the supervisor's tick that put the guard back
   (a Python thread) never came; with SIG_DFL set there, the fault killed. */
#define WATCH_MS 100
static atomic_int watch_started;

static void *watch(void *unused)
{
    struct timespec pause = {0, WATCH_MS * 1000000L};
    for (;;) {
        nanosleep(&pause, NULL);
        ensure_installed();
    }
    return NULL;
}

static void start_watch(void)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&watch_started, &expected, 1)) {
        return;
    }
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t every, before;
    if (pthread_attr_init(&attr) != 0) {
        atomic_store(&watch_started, 0);
        return;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    /* It takes none of the host's signals: they go to its own threads, as without the store. */
    sigfillset(&every);
    pthread_sigmask(SIG_SETMASK, &every, &before);
    if (pthread_create(&thread, &attr, watch, NULL) != 0) {
        atomic_store(&watch_started, 0); /* no thread now: the next guard() tries again, and the tick still reinstalls */
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    pthread_attr_destroy(&attr);
}

/* A forked child has no watch thread (threads do not survive fork): its next guard() starts one. */
static void watch_gone_in_child(void)
{
    atomic_store(&watch_started, 0);
    atomic_flag_clear(&installing); /* a fork inside the watch thread's install: no one to clear it */
}

PyDoc_STRVAR(guard_doc,
"guard(buffer) -> int\n\n"
"Register a file map (an mmap, writable or not): a fault on it that would be SIGBUS maps a zero\n"
"page there instead and is counted. Returns the map's token for faults() and release(); OSError\n"
"if the handler cannot be installed, RuntimeError when every slot is taken. A slot whose range\n"
"the new map overlaps is released first: that map is gone (two live maps never share an\n"
"address), and a fault on the new one must not be credited to it.");

static PyObject *guard(PyObject *module, PyObject *buffer)
{
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    /* The address is taken and the export released at once: mmap.close() refuses a map with
       exported buffers, and the owner calls release() before it closes the map. */
    uintptr_t start = (uintptr_t)view.buf;
    uintptr_t end = start + (uintptr_t)view.len;
    PyBuffer_Release(&view);
    if (ensure_installed() != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    start_watch();
    size_t used = atomic_load_explicit(&slots_used, memory_order_relaxed);
    /* A slot left by a map that went without release() (its owner never closed it) would take
       this map's faults: the handler credits the first slot that holds the address. */
    for (size_t i = 0; i < used; i++) {
        uintptr_t other = atomic_load_explicit(&slots[i].start, memory_order_relaxed);
        if (other != 0 && other < end && start < atomic_load_explicit(&slots[i].end, memory_order_relaxed)) {
            atomic_store_explicit(&slots[i].start, 0, memory_order_release);
            if (i < free_hint) {
                free_hint = i;
            }
        }
    }
    size_t slot = GUARD_SLOTS;
    for (size_t i = free_hint; i < used; i++) {
        if (atomic_load_explicit(&slots[i].start, memory_order_relaxed) == 0) {
            slot = i;
            break;
        }
    }
    if (slot == GUARD_SLOTS) {
        if (used == GUARD_SLOTS) {
            PyErr_SetString(PyExc_RuntimeError, "every SIGBUS guard slot is taken");
            return NULL;
        }
        slot = used;
    }
    unsigned long long generation = (slots[slot].generation + 1) & (ULLONG_MAX >> SLOT_BITS);
    slots[slot].generation = generation != 0 ? generation : 1; /* 0 is no token's */
    generation = slots[slot].generation;
    atomic_store_explicit(&slots[slot].faults, 0, memory_order_relaxed);
    atomic_store_explicit(&slots[slot].end, end, memory_order_release);
    atomic_store_explicit(&slots[slot].start, start, memory_order_release); /* live from here */
    if (slot == used) {
        atomic_store_explicit(&slots_used, used + 1, memory_order_release);
    }
    free_hint = slot + 1;
    return PyLong_FromUnsignedLongLong((generation << SLOT_BITS) | slot);
}

/* The slot a token names, if it still is that map's: 1, or 0 for a token of a map whose slot
   was taken again since (nothing to release, no faults of its own to read); -1 with an
   exception for something that never was a token. */
static int slot_of(PyObject *arg, size_t *slot)
{
    unsigned long long token = PyLong_AsUnsignedLongLong(arg);
    if (token == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    size_t index = (size_t)(token & (GUARD_SLOTS - 1));
    if (index >= atomic_load_explicit(&slots_used, memory_order_relaxed) || (token >> SLOT_BITS) == 0) {
        PyErr_Format(PyExc_ValueError, "no SIGBUS guard slot %llu", token);
        return -1;
    }
    *slot = index;
    return slots[index].generation == (token >> SLOT_BITS);
}

PyDoc_STRVAR(release_doc,
"release(token) -> None\n\nUnregister a map before it is closed: its address may be reused. A second\n"
"release, or one after guard() reclaimed the slot for a map at the same address, does nothing.");

static PyObject *release(PyObject *module, PyObject *arg)
{
    size_t slot;
    int mine = slot_of(arg, &slot);
    if (mine < 0) {
        return NULL;
    }
    if (mine && atomic_load_explicit(&slots[slot].start, memory_order_relaxed) != 0) {
        atomic_store_explicit(&slots[slot].start, 0, memory_order_release);
        if (slot < free_hint) {
            free_hint = slot;
        }
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(faults_doc,
"faults(token) -> int\n\nPages of this map that faulted (cut from its file) and read zeros since; 0 once\n"
"its slot was taken by another map.");

static PyObject *faults(PyObject *module, PyObject *arg)
{
    size_t slot;
    int mine = slot_of(arg, &slot);
    if (mine < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLong(mine ? atomic_load_explicit(&slots[slot].faults, memory_order_acquire) : 0);
}

PyDoc_STRVAR(held_doc, "held() -> int\n\nSlots registered now (maps guarded and not released).");

static PyObject *held(PyObject *module, PyObject *unused)
{
    size_t used = atomic_load_explicit(&slots_used, memory_order_relaxed), count = 0;
    for (size_t i = 0; i < used; i++) {
        count += atomic_load_explicit(&slots[i].start, memory_order_relaxed) != 0;
    }
    return PyLong_FromSize_t(count);
}

PyDoc_STRVAR(total_faults_doc, "total_faults() -> int\n\nFaults caught on every map since the process started.");

static PyObject *total_faults_py(PyObject *module, PyObject *unused)
{
    return PyLong_FromUnsignedLong(atomic_load_explicit(&total_faults, memory_order_acquire));
}

PyDoc_STRVAR(installed_doc, "installed() -> bool\n\nWhether SIGBUS goes to the guard's handler now.");

static PyObject *installed(PyObject *module, PyObject *unused)
{
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus);
}

PyDoc_STRVAR(reinstall_doc,
"reinstall() -> None\n\n"
"Put the handler back in front if the host set another SIGBUS handler since (the other one is\n"
"chained to). guard() does this, a thread of the guard's own every 100 ms, and the supervisor on its tick.");

static PyObject *reinstall(PyObject *module, PyObject *unused)
{
    if (atomic_load_explicit(&slots_used, memory_order_relaxed) == 0) {
        Py_RETURN_NONE; /* never guarded anything: leave the process's handlers alone */
    }
    if (ensure_installed() != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* args[1] and args[2]: a file's device and inode numbers (os.stat's st_dev, st_ino). */
static int file_identity(PyObject *const *args, unsigned long long *dev, unsigned long long *ino)
{
    *dev = PyLong_AsUnsignedLongLong(args[1]);
    if (*dev == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *ino = PyLong_AsUnsignedLongLong(args[2]);
    if (*ino == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(names_file_doc,
"names_file(path, dev, ino) -> bool\n\n"
"Whether `path` (bytes) names the file of device `dev` and inode `ino`: false once another\n"
"process renamed a file over it, renamed it away, or deleted it. For a mapped file, whose map\n"
"keeps the inode (no other file gets its number meanwhile), with no descriptor kept for it.\n"
"One syscall, no stat results built (the writer asks every pass).");

static PyObject *names_file(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "names_file(path: bytes, dev: int, ino: int)");
        return NULL;
    }
    unsigned long long dev, ino;
    if (file_identity(args, &dev, &ino) != 0) {
        return NULL;
    }
    struct stat named;
    if (stat(PyBytes_AS_STRING(args[0]), &named) != 0) {
        Py_RETURN_FALSE; /* none at the path */
    }
    return PyBool_FromLong((unsigned long long)named.st_dev == dev && (unsigned long long)named.st_ino == ino);
}

PyDoc_STRVAR(drop_descriptor_doc,
"drop_descriptor(map, dev, ino) -> bool\n\n"
"Close the descriptor that CPython's mmap object keeps of its file (a dup, for size() and\n"
"resize(), which the store never calls), once it is checked to be the one of device `dev` and\n"
"inode `ino`: a map then costs no descriptor, as Python 3.13's mmap(trackfd=False) does. The\n"
"object's layout is checked against the interpreter's (its buffer, size and export count seen\n"
"where this expects them) before anything is changed; false, and nothing changed, where it\n"
"does not match, on 3.13 and later (use trackfd=False there), or on another interpreter.");

#if PY_VERSION_HEX < 0x030D0000 && !defined(PYPY_VERSION)
/* The head of Modules/mmapmodule.c's mmap_object on Unix, CPython 3.8 to 3.12. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;
    Py_ssize_t pos;
    off_t offset;
    Py_ssize_t exports;
    int fd;
} mmap_head;
#endif

static PyObject *drop_descriptor(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "drop_descriptor(map: mmap.mmap, dev: int, ino: int)");
        return NULL;
    }
    unsigned long long dev, ino;
    if (file_identity(args, &dev, &ino) != 0) {
        return NULL;
    }
#if PY_VERSION_HEX < 0x030D0000 && !defined(PYPY_VERSION)
    PyObject *map = args[0];
    if (strcmp(Py_TYPE(map)->tp_name, "mmap.mmap") != 0 || Py_TYPE(map)->tp_basicsize < (Py_ssize_t)sizeof(mmap_head)) {
        Py_RETURN_FALSE;
    }
    mmap_head *head = (mmap_head *)map;
    Py_ssize_t exports_before = head->exports;
    Py_buffer view;
    if (PyObject_GetBuffer(map, &view, PyBUF_SIMPLE) < 0) {
        return NULL; /* closed */
    }
    int layout_matches = head->data == (char *)view.buf && head->size == view.len &&
                         head->exports == exports_before + 1;
    PyBuffer_Release(&view);
    if (!layout_matches || head->exports != exports_before) {
        Py_RETURN_FALSE;
    }
    int fd = head->fd;
    struct stat kept;
    if (fd < 0 || fstat(fd, &kept) != 0 || (unsigned long long)kept.st_dev != dev ||
        (unsigned long long)kept.st_ino != ino) {
        Py_RETURN_FALSE;
    }
    head->fd = -1; /* as an anonymous map's: close() and dealloc leave descriptors alone */
    close(fd);
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"drop_descriptor", (PyCFunction)(void (*)(void))drop_descriptor, METH_FASTCALL, drop_descriptor_doc},
    {"names_file", (PyCFunction)(void (*)(void))names_file, METH_FASTCALL, names_file_doc},
    {"reinstall", reinstall, METH_NOARGS, reinstall_doc},
    {"guard", guard, METH_O, guard_doc},
    {"release", release, METH_O, release_doc},
    {"faults", faults, METH_O, faults_doc},
    {"held", held, METH_NOARGS, held_doc},
    {"total_faults", total_faults_py, METH_NOARGS, total_faults_doc},
    {"installed", installed, METH_NOARGS, installed_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_mapguard", "SIGBUS guard for the store's file maps.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__mapguard(void)
{
    page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    pthread_atfork(NULL, NULL, watch_gone_in_child);
    return PyModule_Create(&module_def);
}
