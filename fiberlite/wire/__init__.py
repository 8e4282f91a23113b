"""The wire: authenticated nng request/reply connections carrying pickled envelopes.

``server.Server`` listens and dispatches requests; ``client.Client`` dials and sends
them; ``auth`` is the challenge-response both run before any pickle is loaded;
``codec`` frames objects with out-of-band buffers.
"""

import atexit as _atexit

import pynng.nng as _nng

# pynng finalizes nng at exit; a daemon thread still inside an nng call then crashes
# the interpreter ("panic: pthread_mutex_lock"). The OS reclaims everything anyway.
_atexit.unregister(_nng._pynng_atexit)
