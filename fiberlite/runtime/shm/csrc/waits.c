/* Waits on a word of shared memory: futexes, a look awake before sleeping, and the lock
 * word every primitive is built on (a holder's token; bit 31: someone may sleep on it). */
#include "sync.h"

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

PyObject *NotOwnedError;
uint32_t next_thread = 0;
__thread uint32_t thread_index = 0;
unsigned long generation = 0;
long spin_ns = 0;
unsigned long looks_awake = 0;
unsigned long main_thread = 0;

/* -- futexes ------------------------------------------------------------------------- */
#ifdef __linux__
int futex_wait(uint32_t *addr, uint32_t expected, const struct timespec *deadline)
{
    long r = syscall(SYS_futex, addr, FUTEX_WAIT_BITSET, expected, deadline, NULL,
                     FUTEX_BITSET_MATCH_ANY);
    return r == -1 ? errno : 0;
}

void futex_wake(uint32_t *addr, int count)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, count, NULL, NULL, 0);
}
#endif

/* block and timeout as multiprocessing reads them: a negative timeout is 0, no
 * timeout (None) is no limit, and a non-blocking call does not wait at all. */
int parse_wait(PyObject *block, PyObject *timeout, Wait *w)
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
int watch_then_sleep_on(uint32_t *addr, uint32_t expected, Wait *w)
{
    int changed;
    Py_BEGIN_ALLOW_THREADS
    changed = changes_soon(addr, expected);
    Py_END_ALLOW_THREADS
    return changed ? 1 : sleep_on(addr, expected, w);
}

/* The thread that runs signal handlers: threading.main_thread() (0: not known). */
int find_main_thread(void)
{
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *thread = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = thread ? PyObject_GetAttrString(thread, "ident") : NULL;
    Py_XDECREF(threading);
    Py_XDECREF(thread);
    if (ident == NULL)
        return -1;
    main_thread = ident == Py_None ? 0 : PyLong_AsUnsignedLong(ident);
    Py_DECREF(ident);
    return PyErr_Occurred() ? -1 : 0;
}

/* Sleep while *addr == expected (GIL released): 1 woken (look again), 0 the deadline
 * passed, -1 a signal handler raised.
 *
 * A signal interrupts the sleep only if it comes to this thread while it sleeps. One that
 * came a moment before (while the wait looked awake, or on its way into the futex), or
 * to another thread, only sets Python's flag: the main thread, where handlers run, looks
 * at that flag before it sleeps and at least every SIGNAL_SLICE_NS while it sleeps, so
 * that Ctrl-C raises KeyboardInterrupt within that time, never at the wait's end. */
int sleep_on(uint32_t *addr, uint32_t expected, Wait *w)
{
    int main = PyThread_get_thread_ident() == main_thread;
    if (main && PyErr_CheckSignals() < 0)
        return -1;
    for (;;) {
        const struct timespec *until = w->limited ? &w->deadline : NULL;
        struct timespec slice;
        if (main) {
            clock_gettime(CLOCK_MONOTONIC, &slice);
            slice.tv_nsec += SIGNAL_SLICE_NS;
            if (slice.tv_nsec >= 1000000000L) {
                slice.tv_sec += 1;
                slice.tv_nsec -= 1000000000L;
            }
            if (until == NULL || slice.tv_sec < until->tv_sec ||
                (slice.tv_sec == until->tv_sec && slice.tv_nsec < until->tv_nsec))
                until = &slice;
        }
        int err;
        Py_BEGIN_ALLOW_THREADS
        err = futex_wait(addr, expected, until);
        Py_END_ALLOW_THREADS
        if (err == ETIMEDOUT && until != &slice)
            return 0;
        if ((err == EINTR || err == ETIMEDOUT) && PyErr_CheckSignals() < 0)
            return -1;
        if (err != ETIMEDOUT)
            return 1;
        /* a slice passed, no signal: sleep on (at once back if the word changed) */
    }
}

/* -- the lock every primitive is built on -------------------------------------------- */
/* 1 taken, 0 not (non-blocking, or the deadline passed), -1 exception.
 * dead: a slot whose hold is taken over (0: none). */
int lock_word(uint32_t *owner, uint32_t token, Wait *w, uint32_t dead)
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

/* A lock for a moment's bookkeeping: waits as long as it takes, never raises. */
void lock_briefly(uint32_t *owner, uint32_t token, uint32_t dead)
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
