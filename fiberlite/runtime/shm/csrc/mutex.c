/* Mutex: a lock in shared memory, its word naming its holder (sync.h). */
#include "sync.h"

typedef struct {
    Shared shared;
    int recursive;
} Mutex;

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

PyTypeObject MutexType = {
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
