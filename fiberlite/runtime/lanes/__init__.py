"""Lanes: FIFOs of messages shared by every process of one machine (a queue's items).

:mod:`.lane` is one lane as a process uses it (a ``SOCK_SEQPACKET`` socket pair);
:mod:`.shared` makes lanes and brings them to the other processes of the machine
through their creator's door.
"""
