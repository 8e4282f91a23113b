"""The wire: authenticated nng request/reply connections carrying pickled envelopes.

``server.Server`` listens and dispatches requests; ``client.Client`` dials and sends
them; ``auth`` is the challenge-response both run before any pickle is loaded;
``codec`` frames objects with out-of-band buffers. Every other socket of fiberlite is
opened here too (but for the stdlib-API ``Listener``/``Client`` of
``fiberlite.connection``): ``unix`` listens on, dials and pairs Unix sockets and passes
descriptors, ``frames`` reads length-prefixed frames off a stream socket, ``doorman``
makes every listener's peers prove the key first, and ``waking`` is the selector of the
loops that serve many sockets.
"""

import atexit as _atexit

import pynng.nng as _nng

# pynng finalizes nng at exit; a daemon thread still inside an nng call then crashes
# the interpreter ("panic: pthread_mutex_lock"). The OS reclaims everything anyway.
_atexit.unregister(_nng._pynng_atexit)
