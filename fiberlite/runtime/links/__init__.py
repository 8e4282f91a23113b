"""Links: a pipe's end or a queue's slot handed straight to the one job that uses it.

``channel`` is the FIFO behind every pipe and queue (in its owner's hub); ``servant``
the owner's servant side of links; ``forwarder`` the owner's half of one link;
``reader`` the job's half (and the job's registry of links); ``reading`` the receiving
half both sides share; ``frames`` what travels on a link; ``route`` the one way a
``Queue`` and a ``Pipe`` send and receive: over a link, else in the owner itself, else
through the owner's hub. The connections themselves are :mod:`fiberlite.wire.link`'s.
"""
