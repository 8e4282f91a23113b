/* Process-shared locks and semaphores in shared memory, on Linux futexes.
 *
 * Every primitive is a few 32-bit words in memory that several processes map (see
 * fiberlite/runtime/shm/arena.py). A holder is named by a *token*: the slot its process
 * was given in that memory (slot << 12) plus the index of its thread (1..4095), so that
 * the memory itself says who holds what. When a process dies, whoever serves the memory
 * calls recover(slot): a lock it held is released, the units of a semaphore it held go
 * back, and a critical section it died in is finished from its journal. Nothing here
 * depends on the dead process having run any code on its way out.
 *
 *   Mutex      word 0: owner token (bit 31: someone may sleep on it); word 16 (the next
 *              cache line, where waiters do not spin): the holder's depth
 *   Semaphore  a short internal mutex (word 0), the value (word 1, slept on), the bound,
 *              the initial value, a journal of the update under way, and a table of
 *              (slot, units held), so that a dead process's units can be given back
 *   Event      word 0: the flag (slept on); word 1: sleepers
 *
 * Blocking calls release the GIL, wait with an absolute CLOCK_MONOTONIC deadline, and
 * run Python's signal handlers when interrupted (a KeyboardInterrupt raised there leaves
 * nothing acquired). Generic word operations (load, store, add, wait, wake) let Python
 * build conditions and barriers on the same memory.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define WAITERS 0x80000000u
#define TOKEN_MASK 0x7fffffffu
#define THREAD_BITS 12
#define THREAD_MASK ((1u << THREAD_BITS) - 1)
#define MAX_SLOT ((TOKEN_MASK >> THREAD_BITS))
#define SPINS 100
#define UNBOUNDED 0xffffffffu
#define HELD 24

static PyObject *NotOwnedError; /* an AssertionError (as multiprocessing) and a RuntimeError (as threading) */
static uint32_t next_thread = 0;
static __thread uint32_t thread_index = 0;
static unsigned long generation = 0; /* bumped in a forked child: older objects refuse */

static inline uint32_t my_thread(void)
{
    if (!thread_index) {
        uint32_t n = __atomic_add_fetch(&next_thread, 1, __ATOMIC_RELAXED);
        thread_index = (n % THREAD_MASK) + 1;
    }
    return thread_index;
}

static inline uint32_t slot_of(uint32_t token) { return (token & TOKEN_MASK) >> THREAD_BITS; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* -- futexes ------------------------------------------------------------------------- */
static int futex_wait(uint32_t *addr, uint32_t expected, const struct timespec *deadline)
{
    long r = syscall(SYS_futex, addr, FUTEX_WAIT_BITSET, expected, deadline, NULL,
                     FUTEX_BITSET_MATCH_ANY);
    return r == -1 ? errno : 0;
}

static void futex_wake(uint32_t *addr, int count)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, count, NULL, NULL, 0);
}

typedef struct {
    int blocking;
    int limited;             /* a deadline applies */
    struct timespec deadline;
} Wait;

/* block and timeout as multiprocessing reads them: a negative timeout is 0, no
 * timeout (None) is no limit, and a non-blocking call does not wait at all. */
static int parse_wait(PyObject *block, PyObject *timeout, Wait *w)
{
    w->blocking = block == NULL ? 1 : PyObject_IsTrue(block);
    if (w->blocking < 0)
        return -1;
    w->limited = 0;
    if (w->blocking && timeout != NULL && timeout != Py_None) {
        double t = PyFloat_AsDouble(timeout);
        if (t == -1.0 && PyErr_Occurred())
            return -1;
        if (t < 0)
            t = 0;
        clock_gettime(CLOCK_MONOTONIC, &w->deadline);
        double whole = (double)(long long)t;
        w->deadline.tv_sec += (time_t)whole;
        w->deadline.tv_nsec += (long)((t - whole) * 1e9);
        if (w->deadline.tv_nsec >= 1000000000L) {
            w->deadline.tv_sec += 1;
            w->deadline.tv_nsec -= 1000000000L;
        }
        w->limited = 1;
    }
    return 0;
}

/* How long a wait on a word looks at it awake before sleeping (0: one CPU, where the
 * thread that changes it could not run meanwhile); set when the module is loaded. */
static long spin_ns = 0;
static int sleep_on(uint32_t *addr, uint32_t expected, Wait *w);
#define SPIN_NS 50000L

/* What the last looks at a word found, per word (a few, by address): a word that did not
 * change while looked at is not looked at for its next 1, 2, 4 ... MAX_SKIPS waits, so
 * a process whose partner answers in hundreds of microseconds (a job on another machine,
 * through the hub) does not keep a CPU busy for nothing. Races between threads only
 * blur the guess. */
#define SPIN_MEMORY 64
#define MAX_SKIPS 64
static struct {
    uintptr_t addr;
    uint32_t skips;   /* waits left that sleep at once */
    uint32_t backoff; /* skips after the next miss */
} spin_memory[SPIN_MEMORY];
static unsigned long looks_awake = 0; /* waits of this process that looked awake */

/* Look at *addr awake for up to spin_ns (the GIL released by the caller): 1 once it is
 * not ``expected``, 0 if it still is. Sleeping and being woken costs more than the
 * microseconds a partner in a ping-pong takes to answer. */
static int changes_soon(uint32_t *addr, uint32_t expected)
{
    struct timespec start, now;
    if (!spin_ns)
        return 0;
    uintptr_t key = (uintptr_t)addr;
    unsigned slot = (unsigned)((key >> 2) ^ (key >> 12)) % SPIN_MEMORY;
    uint32_t skips = __atomic_load_n(&spin_memory[slot].skips, __ATOMIC_RELAXED);
    if (__atomic_load_n(&spin_memory[slot].addr, __ATOMIC_RELAXED) != key) {
        __atomic_store_n(&spin_memory[slot].addr, key, __ATOMIC_RELAXED);
        __atomic_store_n(&spin_memory[slot].backoff, 1, __ATOMIC_RELAXED);
        skips = 0;
    } else if (skips) {
        __atomic_store_n(&spin_memory[slot].skips, skips - 1, __ATOMIC_RELAXED);
        return 0;
    }
    __atomic_add_fetch(&looks_awake, 1, __ATOMIC_RELAXED);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned i = 1;; i++) {
        if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != expected) {
            __atomic_store_n(&spin_memory[slot].backoff, 1, __ATOMIC_RELAXED);
            return 1;
        }
        cpu_relax();
        if (!(i & 63)) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) > spin_ns)
                break;
        }
    }
    uint32_t backoff = __atomic_load_n(&spin_memory[slot].backoff, __ATOMIC_RELAXED);
    if (!backoff)
        backoff = 1;
    __atomic_store_n(&spin_memory[slot].skips, backoff, __ATOMIC_RELAXED);
    __atomic_store_n(&spin_memory[slot].backoff, backoff < MAX_SKIPS ? backoff * 2 : MAX_SKIPS,
                     __ATOMIC_RELAXED);
    return 0;
}

/* As sleep_on, after looking awake first (changes_soon). */
static int watch_then_sleep_on(uint32_t *addr, uint32_t expected, Wait *w)
{
    int changed;
    Py_BEGIN_ALLOW_THREADS
    changed = changes_soon(addr, expected);
    Py_END_ALLOW_THREADS
    return changed ? 1 : sleep_on(addr, expected, w);
}

/* Sleep while *addr == expected (GIL released): 1 woken (look again), 0 the deadline
 * passed, -1 a signal handler raised. */
static int sleep_on(uint32_t *addr, uint32_t expected, Wait *w)
{
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = futex_wait(addr, expected, w->limited ? &w->deadline : NULL);
    Py_END_ALLOW_THREADS
    if (err == ETIMEDOUT)
        return 0;
    if (err == EINTR && PyErr_CheckSignals() < 0)
        return -1;
    return 1;
}

/* -- the lock every primitive is built on -------------------------------------------- */
static inline int try_lock(uint32_t *owner, uint32_t token)
{
    uint32_t expected = 0;
    return __atomic_compare_exchange_n(owner, &expected, token, 0, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
}

/* 1 taken, 0 not (non-blocking, or the deadline passed), -1 exception.
 * dead: a slot whose hold is taken over (0: none). */
static int lock_word(uint32_t *owner, uint32_t token, Wait *w, uint32_t dead)
{
    if (try_lock(owner, token))
        return 1;
    for (int spin = 0; spin < SPINS && w->blocking; spin++) {
        cpu_relax();
        if (__atomic_load_n(owner, __ATOMIC_RELAXED) == 0 && try_lock(owner, token))
            return 1;
    }
    if (w->blocking && spin_ns) { /* still held: look awake a while longer, the GIL released */
        uint32_t held = __atomic_load_n(owner, __ATOMIC_RELAXED);
        if (held) {
            Py_BEGIN_ALLOW_THREADS
            changes_soon(owner, held);
            Py_END_ALLOW_THREADS
        }
    }
    for (;;) {
        uint32_t v = __atomic_load_n(owner, __ATOMIC_RELAXED);
        uint32_t expected = v;
        if (v == 0 || (dead && slot_of(v) == dead)) {
            /* someone else may sleep on it: keep the mark, the release wakes them */
            if (__atomic_compare_exchange_n(owner, &expected, token | (v ? (v & WAITERS) : WAITERS),
                                            0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
                return 1;
            continue;
        }
        if (!w->blocking)
            return 0;
        if (!(v & WAITERS)) {
            if (!__atomic_compare_exchange_n(owner, &expected, v | WAITERS, 0, __ATOMIC_RELAXED,
                                             __ATOMIC_RELAXED))
                continue;
            v |= WAITERS;
        }
        int r = sleep_on(owner, v, w);
        if (r <= 0)
            return r;
    }
}

static inline void unlock_word(uint32_t *owner)
{
    uint32_t old = __atomic_exchange_n(owner, 0, __ATOMIC_RELEASE);
    if (old & WAITERS)
        futex_wake(owner, 1);
}

/* A lock for a moment's bookkeeping: waits as long as it takes, never raises. */
static void lock_briefly(uint32_t *owner, uint32_t token, uint32_t dead)
{
    Wait forever = {1, 0, {0, 0}};
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    while (lock_word(owner, token, &forever, dead) != 1) {
        /* a signal handler raised while waiting: its exception waits for the lock */
        if (type == NULL)
            PyErr_Fetch(&type, &value, &tb);
        else
            PyErr_Clear();
    }
    if (type != NULL)
        PyErr_Restore(type, value, tb);
}

/* -- a view on shared memory --------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    uint32_t *words;
    uint32_t slot;           /* this process's slot in that memory */
    unsigned long generation;
} Shared;

/* the ``size`` bytes at ``offset`` of ``buffer``, as words (``view`` then holds the buffer) */
static uint32_t *words_of(PyObject *buffer, Py_ssize_t offset, Py_ssize_t size, Py_buffer *view)
{
    if (PyObject_GetBuffer(buffer, view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (offset < 0 || offset % 4 || offset + size > view->len) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_SetString(PyExc_ValueError, "offset out of the buffer or not aligned");
        return NULL;
    }
    return (uint32_t *)((char *)view->buf + offset);
}

static int shared_init(Shared *self, PyObject *buffer, Py_ssize_t offset, Py_ssize_t size,
                       unsigned long slot)
{
    if (slot == 0 || slot > MAX_SLOT) {
        PyErr_Format(PyExc_ValueError, "slot %lu out of range", slot);
        return -1;
    }
    self->words = words_of(buffer, offset, size, &self->view);
    if (self->words == NULL)
        return -1;
    self->slot = (uint32_t)slot;
    self->generation = generation;
    return 0;
}

static void shared_dealloc(Shared *self)
{
    if (self->view.obj)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_generation(Shared *self)
{
    if (self->generation != generation) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this primitive was made in the process this one was forked from: "
                        "pass it to the new process (as an argument) instead");
        return -1;
    }
    return 0;
}

static inline uint32_t my_token(Shared *self) { return (self->slot << THREAD_BITS) | my_thread(); }

static PyObject *address(Shared *self, PyObject *unused)
{
    return PyLong_FromVoidPtr(self->words);
}

/* -- Mutex ---------------------------------------------------------------------------- */
typedef struct {
    Shared shared;
    int recursive;
} Mutex;

#define DEPTH 16 /* the word of the holder's depth */
#define MUTEX_BYTES (4 * (DEPTH + 1))

static int Mutex_init(Mutex *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offset", "slot", "recursive", NULL};
    PyObject *buffer;
    Py_ssize_t offset;
    unsigned long slot;
    int recursive = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onk|p", kwlist, &buffer, &offset, &slot, &recursive))
        return -1;
    self->recursive = recursive;
    return shared_init(&self->shared, buffer, offset, MUTEX_BYTES, slot);
}

static PyObject *mutex_acquire_token(Mutex *self, uint32_t token, PyObject *block, PyObject *timeout)
{
    uint32_t *owner = self->shared.words;
    if (self->recursive && (__atomic_load_n(owner, __ATOMIC_RELAXED) & TOKEN_MASK) == token) {
        self->shared.words[DEPTH] += 1;
        Py_RETURN_TRUE;
    }
    if (try_lock(owner, token)) { /* free, as nearly always */
        self->shared.words[DEPTH] = 1;
        Py_RETURN_TRUE;
    }
    Wait w;
    if (parse_wait(block, timeout, &w) < 0)
        return NULL;
    int r = lock_word(owner, token, &w, 0);
    if (r < 0)
        return NULL;
    if (!r)
        Py_RETURN_FALSE;
    self->shared.words[DEPTH] = 1;
    Py_RETURN_TRUE;
}

/* block and timeout, by position or by name, without building a tuple (the hot path) */
static int fast_wait_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                          PyObject **block, PyObject **timeout)
{
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "acquire() takes at most 2 arguments (block, timeout)");
        return -1;
    }
    *block = nargs > 0 ? args[0] : NULL;
    *timeout = nargs > 1 ? args[1] : NULL;
    Py_ssize_t count = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "block") == 0 && !*block)
            *block = args[nargs + i];
        else if (PyUnicode_CompareWithASCIIString(name, "timeout") == 0 && !*timeout)
            *timeout = args[nargs + i];
        else {
            PyErr_Format(PyExc_TypeError, "acquire() got an unexpected keyword argument '%U'", name);
            return -1;
        }
    }
    return 0;
}

static PyObject *Mutex_acquire(Mutex *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *block, *timeout;
    if (fast_wait_args(args, nargs, kwnames, &block, &timeout) < 0 || check_generation(&self->shared) < 0)
        return NULL;
    return mutex_acquire_token(self, my_token(&self->shared), block, timeout);
}

static PyObject *mutex_release_token(Mutex *self, uint32_t token)
{
    uint32_t *owner = self->shared.words;
    uint32_t held = __atomic_load_n(owner, __ATOMIC_RELAXED) & TOKEN_MASK;
    if (self->recursive) {
        if (held != token) {
            PyErr_SetString(NotOwnedError, "attempt to release recursive lock not owned by thread");
            return NULL;
        }
        if (--self->shared.words[DEPTH] > 0)
            Py_RETURN_NONE;
    } else if (!held) {
        PyErr_SetString(PyExc_ValueError, "semaphore or lock released too many times");
        return NULL;
    }
    self->shared.words[DEPTH] = 0;
    unlock_word(owner);
    Py_RETURN_NONE;
}

static PyObject *Mutex_release(Mutex *self, PyObject *unused)
{
    if (check_generation(&self->shared) < 0)
        return NULL;
    return mutex_release_token(self, my_token(&self->shared));
}

static PyObject *Mutex_enter(Mutex *self, PyObject *unused)
{
    if (check_generation(&self->shared) < 0)
        return NULL;
    return mutex_acquire_token(self, my_token(&self->shared), NULL, NULL);
}

static PyObject *Mutex_exit(Mutex *self, PyObject *args)
{
    return Mutex_release(self, NULL);
}

/* acquire_as(token, block=True, timeout=None): acquire for another process's thread */
static PyObject *Mutex_acquire_as(Mutex *self, PyObject *args)
{
    unsigned long token;
    PyObject *block = NULL, *timeout = NULL;
    if (!PyArg_ParseTuple(args, "k|OO", &token, &block, &timeout))
        return NULL;
    return mutex_acquire_token(self, (uint32_t)token & TOKEN_MASK, block, timeout);
}

static PyObject *Mutex_release_as(Mutex *self, PyObject *args)
{
    unsigned long token;
    if (!PyArg_ParseTuple(args, "k", &token))
        return NULL;
    return mutex_release_token(self, (uint32_t)token & TOKEN_MASK);
}

/* release_save(token=this thread's): release the holder's hold at any depth (a
 * condition's wait); the depth */
static PyObject *mutex_release_save(Mutex *self, uint32_t token)
{
    if ((__atomic_load_n(self->shared.words, __ATOMIC_RELAXED) & TOKEN_MASK) != token) {
        PyErr_SetString(NotOwnedError, "cannot wait on un-acquired lock");
        return NULL;
    }
    uint32_t depth = self->shared.words[DEPTH];
    self->shared.words[DEPTH] = 0;
    unlock_word(self->shared.words);
    return PyLong_FromUnsignedLong(depth);
}

/* take the lock again at ``depth``, however long it takes; a signal handler that raises
 * meanwhile has its exception raised once the lock is held */
static PyObject *mutex_acquire_restore(Mutex *self, uint32_t token, unsigned long depth)
{
    lock_briefly(self->shared.words, token, 0);
    self->shared.words[DEPTH] = (uint32_t)depth;
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Mutex_release_save(Mutex *self, PyObject *args)
{
    unsigned long token = 0;
    if (!PyArg_ParseTuple(args, "|k", &token))
        return NULL;
    return mutex_release_save(self, token ? (uint32_t)token & TOKEN_MASK : my_token(&self->shared));
}

static PyObject *Mutex_acquire_restore(Mutex *self, PyObject *args)
{
    unsigned long depth, token = 0;
    if (!PyArg_ParseTuple(args, "k|k", &depth, &token))
        return NULL;
    return mutex_acquire_restore(self, token ? (uint32_t)token & TOKEN_MASK : my_token(&self->shared), depth);
}

static PyObject *Mutex_owner(Mutex *self, PyObject *unused)
{
    return PyLong_FromUnsignedLong(__atomic_load_n(self->shared.words, __ATOMIC_ACQUIRE) & TOKEN_MASK);
}

static PyObject *Mutex_depth(Mutex *self, PyObject *unused)
{
    return PyLong_FromUnsignedLong(self->shared.words[DEPTH]);
}

static PyObject *Mutex_is_mine(Mutex *self, PyObject *unused)
{
    return PyBool_FromLong((__atomic_load_n(self->shared.words, __ATOMIC_RELAXED) & TOKEN_MASK)
                           == my_token(&self->shared));
}

static PyObject *Mutex_token(Mutex *self, PyObject *unused)
{
    return PyLong_FromUnsignedLong(my_token(&self->shared));
}

/* recover(slot): release the lock if a thread of that (dead) process holds it */
static PyObject *Mutex_recover(Mutex *self, PyObject *arg)
{
    unsigned long dead = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return NULL;
    uint32_t *owner = self->shared.words;
    for (;;) {
        uint32_t v = __atomic_load_n(owner, __ATOMIC_ACQUIRE);
        if (!v || slot_of(v) != dead)
            Py_RETURN_FALSE;
        uint32_t expected = v;
        if (__atomic_compare_exchange_n(owner, &expected, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            self->shared.words[DEPTH] = 0;
            if (v & WAITERS)
                futex_wake(owner, 1);
            Py_RETURN_TRUE;
        }
    }
}

static PyMethodDef Mutex_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Mutex_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(block=True, timeout=None) -> bool"},
    {"release", (PyCFunction)Mutex_release, METH_NOARGS, "release()"},
    {"__enter__", (PyCFunction)Mutex_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Mutex_exit, METH_VARARGS, NULL},
    {"acquire_as", (PyCFunction)Mutex_acquire_as, METH_VARARGS,
     "acquire_as(token, block=True, timeout=None): acquire for the holder named by token"},
    {"release_as", (PyCFunction)Mutex_release_as, METH_VARARGS, "release_as(token)"},
    {"release_save", (PyCFunction)Mutex_release_save, METH_VARARGS,
     "release_save(token=the calling thread's): release that hold at any depth; the depth"},
    {"acquire_restore", (PyCFunction)Mutex_acquire_restore, METH_VARARGS,
     "acquire_restore(depth, token=the calling thread's): hold it again, however long it takes"},
    {"owner", (PyCFunction)Mutex_owner, METH_NOARGS, "the holder's token (0: free)"},
    {"depth", (PyCFunction)Mutex_depth, METH_NOARGS, "how many times the holder holds it"},
    {"is_mine", (PyCFunction)Mutex_is_mine, METH_NOARGS, "whether the calling thread holds it"},
    {"token", (PyCFunction)Mutex_token, METH_NOARGS, "the calling thread's token"},
    {"recover", (PyCFunction)Mutex_recover, METH_O, "recover(slot): release a dead process's hold"},
    {"address", (PyCFunction)address, METH_NOARGS, "the address of word 0"},
    {NULL}};

static PyTypeObject MutexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fiberlite.runtime.shm._sync.Mutex",
    .tp_basicsize = sizeof(Mutex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Mutex(buffer, offset, slot, recursive=False): a lock in shared memory",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Mutex_init,
    .tp_dealloc = (destructor)shared_dealloc,
    .tp_methods = Mutex_methods,
};

/* -- Semaphore ------------------------------------------------------------------------- */
enum { S_META, S_VALUE, S_MAX, S_INITIAL, S_SLEEPERS, S_J_VALID, S_J_VALUE, S_J_INDEX,
       S_J_SLOT, S_J_COUNT, S_HELD = 16 };
#define SEMAPHORE_WORDS (S_HELD + 2 * HELD)

typedef struct {
    Shared shared;
} Semaphore;

static int Semaphore_init(Semaphore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offset", "slot", NULL};
    PyObject *buffer;
    Py_ssize_t offset;
    unsigned long slot;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onk", kwlist, &buffer, &offset, &slot))
        return -1;
    return shared_init(&self->shared, buffer, offset, SEMAPHORE_WORDS * 4, slot);
}

/* the journal: the update under way, applied again by whoever finds it valid */
static void apply_journal(uint32_t *s)
{
    __atomic_store_n(&s[S_VALUE], s[S_J_VALUE], __ATOMIC_RELAXED);
    uint32_t index = s[S_J_INDEX];
    if (index < HELD) {
        s[S_HELD + 2 * index] = s[S_J_COUNT] ? s[S_J_SLOT] : 0;
        s[S_HELD + 2 * index + 1] = s[S_J_COUNT];
    }
    __atomic_store_n(&s[S_J_VALID], 0, __ATOMIC_RELEASE);
}

static void commit(uint32_t *s, uint32_t value, uint32_t index, uint32_t slot, uint32_t count)
{
    s[S_J_VALUE] = value;
    s[S_J_INDEX] = index;
    s[S_J_SLOT] = slot;
    s[S_J_COUNT] = count;
    __atomic_store_n(&s[S_J_VALID], 1, __ATOMIC_RELEASE);
    apply_journal(s);
}

/* the table entry of ``slot`` (or a free one when ``claim``); HELD: none */
static uint32_t held_index(uint32_t *s, uint32_t slot, int claim)
{
    uint32_t free_index = HELD;
    for (uint32_t i = 0; i < HELD; i++) {
        uint32_t who = s[S_HELD + 2 * i], count = s[S_HELD + 2 * i + 1];
        if (count && who == slot)
            return i;
        if (!count && free_index == HELD)
            free_index = i;
    }
    return claim ? free_index : HELD;
}

static void enter_meta(uint32_t *s, uint32_t token, uint32_t dead)
{
    lock_briefly(&s[S_META], token, dead);
    if (__atomic_load_n(&s[S_J_VALID], __ATOMIC_ACQUIRE))
        apply_journal(s); /* its writer died in the middle */
}

static PyObject *semaphore_acquire_slot(Semaphore *self, uint32_t slot, PyObject *block, PyObject *timeout)
{
    uint32_t *s = self->shared.words;
    uint32_t token = my_token(&self->shared);
    Wait w;
    if (parse_wait(block, timeout, &w) < 0)
        return NULL;
    for (int spin = 0;; spin++) {
        if (__atomic_load_n(&s[S_VALUE], __ATOMIC_RELAXED)) {
            enter_meta(s, token, 0);
            uint32_t value = s[S_VALUE];
            if (value) {
                uint32_t index = held_index(s, slot, 1);
                uint32_t count = 0;
                if (index < HELD) {
                    count = s[S_HELD + 2 * index + 1] + 1;
                    if (count > s[S_INITIAL])
                        count = s[S_INITIAL];
                    if (!count)
                        index = HELD; /* nothing to give back: not recorded */
                }
                commit(s, value - 1, index, slot, count);
                unlock_word(&s[S_META]);
                Py_RETURN_TRUE;
            }
            unlock_word(&s[S_META]);
        }
        if (!w.blocking)
            Py_RETURN_FALSE;
        if (spin < SPINS) {
            cpu_relax();
            continue;
        }
        __atomic_add_fetch(&s[S_SLEEPERS], 1, __ATOMIC_SEQ_CST);
        int r = sleep_on(&s[S_VALUE], 0, &w);
        __atomic_sub_fetch(&s[S_SLEEPERS], 1, __ATOMIC_SEQ_CST);
        if (r < 0)
            return NULL;
        if (r == 0)
            Py_RETURN_FALSE;
    }
}

static PyObject *Semaphore_acquire(Semaphore *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    PyObject *block, *timeout;
    if (fast_wait_args(args, nargs, kwnames, &block, &timeout) < 0 || check_generation(&self->shared) < 0)
        return NULL;
    return semaphore_acquire_slot(self, self->shared.slot, block, timeout);
}

static PyObject *semaphore_release_slot(Semaphore *self, uint32_t slot)
{
    uint32_t *s = self->shared.words;
    enter_meta(s, my_token(&self->shared), 0);
    uint32_t value = s[S_VALUE];
    if (s[S_MAX] != UNBOUNDED && value >= s[S_MAX]) {
        unlock_word(&s[S_META]);
        PyErr_SetString(PyExc_ValueError, "semaphore or lock released too many times");
        return NULL;
    }
    uint32_t index = held_index(s, slot, 0);
    uint32_t count = index < HELD ? s[S_HELD + 2 * index + 1] - 1 : 0;
    commit(s, value + 1, index, slot, count);
    unlock_word(&s[S_META]);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the value is out before the sleepers are read */
    if (__atomic_load_n(&s[S_SLEEPERS], __ATOMIC_SEQ_CST))
        futex_wake(&s[S_VALUE], 1);
    Py_RETURN_NONE;
}

static PyObject *Semaphore_release(Semaphore *self, PyObject *unused)
{
    if (check_generation(&self->shared) < 0)
        return NULL;
    return semaphore_release_slot(self, self->shared.slot);
}

static PyObject *Semaphore_enter(Semaphore *self, PyObject *unused)
{
    if (check_generation(&self->shared) < 0)
        return NULL;
    return semaphore_acquire_slot(self, self->shared.slot, NULL, NULL);
}

static PyObject *Semaphore_exit(Semaphore *self, PyObject *args)
{
    return Semaphore_release(self, NULL);
}

static PyObject *Semaphore_acquire_as(Semaphore *self, PyObject *args)
{
    unsigned long slot;
    PyObject *block = NULL, *timeout = NULL;
    if (!PyArg_ParseTuple(args, "k|OO", &slot, &block, &timeout))
        return NULL;
    return semaphore_acquire_slot(self, (uint32_t)slot, block, timeout);
}

static PyObject *Semaphore_release_as(Semaphore *self, PyObject *args)
{
    unsigned long slot;
    if (!PyArg_ParseTuple(args, "k", &slot))
        return NULL;
    return semaphore_release_slot(self, (uint32_t)slot);
}

static PyObject *Semaphore_get_value(Semaphore *self, PyObject *unused)
{
    return PyLong_FromUnsignedLong(__atomic_load_n(&self->shared.words[S_VALUE], __ATOMIC_ACQUIRE));
}

/* recover(slot): give back the units the dead process held (and finish its update) */
static PyObject *Semaphore_recover(Semaphore *self, PyObject *arg)
{
    unsigned long dead = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return NULL;
    uint32_t *s = self->shared.words;
    enter_meta(s, my_token(&self->shared), (uint32_t)dead);
    uint32_t index = held_index(s, (uint32_t)dead, 0);
    uint32_t back = 0;
    if (index < HELD) {
        back = s[S_HELD + 2 * index + 1];
        uint32_t value = s[S_VALUE];
        if (s[S_MAX] != UNBOUNDED && value + back > s[S_MAX])
            back = s[S_MAX] > value ? s[S_MAX] - value : 0;
        commit(s, value + back, index, 0, 0);
    }
    unlock_word(&s[S_META]);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (back && __atomic_load_n(&s[S_SLEEPERS], __ATOMIC_SEQ_CST))
        futex_wake(&s[S_VALUE], (int)back);
    return PyLong_FromUnsignedLong(back);
}

static PyObject *Semaphore_setup(PyObject *unused, PyObject *args)
{
    /* setup(buffer, offset, value, maxvalue): lay out a new semaphore (maxvalue -1: unbounded) */
    PyObject *buffer;
    Py_ssize_t offset;
    unsigned long value;
    long long maxvalue;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "OnkL", &buffer, &offset, &value, &maxvalue))
        return NULL;
    uint32_t *s = words_of(buffer, offset, SEMAPHORE_WORDS * 4, &view);
    if (s == NULL)
        return NULL;
    memset(s, 0, SEMAPHORE_WORDS * 4);
    s[S_VALUE] = (uint32_t)value;
    s[S_MAX] = maxvalue < 0 ? UNBOUNDED : (uint32_t)maxvalue;
    s[S_INITIAL] = (uint32_t)value;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef Semaphore_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Semaphore_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(block=True, timeout=None) -> bool"},
    {"release", (PyCFunction)Semaphore_release, METH_NOARGS, "release()"},
    {"__enter__", (PyCFunction)Semaphore_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Semaphore_exit, METH_VARARGS, NULL},
    {"acquire_as", (PyCFunction)Semaphore_acquire_as, METH_VARARGS,
     "acquire_as(slot, block=True, timeout=None): acquire for the process of that slot"},
    {"release_as", (PyCFunction)Semaphore_release_as, METH_VARARGS, "release_as(slot)"},
    {"get_value", (PyCFunction)Semaphore_get_value, METH_NOARGS, "the value"},
    {"recover", (PyCFunction)Semaphore_recover, METH_O,
     "recover(slot): give back what a dead process held; how many units"},
    {"address", (PyCFunction)address, METH_NOARGS, "the address of word 0"},
    {NULL}};

static PyTypeObject SemaphoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fiberlite.runtime.shm._sync.Semaphore",
    .tp_basicsize = sizeof(Semaphore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Semaphore(buffer, offset, slot): a counting semaphore in shared memory",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Semaphore_init,
    .tp_dealloc = (destructor)shared_dealloc,
    .tp_methods = Semaphore_methods,
};

/* -- words ---------------------------------------------------------------------------- */
static uint32_t *word_at(PyObject *address)
{
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    if (p == NULL || ((uintptr_t)p & 3)) {
        PyErr_SetString(PyExc_ValueError, "not the address of a word");
        return NULL;
    }
    return (uint32_t *)p;
}

static PyObject *w_load(PyObject *m, PyObject *address)
{
    uint32_t *w = word_at(address);
    return w ? PyLong_FromUnsignedLong(__atomic_load_n(w, __ATOMIC_SEQ_CST)) : NULL;
}

static PyObject *w_store(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store(address, value)");
        return NULL;
    }
    uint32_t *w = word_at(args[0]);
    unsigned long v = PyLong_AsUnsignedLong(args[1]);
    if (!w || PyErr_Occurred())
        return NULL;
    __atomic_store_n(w, (uint32_t)v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *w_add(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(address, delta)");
        return NULL;
    }
    uint32_t *w = word_at(args[0]);
    long d = PyLong_AsLong(args[1]);
    if (!w || PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLong(__atomic_fetch_add(w, (uint32_t)d, __ATOMIC_SEQ_CST));
}

/* wait(address, expected, timeout=None): sleep while the word is ``expected``; False
 * once the timeout passed, True when woken or the word differs */
static PyObject *w_wait(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "wait(address, expected, timeout=None)");
        return NULL;
    }
    uint32_t *w = word_at(args[0]);
    unsigned long expected = PyLong_AsUnsignedLong(args[1]);
    if (!w || PyErr_Occurred())
        return NULL;
    Wait wait;
    if (parse_wait(NULL, nargs == 3 ? args[2] : NULL, &wait) < 0)
        return NULL;
    int r = watch_then_sleep_on(w, (uint32_t)expected, &wait);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

/* set_and_wake(address, value, sleepers_address): store, then wake every sleeper if the
 * count at sleepers_address says there may be one */
static PyObject *w_set_and_wake(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_and_wake(address, value, sleepers_address)");
        return NULL;
    }
    uint32_t *w = word_at(args[0]);
    unsigned long v = PyLong_AsUnsignedLong(args[1]);
    uint32_t *sleepers = word_at(args[2]);
    if (!w || !sleepers || PyErr_Occurred())
        return NULL;
    __atomic_store_n(w, (uint32_t)v, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST))
        futex_wake(w, INT_MAX);
    Py_RETURN_NONE;
}

/* wait_while(address, value, sleepers_address, timeout=None): sleep while the word is
 * ``value``, counted among the sleepers; the word's value at the end */
static PyObject *w_wait_while(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "wait_while(address, value, sleepers_address, timeout=None)");
        return NULL;
    }
    uint32_t *w = word_at(args[0]);
    unsigned long v = PyLong_AsUnsignedLong(args[1]);
    uint32_t *sleepers = word_at(args[2]);
    if (!w || !sleepers || PyErr_Occurred())
        return NULL;
    Wait wait;
    if (parse_wait(NULL, nargs == 4 ? args[3] : NULL, &wait) < 0)
        return NULL;
    uint32_t now;
    while ((now = __atomic_load_n(w, __ATOMIC_SEQ_CST)) == (uint32_t)v) {
        __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
        int r = watch_then_sleep_on(w, (uint32_t)v, &wait);
        __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
        if (r < 0)
            return NULL;
        if (r == 0) {
            now = __atomic_load_n(w, __ATOMIC_SEQ_CST);
            break;
        }
    }
    return PyLong_FromUnsignedLong(now);
}

static PyObject *w_wake(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wake(address, count)");
        return NULL;
    }
    uint32_t *w = word_at(args[0]);
    long n = PyLong_AsLong(args[1]);
    if (!w || PyErr_Occurred())
        return NULL;
    futex_wake(w, n < 0 || n > INT_MAX ? INT_MAX : (int)n);
    Py_RETURN_NONE;
}

static PyObject *w_looks_awake(PyObject *m, PyObject *unused)
{
    return PyLong_FromUnsignedLong(__atomic_load_n(&looks_awake, __ATOMIC_RELAXED));
}

static PyObject *after_fork(PyObject *m, PyObject *unused)
{
    generation++;
    thread_index = 0;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"load", (PyCFunction)w_load, METH_O, "load(address): the word"},
    {"store", (PyCFunction)(void (*)(void))w_store, METH_FASTCALL, "store(address, value)"},
    {"add", (PyCFunction)(void (*)(void))w_add, METH_FASTCALL, "add(address, delta): the old value"},
    {"wait", (PyCFunction)(void (*)(void))w_wait, METH_FASTCALL,
     "wait(address, expected, timeout=None) -> bool (False: timed out)"},
    {"wake", (PyCFunction)(void (*)(void))w_wake, METH_FASTCALL, "wake(address, count)"},
    {"set_and_wake", (PyCFunction)(void (*)(void))w_set_and_wake, METH_FASTCALL,
     "set_and_wake(address, value, sleepers_address)"},
    {"wait_while", (PyCFunction)(void (*)(void))w_wait_while, METH_FASTCALL,
     "wait_while(address, value, sleepers_address, timeout=None) -> the word's value"},
    {"setup_semaphore", (PyCFunction)Semaphore_setup, METH_VARARGS,
     "setup_semaphore(buffer, offset, value, maxvalue): lay out a semaphore (-1: unbounded)"},
    {"looks_awake", (PyCFunction)w_looks_awake, METH_NOARGS,
     "looks_awake(): how many waits of this process looked at their word awake before sleeping"},
    {"after_fork", (PyCFunction)after_fork, METH_NOARGS,
     "in a forked child: primitives made before the fork refuse to work"},
    {NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sync",
    "Process-shared locks and semaphores on futexes in shared memory.", -1, module_methods};

PyMODINIT_FUNC PyInit__sync(void)
{
    if (PyType_Ready(&MutexType) < 0 || PyType_Ready(&SemaphoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) > 1 : sysconf(_SC_NPROCESSORS_ONLN) > 1)
        spin_ns = SPIN_NS;
    PyObject *bases = PyTuple_Pack(2, PyExc_AssertionError, PyExc_RuntimeError);
    if (bases == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    NotOwnedError = PyErr_NewExceptionWithDoc(
        "fiberlite.synchronize.NotOwnedError",
        "An operation that needs the lock held by the calling thread was called without it.",
        bases, NULL);
    Py_DECREF(bases);
    if (NotOwnedError == NULL || PyModule_AddObjectRef(m, "NotOwnedError", NotOwnedError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&MutexType);
    Py_INCREF(&SemaphoreType);
    if (PyModule_AddObject(m, "Mutex", (PyObject *)&MutexType) < 0 ||
        PyModule_AddObject(m, "Semaphore", (PyObject *)&SemaphoreType) < 0 ||
        PyModule_AddIntConstant(m, "SEMAPHORE_BYTES", SEMAPHORE_WORDS * 4) < 0 ||
        PyModule_AddIntConstant(m, "MUTEX_BYTES", MUTEX_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "THREAD_BITS", THREAD_BITS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_SLOT", MAX_SLOT) < 0 ||
        PyModule_AddIntConstant(m, "HELD", HELD) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
