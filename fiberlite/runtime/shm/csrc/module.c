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
 *
 * The other files: sync.h (what they share), waits.c, shared.c, mutex.c, semaphore.c.
 */
#include "sync.h"

#include <sched.h>
#include <unistd.h>

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

/* The word at args[0] and the number at args[1] (a value, a delta, a count) of a call
 * that takes ``least`` to ``most`` arguments (``usage`` when not); NULL with an
 * exception set when they are not that. */
static uint32_t *word_and_value(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t least,
                                Py_ssize_t most, const char *usage, long long *value)
{
    if (nargs < least || nargs > most) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    uint32_t *w = word_at(args[0]);
    *value = PyLong_AsLongLong(args[1]);
    return !w || PyErr_Occurred() ? NULL : w;
}

static PyObject *w_load(PyObject *m, PyObject *address)
{
    uint32_t *w = word_at(address);
    return w ? PyLong_FromUnsignedLong(__atomic_load_n(w, __ATOMIC_SEQ_CST)) : NULL;
}

static PyObject *w_store(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    long long v;
    uint32_t *w = word_and_value(args, nargs, 2, 2, "store(address, value)", &v);
    if (!w)
        return NULL;
    __atomic_store_n(w, (uint32_t)v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *w_add(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    long long d;
    uint32_t *w = word_and_value(args, nargs, 2, 2, "add(address, delta)", &d);
    if (!w)
        return NULL;
    return PyLong_FromUnsignedLong(__atomic_fetch_add(w, (uint32_t)d, __ATOMIC_SEQ_CST));
}

/* wait(address, expected, timeout=None): sleep while the word is ``expected``; False
 * once the timeout passed, True when woken or the word differs */
static PyObject *w_wait(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    long long expected;
    uint32_t *w = word_and_value(args, nargs, 2, 3, "wait(address, expected, timeout=None)", &expected);
    if (!w)
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
    long long v;
    uint32_t *w = word_and_value(args, nargs, 3, 3, "set_and_wake(address, value, sleepers_address)", &v);
    uint32_t *sleepers = w ? word_at(args[2]) : NULL;
    if (!sleepers)
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
    long long v;
    uint32_t *w = word_and_value(args, nargs, 3, 4,
                                 "wait_while(address, value, sleepers_address, timeout=None)", &v);
    uint32_t *sleepers = w ? word_at(args[2]) : NULL;
    if (!sleepers)
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
    long long n;
    uint32_t *w = word_and_value(args, nargs, 2, 2, "wake(address, count)", &n);
    if (!w)
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
    main_thread = PyThread_get_thread_ident(); /* the thread that forked is the child's main */
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
#ifdef __linux__
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) > 1 : sysconf(_SC_NPROCESSORS_ONLN) > 1)
        spin_ns = SPIN_NS;
#else
    if (sysconf(_SC_NPROCESSORS_ONLN) > 1)
        spin_ns = SPIN_NS;
#endif
    if (find_main_thread() < 0) {
        Py_DECREF(m);
        return NULL;
    }
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

