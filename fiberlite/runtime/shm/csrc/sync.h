/* What the C files of the _sync extension share: the layout of a holder's token, the
 * waits on futexes, the view on shared memory (module.c says what the extension is). */
#ifndef FIBERLITE_SYNC_H
#define FIBERLITE_SYNC_H

/* Linux only: its waits are futexes. setup.py leaves the extension out of the build on
 * other platforms, where fiberlite uses its portable path (runtime/shm/portable.py). */
#ifndef __linux__
#error "fiberlite's _sync extension needs Linux futexes; other platforms use the portable path"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

#pragma GCC visibility push(hidden)

#define WAITERS 0x80000000u
#define TOKEN_MASK 0x7fffffffu
#define THREAD_BITS 12
#define THREAD_MASK ((1u << THREAD_BITS) - 1)
#define MAX_SLOT ((TOKEN_MASK >> THREAD_BITS))
#define SPINS 100
#define UNBOUNDED 0xffffffffu
#define HELD 24
#define SPIN_NS 50000L /* how long a wait looks at its word awake before it sleeps */
#define SIGNAL_SLICE_NS 20000000L /* the main thread looks for signals this often while it sleeps */
#define DEPTH 16       /* the word of a mutex's holder's depth */
#define MUTEX_BYTES (4 * (DEPTH + 1))
enum { S_META, S_VALUE, S_MAX, S_INITIAL, S_SLEEPERS, S_J_VALID, S_J_VALUE, S_J_INDEX,
       S_J_SLOT, S_J_COUNT, S_HELD = 16 };
#define SEMAPHORE_WORDS (S_HELD + 2 * HELD)

extern PyObject *NotOwnedError; /* an AssertionError (as multiprocessing) and a RuntimeError (as threading) */
extern uint32_t next_thread;
extern __thread uint32_t thread_index;
extern unsigned long generation; /* bumped in a forked child: older objects refuse */
extern long spin_ns;             /* SPIN_NS, or 0 on one CPU; set when the module is loaded */
extern unsigned long looks_awake; /* waits of this process that looked awake */
extern unsigned long main_thread; /* the thread that runs signal handlers (find_main_thread) */
extern PyTypeObject MutexType, SemaphoreType;

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

/* -- waits (waits.c) -------------------------------------------------------------------- */
typedef struct {
    int blocking;
    int limited;             /* a deadline applies */
    struct timespec deadline;
} Wait;

int futex_wait(uint32_t *addr, uint32_t expected, const struct timespec *deadline);
void futex_wake(uint32_t *addr, int count);
int parse_wait(PyObject *block, PyObject *timeout, Wait *w);
int find_main_thread(void);
int sleep_on(uint32_t *addr, uint32_t expected, Wait *w);
int watch_then_sleep_on(uint32_t *addr, uint32_t expected, Wait *w);
int lock_word(uint32_t *owner, uint32_t token, Wait *w, uint32_t dead);
void lock_briefly(uint32_t *owner, uint32_t token, uint32_t dead);

static inline int try_lock(uint32_t *owner, uint32_t token)
{
    uint32_t expected = 0;
    return __atomic_compare_exchange_n(owner, &expected, token, 0, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
}

static inline void unlock_word(uint32_t *owner)
{
    uint32_t old = __atomic_exchange_n(owner, 0, __ATOMIC_RELEASE);
    if (old & WAITERS)
        futex_wake(owner, 1);
}

/* -- a view on shared memory (shared.c) -------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    uint32_t *words;
    uint32_t slot;           /* this process's slot in that memory */
    unsigned long generation;
} Shared;

uint32_t *words_of(PyObject *buffer, Py_ssize_t offset, Py_ssize_t size, Py_buffer *view);
int shared_init(Shared *self, PyObject *buffer, Py_ssize_t offset, Py_ssize_t size, unsigned long slot);
void shared_dealloc(Shared *self);
int check_generation(Shared *self);
PyObject *address(Shared *self, PyObject *unused);
int fast_wait_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   PyObject **block, PyObject **timeout);

static inline uint32_t my_token(Shared *self) { return (self->slot << THREAD_BITS) | my_thread(); }

/* -- semaphore.c ------------------------------------------------------------------------- */
PyObject *Semaphore_setup(PyObject *unused, PyObject *args);

#pragma GCC visibility pop
#endif
