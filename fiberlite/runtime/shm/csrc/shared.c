/* A primitive's view on shared memory: its words, this process's slot, the generation
 * (a forked child refuses what its parent made), and how blocking calls take arguments. */
#include "sync.h"

/* the ``size`` bytes at ``offset`` of ``buffer``, as words (``view`` then holds the buffer) */
uint32_t *words_of(PyObject *buffer, Py_ssize_t offset, Py_ssize_t size, Py_buffer *view)
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

int shared_init(Shared *self, PyObject *buffer, Py_ssize_t offset, Py_ssize_t size,
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

void shared_dealloc(Shared *self)
{
    if (self->view.obj)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int check_generation(Shared *self)
{
    if (self->generation != generation) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this primitive was made in the process this one was forked from: "
                        "pass it to the new process (as an argument) instead");
        return -1;
    }
    return 0;
}

PyObject *address(Shared *self, PyObject *unused)
{
    return PyLong_FromVoidPtr(self->words);
}

/* block and timeout, by position or by name, without building a tuple (the hot path) */
int fast_wait_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
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
    /* a timeout that is no real number is refused before anything is taken, as by multiprocessing */
    if (*timeout && *timeout != Py_None && !PyFloat_CheckExact(*timeout) && !PyLong_CheckExact(*timeout)) {
        double t = PyFloat_AsDouble(*timeout);
        if (t == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}
