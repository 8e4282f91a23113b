/* Semaphore: a counting semaphore in shared memory that records who holds its units, so
 * that a dead process's units can be given back. */
#include "sync.h"

#include <string.h>

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

PyObject *Semaphore_setup(PyObject *unused, PyObject *args)
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

PyTypeObject SemaphoreType = {
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
